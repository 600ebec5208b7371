/* schema.c - JSON schema -> node table (grammar.h, gram_internal.h). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gram_internal.h"

typedef struct memo_ent {
    const json_t *sch;
    int32_t node;
} memo_ent;

typedef struct cctx {
    gram_schema *s;
    const json_t *doc;
    hl_err *err;
    hl_status st;
    memo_ent *memo;
    size_t n_memo, cap_memo;
    int depth;
} cctx;

static int32_t compile(cctx *c, const json_t *sch, const char *path);

static int32_t fail(cctx *c, hl_status code, const char *fmt, const char *a, const char *path) {
    if (c->st == HL_OK) {
        char msg[HL_ERR_MSG_LEN];
        snprintf(msg, sizeof msg, fmt, a);
        hl_fail(c->err, code, "%s at %s", msg, path);
        c->st = code;
    }
    return -1;
}

static bool grow(void **p, uint32_t *cap, uint32_t need, size_t elt) {
    if (need <= *cap) return true;
    uint32_t nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * elt);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}

static int32_t new_node(cctx *c, uint8_t kind) {
    gram_schema *s = c->s;
    if (!grow((void **)&s->nodes, &s->cap_nodes, s->n_nodes + 1, sizeof *s->nodes)) {
        fail(c, HL_ERR_NOMEM, "%s", "out of memory", "#");
        return -1;
    }
    gram_node *n = &s->nodes[s->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->additional = -1;
    n->items = GRAM_NODE_ANY;
    n->max = UINT32_MAX;
    n->pattern = -1;
    return (int32_t)s->n_nodes++;
}

static const char *own(cctx *c, const char *p, size_t len) {
    gram_schema *s = c->s;
    if (!grow((void **)&s->strs, &s->cap_strs, s->n_strs + 1, sizeof *s->strs)) return NULL;
    char *d = malloc(len + 1);
    if (!d) return NULL;
    memcpy(d, p, len);
    d[len] = 0;
    s->strs[s->n_strs++] = d;
    return d;
}

static int lit_cmp(const void *a, const void *b) {
    const gram_lit *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int r = memcmp(x->s, y->s, n);
    if (r) return r;
    return x->len < y->len ? -1 : x->len > y->len;
}

/* A literal node from JSON values (compact canonical texts), sorted, deduplicated. */
static int32_t lit_node(cctx *c, const json_t *const *vals, size_t n, const char *path) {
    gram_schema *s = c->s;
    if (n == 0) return new_node(c, GK_NEVER);
    if (!grow((void **)&s->lits, &s->cap_lits, s->n_lits + (uint32_t)n, sizeof *s->lits))
        return fail(c, HL_ERR_NOMEM, "%s", "out of memory", path);
    uint32_t first = s->n_lits;
    for (size_t i = 0; i < n; i++) {
        char *txt = json_dumps(vals[i], JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS);
        if (!txt) return fail(c, HL_ERR_NOMEM, "%s", "out of memory", path);
        const char *o = own(c, txt, strlen(txt));
        size_t len = strlen(txt);
        free(txt);
        if (!o) return fail(c, HL_ERR_NOMEM, "%s", "out of memory", path);
        s->lits[s->n_lits++] = (gram_lit){.s = o, .len = (uint32_t)len, .node = -1};
    }
    qsort(s->lits + first, n, sizeof *s->lits, lit_cmp);
    uint32_t w = first;
    for (uint32_t i = first; i < s->n_lits; i++)
        if (w == first || lit_cmp(&s->lits[w - 1], &s->lits[i])) s->lits[w++] = s->lits[i];
    s->n_lits = w;
    int32_t id = new_node(c, GK_LIT);
    if (id < 0) return -1;
    s->nodes[id].first = first;
    s->nodes[id].n = w - first;
    return id;
}

static int32_t lit_words(cctx *c, const char *const *words, size_t n) {
    json_t *vals[3] = {NULL, NULL, NULL};
    for (size_t i = 0; i < n; i++) vals[i] = json_loads(words[i], JSON_DECODE_ANY, NULL);
    int32_t id = lit_node(c, (const json_t *const *)vals, n, "#");
    for (size_t i = 0; i < n; i++) json_decref(vals[i]);
    return id;
}

/* Keywords that change what validates and that the recognizer does not enforce.
 * (unevaluatedProperties/Items and additionalItems only restrict extras the recognizer
 * never produces: no extra properties unless additionalProperties allows them, no tuples.) */
static const char *const k_unsupported[] = {
    "not", "if", "then", "else", "patternProperties", "propertyNames", "dependentRequired",
    "dependentSchemas", "dependencies", "contains", "minContains", "maxContains", "prefixItems",
    "multipleOf", "$dynamicRef", "$recursiveRef", "minProperties", "maxProperties",
    "uniqueItems",
};

static bool harmless(const char *k, const json_t *v) {
    if (!strcmp(k, "uniqueItems")) return json_is_false(v);
    if (!strcmp(k, "minProperties") || !strcmp(k, "minContains"))
        return json_is_integer(v) && json_integer_value(v) == 0;
    return false;
}

static int32_t check_keywords(cctx *c, const json_t *sch, const char *path) {
    for (size_t i = 0; i < sizeof k_unsupported / sizeof *k_unsupported; i++) {
        const json_t *v = json_object_get(sch, k_unsupported[i]);
        if (v && !harmless(k_unsupported[i], v))
            return fail(c, HL_ERR_UNSUPPORTED, "unsupported JSON schema keyword \"%s\"",
                        k_unsupported[i], path);
    }
    return 0;
}

/* "#/$defs/A" style pointers into the root document. */
static const json_t *resolve(cctx *c, const char *ref, const char *path) {
    if (ref[0] != '#') {
        fail(c, HL_ERR_UNSUPPORTED, "unsupported $ref \"%s\" (only local \"#/...\" references)",
             ref, path);
        return NULL;
    }
    const json_t *cur = c->doc;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '1') tok[n++] = '/', p += 2;
            else if (p[0] == '~' && p[1] == '0') tok[n++] = '~', p += 2;
            else tok[n++] = *p++;
        }
        tok[n] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) cur = json_array_get(cur, (size_t)strtoul(tok, NULL, 10));
        else cur = NULL;
        if (!cur) break;
    }
    if (!cur || *p) {
        fail(c, HL_ERR_INVALID, "invalid JSON schema: $ref \"%s\" does not resolve", ref, path);
        return NULL;
    }
    return cur;
}

static bool get_u32(cctx *c, const json_t *sch, const char *k, uint32_t *out, const char *path) {
    const json_t *v = json_object_get(sch, k);
    if (!v) return true;
    if (!json_is_number(v) || json_number_value(v) < 0) {
        fail(c, HL_ERR_INVALID, "invalid JSON schema: \"%s\" must be a non-negative integer", k,
             path);
        return false;
    }
    double d = json_number_value(v);
    *out = d > 4e9 ? UINT32_MAX : (uint32_t)d;
    return true;
}

static int32_t compile_object(cctx *c, const json_t *sch, const char *path) {
    const json_t *props = json_object_get(sch, "properties");
    const json_t *req = json_object_get(sch, "required");
    const json_t *add = json_object_get(sch, "additionalProperties");
    if (props && !json_is_object(props))
        return fail(c, HL_ERR_INVALID, "invalid JSON schema: \"%s\" must be an object",
                    "properties", path);
    if (req && !json_is_array(req))
        return fail(c, HL_ERR_INVALID, "invalid JSON schema: \"%s\" must be an array", "required",
                    path);
    size_t np = props ? json_object_size(props) : 0;
    if (np > GRAM_MAX_PROPS)
        return fail(c, HL_ERR_UNSUPPORTED, "too many properties in one object (more than %s)",
                    "64", path);
    int32_t id = new_node(c, GK_OBJ);
    if (id < 0) return -1;
    gram_schema *s = c->s;
    if (!grow((void **)&s->lits, &s->cap_lits, s->n_lits + (uint32_t)np, sizeof *s->lits))
        return fail(c, HL_ERR_NOMEM, "%s", "out of memory", path);
    uint32_t first = s->n_lits;
    const char *k;
    json_t *v;
    s->n_lits += (uint32_t)np; /* reserved: compiling children may add literals after */
    uint32_t i = 0;
    json_object_foreach((json_t *)props, k, v) {
        json_t *ks = json_string(k);
        char *txt = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (!txt) return fail(c, HL_ERR_NOMEM, "%s", "out of memory", path);
        const char *o = own(c, txt + 1, strlen(txt) - 2); /* without the quotes */
        size_t len = strlen(txt) - 2;
        free(txt);
        if (!o) return fail(c, HL_ERR_NOMEM, "%s", "out of memory", path);
        char sub[512];
        snprintf(sub, sizeof sub, "%s/properties/%s", path, k);
        int32_t child = compile(c, v, sub);
        if (child < 0) return -1;
        s->lits[first + i++] = (gram_lit){.s = o, .len = (uint32_t)len, .node = child};
    }
    qsort(s->lits + first, np, sizeof *s->lits, lit_cmp);
    gram_node *n = &s->nodes[id];
    n->first = first;
    n->n = (uint32_t)np;
    size_t ri;
    json_array_foreach((json_t *)req, ri, v) {
        if (!json_is_string(v))
            return fail(c, HL_ERR_INVALID, "invalid JSON schema: \"%s\" must list strings",
                        "required", path);
        bool found = false;
        for (uint32_t j = 0; j < np; j++) {
            json_t *ks = json_string(json_string_value(v));
            char *txt = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
            json_decref(ks);
            if (!txt) return fail(c, HL_ERR_NOMEM, "%s", "out of memory", path);
            bool eq = strlen(txt) - 2 == s->lits[first + j].len &&
                      !memcmp(txt + 1, s->lits[first + j].s, s->lits[first + j].len);
            free(txt);
            if (eq) {
                s->nodes[id].required |= 1ull << j;
                found = true;
            }
        }
        if (!found)
            return fail(c, HL_ERR_UNSUPPORTED,
                        "required property \"%s\" is not listed in \"properties\"",
                        json_string_value(v), path);
    }
    if (add && !json_is_false(add)) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/additionalProperties", path);
        int32_t a = compile(c, add, sub);
        if (a < 0) return -1;
        s->nodes[id].additional = a;
    }
    return id;
}

static bool number_bound(const json_t *v, double *out) {
    if (!v || !json_is_number(v)) return false;
    *out = json_number_value(v);
    return true;
}

static int32_t compile_number(cctx *c, const json_t *sch, bool integer, const char *path) {
    int32_t id = new_node(c, GK_NUM);
    if (id < 0) return -1;
    gram_node *n = &c->s->nodes[id];
    n->integer = integer;
    double mn = 0, mx = 0, xmn = 0, xmx = 0;
    bool has_mn = number_bound(json_object_get(sch, "minimum"), &mn);
    bool has_mx = number_bound(json_object_get(sch, "maximum"), &mx);
    const json_t *emn = json_object_get(sch, "exclusiveMinimum");
    const json_t *emx = json_object_get(sch, "exclusiveMaximum");
    bool x_mn = false, x_mx = false;
    if (json_is_true(emn) && has_mn) x_mn = true; /* draft 4 */
    if (json_is_true(emx) && has_mx) x_mx = true;
    if (number_bound(emn, &xmn) && (!has_mn || xmn >= mn)) mn = xmn, has_mn = true, x_mn = true;
    if (number_bound(emx, &xmx) && (!has_mx || xmx <= mx)) mx = xmx, has_mx = true, x_mx = true;
    const double lim = 9e17;
    if (has_mn) {
        if (mn < -lim || mn > lim)
            return fail(c, HL_ERR_UNSUPPORTED, "%s out of the supported range", "minimum", path);
        double f = floor(mn);
        n->lo = (int64_t)(x_mn || f < mn ? f + 1 : f);
        n->flo = (int64_t)ceil(mn);
        n->has_lo = true;
    }
    if (has_mx) {
        if (mx < -lim || mx > lim)
            return fail(c, HL_ERR_UNSUPPORTED, "%s out of the supported range", "maximum", path);
        double f = ceil(mx);
        n->hi = (int64_t)(x_mx || f > mx ? f - 1 : f);
        n->fhi = (int64_t)floor(mx);
        n->has_hi = true;
    }
    if (n->has_lo && n->has_hi && n->lo > n->hi)
        return fail(c, HL_ERR_UNSUPPORTED,
                    "%s: no integer lies in the range (fractional ranges are not supported)",
                    "minimum/maximum", path);
    /* bounded numbers: integers in range, and fractions where the whole unit interval
     * after the integer part stays inside (match.c) */
    n->frac_ok = !integer;
    return id;
}

static int32_t compile_typed(cctx *c, const json_t *sch, const char *type, const char *path) {
    if (!strcmp(type, "object")) return compile_object(c, sch, path);
    if (!strcmp(type, "array")) {
        const json_t *items = json_object_get(sch, "items");
        if (json_is_array(items))
            return fail(c, HL_ERR_UNSUPPORTED,
                        "unsupported JSON schema keyword \"%s\" (as an array)", "items", path);
        int32_t it = GRAM_NODE_ANY;
        if (items) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/items", path);
            it = compile(c, items, sub);
            if (it < 0) return -1;
        }
        uint32_t mn = 0, mx = UINT32_MAX;
        if (!get_u32(c, sch, "minItems", &mn, path) || !get_u32(c, sch, "maxItems", &mx, path))
            return -1;
        if (mn > mx)
            return fail(c, HL_ERR_INVALID, "invalid JSON schema: %s", "minItems > maxItems", path);
        int32_t id = new_node(c, GK_ARR);
        if (id < 0) return -1;
        c->s->nodes[id].items = it;
        c->s->nodes[id].min = mn;
        c->s->nodes[id].max = mx;
        return id;
    }
    if (!strcmp(type, "string")) {
        uint32_t mn = 0, mx = UINT32_MAX;
        if (!get_u32(c, sch, "minLength", &mn, path) || !get_u32(c, sch, "maxLength", &mx, path))
            return -1;
        if (mn > mx)
            return fail(c, HL_ERR_INVALID, "invalid JSON schema: %s", "minLength > maxLength",
                        path);
        const json_t *pat = json_object_get(sch, "pattern");
        if (pat && !json_is_string(pat))
            return fail(c, HL_ERR_INVALID, "invalid JSON schema: \"%s\" must be a string",
                        "pattern", path);
        int32_t id = new_node(c, GK_STR);
        if (id < 0) return -1;
        c->s->nodes[id].min = mn;
        c->s->nodes[id].max = mx;
        if (pat) {
            gram_schema *s = c->s;
            if (!grow((void **)&s->regexes, &s->cap_regexes, s->n_regexes + 1, sizeof *s->regexes))
                return fail(c, HL_ERR_NOMEM, "%s", "out of memory", path);
            char why[200];
            if (!gram_regex_compile(json_string_value(pat), json_string_length(pat),
                                    &s->regexes[s->n_regexes], why, sizeof why)) {
                char msg[300];
                snprintf(msg, sizeof msg, "unsupported JSON schema keyword \"pattern\" (%s)", why);
                return fail(c, HL_ERR_UNSUPPORTED, "%s", msg, path);
            }
            s->nodes[id].pattern = (int32_t)s->n_regexes++;
        }
        return id;
    }
    if (!strcmp(type, "number")) return compile_number(c, sch, false, path);
    if (!strcmp(type, "integer")) return compile_number(c, sch, true, path);
    if (!strcmp(type, "boolean")) return lit_words(c, (const char *const[]){"true", "false"}, 2);
    if (!strcmp(type, "null")) return lit_words(c, (const char *const[]){"null"}, 1);
    return fail(c, HL_ERR_INVALID, "invalid JSON schema: unknown type \"%s\"", type, path);
}

static bool has_any(const json_t *sch, const char *const *keys, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (json_object_get(sch, keys[i])) return true;
    return false;
}

static int32_t compile_body(cctx *c, const json_t *sch, const char *path) {
    if (check_keywords(c, sch, path) < 0) return -1;
    const json_t *ref = json_object_get(sch, "$ref");
    if (ref) {
        if (!json_is_string(ref))
            return fail(c, HL_ERR_INVALID, "invalid JSON schema: \"%s\" must be a string", "$ref",
                        path);
        const json_t *t = resolve(c, json_string_value(ref), path);
        if (!t) return -1;
        return compile(c, t, json_string_value(ref));
    }
    const json_t *all = json_object_get(sch, "allOf");
    if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1)
            return fail(c, HL_ERR_UNSUPPORTED,
                        "unsupported JSON schema keyword \"%s\" (only with one subschema)",
                        "allOf", path);
        static const char *const vkeys[] = {"type", "properties", "items", "enum", "const",
                                            "anyOf", "oneOf", "required"};
        if (has_any(sch, vkeys, sizeof vkeys / sizeof *vkeys))
            return fail(c, HL_ERR_UNSUPPORTED,
                        "unsupported JSON schema keyword \"%s\" next to other constraints",
                        "allOf", path);
        char sub[512];
        snprintf(sub, sizeof sub, "%s/allOf/0", path);
        return compile(c, json_array_get(all, 0), sub);
    }
    const char *alt_key = json_object_get(sch, "anyOf") ? "anyOf"
                          : json_object_get(sch, "oneOf") ? "oneOf" : NULL;
    if (alt_key) {
        const json_t *alts = json_object_get(sch, alt_key);
        if (!json_is_array(alts) || json_array_size(alts) == 0)
            return fail(c, HL_ERR_INVALID, "invalid JSON schema: \"%s\" must be a non-empty array",
                        alt_key, path);
        static const char *const vkeys[] = {"type", "properties", "items", "enum", "const",
                                            "anyOf", "oneOf", "required", "minLength",
                                            "maxLength", "minItems", "maxItems"};
        for (size_t i = 0; i < sizeof vkeys / sizeof *vkeys; i++)
            if (strcmp(vkeys[i], alt_key) && json_object_get(sch, vkeys[i]))
                return fail(c, HL_ERR_UNSUPPORTED,
                            "unsupported JSON schema keyword \"%s\" next to anyOf/oneOf",
                            vkeys[i], path);
        size_t na = json_array_size(alts);
        int32_t *ids = malloc(na * sizeof *ids);
        if (!ids) return fail(c, HL_ERR_NOMEM, "%s", "out of memory", path);
        for (size_t i = 0; i < na; i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/%s/%zu", path, alt_key, i);
            ids[i] = compile(c, json_array_get(alts, i), sub);
            if (ids[i] < 0) {
                free(ids);
                return -1;
            }
        }
        int32_t id = -1;
        gram_schema *s = c->s;
        if (grow((void **)&s->alts, &s->cap_alts, s->n_alts + (uint32_t)na, sizeof *s->alts))
            id = new_node(c, GK_ALT);
        if (id >= 0) {
            s->nodes[id].first = s->n_alts;
            s->nodes[id].n = (uint32_t)na;
            memcpy(s->alts + s->n_alts, ids, na * sizeof *ids);
            s->n_alts += (uint32_t)na;
        } else {
            fail(c, HL_ERR_NOMEM, "%s", "out of memory", path);
        }
        free(ids);
        return id;
    }
    const json_t *cst = json_object_get(sch, "const");
    if (cst) return lit_node(c, &cst, 1, path);
    const json_t *en = json_object_get(sch, "enum");
    if (en) {
        if (!json_is_array(en))
            return fail(c, HL_ERR_INVALID, "invalid JSON schema: \"%s\" must be an array", "enum",
                        path);
        size_t n = json_array_size(en);
        const json_t **vals = malloc((n ? n : 1) * sizeof *vals);
        if (!vals) return fail(c, HL_ERR_NOMEM, "%s", "out of memory", path);
        for (size_t i = 0; i < n; i++) vals[i] = json_array_get(en, i);
        int32_t id = lit_node(c, vals, n, path);
        free(vals);
        return id;
    }
    const json_t *type = json_object_get(sch, "type");
    if (json_is_string(type)) return compile_typed(c, sch, json_string_value(type), path);
    if (json_is_array(type)) {
        size_t na = json_array_size(type);
        if (na == 0)
            return fail(c, HL_ERR_INVALID, "invalid JSON schema: \"%s\" must not be empty", "type",
                        path);
        if (na == 1 && json_is_string(json_array_get(type, 0)))
            return compile_typed(c, sch, json_string_value(json_array_get(type, 0)), path);
        int32_t ids[8];
        if (na > 8)
            return fail(c, HL_ERR_INVALID, "invalid JSON schema: %s", "too many types", path);
        for (size_t i = 0; i < na; i++) {
            const json_t *t = json_array_get(type, i);
            if (!json_is_string(t))
                return fail(c, HL_ERR_INVALID, "invalid JSON schema: \"%s\" must list strings",
                            "type", path);
            ids[i] = compile_typed(c, sch, json_string_value(t), path);
            if (ids[i] < 0) return -1;
        }
        gram_schema *s = c->s;
        if (!grow((void **)&s->alts, &s->cap_alts, s->n_alts + (uint32_t)na, sizeof *s->alts))
            return fail(c, HL_ERR_NOMEM, "%s", "out of memory", path);
        int32_t id = new_node(c, GK_ALT);
        if (id < 0) return -1;
        s->nodes[id].first = s->n_alts;
        s->nodes[id].n = (uint32_t)na;
        memcpy(s->alts + s->n_alts, ids, na * sizeof *ids);
        s->n_alts += (uint32_t)na;
        return id;
    }
    if (type)
        return fail(c, HL_ERR_INVALID, "invalid JSON schema: \"%s\" must be a string or array",
                    "type", path);
    static const char *const okeys[] = {"properties", "required", "additionalProperties"};
    static const char *const akeys[] = {"items", "minItems", "maxItems"};
    static const char *const skeys[] = {"minLength", "maxLength", "pattern"};
    static const char *const nkeys[] = {"minimum", "maximum", "exclusiveMinimum",
                                        "exclusiveMaximum"};
    if (has_any(sch, okeys, 3)) return compile_typed(c, sch, "object", path);
    if (has_any(sch, akeys, 3)) return compile_typed(c, sch, "array", path);
    if (has_any(sch, skeys, 3)) return compile_typed(c, sch, "string", path);
    if (has_any(sch, nkeys, 4)) return compile_typed(c, sch, "number", path);
    return GRAM_NODE_ANY;
}

static int32_t compile(cctx *c, const json_t *sch, const char *path) {
    if (c->st) return -1;
    if (json_is_true(sch)) return GRAM_NODE_ANY;
    if (json_is_false(sch)) return new_node(c, GK_NEVER);
    if (!json_is_object(sch))
        return fail(c, HL_ERR_INVALID, "invalid JSON schema: %s", "expected an object", path);
    for (size_t i = 0; i < c->n_memo; i++)
        if (c->memo[i].sch == sch) return c->memo[i].node;
    if (++c->depth > 64)
        return fail(c, HL_ERR_UNSUPPORTED, "%s", "JSON schema nested too deeply", path);
    /* a placeholder first, so that a $ref cycle resolves to this node */
    int32_t id = new_node(c, GK_ALT);
    if (id < 0) return -1;
    if (c->n_memo == c->cap_memo) {
        size_t nc = c->cap_memo ? c->cap_memo * 2 : 16;
        memo_ent *m = realloc(c->memo, nc * sizeof *m);
        if (!m) return fail(c, HL_ERR_NOMEM, "%s", "out of memory", path);
        c->memo = m;
        c->cap_memo = nc;
    }
    c->memo[c->n_memo++] = (memo_ent){sch, id};
    int32_t body = compile_body(c, sch, path);
    c->depth--;
    if (body < 0) return -1;
    /* OpenAPI's nullable */
    if (json_is_true(json_object_get(sch, "nullable"))) {
        int32_t nul = lit_words(c, (const char *const[]){"null"}, 1);
        if (nul < 0) return -1;
        gram_schema *s = c->s;
        if (!grow((void **)&s->alts, &s->cap_alts, s->n_alts + 2, sizeof *s->alts))
            return fail(c, HL_ERR_NOMEM, "%s", "out of memory", path);
        s->alts[s->n_alts] = body;
        s->alts[s->n_alts + 1] = nul;
        s->nodes[id] = (gram_node){.kind = GK_ALT, .first = s->n_alts, .n = 2, .additional = -1};
        s->n_alts += 2;
        return id;
    }
    /* the placeholder becomes a one-way alternative to the body */
    gram_schema *s = c->s;
    if (!grow((void **)&s->alts, &s->cap_alts, s->n_alts + 1, sizeof *s->alts))
        return fail(c, HL_ERR_NOMEM, "%s", "out of memory", path);
    s->alts[s->n_alts] = body;
    s->nodes[id] = (gram_node){.kind = GK_ALT, .first = s->n_alts, .n = 1, .additional = -1};
    s->n_alts++;
    return id;
}

void gram_schema_free(gram_schema *s) {
    if (!s) return;
    for (uint32_t i = 0; i < s->n_strs; i++) free(s->strs[i]);
    free(s->strs);
    free(s->nodes);
    free(s->lits);
    free(s->alts);
    free(s->regexes);
    free(s);
}

hl_status gram_compile(const char *format, size_t len, gram_schema **out, hl_err *err) {
    *out = NULL;
    json_error_t je;
    json_t *doc = json_loadb(format, len, JSON_DECODE_ANY, &je);
    if (!doc) return hl_fail(err, HL_ERR_INVALID, "invalid format: %s", je.text);
    gram_schema *s = calloc(1, sizeof *s);
    cctx c = {.s = s, .doc = doc, .err = err};
    if (!s) {
        json_decref(doc);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    /* the fixed nodes */
    new_node(&c, GK_ANY);
    new_node(&c, GK_OBJ);
    s->nodes[GRAM_NODE_ANY_OBJ].additional = GRAM_NODE_ANY;
    new_node(&c, GK_ARR);
    new_node(&c, GK_STR);
    new_node(&c, GK_NUM);
    lit_words(&c, (const char *const[]){"true", "false", "null"}, 3);
    if (c.st == HL_OK && s->n_nodes != GRAM_NODE_FIXED)
        fail(&c, HL_ERR_NOMEM, "%s", "out of memory", "#");
    if (c.st == HL_OK) {
        if (json_is_string(doc)) {
            if (strcmp(json_string_value(doc), "json"))
                fail(&c, HL_ERR_INVALID,
                     "invalid format: \"%s\"; expected \"json\" or a JSON schema",
                     json_string_value(doc), "#");
            s->root = GRAM_NODE_ANY_OBJ; /* Ollama's "json": one object */
        } else {
            s->root = compile(&c, doc, "#");
        }
    }
    free(c.memo);
    json_decref(doc);
    if (c.st) {
        gram_schema_free(s);
        return c.st;
    }
    *out = s;
    return HL_OK;
}
