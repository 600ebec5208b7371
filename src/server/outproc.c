/* outproc.c - stop strings, thinking and tool-call parsing of generated text. */
#include "server/outproc.h"

#include <ctype.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "grammar/grammar.h"

void outbuf_add(outbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void outbuf_clear(outbuf *b) {
    b->len = 0;
    if (b->p) b->p[0] = '\0';
}

void outbuf_free(outbuf *b) {
    free(b->p);
    *b = (outbuf){0};
}

/* Drops the first n bytes. */
static void outbuf_consume(outbuf *b, size_t n) {
    if (n >= b->len) {
        outbuf_clear(b);
        return;
    }
    memmove(b->p, b->p + n, b->len - n + 1);
    b->len -= n;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of pat. */
static size_t partial_suffix(const char *s, size_t n, const char *pat) {
    size_t pl = strlen(pat);
    size_t k = n < pl - 1 ? n : pl - 1;
    for (; k > 0; k--)
        if (memcmp(s + n - k, pat, k) == 0) return k;
    return 0;
}

static const char *find_mem(const char *hay, size_t n, const char *needle) {
    size_t nl = strlen(needle);
    if (nl == 0 || nl > n) return NULL;
    for (size_t i = 0; i + nl <= n; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, nl) == 0) return hay + i;
    return NULL;
}

/* ---- stop strings ---- */

void stop_init(stop_matcher *m, char *const *stops, size_t n_stops) {
    *m = (stop_matcher){.stops = stops, .n_stops = n_stops};
}

bool stop_feed(stop_matcher *m, const char *s, size_t n, outbuf *ready) {
    if (m->n_stops == 0) {
        outbuf_add(ready, s, n);
        return false;
    }
    outbuf_add(&m->pending, s, n);
    const char *p = m->pending.p ? m->pending.p : "";
    size_t len = m->pending.len;
    const char *first = NULL;
    for (size_t i = 0; i < m->n_stops; i++) {
        const char *at = find_mem(p, len, m->stops[i]);
        if (at && (!first || at < first)) first = at;
    }
    if (first) {
        outbuf_add(ready, p, (size_t)(first - p));
        outbuf_clear(&m->pending);
        return true;
    }
    size_t hold = 0;
    for (size_t i = 0; i < m->n_stops; i++) {
        size_t k = partial_suffix(p, len, m->stops[i]);
        if (k > hold) hold = k;
    }
    outbuf_add(ready, p, len - hold);
    outbuf_consume(&m->pending, len - hold);
    return false;
}

void stop_flush(stop_matcher *m, outbuf *ready) {
    if (m->pending.len) outbuf_add(ready, m->pending.p, m->pending.len);
    outbuf_clear(&m->pending);
}

void stop_free(stop_matcher *m) { outbuf_free(&m->pending); }

/* ---- thinking ---- */

enum { TH_LOOK_OPEN, TH_EAT_WS_THINK, TH_THINK, TH_EAT_WS_CONTENT, TH_CONTENT };

void think_init(think_parser *t, const char *open, const char *close, bool in_thinking) {
    *t = (think_parser){.open = open, .close = close,
                        .state = in_thinking ? TH_EAT_WS_THINK : TH_LOOK_OPEN};
}

static size_t skip_ws(const char *s, size_t n) {
    size_t i = 0;
    while (i < n && isspace((unsigned char)s[i])) i++;
    return i;
}

void think_feed(think_parser *t, const char *s, size_t n, outbuf *thinking, outbuf *content) {
    outbuf_add(&t->buf, s, n);
    for (;;) {
        const char *p = t->buf.p ? t->buf.p : "";
        size_t len = t->buf.len;
        switch (t->state) {
        case TH_LOOK_OPEN: {
            size_t ws = skip_ws(p, len);
            size_t ol = strlen(t->open), rest = len - ws;
            if (rest == 0) return;
            if (rest >= ol && memcmp(p + ws, t->open, ol) == 0) {
                outbuf_consume(&t->buf, ws + ol);
                t->state = TH_EAT_WS_THINK;
                continue;
            }
            if (rest < ol && memcmp(p + ws, t->open, rest) == 0) return; /* partial tag */
            outbuf_consume(&t->buf, ws);
            t->state = TH_CONTENT;
            continue;
        }
        case TH_EAT_WS_THINK:
        case TH_EAT_WS_CONTENT: {
            size_t ws = skip_ws(p, len);
            outbuf_consume(&t->buf, ws);
            if (ws == len) return;
            t->state = t->state == TH_EAT_WS_THINK ? TH_THINK : TH_CONTENT;
            continue;
        }
        case TH_THINK: {
            const char *at = find_mem(p, len, t->close);
            if (at) {
                size_t k = (size_t)(at - p);
                while (k > 0 && isspace((unsigned char)p[k - 1])) k--;
                outbuf_add(thinking, p, k);
                outbuf_consume(&t->buf, (size_t)(at - p) + strlen(t->close));
                t->state = TH_EAT_WS_CONTENT;
                continue;
            }
            /* hold a partial closing tag and trailing whitespace */
            size_t hold = partial_suffix(p, len, t->close);
            size_t k = len - hold;
            while (k > 0 && isspace((unsigned char)p[k - 1])) k--;
            outbuf_add(thinking, p, k);
            outbuf_consume(&t->buf, k);
            return;
        }
        default:
            outbuf_add(content, p, len);
            outbuf_clear(&t->buf);
            return;
        }
    }
}

void think_flush(think_parser *t, outbuf *thinking, outbuf *content) {
    if (t->buf.len) {
        if (t->state == TH_THINK) outbuf_add(thinking, t->buf.p, t->buf.len);
        else if (t->state == TH_CONTENT || t->state == TH_LOOK_OPEN) {
            size_t ws = skip_ws(t->buf.p, t->buf.len);
            outbuf_add(content, t->buf.p + ws, t->buf.len - ws);
        }
    }
    outbuf_clear(&t->buf);
}

void think_free(think_parser *t) { outbuf_free(&t->buf); }

/* ---- tool calls ---- */

enum { TP_SCAN, TP_CAPTURE, TP_PASS };

void tool_init(tool_parser *p, const char *tag, const json_t *tools) {
    *p = (tool_parser){.tag = tag, .tools = tools, .state = TP_SCAN};
}

void tool_feed(tool_parser *p, const char *s, size_t n, outbuf *content) {
    if (p->state == TP_PASS) {
        outbuf_add(content, s, n);
        return;
    }
    outbuf_add(&p->buf, s, n);
    if (p->state == TP_CAPTURE) return;
    const char *b = p->buf.p;
    size_t len = p->buf.len;
    if (strcmp(p->tag, "{") == 0) { /* bare JSON: a call only at the start */
        size_t ws = skip_ws(b, len);
        if (ws == len) return;
        /* Llama 3.x may open a call with <|python_tag|> (special tokens are rendered) */
        static const char py[] = "<|python_tag|>";
        size_t rest = len - ws, pl = sizeof py - 1;
        if (rest < pl && memcmp(b + ws, py, rest) == 0) return;
        if (rest >= pl && memcmp(b + ws, py, pl) == 0) {
            outbuf_consume(&p->buf, ws + pl);
            b = p->buf.p;
            len = p->buf.len;
            ws = skip_ws(b, len);
            if (ws == len) return;
        }
        if (b[ws] == '{') {
            p->state = TP_CAPTURE;
        } else {
            p->state = TP_PASS;
            outbuf_add(content, b, len);
            outbuf_clear(&p->buf);
        }
        return;
    }
    const char *at = find_mem(b, len, p->tag);
    if (at) {
        outbuf_add(content, b, (size_t)(at - b));
        outbuf_consume(&p->buf, (size_t)(at - b));
        p->state = TP_CAPTURE;
        return;
    }
    size_t hold = partial_suffix(b, len, p->tag);
    outbuf_add(content, b, len - hold);
    outbuf_consume(&p->buf, len - hold);
}

static bool tool_known(const json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (n && strcmp(n, name) == 0) return true;
    }
    return false;
}

static void call_id(char out[16]) {
    static _Atomic uint64_t counter;
    uint64_t x = hl_time_ns() ^ (atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ull);
    static const char al[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    memcpy(out, "call_", 5);
    for (int i = 0; i < 8; i++) {
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 29;
        out[5 + i] = al[x % 36];
    }
    out[13] = '\0';
}

void tool_flush(tool_parser *p, json_t *calls, outbuf *content) {
    if (p->state != TP_CAPTURE) {
        if (p->buf.len) outbuf_add(content, p->buf.p, p->buf.len);
        outbuf_clear(&p->buf);
        return;
    }
    const char *b = p->buf.p;
    size_t len = p->buf.len, pos = 0;
    int found = 0;
    while (pos < len) {
        const char *brace = memchr(b + pos, '{', len - pos);
        if (!brace) break;
        json_error_t je;
        size_t off = (size_t)(brace - b);
        json_t *obj = json_loadb(brace, len - off, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &je);
        if (!obj) {
            pos = off + 1;
            continue;
        }
        pos = off + (je.position > 0 ? (size_t)je.position : 1);
        const char *name = json_string_value(json_object_get(obj, "name"));
        json_t *args = json_object_get(obj, "arguments");
        if (!args) args = json_object_get(obj, "parameters");
        json_t *parsed = NULL;
        if (json_is_string(args)) { /* some models quote the arguments object */
            parsed = json_loads(json_string_value(args), 0, NULL);
            args = json_is_object(parsed) ? parsed : NULL;
        }
        if (json_is_object(obj) && name && tool_known(p->tools, name) &&
            (json_is_object(args) || !args)) {
            char id[16];
            call_id(id);
            json_t *a = args ? json_incref(args) : json_object();
            json_t *fn = json_pack("{s:i, s:s, s:o}", "index", p->n_calls, "name", name,
                                   "arguments", a);
            json_array_append_new(calls, json_pack("{s:s, s:o}", "id", id, "function", fn));
            p->n_calls++;
            found++;
        }
        json_decref(parsed);
        json_decref(obj);
    }
    if (!found) outbuf_add(content, b, len);
    outbuf_clear(&p->buf);
}

void tool_free(tool_parser *p) { outbuf_free(&p->buf); }

/* ---- the tool-call grammar ---- */

/* A deep copy of schema whose local $refs ("#...") point below prefix: the parameters
 * move from a document's root into the composed one. */
static json_t *rebase_refs(const json_t *schema, const char *prefix) {
    if (json_is_array(schema)) {
        json_t *a = json_array();
        size_t i;
        json_t *v;
        json_array_foreach(schema, i, v) json_array_append_new(a, rebase_refs(v, prefix));
        return a;
    }
    if (!json_is_object(schema)) return json_deep_copy(schema);
    json_t *o = json_object();
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)schema, k, v) {
        const char *ref = json_string_value(v);
        if (!strcmp(k, "$ref") && ref && ref[0] == '#') {
            size_t n = strlen(prefix) + strlen(ref) + 1;
            char *r = malloc(n);
            if (r) snprintf(r, n, "%s%s", prefix, ref + 1);
            json_object_set_new(o, k, r ? json_string(r) : json_null());
            free(r);
        } else {
            json_object_set_new(o, k, rebase_refs(v, prefix));
        }
    }
    return o;
}

/* {"name": {"const": name}, "arguments": args} with its refs under prefix. */
static json_t *call_schema(const char *name, const json_t *args, const char *prefix) {
    char pre[96];
    snprintf(pre, sizeof pre, "%s/properties/arguments", prefix);
    json_t *a = args ? rebase_refs(args, pre) : json_pack("{s:s, s:b}", "type", "object",
                                                        "additionalProperties", 1);
    return json_pack("{s:s, s:{s:{s:s}, s:o}, s:[s, s], s:b}", "type", "object", "properties",
                     "name", "const", name, "arguments", a, "required", "name", "arguments",
                     "additionalProperties", 0);
}

static bool compiles(const json_t *schema, hl_err *err) {
    char *text = json_dumps(schema, JSON_COMPACT);
    gram_schema *gs = NULL;
    hl_status st = text ? gram_compile(text, strlen(text), &gs, err) : HL_ERR_NOMEM;
    if (!text) hl_fail(err, HL_ERR_NOMEM, "out of memory");
    gram_schema_free(gs);
    free(text);
    return st == HL_OK;
}

char *tool_grammar(const json_t *tools, const char *tag, const char *only, const char **trigger,
                   const char **trigger_end) {
    bool array;
    if (!strcmp(tag, "<tool_call>")) {
        *trigger = "<tool_call>", *trigger_end = "</tool_call>", array = false;
    } else if (!strcmp(tag, "[TOOL_CALLS]")) {
        *trigger = "[TOOL_CALLS]", *trigger_end = "", array = true;
    } else {
        HL_DEBUG("tool calls after \"%s\" are not constrained", tag);
        return NULL;
    }
    json_t *fns = json_array(); /* {name, parameters} of the tools kept */
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || (only && strcmp(name, only))) continue;
        bool dup = false;
        size_t k;
        json_t *f;
        json_array_foreach(fns, k, f) dup |= !strcmp(json_string_value(json_object_get(f, "name")), name);
        if (dup) continue;
        json_t *params = json_object_get(fn, "parameters");
        json_array_append_new(fns, json_pack("{s:s, s:O?}", "name", name, "parameters",
                                             json_is_object(params) ? params : NULL));
    }
    size_t n = json_array_size(fns);
    bool loose = n > TOOL_GRAMMAR_MAX;
    if (loose)
        HL_DEBUG("%zu tools: their arguments are not constrained (more than %d)", n,
                 TOOL_GRAMMAR_MAX);
    const char *pre = array ? "#/items/anyOf" : "#/anyOf";
    json_t *alts = json_array();
    for (i = 0; i < n && alts; i++) {
        json_t *f = json_array_get(fns, i);
        const char *name = json_string_value(json_object_get(f, "name"));
        const json_t *params = loose ? NULL : json_object_get(f, "parameters");
        hl_err err = {.code = HL_ERR_NOMEM};
        json_t *one = call_schema(name, params, "#");
        bool ok = one && compiles(one, &err);
        json_decref(one);
        if (!ok && err.code == HL_ERR_NOMEM) {
            json_decref(alts);
            alts = NULL;
            break;
        }
        if (!ok) {
            HL_DEBUG("tool \"%s\": arguments not constrained: %s", name, err.msg);
            params = NULL;
        }
        char p[64];
        snprintf(p, sizeof p, "%s/%zu", pre, i);
        json_array_append_new(alts, call_schema(name, params, p));
    }
    json_decref(fns);
    if (!alts || json_array_size(alts) == 0) {
        json_decref(alts);
        return NULL;
    }
    json_t *root = json_pack("{s:o}", "anyOf", alts);
    if (array) root = json_pack("{s:s, s:o, s:i}", "type", "array", "items", root, "minItems", 1);
    hl_err err;
    char *text = NULL;
    if (root && compiles(root, &err)) text = json_dumps(root, JSON_COMPACT);
    else if (root) HL_DEBUG("tool calls are not constrained: %s", err.msg);
    json_decref(root);
    return text;
}
