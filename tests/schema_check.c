/* schema_check.c - the tests' JSON schema validator (schema_check.h). */
#include "schema_check.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool no(char *why, size_t cap, const char *what, const json_t *v) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    snprintf(why, cap, "%s: %.200s", what, t ? t : "?");
    free(t);
    return false;
}

static const json_t *resolve(const json_t *root, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *cur = root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) tok[n++] = *p++;
        tok[n] = 0;
        cur = json_object_get(cur, tok);
        if (!cur) return NULL;
    }
    return cur;
}

static size_t utf8_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

static bool type_ok(const json_t *v, const char *t) {
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v) ||
               (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    return false;
}

bool schema_check(const json_t *v, const json_t *s, const json_t *root, char *why, size_t cap) {
    if (json_is_true(s)) return true;
    if (json_is_false(s)) return no(why, cap, "false schema", v);
    if (!json_is_object(s)) return no(why, cap, "bad schema", s);
    if (json_is_null(v) && json_is_true(json_object_get(s, "nullable"))) return true;
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        const json_t *t = resolve(root, json_string_value(ref));
        if (!t) return no(why, cap, "unresolved $ref", ref);
        return schema_check(v, t, root, why, cap);
    }
    const json_t *x;
    size_t i;
    json_t *e;
    if ((x = json_object_get(s, "allOf")))
        json_array_foreach(x, i, e) if (!schema_check(v, e, root, why, cap)) return false;
    if ((x = json_object_get(s, "anyOf"))) {
        bool ok = false;
        json_array_foreach(x, i, e) if (schema_check(v, e, root, why, cap)) ok = true;
        if (!ok) return no(why, cap, "no anyOf branch matches", v);
    }
    if ((x = json_object_get(s, "oneOf"))) {
        int n = 0;
        json_array_foreach(x, i, e) if (schema_check(v, e, root, why, cap)) n++;
        if (n != 1) return no(why, cap, n ? "several oneOf branches match" : "no oneOf branch", v);
    }
    if ((x = json_object_get(s, "const")) && !json_equal(x, (json_t *)v))
        return no(why, cap, "not the const", v);
    if ((x = json_object_get(s, "enum"))) {
        bool ok = false;
        json_array_foreach(x, i, e) if (json_equal(e, (json_t *)v)) ok = true;
        if (!ok) return no(why, cap, "not in enum", v);
    }
    if ((x = json_object_get(s, "type"))) {
        bool ok = false;
        if (json_is_string(x)) ok = type_ok(v, json_string_value(x));
        else json_array_foreach(x, i, e) if (type_ok(v, json_string_value(e))) ok = true;
        if (!ok) return no(why, cap, "wrong type", v);
    }
    if (json_is_object(v)) {
        const json_t *props = json_object_get(s, "properties");
        const json_t *add = json_object_get(s, "additionalProperties");
        const char *k;
        json_t *pv;
        json_object_foreach((json_t *)v, k, pv) {
            const json_t *ps = props ? json_object_get(props, k) : NULL;
            if (ps) {
                if (!schema_check(pv, ps, root, why, cap)) return false;
            } else if (add) {
                if (!schema_check(pv, add, root, why, cap)) return false;
            }
        }
        json_array_foreach(json_object_get(s, "required"), i, e) if (!json_object_get(v, json_string_value(e)))
            return no(why, cap, "missing required property", e);
    }
    if (json_is_array(v)) {
        const json_t *items = json_object_get(s, "items");
        if (items) json_array_foreach((json_t *)v, i, e) if (!schema_check(e, items, root, why, cap)) return false;
        if ((x = json_object_get(s, "minItems")) && json_array_size(v) < (size_t)json_integer_value(x))
            return no(why, cap, "too few items", v);
        if ((x = json_object_get(s, "maxItems")) && json_array_size(v) > (size_t)json_integer_value(x))
            return no(why, cap, "too many items", v);
    }
    if (json_is_string(v)) {
        size_t n = utf8_chars(json_string_value(v), json_string_length(v));
        if ((x = json_object_get(s, "minLength")) && n < (size_t)json_integer_value(x))
            return no(why, cap, "string too short", v);
        if ((x = json_object_get(s, "maxLength")) && n > (size_t)json_integer_value(x))
            return no(why, cap, "string too long", v);
        if ((x = json_object_get(s, "pattern"))) { /* PCRE2: close to ECMA-262 for these */
            int ec;
            PCRE2_SIZE eo;
            pcre2_code *re = pcre2_compile((PCRE2_SPTR)json_string_value(x), PCRE2_ZERO_TERMINATED,
                                           PCRE2_UTF, &ec, &eo, NULL);
            if (!re) return no(why, cap, "pattern does not compile", x);
            pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
            int rc = pcre2_match(re, (PCRE2_SPTR)json_string_value(v), json_string_length(v), 0, 0, md,
                                 NULL);
            pcre2_match_data_free(md);
            pcre2_code_free(re);
            if (rc < 0) return no(why, cap, "does not match the pattern", v);
        }
    }
    if (json_is_number(v)) {
        double d = json_number_value(v);
        if ((x = json_object_get(s, "minimum")) && d < json_number_value(x)) return no(why, cap, "below minimum", v);
        if ((x = json_object_get(s, "maximum")) && d > json_number_value(x)) return no(why, cap, "above maximum", v);
        if ((x = json_object_get(s, "exclusiveMinimum")) && json_is_number(x) && d <= json_number_value(x))
            return no(why, cap, "not above exclusiveMinimum", v);
        if ((x = json_object_get(s, "exclusiveMaximum")) && json_is_number(x) && d >= json_number_value(x))
            return no(why, cap, "not below exclusiveMaximum", v);
    }
    return true;
}
