/* value.c - the template arena and value helpers: containers, equality, truthiness,
 * and writing values as Python's str()/repr() and json.dumps() would. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tmpl/internal.h"

struct tarena_chunk {
    tarena_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

#define TA_CHUNK 65536

void *ta_alloc(tarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    tarena_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > TA_CHUNK / 4 ? n : TA_CHUNK;
        if (size > SIZE_MAX - sizeof(tarena_chunk) ||
            (a->cap && (size > a->cap || a->used_total > a->cap - size))) {
            a->over = true;
            return NULL;
        }
        tarena_chunk *nc = malloc(sizeof(tarena_chunk) + size);
        if (!nc) {
            a->over = true;
            return NULL;
        }
        nc->size = size;
        nc->used = 0;
        a->used_total += size;
        if (size == TA_CHUNK || !c) {
            nc->next = c;
            a->head = nc;
            c = nc;
        } else {
            /* a big one-off: keep the current chunk on top for small allocations */
            nc->next = c->next;
            c->next = nc;
            nc->used = n;
            memset(nc->data, 0, n);
            return nc->data;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *ta_strdup(tarena *a, const char *s, size_t n) {
    if (n == SIZE_MAX) return NULL;
    char *p = ta_alloc(a, n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void ta_free_all(tarena *a) {
    tarena_chunk *c = a->head;
    while (c) {
        tarena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used_total = 0;
}

tlist *tl_new(tarena *a, size_t cap) {
    tlist *l = ta_alloc(a, sizeof *l);
    if (!l) return NULL;
    if (cap) {
        if (cap > SIZE_MAX / sizeof(tval)) return NULL;
        l->items = ta_alloc(a, cap * sizeof(tval));
        if (!l->items) return NULL;
        l->cap = cap;
    }
    return l;
}

bool tl_push(tarena *a, tlist *l, tval v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        if (cap > SIZE_MAX / sizeof(tval)) return false;
        tval *items = ta_alloc(a, cap * sizeof(tval));
        if (!items) return false;
        if (l->n) memcpy(items, l->items, l->n * sizeof(tval));
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n++] = v;
    return true;
}

tdict *td_new(tarena *a, size_t cap) {
    tdict *d = ta_alloc(a, sizeof *d);
    if (!d) return NULL;
    if (cap) {
        if (cap > SIZE_MAX / sizeof(tval)) return NULL;
        d->keys = ta_alloc(a, cap * sizeof(tval));
        d->vals = ta_alloc(a, cap * sizeof(tval));
        if (!d->keys || !d->vals) return NULL;
        d->cap = cap;
    }
    return d;
}

tval *td_get(const tdict *d, tval key) {
    for (size_t i = 0; i < d->n; i++)
        if (tv_equal(d->keys[i], key)) return &d->vals[i];
    return NULL;
}

tval *td_get_str(const tdict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++) {
        const tval *key = &d->keys[i];
        if (key->kind == TV_STR && key->u.s.n == n && memcmp(key->u.s.p, k, n) == 0)
            return &d->vals[i];
    }
    return NULL;
}

bool td_set(tarena *a, tdict *d, tval key, tval val) {
    tval *old = td_get(d, key);
    if (old) {
        *old = val;
        return true;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        if (cap > SIZE_MAX / sizeof(tval)) return false;
        tval *keys = ta_alloc(a, cap * sizeof(tval));
        tval *vals = ta_alloc(a, cap * sizeof(tval));
        if (!keys || !vals) return false;
        if (d->n) {
            memcpy(keys, d->keys, d->n * sizeof(tval));
            memcpy(vals, d->vals, d->n * sizeof(tval));
        }
        d->keys = keys;
        d->vals = vals;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n] = val;
    d->n++;
    return true;
}

bool tv_truthy(tval v) {
    switch (v.kind) {
    case TV_UNDEF:
    case TV_NONE: return false;
    case TV_BOOL: return v.u.b;
    case TV_INT: return v.u.i != 0;
    case TV_FLOAT: return v.u.f != 0.0;
    case TV_STR: return v.u.s.n != 0;
    case TV_LIST: return v.u.l->n != 0;
    case TV_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

static bool tv_is_number(tval v) {
    return v.kind == TV_INT || v.kind == TV_FLOAT || v.kind == TV_BOOL;
}

static double tv_num(tval v) {
    return v.kind == TV_FLOAT ? v.u.f : v.kind == TV_INT ? (double)v.u.i : (double)v.u.b;
}

static bool equal_depth(tval a, tval b, int depth);

bool tv_equal(tval a, tval b) { return equal_depth(a, b, 0); }

/* Deeply nested or self-containing lists (a template can append a list to itself) compare
 * unequal past a depth, where python would raise RecursionError. */
static bool equal_depth(tval a, tval b, int depth) {
    if (depth > 200) return false;
    if (tv_is_number(a) && tv_is_number(b)) {
        if (a.kind != TV_FLOAT && b.kind != TV_FLOAT) {
            int64_t x = a.kind == TV_INT ? a.u.i : a.u.b, y = b.kind == TV_INT ? b.u.i : b.u.b;
            return x == y;
        }
        return tv_num(a) == tv_num(b);
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case TV_UNDEF:
    case TV_NONE: return true;
    case TV_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case TV_LIST:
        if (a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!equal_depth(a.u.l->items[i], b.u.l->items[i], depth + 1)) return false;
        return true;
    case TV_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            tval *o = td_get(b.u.d, a.u.d->keys[i]);
            if (!o || !equal_depth(a.u.d->vals[i], *o, depth + 1)) return false;
        }
        return true;
    case TV_NS: return a.u.d == b.u.d;
    case TV_MACRO: return a.u.mac == b.u.mac;
    case TV_BUILTIN: return a.u.i == b.u.i;
    case TV_METHOD: return a.u.m == b.u.m;
    case TV_LOOP: return a.u.loop == b.u.loop;
    default: return false;
    }
}

const char *tv_type_name(tval v) {
    switch (v.kind) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return "str";
    case TV_LIST: return v.tuple ? "tuple" : "list";
    case TV_DICT: return "dict";
    case TV_NS: return "Namespace";
    case TV_MACRO: return "Macro";
    case TV_LOOP: return "LoopContext";
    default: return "builtin_function_or_method";
    }
}

bool tb_put(tarena *a, tval_buf *b, const char *s, size_t n) {
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) return false;
            cap *= 2;
        }
        char *p = ta_alloc(a, cap);
        if (!p) return false;
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return true;
}

/* Python's repr(float): the shortest digits that round-trip, in fixed notation when
 * the exponent is in [-4, 16), else scientific like 1e+20. */
void tv_format_float(double f, char *out, size_t cap) {
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp = [-]d.ddde[+-]XX: split digits and exponent */
    char digits[24];
    int nd = 0;
    const char *p = tmp;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char res[64];
    size_t r = 0;
    if (neg) res[r++] = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            res[r++] = '0';
            res[r++] = '.';
            for (int i = 0; i < -exp10 - 1; i++) res[r++] = '0';
            for (int i = 0; i < nd; i++) res[r++] = digits[i];
        } else {
            for (int i = 0; i <= exp10; i++) res[r++] = i < nd ? digits[i] : '0';
            res[r++] = '.';
            if (nd > exp10 + 1)
                for (int i = exp10 + 1; i < nd; i++) res[r++] = digits[i];
            else
                res[r++] = '0';
        }
        res[r] = 0;
    } else {
        res[r++] = digits[0];
        if (nd > 1) {
            res[r++] = '.';
            for (int i = 1; i < nd; i++) res[r++] = digits[i];
        }
        res[r] = 0;
        char e[12];
        snprintf(e, sizeof e, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
        strcat(res, e);
    }
    snprintf(out, cap, "%s", res);
}

static bool write_py_str_repr(tarena *a, tval_buf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    if (!tb_put(a, b, &q, 1)) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *e = NULL;
        if (c == '\\') e = "\\\\";
        else if (c == '\n') e = "\\n";
        else if (c == '\r') e = "\\r";
        else if (c == '\t') e = "\\t";
        else if (c == (unsigned char)q) e = q == '\'' ? "\\'" : "\\\"";
        else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            e = esc;
        }
        if (e ? !tb_puts(a, b, e) : !tb_put(a, b, (const char *)&s[i], 1)) return false;
    }
    return tb_put(a, b, &q, 1);
}

static bool write_common(tarena *a, tval_buf *b, tval v, int depth, bool repr) {
    char num[64];
    if (depth > 500) return false;
    switch (v.kind) {
    case TV_UNDEF: return repr ? tb_puts(a, b, "Undefined") : true;
    case TV_NONE: return tb_puts(a, b, "None");
    case TV_BOOL: return tb_puts(a, b, v.u.b ? "True" : "False");
    case TV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        return tb_puts(a, b, num);
    case TV_FLOAT:
        tv_format_float(v.u.f, num, sizeof num);
        return tb_puts(a, b, num);
    case TV_STR:
        if (repr) return write_py_str_repr(a, b, v.u.s.p, v.u.s.n);
        return tb_put(a, b, v.u.s.p, v.u.s.n);
    case TV_LIST: {
        if (!tb_puts(a, b, v.tuple ? "(" : "[")) return false;
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i && !tb_puts(a, b, ", ")) return false;
            if (!write_common(a, b, v.u.l->items[i], depth + 1, true)) return false;
        }
        if (v.tuple && v.u.l->n == 1 && !tb_puts(a, b, ",")) return false;
        return tb_puts(a, b, v.tuple ? ")" : "]");
    }
    case TV_DICT:
    case TV_NS: {
        if (v.kind == TV_NS && !tb_puts(a, b, "<Namespace ")) return false;
        if (!tb_puts(a, b, "{")) return false;
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i && !tb_puts(a, b, ", ")) return false;
            if (!write_common(a, b, v.u.d->keys[i], depth + 1, true)) return false;
            if (!tb_puts(a, b, ": ")) return false;
            if (!write_common(a, b, v.u.d->vals[i], depth + 1, true)) return false;
        }
        return tb_puts(a, b, v.kind == TV_NS ? "}>" : "}");
    }
    case TV_MACRO: return tb_puts(a, b, "<Macro>");
    case TV_LOOP: return tb_puts(a, b, "<LoopContext>");
    default: return tb_puts(a, b, "<built-in method>");
    }
}

bool tv_write_str(tarena *a, tval_buf *b, tval v, int depth) {
    return write_common(a, b, v, depth, false);
}

bool tv_write_repr(tarena *a, tval_buf *b, tval v, int depth) {
    if (v.kind == TV_UNDEF) return tb_puts(a, b, "Undefined");
    return write_common(a, b, v, depth, true);
}

static bool json_string(tarena *a, tval_buf *b, const char *s, size_t n, bool ascii) {
    if (!tb_puts(a, b, "\"")) return false;
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[16];
        const char *e = NULL;
        size_t skip = 0;
        if (c == '"') e = "\\\"";
        else if (c == '\\') e = "\\\\";
        else if (c == '\n') e = "\\n";
        else if (c == '\r') e = "\\r";
        else if (c == '\t') e = "\\t";
        else if (c == '\b') e = "\\b";
        else if (c == '\f') e = "\\f";
        else if (c < 0x20 || (ascii && c == 0x7f)) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            e = esc;
        } else if (ascii && c >= 0x80) {
            /* decode one UTF-8 sequence (invalid bytes pass as U+FFFD) */
            uint32_t cp = 0xFFFD;
            size_t len = 1;
            if (c >= 0xC2 && c < 0xE0 && i + 1 < n) {
                cp = ((c & 0x1Fu) << 6) | (s[i + 1] & 0x3F);
                len = 2;
            } else if (c >= 0xE0 && c < 0xF0 && i + 2 < n) {
                cp = ((c & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3F);
                len = 3;
            } else if (c >= 0xF0 && c < 0xF5 && i + 3 < n) {
                cp = ((c & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) |
                     ((s[i + 2] & 0x3Fu) << 6) | (s[i + 3] & 0x3F);
                len = 4;
            }
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                         0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
            }
            e = esc;
            skip = len - 1;
        }
        if (e) {
            if (run && !tb_put(a, b, s + i - run, run)) return false;
            run = 0;
            if (!tb_puts(a, b, e)) return false;
            i += skip;
        } else {
            run++;
        }
    }
    if (run && !tb_put(a, b, s + n - run, run)) return false;
    return tb_puts(a, b, "\"");
}

static bool json_newline(tarena *a, tval_buf *b, int indent, int level) {
    if (indent < 0) return true;
    if (!tb_puts(a, b, "\n")) return false;
    for (int i = 0; i < indent * level; i++)
        if (!tb_puts(a, b, " ")) return false;
    return true;
}

static int key_cmp(const void *x, const void *y) {
    const tval *a = *(const tval *const *)x, *b = *(const tval *const *)y;
    if (a->kind == TV_STR && b->kind == TV_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int c = memcmp(a->u.s.p, b->u.s.p, n);
        if (c) return c;
        return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
    }
    return 0;
}

int tv_write_json(tarena *a, tval_buf *b, tval v, int indent, const char *item_sep,
                  const char *key_sep, bool ensure_ascii, bool sort_keys, int level,
                  tval *bad) {
    char num[64];
    if (level > 500) return -1;
    if (!item_sep) item_sep = indent >= 0 ? "," : ", ";
    if (!key_sep) key_sep = ": ";
    switch (v.kind) {
    case TV_NONE: return tb_puts(a, b, "null") ? 0 : -1;
    case TV_BOOL: return tb_puts(a, b, v.u.b ? "true" : "false") ? 0 : -1;
    case TV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        return tb_puts(a, b, num) ? 0 : -1;
    case TV_FLOAT:
        if (isnan(v.u.f)) snprintf(num, sizeof num, "NaN");
        else if (isinf(v.u.f)) snprintf(num, sizeof num, v.u.f < 0 ? "-Infinity" : "Infinity");
        else tv_format_float(v.u.f, num, sizeof num);
        return tb_puts(a, b, num) ? 0 : -1;
    case TV_STR: return json_string(a, b, v.u.s.p, v.u.s.n, ensure_ascii) ? 0 : -1;
    case TV_LIST: {
        if (v.u.l->n == 0) return tb_puts(a, b, "[]") ? 0 : -1;
        if (!tb_puts(a, b, "[")) return -1;
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i && !tb_puts(a, b, item_sep)) return -1;
            if (!json_newline(a, b, indent, level + 1)) return -1;
            int rc = tv_write_json(a, b, v.u.l->items[i], indent, item_sep, key_sep,
                                   ensure_ascii, sort_keys, level + 1, bad);
            if (rc) return rc;
        }
        if (!json_newline(a, b, indent, level)) return -1;
        return tb_puts(a, b, "]") ? 0 : -1;
    }
    case TV_DICT: {
        tdict *d = v.u.d;
        if (d->n == 0) return tb_puts(a, b, "{}") ? 0 : -1;
        const tval **order = ta_alloc(a, d->n * sizeof *order);
        if (!order) return -1;
        for (size_t i = 0; i < d->n; i++) order[i] = &d->keys[i];
        if (sort_keys) qsort(order, d->n, sizeof *order, key_cmp);
        if (!tb_puts(a, b, "{")) return -1;
        for (size_t i = 0; i < d->n; i++) {
            const tval *k = order[i];
            const tval *val = &d->vals[k - d->keys];
            if (i && !tb_puts(a, b, item_sep)) return -1;
            if (!json_newline(a, b, indent, level + 1)) return -1;
            if (k->kind == TV_STR) {
                if (!json_string(a, b, k->u.s.p, k->u.s.n, ensure_ascii)) return -1;
            } else if (k->kind == TV_NONE || k->kind == TV_BOOL || k->kind == TV_INT ||
                       k->kind == TV_FLOAT) {
                /* python converts these keys to strings */
                tval_buf kb = {0};
                if (k->kind == TV_NONE) {
                    if (!tb_puts(a, &kb, "null")) return -1;
                } else if (k->kind == TV_BOOL) {
                    if (!tb_puts(a, &kb, k->u.b ? "true" : "false")) return -1;
                } else if (!tv_write_str(a, &kb, *k, 0)) {
                    return -1;
                }
                if (!json_string(a, b, kb.p, kb.n, ensure_ascii)) return -1;
            } else {
                *bad = *k;
                return -2;
            }
            if (!tb_puts(a, b, key_sep)) return -1;
            int rc = tv_write_json(a, b, *val, indent, item_sep, key_sep, ensure_ascii,
                                   sort_keys, level + 1, bad);
            if (rc) return rc;
        }
        if (!json_newline(a, b, indent, level)) return -1;
        return tb_puts(a, b, "}") ? 0 : -1;
    }
    default: *bad = v; return -2;
    }
}
