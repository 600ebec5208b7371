/* render.c - evaluates a parsed template: scopes, statements, expressions, and the
 * filters, tests, methods and globals that chat templates use, with jinja2's
 * semantics (Python truthiness, str()/repr(), Undefined) and hard limits. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "tmpl/internal.h"
#include "tmpl/tmpl.h"

#define MAX_RANGE 100000
#define MAX_EVAL_DEPTH 1000

typedef struct frame frame;
struct frame {
    frame *parent;
    const char **names;
    tval *vals;
    size_t n, cap;
};

struct tmacro {
    tnode *def;
    frame *closure;
};

struct tloop {
    tlist *items;
    size_t index; /* 0-based */
};

enum { BI_RANGE = 1, BI_NAMESPACE, BI_RAISE, BI_DICT, BI_STRFTIME };

typedef enum { EX_OK, EX_ERR, EX_BREAK, EX_CONTINUE } exec_rc;

typedef struct rctx {
    tarena a;
    tmpl_limits lim;
    const tmpl_options *opts;
    hl_err *err;
    bool failed;
    tval_buf *out;
    frame *root;
    uint64_t iterations, steps;
    int call_depth, depth;
} rctx;

static bool rfail(rctx *r, const tnode *n, hl_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static bool rfail(rctx *r, const tnode *n, hl_status code, const char *fmt, ...) {
    if (r->failed) return false;
    r->failed = true;
    char msg[HL_ERR_MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (code == HL_ERR_FORMAT && n)
        hl_fail(r->err, code, "template error at line %d: %s", n->line, msg);
    else
        hl_fail(r->err, code, "%s", msg);
    return false;
}

static bool oom(rctx *r, const tnode *n) {
    if (r->a.over && r->a.cap)
        return rfail(r, n, HL_ERR_INVALID, "template rendering used more than %zu bytes of memory",
                     r->lim.max_memory);
    return rfail(r, n, HL_ERR_NOMEM, "out of memory rendering template");
}

/* Charges evaluation work (bytes/64 for scans); false once over the step budget. */
static bool charge(rctx *r, const tnode *n, size_t bytes) {
    r->steps += 1 + bytes / 64;
    if (r->steps > r->lim.max_steps)
        return rfail(r, n, HL_ERR_INVALID, "template rendering exceeded %llu evaluation steps",
                     (unsigned long long)r->lim.max_steps);
    return true;
}

static bool fail_undef(rctx *r, const tnode *n, tval v) {
    return rfail(r, n, HL_ERR_FORMAT, "%.*s", (int)v.u.s.n, v.u.s.p ? v.u.s.p : "undefined");
}

/* ---------- small helpers ---------- */

static tval mk_str(rctx *r, const char *p, size_t n) {
    char *s = ta_strdup(&r->a, p, n);
    tval v = tv_str(s ? s : "", s ? n : 0);
    return v;
}

static tval undef_fmt(rctx *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static tval undef_fmt(rctx *r, const char *fmt, ...) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tv_undef(ta_strdup(&r->a, msg, strlen(msg)));
}

static const char *obj_repr(tval v) {
    switch (v.kind) {
    case TV_NONE: return "None";
    case TV_DICT: return "dict object";
    case TV_LIST: return v.tuple ? "tuple object" : "list object";
    case TV_STR: return "str object";
    case TV_INT: return "int object";
    case TV_FLOAT: return "float object";
    case TV_BOOL: return "bool object";
    case TV_NS: return "jinja2.utils.Namespace object";
    case TV_LOOP: return "jinja2.runtime.LoopContext object";
    case TV_MACRO: return "jinja2.runtime.Macro object";
    default: return "builtin_function_or_method object";
    }
}

static tval undef_attr(rctx *r, tval obj, const char *name, size_t n) {
    if (obj.kind == TV_NONE) return undef_fmt(r, "'None' has no attribute '%.*s'", (int)n, name);
    return undef_fmt(r, "'%s' has no attribute '%.*s'", obj_repr(obj), (int)n, name);
}

/* str(v) as an arena string */
static bool to_str(rctx *r, const tnode *n, tval v, tval *out) {
    if (v.kind == TV_STR) {
        *out = v;
        return true;
    }
    tval_buf b = {0};
    if (!tv_write_str(&r->a, &b, v, 0)) {
        if (r->a.over) return oom(r, n);
        return rfail(r, n, HL_ERR_INVALID, "value nested too deeply (or containing itself) to print");
    }
    *out = tv_str(b.p ? b.p : "", b.n);
    return true;
}

static bool emit(rctx *r, const tnode *n, const char *s, size_t len) {
    if (len > r->lim.max_output || r->out->n > r->lim.max_output - len)
        return rfail(r, n, HL_ERR_INVALID, "template output exceeds the limit of %zu bytes",
                     r->lim.max_output);
    if (!tb_put(&r->a, r->out, s, len)) return oom(r, n);
    return true;
}

/* UTF-8 helpers: strings are sequences of code points for len/index/slice. */
static size_t u8_next(const char *s, size_t n, size_t i, int32_t *cp) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) {
        if (cp) *cp = (unsigned char)s[i];
        return 1;
    }
    if (cp) *cp = c;
    return (size_t)k;
}

static bool is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

static size_t u8_len(const char *s, size_t n) {
    if (is_ascii(s, n)) return n;
    size_t c = 0;
    for (size_t i = 0; i < n; i += u8_next(s, n, i, NULL)) c++;
    return c;
}

/* byte offsets of each code point (count+1 entries); NULL when ASCII */
static size_t *u8_offsets(rctx *r, const char *s, size_t n, size_t *count) {
    size_t c = u8_len(s, n);
    *count = c;
    if (c == n) return NULL;
    size_t *off = ta_alloc(&r->a, (c + 1) * sizeof *off);
    if (!off) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i += u8_next(s, n, i, NULL)) off[k++] = i;
    off[k] = n;
    return off;
}

static bool py_space(int32_t c) {
    return (c >= 9 && c <= 13) || c == ' ' || (c >= 0x1c && c <= 0x1f) || c == 0x85 ||
           c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
           c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

static const char *find_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    const char *end = h + hn - nn;
    for (const char *p = h; p <= end; p++) {
        p = memchr(p, nd[0], (size_t)(end - p) + 1);
        if (!p) return NULL;
        if (memcmp(p, nd, nn) == 0) return p;
    }
    return NULL;
}

/* ---------- scopes ---------- */

static frame *frame_new(rctx *r, frame *parent) {
    frame *f = ta_alloc(&r->a, sizeof *f);
    if (f) f->parent = parent;
    return f;
}

static bool frame_set(rctx *r, frame *f, const char *name, tval v) {
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            f->vals[i] = v;
            return true;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        const char **names = ta_alloc(&r->a, cap * sizeof *names);
        tval *vals = ta_alloc(&r->a, cap * sizeof *vals);
        if (!names || !vals) return false;
        if (f->n) {
            memcpy(names, f->names, f->n * sizeof *names);
            memcpy(vals, f->vals, f->n * sizeof *vals);
        }
        f->names = names;
        f->vals = vals;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n] = v;
    f->n++;
    return true;
}

static tval lookup(rctx *r, frame *f, const char *name) {
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (!strcmp(f->names[i], name)) return f->vals[i];
    tval v = {0};
    v.kind = TV_BUILTIN;
    if (!strcmp(name, "range")) v.u.i = BI_RANGE;
    else if (!strcmp(name, "namespace")) v.u.i = BI_NAMESPACE;
    else if (!strcmp(name, "raise_exception")) v.u.i = BI_RAISE;
    else if (!strcmp(name, "dict")) v.u.i = BI_DICT;
    else if (!strcmp(name, "strftime_now") && r->opts->strftime_now) v.u.i = BI_STRFTIME;
    else return undef_fmt(r, "'%s' is undefined", name);
    return v;
}

/* ---------- JSON <-> values ---------- */

static bool from_json(rctx *r, const json_t *j, tval *out, int depth) {
    if (depth > 1000) return false;
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        tdict *d = td_new(&r->a, json_object_size(j));
        if (!d) return false;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) {
            tval kv = mk_str(r, k, strlen(k)), vv;
            if (!from_json(r, v, &vv, depth + 1) || !td_set(&r->a, d, kv, vv)) return false;
        }
        tval t = {0};
        t.kind = TV_DICT;
        t.u.d = d;
        *out = t;
        return true;
    }
    case JSON_ARRAY: {
        tlist *l = tl_new(&r->a, json_array_size(j));
        if (!l) return false;
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) {
            tval vv;
            if (!from_json(r, v, &vv, depth + 1) || !tl_push(&r->a, l, vv)) return false;
        }
        tval t = {0};
        t.kind = TV_LIST;
        t.u.l = l;
        *out = t;
        return true;
    }
    case JSON_STRING: {
        const char *s = json_string_value(j);
        size_t n = json_string_length(j);
        char *c = ta_strdup(&r->a, s, n);
        if (!c) return false;
        *out = tv_str(c, n);
        return true;
    }
    case JSON_INTEGER: *out = tv_int((int64_t)json_integer_value(j)); return true;
    case JSON_REAL: *out = tv_float(json_real_value(j)); return true;
    case JSON_TRUE: *out = tv_bool(true); return true;
    case JSON_FALSE: *out = tv_bool(false); return true;
    default: *out = tv_none(); return true;
    }
}

static tval mk_list(tlist *l) {
    tval v = {0};
    v.kind = TV_LIST;
    v.u.l = l;
    return v;
}

static tval mk_dict(tdict *d) {
    tval v = {0};
    v.kind = TV_DICT;
    v.u.d = d;
    return v;
}

/* Iterates v as Python would into a fresh list (dict -> keys, str -> chars). */
static bool to_list(rctx *r, const tnode *n, tval v, tlist **out) {
    tlist *l = NULL;
    switch (v.kind) {
    case TV_UNDEF: l = tl_new(&r->a, 0); break;
    case TV_LIST:
        l = tl_new(&r->a, v.u.l->n);
        if (l) {
            if (v.u.l->n) memcpy(l->items, v.u.l->items, v.u.l->n * sizeof(tval));
            l->n = v.u.l->n;
        }
        break;
    case TV_DICT:
        l = tl_new(&r->a, v.u.d->n);
        if (l) {
            if (v.u.d->n) memcpy(l->items, v.u.d->keys, v.u.d->n * sizeof(tval));
            l->n = v.u.d->n;
        }
        break;
    case TV_STR: {
        size_t cnt;
        l = tl_new(&r->a, v.u.s.n);
        if (!l) break;
        (void)cnt;
        for (size_t i = 0; i < v.u.s.n;) {
            size_t k = u8_next(v.u.s.p, v.u.s.n, i, NULL);
            l->items[l->n++] = tv_str(v.u.s.p + i, k);
            i += k;
        }
        break;
    }
    default:
        return rfail(r, n, HL_ERR_FORMAT, "'%s' object is not iterable", tv_type_name(v));
    }
    if (!l) return oom(r, n);
    *out = l;
    return true;
}

/* ---------- ordering ---------- */

static bool is_num(tval v) { return v.kind == TV_INT || v.kind == TV_FLOAT || v.kind == TV_BOOL; }
static double num_of(tval v) {
    return v.kind == TV_FLOAT ? v.u.f : v.kind == TV_INT ? (double)v.u.i : (double)v.u.b;
}

/* <0, 0, >0; sets *ok = false when python would raise TypeError (or recursion runs deep) */
static int tv_cmp_depth(tval a, tval b, bool *ok, int depth);
static int tv_cmp(tval a, tval b, bool *ok) { return tv_cmp_depth(a, b, ok, 0); }

static int tv_cmp_depth(tval a, tval b, bool *ok, int depth) {
    if (depth > 200) {
        *ok = false;
        return 0;
    }
    if (is_num(a) && is_num(b)) {
        if (a.kind != TV_FLOAT && b.kind != TV_FLOAT) {
            int64_t x = a.kind == TV_INT ? a.u.i : a.u.b, y = b.kind == TV_INT ? b.u.i : b.u.b;
            return x < y ? -1 : x > y;
        }
        double x = num_of(a), y = num_of(b);
        return x < y ? -1 : x > y;
    }
    if (a.kind == TV_STR && b.kind == TV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.p, b.u.s.p, n);
        if (c) return c;
        return a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
    }
    if (a.kind == TV_LIST && b.kind == TV_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (tv_equal(a.u.l->items[i], b.u.l->items[i])) continue;
            return tv_cmp_depth(a.u.l->items[i], b.u.l->items[i], ok, depth + 1);
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    *ok = false;
    return 0;
}

static bool lower_str(rctx *r, tval v, tval *out);

typedef struct sort_ctx {
    rctx *r;
    bool ok;
    bool reverse;
} sort_ctx;

/* stable merge sort of (key, value) pairs by key */
static void merge_sort(sort_ctx *sc, tval *keys, tval *vals, tval *tk, tval *tv, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(sc, keys, vals, tk, tv, h);
    merge_sort(sc, keys + h, vals + h, tk, tv, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c = tv_cmp(keys[j], keys[i], &sc->ok);
        if (sc->reverse) c = -c;
        if (c < 0) {
            tk[k] = keys[j];
            tv[k++] = vals[j++];
        } else {
            tk[k] = keys[i];
            tv[k++] = vals[i++];
        }
    }
    while (i < h) {
        tk[k] = keys[i];
        tv[k++] = vals[i++];
    }
    while (j < n) {
        tk[k] = keys[j];
        tv[k++] = vals[j++];
    }
    memcpy(keys, tk, n * sizeof(tval));
    memcpy(vals, tv, n * sizeof(tval));
}

/* ---------- forward declarations ---------- */

static bool eval(rctx *r, tnode *n, frame *f, tval *out);
static exec_rc exec_body(rctx *r, tnode **body, size_t nb, frame *f);
static bool call_value(rctx *r, tnode *n, frame *f, tval callee, size_t npos, tval *pos,
                       size_t nkw, const char **kwn, tval *kwv, tval *out);
static bool apply_filter(rctx *r, tnode *n, frame *f, const char *name, tval in, size_t npos,
                         tval *pos, size_t nkw, const char **kwn, tval *kwv, tval *out);
static bool apply_test(rctx *r, tnode *n, frame *f, const char *name, tval v, size_t npos,
                       tval *pos, bool *res);

/* ---------- attribute / item access ---------- */

static bool is_method_name(tval obj, const char *name) {
    static const char *const str_m[] = {"strip", "lstrip", "rstrip", "split", "rsplit",
        "startswith", "endswith", "replace", "upper", "lower", "title", "capitalize", "find",
        "rfind", "count", "join", "format", "isdigit", "isalpha", "isalnum", "isspace",
        "isupper", "islower", "splitlines", "index", NULL};
    static const char *const dict_m[] = {"get", "items", "keys", "values", "pop", "update",
        "copy", "setdefault", NULL};
    static const char *const list_m[] = {"append", "pop", "extend", "insert", "index",
        "count", "copy", "remove", "reverse", "sort", NULL};
    const char *const *m = obj.kind == TV_STR ? str_m : obj.kind == TV_DICT ? dict_m
                         : obj.kind == TV_LIST ? list_m : NULL;
    if (obj.kind == TV_LOOP) return !strcmp(name, "cycle");
    for (; m && *m; m++)
        if (!strcmp(*m, name)) return true;
    return false;
}

static bool get_attr(rctx *r, const tnode *n, tval obj, const char *name, size_t len, tval *out) {
    switch (obj.kind) {
    case TV_UNDEF: return fail_undef(r, n, obj);
    case TV_DICT:
    case TV_NS: {
        if (obj.kind == TV_DICT && is_method_name(obj, name)) break;
        tval *v = td_get_str(obj.u.d, name, len);
        if (v) {
            *out = *v;
            return true;
        }
        *out = undef_attr(r, obj, name, len);
        return true;
    }
    case TV_LOOP: {
        tloop *lp = obj.u.loop;
        int64_t i = (int64_t)lp->index, cnt = (int64_t)lp->items->n;
        if (!strcmp(name, "index")) *out = tv_int(i + 1);
        else if (!strcmp(name, "index0")) *out = tv_int(i);
        else if (!strcmp(name, "revindex")) *out = tv_int(cnt - i);
        else if (!strcmp(name, "revindex0")) *out = tv_int(cnt - i - 1);
        else if (!strcmp(name, "first")) *out = tv_bool(i == 0);
        else if (!strcmp(name, "last")) *out = tv_bool(i == cnt - 1);
        else if (!strcmp(name, "length")) *out = tv_int(cnt);
        else if (!strcmp(name, "depth")) *out = tv_int(1);
        else if (!strcmp(name, "depth0")) *out = tv_int(0);
        else if (!strcmp(name, "previtem"))
            *out = i > 0 ? lp->items->items[i - 1] : undef_fmt(r, "there is no previous item");
        else if (!strcmp(name, "nextitem"))
            *out = i + 1 < cnt ? lp->items->items[i + 1] : undef_fmt(r, "there is no next item");
        else if (!strcmp(name, "cycle")) break;
        else *out = undef_attr(r, obj, name, len);
        return true;
    }
    default: break;
    }
    if (is_method_name(obj, name)) {
        tmethod *m = ta_alloc(&r->a, sizeof *m);
        if (!m) return oom(r, n);
        m->self = obj;
        m->name = name;
        tval v = {0};
        v.kind = TV_METHOD;
        v.u.m = m;
        *out = v;
        return true;
    }
    *out = undef_attr(r, obj, name, len);
    return true;
}

static bool get_item(rctx *r, const tnode *n, tval obj, tval key, tval *out) {
    switch (obj.kind) {
    case TV_UNDEF: return fail_undef(r, n, obj);
    case TV_DICT:
    case TV_NS: {
        tval *v = td_get(obj.u.d, key);
        if (v) {
            *out = *v;
            return true;
        }
        break;
    }
    case TV_LIST:
    case TV_STR:
        if (key.kind == TV_INT || key.kind == TV_BOOL) {
            int64_t i = key.kind == TV_INT ? key.u.i : key.u.b;
            if (obj.kind == TV_LIST) {
                int64_t cnt = (int64_t)obj.u.l->n;
                if (i < 0) i += cnt;
                if (i >= 0 && i < cnt) {
                    *out = obj.u.l->items[i];
                    return true;
                }
            } else {
                size_t cnt;
                size_t *off = u8_offsets(r, obj.u.s.p, obj.u.s.n, &cnt);
                if (i < 0) i += (int64_t)cnt;
                if (i >= 0 && i < (int64_t)cnt) {
                    size_t s = off ? off[i] : (size_t)i, e = off ? off[i + 1] : (size_t)i + 1;
                    *out = tv_str(obj.u.s.p + s, e - s);
                    return true;
                }
            }
            tval_buf b = {0};
            if (!tv_write_repr(&r->a, &b, key, 0)) return oom(r, n);
            *out = undef_fmt(r, "%s has no element %.*s", obj_repr(obj), (int)b.n, b.p);
            return true;
        }
        break;
    default: break;
    }
    if (key.kind == TV_STR) {
        /* jinja's subscript falls back to attribute lookup */
        if (obj.kind == TV_DICT || obj.kind == TV_NS) {
            *out = undef_attr(r, obj, key.u.s.p, key.u.s.n);
            return true;
        }
        const char *name = ta_strdup(&r->a, key.u.s.p, key.u.s.n);
        if (!name) return oom(r, n);
        return get_attr(r, n, obj, name, key.u.s.n, out);
    }
    tval_buf b = {0};
    if (!tv_write_repr(&r->a, &b, key, 0)) return oom(r, n);
    *out = undef_fmt(r, "%s has no element %.*s", obj_repr(obj), (int)b.n, b.p);
    return true;
}

/* python slice.indices */
static void slice_indices(int64_t len, bool has_start, int64_t start, bool has_stop,
                          int64_t stop, int64_t step, int64_t *s, int64_t *e) {
    if (step > 0) {
        *s = !has_start ? 0 : start < 0 ? (start + len < 0 ? 0 : start + len) : (start > len ? len : start);
        *e = !has_stop ? len : stop < 0 ? (stop + len < 0 ? 0 : stop + len) : (stop > len ? len : stop);
    } else {
        *s = !has_start ? len - 1 : start < 0 ? (start + len < 0 ? -1 : start + len) : (start >= len ? len - 1 : start);
        *e = !has_stop ? -1 : stop < 0 ? (stop + len < 0 ? -1 : stop + len) : (stop >= len ? len - 1 : stop);
    }
}

static bool slice_part(rctx *r, tnode *n, frame *f, tnode *x, bool *has, int64_t *v) {
    *has = false;
    if (!x) return true;
    tval t;
    if (!eval(r, x, f, &t)) return false;
    if (t.kind == TV_NONE) return true;
    if (t.kind != TV_INT && t.kind != TV_BOOL)
        return rfail(r, n, HL_ERR_FORMAT,
                     "slice indices must be integers or None or have an __index__ method");
    *has = true;
    *v = t.kind == TV_INT ? t.u.i : t.u.b;
    return true;
}

static bool eval_slice(rctx *r, tnode *n, frame *f, tval *out) {
    tval obj;
    if (!eval(r, n->a, f, &obj)) return false;
    bool hs, he, hp;
    int64_t s0 = 0, e0 = 0, step = 1;
    if (!slice_part(r, n, f, n->b, &hs, &s0) || !slice_part(r, n, f, n->c, &he, &e0) ||
        !slice_part(r, n, f, n->d, &hp, &step))
        return false;
    if (!hp) step = 1;
    if (step == 0) return rfail(r, n, HL_ERR_FORMAT, "slice step cannot be zero");
    if (obj.kind == TV_UNDEF) return fail_undef(r, n, obj);
    size_t cnt;
    size_t *off = NULL;
    if (obj.kind == TV_STR) off = u8_offsets(r, obj.u.s.p, obj.u.s.n, &cnt);
    else if (obj.kind == TV_LIST) cnt = obj.u.l->n;
    else return rfail(r, n, HL_ERR_FORMAT, "'%s' object is not subscriptable", tv_type_name(obj));
    int64_t s, e;
    slice_indices((int64_t)cnt, hs, s0, he, e0, step, &s, &e);
    if (obj.kind == TV_LIST) {
        tlist *l = tl_new(&r->a, 0);
        if (!l) return oom(r, n);
        for (int64_t i = s; step > 0 ? i < e : i > e; i += step)
            if (!tl_push(&r->a, l, obj.u.l->items[i])) return oom(r, n);
        *out = mk_list(l);
        out->tuple = obj.tuple;
        return true;
    }
    tval_buf b = {0};
    for (int64_t i = s; step > 0 ? i < e : i > e; i += step) {
        size_t bs = off ? off[i] : (size_t)i, be = off ? off[i + 1] : (size_t)i + 1;
        if (!tb_put(&r->a, &b, obj.u.s.p + bs, be - bs)) return oom(r, n);
    }
    *out = tv_str(b.p ? b.p : "", b.n);
    return true;
}

/* ---------- operators ---------- */

static const char *html_escape_char(char c) {
    switch (c) {
    case '&': return "&amp;";
    case '<': return "&lt;";
    case '>': return "&gt;";
    case '"': return "&#34;";
    case '\'': return "&#39;";
    default: return NULL;
    }
}

static bool html_escape(rctx *r, const tnode *n, tval v, tval *out) {
    if (v.kind == TV_STR && v.safe) {
        *out = v;
        return true;
    }
    tval s;
    if (!to_str(r, n, v, &s)) return false;
    tval_buf b = {0};
    for (size_t i = 0; i < s.u.s.n; i++) {
        const char *e = html_escape_char(s.u.s.p[i]);
        if (!(e ? tb_puts(&r->a, &b, e) : tb_put(&r->a, &b, s.u.s.p + i, 1))) return oom(r, n);
    }
    *out = tv_str(b.p ? b.p : "", b.n);
    out->safe = 1;
    return true;
}

static bool concat2(rctx *r, const tnode *n, tval a, tval b, tval *out) {
    tval_buf buf = {0};
    if (!tb_put(&r->a, &buf, a.u.s.p, a.u.s.n) || !tb_put(&r->a, &buf, b.u.s.p, b.u.s.n))
        return oom(r, n);
    *out = tv_str(buf.p ? buf.p : "", buf.n);
    return true;
}

/* python's str % args for the common conversions: %s %r %d %i %f %x %% with flags,
 * width and precision; a dict argument serves %(name)s. */
static bool percent_format(rctx *r, tnode *n, tval fmt, tval args, tval *out) {
    tval_buf b = {0};
    size_t argi = 0;
    bool tuple = args.kind == TV_LIST && args.tuple;
    size_t nargs = tuple ? args.u.l->n : 1;
    const char *p = fmt.u.s.p;
    size_t len = fmt.u.s.n;
    for (size_t i = 0; i < len; i++) {
        if (p[i] != '%') {
            if (!tb_put(&r->a, &b, p + i, 1)) return oom(r, n);
            continue;
        }
        if (++i >= len) return rfail(r, n, HL_ERR_FORMAT, "incomplete format");
        tval v;
        bool have = false;
        if (p[i] == '(') {
            const char *e = memchr(p + i, ')', len - i);
            if (!e || args.kind != TV_DICT) return rfail(r, n, HL_ERR_FORMAT, "format requires a mapping");
            tval *hit = td_get_str(args.u.d, p + i + 1, (size_t)(e - p) - i - 1);
            if (!hit) return rfail(r, n, HL_ERR_FORMAT, "KeyError in %% format");
            v = *hit;
            have = true;
            i = (size_t)(e - p) + 1;
        }
        char spec[32];
        size_t k = 0;
        spec[k++] = '%';
        while (i < len && strchr("-+ 0#", p[i]) && k < 8) spec[k++] = p[i++];
        while (i < len && p[i] >= '0' && p[i] <= '9' && k < 16) spec[k++] = p[i++];
        if (i < len && p[i] == '.') {
            spec[k++] = p[i++];
            while (i < len && p[i] >= '0' && p[i] <= '9' && k < 24) spec[k++] = p[i++];
        }
        spec[k] = 0;
        if (i >= len) return rfail(r, n, HL_ERR_FORMAT, "incomplete format");
        char conv = p[i];
        if (conv == '%') {
            if (!tb_puts(&r->a, &b, "%")) return oom(r, n);
            continue;
        }
        if (!have) {
            if (argi >= nargs) return rfail(r, n, HL_ERR_FORMAT, "not enough arguments for format string");
            v = tuple ? args.u.l->items[argi] : args;
            argi++;
        }
        char num[128];
        if (conv == 's' || conv == 'r') {
            tval sv;
            if (conv == 's' ? !to_str(r, n, v, &sv) : false) return false;
            if (conv == 'r') {
                tval_buf rb = {0};
                if (!tv_write_repr(&r->a, &rb, v, 0)) return oom(r, n);
                sv = tv_str(rb.p ? rb.p : "", rb.n);
            }
            int width = atoi(spec + 1 + (spec[1] == '-'));
            size_t cl = u8_len(sv.u.s.p, sv.u.s.n);
            size_t pad = width > 0 && (size_t)width > cl ? (size_t)width - cl : 0;
            if (pad > 10000) return rfail(r, n, HL_ERR_INVALID, "format width too large");
            bool left = spec[1] == '-';
            for (size_t q = 0; !left && q < pad; q++) if (!tb_puts(&r->a, &b, " ")) return oom(r, n);
            if (!tb_put(&r->a, &b, sv.u.s.p, sv.u.s.n)) return oom(r, n);
            for (size_t q = 0; left && q < pad; q++) if (!tb_puts(&r->a, &b, " ")) return oom(r, n);
            continue;
        }
        if (!is_num(v)) return rfail(r, n, HL_ERR_FORMAT, "%%%c format: a number is required, not %s", conv, tv_type_name(v));
        if (atoi(spec + 1) > 100) return rfail(r, n, HL_ERR_INVALID, "format width too large");
        if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
            spec[k++] = 'l';
            spec[k++] = 'l';
            spec[k++] = conv == 'i' ? 'd' : conv;
            spec[k] = 0;
            double d = num_of(v);
            long long iv = v.kind == TV_FLOAT ? (long long)d : (long long)(v.kind == TV_INT ? v.u.i : v.u.b);
            snprintf(num, sizeof num, spec, iv);
        } else if (conv == 'f' || conv == 'F' || conv == 'e' || conv == 'E' || conv == 'g' || conv == 'G') {
            spec[k++] = conv;
            spec[k] = 0;
            snprintf(num, sizeof num, spec, num_of(v));
        } else {
            return rfail(r, n, HL_ERR_FORMAT, "unsupported format character '%c'", conv);
        }
        if (!tb_puts(&r->a, &b, num)) return oom(r, n);
    }
    /* a lone argument must be used up unless it is mapping-like (python's rule) */
    bool mapping_like = !tuple && (args.kind == TV_DICT || args.kind == TV_LIST ||
                                   args.kind == TV_UNDEF || args.kind == TV_NS);
    if (argi < nargs && !mapping_like)
        return rfail(r, n, HL_ERR_FORMAT, "not all arguments converted during string formatting");
    *out = tv_str(b.p ? b.p : "", b.n);
    return true;
}

static bool binop(rctx *r, tnode *n, int op, tval a, tval b, tval *out) {
    if (op == '~') {
        tval x, y;
        if (!to_str(r, n, a, &x) || !to_str(r, n, b, &y)) return false;
        return concat2(r, n, x, y, out);
    }
    if (op == '%' && a.kind == TV_STR) return percent_format(r, n, a, b, out);
    if (a.kind == TV_UNDEF) return fail_undef(r, n, a);
    if (b.kind == TV_UNDEF) return fail_undef(r, n, b);
    bool ints = (a.kind == TV_INT || a.kind == TV_BOOL) && (b.kind == TV_INT || b.kind == TV_BOOL);
    if (is_num(a) && is_num(b)) {
        if (ints) {
            int64_t x = a.kind == TV_INT ? a.u.i : a.u.b, y = b.kind == TV_INT ? b.u.i : b.u.b, z;
            bool ovf = false;
            switch (op) {
            case '+': ovf = __builtin_add_overflow(x, y, &z); break;
            case '-': ovf = __builtin_sub_overflow(x, y, &z); break;
            case '*': ovf = __builtin_mul_overflow(x, y, &z); break;
            case '/':
                if (y == 0) return rfail(r, n, HL_ERR_FORMAT, "division by zero");
                *out = tv_float((double)x / (double)y);
                return true;
            case 'f':
            case '%':
                if (y == 0)
                    return rfail(r, n, HL_ERR_FORMAT, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) {
                    ovf = true;
                    break;
                }
                z = x / y;
                if ((x % y != 0) && ((x < 0) != (y < 0))) z--;
                if (op == '%') z = x - z * y;
                break;
            case 'p':
                if (y < 0) {
                    *out = tv_float(pow((double)x, (double)y));
                    return true;
                }
                z = 1;
                for (int64_t i = 0; i < y && !ovf; i++) {
                    ovf = __builtin_mul_overflow(z, x, &z);
                    if (z == 0 || z == 1) break;
                }
                if (!ovf && x == -1) z = (y % 2) ? -1 : 1;
                break;
            default: return rfail(r, n, HL_ERR_FORMAT, "bad operator");
            }
            if (ovf) return rfail(r, n, HL_ERR_FORMAT, "integer overflow in arithmetic");
            *out = tv_int(z);
            return true;
        }
        double x = num_of(a), y = num_of(b);
        switch (op) {
        case '+': *out = tv_float(x + y); return true;
        case '-': *out = tv_float(x - y); return true;
        case '*': *out = tv_float(x * y); return true;
        case '/':
            if (y == 0) return rfail(r, n, HL_ERR_FORMAT, "float division by zero");
            *out = tv_float(x / y);
            return true;
        case 'f':
        case '%': {
            if (y == 0) return rfail(r, n, HL_ERR_FORMAT, "float modulo");
            /* python's float_divmod */
            double mod = fmod(x, y), div = (x - mod) / y, fdiv;
            if (mod != 0) {
                if ((y < 0) != (mod < 0)) {
                    mod += y;
                    div -= 1.0;
                }
            } else {
                mod = copysign(0.0, y);
            }
            if (div != 0) {
                fdiv = floor(div);
                if (div - fdiv > 0.5) fdiv += 1.0;
            } else {
                fdiv = copysign(0.0, x / y);
            }
            *out = tv_float(op == '%' ? mod : fdiv);
            return true;
        }
        case 'p': *out = tv_float(pow(x, y)); return true;
        default: break;
        }
    }
    if (op == '+' && a.kind == TV_STR && b.kind == TV_STR) {
        if (a.safe || b.safe) {
            /* Markup + str escapes the plain side */
            tval x, y;
            if (!html_escape(r, n, a, &x) || !html_escape(r, n, b, &y)) return false;
            if (!concat2(r, n, x, y, out)) return false;
            out->safe = 1;
            return true;
        }
        return concat2(r, n, a, b, out);
    }
    if (op == '+' && a.kind == TV_LIST && b.kind == TV_LIST) {
        tlist *l = tl_new(&r->a, a.u.l->n + b.u.l->n);
        if (!l) return oom(r, n);
        for (size_t i = 0; i < a.u.l->n; i++) l->items[l->n++] = a.u.l->items[i];
        for (size_t i = 0; i < b.u.l->n; i++) l->items[l->n++] = b.u.l->items[i];
        *out = mk_list(l);
        out->tuple = a.tuple;
        return true;
    }
    if (op == '*' && ((a.kind == TV_STR || a.kind == TV_LIST) && (b.kind == TV_INT || b.kind == TV_BOOL))) {
        int64_t k = b.kind == TV_INT ? b.u.i : b.u.b;
        if (k < 0) k = 0;
        size_t unit = a.kind == TV_STR ? a.u.s.n : a.u.l->n, total;
        if (__builtin_mul_overflow(unit, (size_t)k, &total) || total > r->lim.max_output)
            return rfail(r, n, HL_ERR_INVALID, "repetition result too large");
        if (a.kind == TV_STR) {
            tval_buf buf = {0};
            for (int64_t i = 0; i < k; i++)
                if (!tb_put(&r->a, &buf, a.u.s.p, a.u.s.n)) return oom(r, n);
            *out = tv_str(buf.p ? buf.p : "", buf.n);
        } else {
            tlist *l = tl_new(&r->a, total);
            if (!l) return oom(r, n);
            for (int64_t i = 0; i < k; i++)
                for (size_t j = 0; j < a.u.l->n; j++) l->items[l->n++] = a.u.l->items[j];
            *out = mk_list(l);
        }
        return true;
    }
    if (op == '*' && (b.kind == TV_STR || b.kind == TV_LIST) && (a.kind == TV_INT || a.kind == TV_BOOL))
        return binop(r, n, op, b, a, out);
    static const char *const names[128] = {['+'] = "+", ['-'] = "-", ['*'] = "*", ['/'] = "/",
                                            ['f'] = "//", ['%'] = "%", ['p'] = "** or pow()"};
    if (op == '+' && a.kind == TV_STR)
        return rfail(r, n, HL_ERR_FORMAT, "can only concatenate str (not \"%s\") to str",
                     tv_type_name(b));
    if (op == '+' && a.kind == TV_LIST)
        return rfail(r, n, HL_ERR_FORMAT, "can only concatenate list (not \"%s\") to list",
                     tv_type_name(b));
    return rfail(r, n, HL_ERR_FORMAT, "unsupported operand type(s) for %s: '%s' and '%s'",
                 names[op & 127] ? names[op & 127] : "?", tv_type_name(a), tv_type_name(b));
}

static bool contains(rctx *r, tnode *n, tval item, tval container, bool *res) {
    if (container.kind == TV_STR && !charge(r, n, container.u.s.n)) return false;
    if (container.kind == TV_LIST && !charge(r, n, container.u.l->n * 8)) return false;
    if ((container.kind == TV_DICT || container.kind == TV_NS) && !charge(r, n, container.u.d->n * 8))
        return false;
    switch (container.kind) {
    case TV_UNDEF: *res = false; return true;
    case TV_STR:
        if (item.kind != TV_STR)
            return rfail(r, n, HL_ERR_FORMAT, "'in <string>' requires string as left operand, not %s",
                         tv_type_name(item));
        if (item.u.s.n == 0) {
            *res = true;
            return true;
        }
        *res = find_bytes(container.u.s.p, container.u.s.n, item.u.s.p, item.u.s.n) != NULL;
        return true;
    case TV_LIST:
        *res = false;
        for (size_t i = 0; i < container.u.l->n; i++)
            if (tv_equal(item, container.u.l->items[i])) {
                *res = true;
                break;
            }
        return true;
    case TV_DICT:
    case TV_NS: *res = td_get(container.u.d, item) != NULL; return true;
    default:
        return rfail(r, n, HL_ERR_FORMAT, "argument of type '%s' is not iterable",
                     tv_type_name(container));
    }
}

static bool compare(rctx *r, tnode *n, int op, tval a, tval b, bool *res) {
    switch (op) {
    case CMP_EQ: *res = tv_equal(a, b); return true;
    case CMP_NE: *res = !tv_equal(a, b); return true;
    case CMP_IN: return contains(r, n, a, b, res);
    case CMP_NOTIN:
        if (!contains(r, n, a, b, res)) return false;
        *res = !*res;
        return true;
    default: {
        if (a.kind == TV_UNDEF) return fail_undef(r, n, a);
        if (b.kind == TV_UNDEF) return fail_undef(r, n, b);
        bool ok = true;
        int c = tv_cmp(a, b, &ok);
        static const char *const sym[] = {"==", "!=", "<", "<=", ">", ">="};
        if (!ok)
            return rfail(r, n, HL_ERR_FORMAT, "'%s' not supported between instances of '%s' and '%s'",
                         sym[op], tv_type_name(a), tv_type_name(b));
        *res = op == CMP_LT ? c < 0 : op == CMP_LE ? c <= 0 : op == CMP_GT ? c > 0 : c >= 0;
        return true;
    }
    }
}

/* ---------- evaluation ---------- */

static bool eval_args(rctx *r, tnode *n, frame *f, tval **pos, tval **kwv) {
    *pos = *kwv = NULL;
    if (n->n) {
        *pos = ta_alloc(&r->a, n->n * sizeof(tval));
        if (!*pos) return oom(r, n);
        for (size_t i = 0; i < n->n; i++)
            if (!eval(r, n->list[i], f, &(*pos)[i])) return false;
    }
    if (n->n2) {
        *kwv = ta_alloc(&r->a, n->n2 * sizeof(tval));
        if (!*kwv) return oom(r, n);
        for (size_t i = 0; i < n->n2; i++)
            if (!eval(r, n->list2[i], f, &(*kwv)[i])) return false;
    }
    return true;
}

static bool eval_inner(rctx *r, tnode *n, frame *f, tval *out) {
    switch (n->kind) {
    case N_CONST: *out = n->val; return true;
    case N_NAME: *out = lookup(r, f, n->str); return true;
    case N_ATTR: {
        tval obj;
        if (!eval(r, n->a, f, &obj)) return false;
        return get_attr(r, n, obj, n->str, n->len, out);
    }
    case N_ITEM: {
        tval obj, key;
        if (!eval(r, n->a, f, &obj) || !eval(r, n->b, f, &key)) return false;
        return get_item(r, n, obj, key, out);
    }
    case N_SLICE: return eval_slice(r, n, f, out);
    case N_CALL: {
        tval callee, *pos, *kwv;
        if (!eval(r, n->a, f, &callee) || !eval_args(r, n, f, &pos, &kwv)) return false;
        return call_value(r, n, f, callee, n->n, pos, n->n_names, n->names, kwv, out);
    }
    case N_FILTER: {
        tval in, *pos, *kwv;
        if (!eval(r, n->a, f, &in) || !eval_args(r, n, f, &pos, &kwv)) return false;
        return apply_filter(r, n, f, n->str, in, n->n, pos, n->n_names, n->names, kwv, out);
    }
    case N_TEST: {
        tval v, *pos, *kwv;
        if (!eval(r, n->a, f, &v) || !eval_args(r, n, f, &pos, &kwv)) return false;
        bool res;
        if (!apply_test(r, n, f, n->str, v, n->n, pos, &res)) return false;
        *out = tv_bool(n->op ? !res : res);
        return true;
    }
    case N_NEG:
    case N_POS: {
        tval v;
        if (!eval(r, n->a, f, &v)) return false;
        if (v.kind == TV_UNDEF) return fail_undef(r, n, v);
        if (!is_num(v))
            return rfail(r, n, HL_ERR_FORMAT, "bad operand type for unary %c: '%s'",
                         n->kind == N_NEG ? '-' : '+', tv_type_name(v));
        if (n->kind == N_POS) *out = v.kind == TV_BOOL ? tv_int(v.u.b) : v;
        else if (v.kind == TV_FLOAT) *out = tv_float(-v.u.f);
        else {
            int64_t x = v.kind == TV_INT ? v.u.i : v.u.b;
            if (x == INT64_MIN) return rfail(r, n, HL_ERR_FORMAT, "integer overflow in arithmetic");
            *out = tv_int(-x);
        }
        return true;
    }
    case N_NOT: {
        tval v;
        if (!eval(r, n->a, f, &v)) return false;
        *out = tv_bool(!tv_truthy(v));
        return true;
    }
    case N_AND:
    case N_OR: {
        tval v;
        if (!eval(r, n->a, f, &v)) return false;
        if (tv_truthy(v) == (n->kind == N_OR)) {
            *out = v;
            return true;
        }
        return eval(r, n->b, f, out);
    }
    case N_BINOP: {
        tval a, b;
        if (!eval(r, n->a, f, &a) || !eval(r, n->b, f, &b)) return false;
        return binop(r, n, n->op, a, b, out);
    }
    case N_COMPARE: {
        tval a;
        if (!eval(r, n->a, f, &a)) return false;
        for (size_t i = 0; i < n->n; i++) {
            tval b;
            bool res;
            if (!eval(r, n->list[i], f, &b) || !compare(r, n, n->ops[i], a, b, &res)) return false;
            if (!res) {
                *out = tv_bool(false);
                return true;
            }
            a = b;
        }
        *out = tv_bool(true);
        return true;
    }
    case N_COND: {
        tval c;
        if (!eval(r, n->a, f, &c)) return false;
        if (tv_truthy(c)) return eval(r, n->b, f, out);
        if (n->c) return eval(r, n->c, f, out);
        *out = undef_fmt(r, "the inline if-expression on line %d evaluated to false and no "
                            "else section was defined.", n->line);
        return true;
    }
    case N_LIST:
    case N_TUPLE: {
        tlist *l = tl_new(&r->a, n->n);
        if (!l) return oom(r, n);
        for (size_t i = 0; i < n->n; i++)
            if (!eval(r, n->list[i], f, &l->items[l->n++])) return false;
        *out = mk_list(l);
        out->tuple = n->kind == N_TUPLE;
        return true;
    }
    case N_DICT: {
        tdict *d = td_new(&r->a, n->n);
        if (!d) return oom(r, n);
        for (size_t i = 0; i < n->n; i++) {
            tval k, v;
            if (!eval(r, n->list[i], f, &k) || !eval(r, n->list2[i], f, &v)) return false;
            if (k.kind == TV_LIST && !k.tuple)
                return rfail(r, n, HL_ERR_FORMAT, "unhashable type: 'list'");
            if (k.kind == TV_DICT) return rfail(r, n, HL_ERR_FORMAT, "unhashable type: 'dict'");
            if (!td_set(&r->a, d, k, v)) return oom(r, n);
        }
        *out = mk_dict(d);
        return true;
    }
    default: return rfail(r, n, HL_ERR_FORMAT, "statement used as an expression");
    }
}

static bool eval(rctx *r, tnode *n, frame *f, tval *out) {
    if (++r->depth > MAX_EVAL_DEPTH) {
        r->depth--;
        return rfail(r, n, HL_ERR_INVALID, "template evaluation nested too deeply");
    }
    if (!charge(r, n, 0)) {
        r->depth--;
        return false;
    }
    bool ok = eval_inner(r, n, f, out);
    /* results that scanned or built long strings pay for their length */
    if (ok && out->kind == TV_STR && out->u.s.n >= 64 && n->kind != N_CONST && n->kind != N_NAME &&
        n->kind != N_ATTR && n->kind != N_ITEM)
        ok = charge(r, n, out->u.s.n);
    r->depth--;
    if (ok && r->a.over) return oom(r, n);
    return ok && !r->failed;
}

/* ---------- argument binding ---------- */

/* Binds positional and keyword args to the named params; absent ones stay kind 0xff. */
#define ARG_MISSING 0xff
static bool bind(rctx *r, tnode *n, const char *what, const char *const *params, size_t npos,
                 tval *pos, size_t nkw, const char **kwn, tval *kwv, tval *out) {
    size_t np = 0;
    while (params[np]) np++;
    for (size_t i = 0; i < np; i++) out[i].kind = ARG_MISSING;
    if (npos > np)
        return rfail(r, n, HL_ERR_FORMAT, "%s() takes at most %zu argument(s) (%zu given)", what,
                     np, npos);
    for (size_t i = 0; i < npos; i++) out[i] = pos[i];
    for (size_t k = 0; k < nkw; k++) {
        size_t i = 0;
        while (i < np && strcmp(params[i], kwn[k])) i++;
        if (i == np)
            return rfail(r, n, HL_ERR_FORMAT, "%s() got an unexpected keyword argument '%s'",
                         what, kwn[k]);
        out[i] = kwv[k];
    }
    return true;
}

static bool present(tval v) { return v.kind != ARG_MISSING; }

static bool arg_int(rctx *r, tnode *n, tval v, const char *what, int64_t *out) {
    if (v.kind == TV_INT) *out = v.u.i;
    else if (v.kind == TV_BOOL) *out = v.u.b;
    else return rfail(r, n, HL_ERR_FORMAT, "%s must be an integer, not '%s'", what, tv_type_name(v));
    return true;
}

static bool arg_str(rctx *r, tnode *n, tval v, const char *what, tval *out) {
    if (v.kind != TV_STR)
        return rfail(r, n, HL_ERR_FORMAT, "%s must be a string, not '%s'", what, tv_type_name(v));
    *out = v;
    return true;
}

/* ---------- string methods ---------- */

static bool strip_set(int32_t c, tval chars) {
    if (chars.kind != TV_STR) return py_space(c);
    for (size_t i = 0; i < chars.u.s.n;) {
        int32_t d;
        i += u8_next(chars.u.s.p, chars.u.s.n, i, &d);
        if (d == c) return true;
    }
    return false;
}

static tval do_strip(tval s, tval chars, bool left, bool right) {
    const char *p = s.u.s.p;
    size_t b = 0, e = s.u.s.n;
    if (left)
        while (b < e) {
            int32_t c;
            size_t k = u8_next(p, e, b, &c);
            if (!strip_set(c, chars)) break;
            b += k;
        }
    if (right)
        while (e > b) {
            size_t st = e - 1;
            while (st > b && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
            int32_t c;
            u8_next(p, e, st, &c);
            if (!strip_set(c, chars)) break;
            e = st;
        }
    tval v = tv_str(p + b, e - b);
    v.safe = s.safe;
    return v;
}

static bool case_map(rctx *r, tnode *n, tval s, int mode, tval *out) {
    /* mode: 0 upper, 1 lower, 2 str.title, 3 capitalize, 4 jinja's title filter (words
     * start after whitespace or one of -({[<) */
    tval_buf b = {0};
    bool prev_cased = false;
    size_t idx = 0;
    for (size_t i = 0; i < s.u.s.n; idx++) {
        int32_t c;
        size_t k = u8_next(s.u.s.p, s.u.s.n, i, &c);
        int32_t m = c;
        if (mode == 0) m = utf8proc_toupper(c);
        else if (mode == 1) m = utf8proc_tolower(c);
        else if (mode == 2) m = prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c);
        else if (mode == 3) m = idx == 0 ? utf8proc_totitle(c) : utf8proc_tolower(c);
        else {
            bool sep = py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
            m = (!sep && prev_cased) ? utf8proc_tolower(c) : sep ? c : utf8proc_toupper(c);
            prev_cased = !sep;
        }
        if (mode == 2) {
            const utf8proc_property_t *pr = utf8proc_get_property(c);
            bool cased = pr->category == UTF8PROC_CATEGORY_LU || pr->category == UTF8PROC_CATEGORY_LL ||
                         pr->category == UTF8PROC_CATEGORY_LT;
            prev_cased = cased;
        }
        char enc[4];
        if (m == c) {
            if (!tb_put(&r->a, &b, s.u.s.p + i, k)) return oom(r, n);
        } else {
            utf8proc_ssize_t el = utf8proc_encode_char(m, (utf8proc_uint8_t *)enc);
            if (!tb_put(&r->a, &b, enc, (size_t)el)) return oom(r, n);
        }
        i += k;
    }
    *out = tv_str(b.p ? b.p : "", b.n);
    return true;
}

static bool do_replace(rctx *r, tnode *n, tval s, tval old, tval new_, int64_t count, tval *out) {
    tval_buf b = {0};
    if (old.u.s.n == 0) {
        /* python inserts new between every character */
        int64_t done = 0;
        size_t i = 0;
        for (;;) {
            if (count < 0 || done < count) {
                if (!tb_put(&r->a, &b, new_.u.s.p, new_.u.s.n)) return oom(r, n);
                done++;
            }
            if (i >= s.u.s.n) break;
            size_t k = u8_next(s.u.s.p, s.u.s.n, i, NULL);
            if (!tb_put(&r->a, &b, s.u.s.p + i, k)) return oom(r, n);
            i += k;
            if (b.n > r->lim.max_output) return rfail(r, n, HL_ERR_INVALID, "replace result too large");
        }
    } else {
        size_t i = 0;
        int64_t done = 0;
        while (i <= s.u.s.n) {
            const char *hit = (count < 0 || done < count)
                ? find_bytes(s.u.s.p + i, s.u.s.n - i, old.u.s.p, old.u.s.n) : NULL;
            if (!hit) {
                if (!tb_put(&r->a, &b, s.u.s.p + i, s.u.s.n - i)) return oom(r, n);
                break;
            }
            size_t at = (size_t)(hit - s.u.s.p);
            if (!tb_put(&r->a, &b, s.u.s.p + i, at - i) ||
                !tb_put(&r->a, &b, new_.u.s.p, new_.u.s.n))
                return oom(r, n);
            if (b.n > r->lim.max_output) return rfail(r, n, HL_ERR_INVALID, "replace result too large");
            i = at + old.u.s.n;
            done++;
        }
    }
    *out = tv_str(b.p ? b.p : "", b.n);
    return true;
}

static bool do_split(rctx *r, tnode *n, tval s, tval sep, int64_t maxsplit, tval *out) {
    tlist *l = tl_new(&r->a, 0);
    if (!l) return oom(r, n);
    const char *p = s.u.s.p;
    size_t len = s.u.s.n;
    if (sep.kind != TV_STR) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            while (i < len) {
                int32_t c;
                size_t k = u8_next(p, len, i, &c);
                if (!py_space(c)) break;
                i += k;
            }
            if (i >= len) break;
            size_t st = i;
            if (maxsplit >= 0 && done >= maxsplit) {
                if (!tl_push(&r->a, l, tv_str(p + st, len - st))) return oom(r, n);
                break;
            }
            while (i < len) {
                int32_t c;
                size_t k = u8_next(p, len, i, &c);
                if (py_space(c)) break;
                i += k;
            }
            if (!tl_push(&r->a, l, tv_str(p + st, i - st))) return oom(r, n);
            done++;
        }
    } else {
        if (sep.u.s.n == 0) return rfail(r, n, HL_ERR_FORMAT, "empty separator");
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *hit = (maxsplit < 0 || done < maxsplit)
                ? find_bytes(p + i, len - i, sep.u.s.p, sep.u.s.n) : NULL;
            if (!hit) {
                if (!tl_push(&r->a, l, tv_str(p + i, len - i))) return oom(r, n);
                break;
            }
            size_t at = (size_t)(hit - p);
            if (!tl_push(&r->a, l, tv_str(p + i, at - i))) return oom(r, n);
            i = at + sep.u.s.n;
            done++;
        }
    }
    *out = mk_list(l);
    return true;
}

static bool prefix_test(rctx *r, tnode *n, tval s, tval arg, bool ends, bool *res) {
    if (arg.kind == TV_LIST) {
        *res = false;
        for (size_t i = 0; i < arg.u.l->n && !*res; i++)
            if (!prefix_test(r, n, s, arg.u.l->items[i], ends, res)) return false;
        return true;
    }
    if (arg.kind != TV_STR)
        return rfail(r, n, HL_ERR_FORMAT, "%s first arg must be str or a tuple of str, not %s",
                     ends ? "endswith" : "startswith", tv_type_name(arg));
    size_t k = arg.u.s.n;
    *res = k <= s.u.s.n && memcmp(ends ? s.u.s.p + s.u.s.n - k : s.u.s.p, arg.u.s.p, k) == 0;
    return true;
}

static bool join_values(rctx *r, tnode *n, tlist *items, tval sep, tval *out) {
    tval_buf b = {0};
    for (size_t i = 0; i < items->n; i++) {
        tval s;
        if (!to_str(r, n, items->items[i], &s)) return false;
        if ((i && !tb_put(&r->a, &b, sep.u.s.p, sep.u.s.n)) || !tb_put(&r->a, &b, s.u.s.p, s.u.s.n))
            return oom(r, n);
        if (b.n > r->lim.max_output) return rfail(r, n, HL_ERR_INVALID, "join result too large");
    }
    *out = tv_str(b.p ? b.p : "", b.n);
    return true;
}

static bool str_format(rctx *r, tnode *n, tval fmt, size_t npos, tval *pos, size_t nkw,
                       const char **kwn, tval *kwv, tval *out) {
    tval_buf b = {0};
    size_t auto_idx = 0;
    const char *p = fmt.u.s.p;
    size_t len = fmt.u.s.n;
    for (size_t i = 0; i < len; i++) {
        if (p[i] == '{' && i + 1 < len && p[i + 1] == '{') {
            if (!tb_puts(&r->a, &b, "{")) return oom(r, n);
            i++;
        } else if (p[i] == '}' && i + 1 < len && p[i + 1] == '}') {
            if (!tb_puts(&r->a, &b, "}")) return oom(r, n);
            i++;
        } else if (p[i] == '{') {
            const char *e = memchr(p + i, '}', len - i);
            if (!e) return rfail(r, n, HL_ERR_FORMAT, "Single '{' encountered in format string");
            size_t fl = (size_t)(e - p) - i - 1;
            const char *field = p + i + 1;
            tval v;
            if (fl == 0) {
                if (auto_idx >= npos)
                    return rfail(r, n, HL_ERR_FORMAT, "Replacement index %zu out of range", auto_idx);
                v = pos[auto_idx++];
            } else if (field[0] >= '0' && field[0] <= '9') {
                size_t k = (size_t)atoi(field);
                if (k >= npos) return rfail(r, n, HL_ERR_FORMAT, "Replacement index %zu out of range", k);
                v = pos[k];
            } else {
                size_t k = 0;
                while (k < nkw && (strlen(kwn[k]) != fl || memcmp(kwn[k], field, fl))) k++;
                if (k == nkw) return rfail(r, n, HL_ERR_FORMAT, "KeyError: '%.*s'", (int)fl, field);
                v = kwv[k];
            }
            tval s;
            if (!to_str(r, n, v, &s) || !tb_put(&r->a, &b, s.u.s.p, s.u.s.n)) return r->failed ? false : oom(r, n);
            i = (size_t)(e - p);
        } else if (!tb_put(&r->a, &b, p + i, 1)) {
            return oom(r, n);
        }
    }
    *out = tv_str(b.p ? b.p : "", b.n);
    return true;
}

static bool str_method(rctx *r, tnode *n, tval s, const char *m, size_t npos, tval *pos,
                       size_t nkw, const char **kwn, tval *kwv, tval *out) {
    tval a[3];
    if (!charge(r, n, s.u.s.n)) return false;
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        static const char *const ps[] = {"chars", NULL};
        if (!bind(r, n, m, ps, npos, pos, nkw, kwn, kwv, a)) return false;
        tval chars = present(a[0]) ? a[0] : tv_none();
        if (chars.kind != TV_NONE && chars.kind != TV_STR)
            return rfail(r, n, HL_ERR_FORMAT, "%s arg must be None or str", m);
        *out = do_strip(s, chars, m[0] != 'r', m[0] != 'l');
        out->safe = 0;
        return true;
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        static const char *const ps[] = {"sep", "maxsplit", NULL};
        if (!bind(r, n, m, ps, npos, pos, nkw, kwn, kwv, a)) return false;
        int64_t maxsplit = -1;
        if (present(a[1]) && !arg_int(r, n, a[1], "maxsplit", &maxsplit)) return false;
        tval sep = present(a[0]) ? a[0] : tv_none();
        if (sep.kind != TV_NONE && sep.kind != TV_STR)
            return rfail(r, n, HL_ERR_FORMAT, "must be str or None, not %s", tv_type_name(sep));
        if (m[0] == 'r' && maxsplit >= 0) return rfail(r, n, HL_ERR_UNSUPPORTED, "rsplit with maxsplit is not supported");
        return do_split(r, n, s, sep, maxsplit, out);
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        static const char *const ps[] = {"prefix", NULL};
        if (!bind(r, n, m, ps, npos, pos, nkw, kwn, kwv, a)) return false;
        if (!present(a[0])) return rfail(r, n, HL_ERR_FORMAT, "%s() takes at least 1 argument", m);
        bool res;
        if (!prefix_test(r, n, s, a[0], m[0] == 'e', &res)) return false;
        *out = tv_bool(res);
        return true;
    }
    if (!strcmp(m, "replace")) {
        static const char *const ps[] = {"old", "new", "count", NULL};
        if (!bind(r, n, m, ps, npos, pos, nkw, kwn, kwv, a)) return false;
        tval o = {0}, nw = {0};
        int64_t count = -1;
        if (!present(a[0]) || !present(a[1]))
            return rfail(r, n, HL_ERR_FORMAT, "replace() takes at least 2 arguments");
        if (!arg_str(r, n, a[0], "replace() argument 1", &o) ||
            !arg_str(r, n, a[1], "replace() argument 2", &nw))
            return false;
        if (present(a[2]) && !arg_int(r, n, a[2], "count", &count)) return false;
        return do_replace(r, n, s, o, nw, count, out);
    }
    if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize")) {
        if (npos || nkw) return rfail(r, n, HL_ERR_FORMAT, "%s() takes no arguments", m);
        return case_map(r, n, s, m[0] == 'u' ? 0 : m[0] == 'l' ? 1 : m[0] == 't' ? 2 : 3, out);
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "count")) {
        static const char *const ps[] = {"sub", NULL};
        if (!bind(r, n, m, ps, npos, pos, nkw, kwn, kwv, a)) return false;
        tval sub = {0};
        if (!present(a[0])) return rfail(r, n, HL_ERR_FORMAT, "%s() takes at least 1 argument", m);
        if (!arg_str(r, n, a[0], m, &sub)) return false;
        if (!strcmp(m, "count")) {
            int64_t c = 0;
            if (sub.u.s.n == 0) c = (int64_t)u8_len(s.u.s.p, s.u.s.n) + 1;
            else
                for (size_t i = 0; i + sub.u.s.n <= s.u.s.n;) {
                    const char *h = find_bytes(s.u.s.p + i, s.u.s.n - i, sub.u.s.p, sub.u.s.n);
                    if (!h) break;
                    c++;
                    i = (size_t)(h - s.u.s.p) + sub.u.s.n;
                }
            *out = tv_int(c);
            return true;
        }
        int64_t at = -1;
        if (m[0] == 'r') {
            for (size_t i = s.u.s.n + 1; i-- > 0;)
                if (i + sub.u.s.n <= s.u.s.n && !memcmp(s.u.s.p + i, sub.u.s.p, sub.u.s.n)) {
                    at = (int64_t)i;
                    break;
                }
        } else {
            const char *h = sub.u.s.n ? find_bytes(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n) : s.u.s.p;
            if (h) at = (int64_t)(h - s.u.s.p);
        }
        if (at >= 0) at = (int64_t)u8_len(s.u.s.p, (size_t)at);
        if (at < 0 && m[0] == 'i') return rfail(r, n, HL_ERR_FORMAT, "substring not found");
        *out = tv_int(at);
        return true;
    }
    if (!strcmp(m, "join")) {
        if (npos != 1 || nkw) return rfail(r, n, HL_ERR_FORMAT, "join() takes exactly one argument");
        tlist *items;
        if (!to_list(r, n, pos[0], &items)) return false;
        for (size_t i = 0; i < items->n; i++)
            if (items->items[i].kind != TV_STR)
                return rfail(r, n, HL_ERR_FORMAT, "sequence item %zu: expected str instance, %s found",
                             i, tv_type_name(items->items[i]));
        return join_values(r, n, items, s, out);
    }
    if (!strcmp(m, "format")) return str_format(r, n, s, npos, pos, nkw, kwn, kwv, out);
    if (!strcmp(m, "splitlines")) {
        tlist *l = tl_new(&r->a, 0);
        if (!l) return oom(r, n);
        size_t st = 0, i = 0;
        while (i < s.u.s.n) {
            char c = s.u.s.p[i];
            if (c == '\n' || c == '\r') {
                if (!tl_push(&r->a, l, tv_str(s.u.s.p + st, i - st))) return oom(r, n);
                if (c == '\r' && i + 1 < s.u.s.n && s.u.s.p[i + 1] == '\n') i++;
                st = ++i;
            } else {
                i++;
            }
        }
        if (st < s.u.s.n && !tl_push(&r->a, l, tv_str(s.u.s.p + st, s.u.s.n - st))) return oom(r, n);
        *out = mk_list(l);
        return true;
    }
    /* is* predicates */
    bool res = s.u.s.n > 0, any_cased = false;
    for (size_t i = 0; i < s.u.s.n;) {
        int32_t c;
        i += u8_next(s.u.s.p, s.u.s.n, i, &c);
        const utf8proc_property_t *pr = utf8proc_get_property(c);
        int cat = pr->category;
        bool up = cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT;
        bool lo = cat == UTF8PROC_CATEGORY_LL;
        bool alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
        bool digit = cat == UTF8PROC_CATEGORY_ND;
        if (up || lo) any_cased = true;
        if (!strcmp(m, "isdigit") && !digit) res = false;
        if (!strcmp(m, "isalpha") && !alpha) res = false;
        if (!strcmp(m, "isalnum") && !alpha && !digit) res = false;
        if (!strcmp(m, "isspace") && !py_space(c)) res = false;
        if (!strcmp(m, "isupper") && lo) res = false;
        if (!strcmp(m, "islower") && up) res = false;
    }
    if (!strcmp(m, "isupper") || !strcmp(m, "islower")) res = res && any_cased;
    *out = tv_bool(res);
    return true;
}

/* ---------- dict / list methods ---------- */

static tval mk_pair(rctx *r, tval k, tval v) {
    tlist *l = tl_new(&r->a, 2);
    tval out = tv_none();
    if (!l) return out;
    l->items[0] = k;
    l->items[1] = v;
    l->n = 2;
    out = mk_list(l);
    out.tuple = 1;
    return out;
}

static bool dict_items(rctx *r, tnode *n, tdict *d, tval *out) {
    tlist *l = tl_new(&r->a, d->n);
    if (!l) return oom(r, n);
    for (size_t i = 0; i < d->n; i++) {
        l->items[l->n++] = mk_pair(r, d->keys[i], d->vals[i]);
        if (r->a.over) return oom(r, n);
    }
    *out = mk_list(l);
    return true;
}

static bool dict_method(rctx *r, tnode *n, tval d, const char *m, size_t npos, tval *pos,
                        size_t nkw, const char **kwn, tval *kwv, tval *out) {
    tval a[2];
    if (strcmp(m, "get") && strcmp(m, "items") && strcmp(m, "keys") && strcmp(m, "values") &&
        strcmp(m, "copy"))
        return rfail(r, n, HL_ERR_FORMAT, "access to attribute '%s' of 'dict' object is unsafe.", m);
    if (!strcmp(m, "get")) {
        static const char *const ps[] = {"key", "default", NULL};
        if (!bind(r, n, m, ps, npos, pos, nkw, kwn, kwv, a)) return false;
        if (!present(a[0])) return rfail(r, n, HL_ERR_FORMAT, "%s expected at least 1 argument", m);
        tval *v = td_get(d.u.d, a[0]);
        *out = v ? *v : present(a[1]) ? a[1] : tv_none();
        return true;
    }
    if (npos || nkw) return rfail(r, n, HL_ERR_FORMAT, "%s() takes no arguments", m);
    if (!strcmp(m, "items")) return dict_items(r, n, d.u.d, out);
    if (!strcmp(m, "keys") || !strcmp(m, "values")) {
        tlist *l = tl_new(&r->a, d.u.d->n);
        if (!l) return oom(r, n);
        for (size_t i = 0; i < d.u.d->n; i++)
            l->items[l->n++] = m[0] == 'k' ? d.u.d->keys[i] : d.u.d->vals[i];
        *out = mk_list(l);
        return true;
    }
    if (!strcmp(m, "copy")) {
        tdict *c = td_new(&r->a, d.u.d->n);
        if (!c) return oom(r, n);
        for (size_t i = 0; i < d.u.d->n; i++)
            if (!td_set(&r->a, c, d.u.d->keys[i], d.u.d->vals[i])) return oom(r, n);
        *out = mk_dict(c);
        return true;
    }
    return rfail(r, n, HL_ERR_FORMAT, "access to attribute '%s' of 'dict' object is unsafe.", m);
}

static bool list_method(rctx *r, tnode *n, tval lv, const char *m, size_t npos, tval *pos,
                        size_t nkw, const char **kwn, tval *kwv, tval *out) {
    tlist *l = lv.u.l;
    tval a[2];
    (void)kwn;
    (void)kwv;
    if (lv.tuple && (!strcmp(m, "append") || !strcmp(m, "pop") || !strcmp(m, "extend") ||
                     !strcmp(m, "insert") || !strcmp(m, "remove") || !strcmp(m, "reverse") ||
                     !strcmp(m, "sort")))
        return rfail(r, n, HL_ERR_FORMAT, "'tuple' object has no attribute '%s'", m);
    if (!strcmp(m, "append")) {
        if (npos != 1 || nkw) return rfail(r, n, HL_ERR_FORMAT, "append() takes exactly one argument");
        if (!tl_push(&r->a, l, pos[0])) return oom(r, n);
        *out = tv_none();
        return true;
    }
    if (!strcmp(m, "extend")) {
        tlist *items;
        if (npos != 1 || nkw) return rfail(r, n, HL_ERR_FORMAT, "extend() takes exactly one argument");
        if (!to_list(r, n, pos[0], &items)) return false;
        for (size_t i = 0; i < items->n; i++)
            if (!tl_push(&r->a, l, items->items[i])) return oom(r, n);
        *out = tv_none();
        return true;
    }
    if (!strcmp(m, "pop")) {
        static const char *const ps[] = {"index", NULL};
        if (!bind(r, n, m, ps, npos, pos, nkw, kwn, kwv, a)) return false;
        int64_t i = -1;
        if (present(a[0]) && !arg_int(r, n, a[0], "pop index", &i)) return false;
        if (l->n == 0) return rfail(r, n, HL_ERR_FORMAT, "pop from empty list");
        if (i < 0) i += (int64_t)l->n;
        if (i < 0 || i >= (int64_t)l->n) return rfail(r, n, HL_ERR_FORMAT, "pop index out of range");
        *out = l->items[i];
        memmove(l->items + i, l->items + i + 1, (l->n - (size_t)i - 1) * sizeof(tval));
        l->n--;
        return true;
    }
    if (!strcmp(m, "insert")) {
        int64_t i = 0;
        if (npos != 2 || nkw) return rfail(r, n, HL_ERR_FORMAT, "insert expected 2 arguments");
        if (!arg_int(r, n, pos[0], "insert index", &i)) return false;
        if (i < 0) i += (int64_t)l->n;
        if (i < 0) i = 0;
        if (i > (int64_t)l->n) i = (int64_t)l->n;
        if (!tl_push(&r->a, l, tv_none())) return oom(r, n);
        memmove(l->items + i + 1, l->items + i, (l->n - 1 - (size_t)i) * sizeof(tval));
        l->items[i] = pos[1];
        *out = tv_none();
        return true;
    }
    if (!strcmp(m, "index") || !strcmp(m, "count")) {
        if (npos != 1 || nkw) return rfail(r, n, HL_ERR_FORMAT, "%s() takes exactly one argument", m);
        int64_t c = 0;
        for (size_t i = 0; i < l->n; i++)
            if (tv_equal(l->items[i], pos[0])) {
                if (m[0] == 'i') {
                    *out = tv_int((int64_t)i);
                    return true;
                }
                c++;
            }
        if (m[0] == 'i') return rfail(r, n, HL_ERR_FORMAT, "value is not in list");
        *out = tv_int(c);
        return true;
    }
    if (!strcmp(m, "copy")) {
        tlist *c;
        if (!to_list(r, n, lv, &c)) return false;
        *out = mk_list(c);
        return true;
    }
    return rfail(r, n, HL_ERR_FORMAT, "access to attribute '%s' of 'list' object is unsafe.", m);
}

/* ---------- calls ---------- */

static bool call_macro(rctx *r, tnode *n, tmacro *mac, size_t npos, tval *pos, size_t nkw,
                       const char **kwn, tval *kwv, tval *out) {
    tnode *def = mac->def;
    if (npos > def->n_names)
        return rfail(r, n, HL_ERR_FORMAT, "macro '%s' takes not more than %zu argument(s)",
                     def->str, def->n_names);
    if (r->call_depth >= r->lim.max_call_depth)
        return rfail(r, n, HL_ERR_INVALID, "macro calls nested deeper than %d (recursion?)",
                     r->lim.max_call_depth);
    frame *f = frame_new(r, mac->closure);
    if (!f) return oom(r, n);
    tval *args = ta_alloc(&r->a, (def->n_names + 1) * sizeof(tval));
    if (!args) return oom(r, n);
    for (size_t i = 0; i < def->n_names; i++) args[i].kind = ARG_MISSING;
    for (size_t i = 0; i < npos; i++) args[i] = pos[i];
    for (size_t k = 0; k < nkw; k++) {
        size_t i = 0;
        while (i < def->n_names && strcmp(def->names[i], kwn[k])) i++;
        if (i == def->n_names)
            return rfail(r, n, HL_ERR_FORMAT, "macro '%s' takes no keyword argument '%s'",
                         def->str, kwn[k]);
        args[i] = kwv[k];
    }
    for (size_t i = 0; i < def->n_names; i++) {
        tval v = args[i];
        if (!present(v)) {
            if (def->list2[i]) {
                if (!eval(r, def->list2[i], f, &v)) return false;
            } else {
                v = undef_fmt(r, "parameter '%s' was not provided", def->names[i]);
            }
        }
        if (!frame_set(r, f, def->names[i], v)) return oom(r, n);
    }
    tval_buf buf = {0}, *saved = r->out;
    r->out = &buf;
    r->call_depth++;
    exec_rc rc = exec_body(r, def->list, def->n, f);
    r->call_depth--;
    r->out = saved;
    if (rc == EX_ERR) return false;
    *out = tv_str(buf.p ? buf.p : "", buf.n);
    return true;
}

static bool call_builtin(rctx *r, tnode *n, int64_t id, size_t npos, tval *pos, size_t nkw,
                         const char **kwn, tval *kwv, tval *out) {
    switch (id) {
    case BI_RANGE: {
        int64_t a[3] = {0, 0, 1};
        if (nkw) return rfail(r, n, HL_ERR_FORMAT, "range() takes no keyword arguments");
        if (npos < 1 || npos > 3)
            return rfail(r, n, HL_ERR_FORMAT, "range expected 1 to 3 arguments, got %zu", npos);
        for (size_t i = 0; i < npos; i++)
            if (!arg_int(r, n, pos[i], "range() argument", &a[npos == 1 ? 1 : i])) return false;
        if (a[2] == 0) return rfail(r, n, HL_ERR_FORMAT, "range() arg 3 must not be zero");
        int64_t start = a[0], stop = a[1], step = a[2];
        double cnt_d = step > 0 ? ((double)stop - (double)start) / (double)step
                                : ((double)start - (double)stop) / (double)-step;
        if (cnt_d > MAX_RANGE)
            return rfail(r, n, HL_ERR_INVALID, "Range too big. The sandbox blocks ranges larger "
                         "than MAX_RANGE (%d).", MAX_RANGE);
        tlist *l = tl_new(&r->a, cnt_d > 0 ? (size_t)ceil(cnt_d) : 0);
        if (!l) return oom(r, n);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
            if (!tl_push(&r->a, l, tv_int(i))) return oom(r, n);
        *out = mk_list(l);
        return true;
    }
    case BI_NAMESPACE:
    case BI_DICT: {
        tdict *d = td_new(&r->a, nkw);
        if (!d) return oom(r, n);
        for (size_t i = 0; i < npos; i++) {
            if (pos[i].kind == TV_DICT || pos[i].kind == TV_NS) {
                for (size_t k = 0; k < pos[i].u.d->n; k++)
                    if (!td_set(&r->a, d, pos[i].u.d->keys[k], pos[i].u.d->vals[k])) return oom(r, n);
            } else {
                return rfail(r, n, HL_ERR_FORMAT, "%s() positional arguments must be mappings",
                             id == BI_DICT ? "dict" : "namespace");
            }
        }
        for (size_t i = 0; i < nkw; i++)
            if (!td_set(&r->a, d, mk_str(r, kwn[i], strlen(kwn[i])), kwv[i])) return oom(r, n);
        *out = mk_dict(d);
        if (id == BI_NAMESPACE) out->kind = TV_NS;
        return true;
    }
    case BI_STRFTIME: {
        if (npos != 1 || nkw || pos[0].kind != TV_STR)
            return rfail(r, n, HL_ERR_FORMAT, "strftime_now() takes one format string");
        char fmt[256], buf[512];
        if (pos[0].u.s.n >= sizeof fmt) return rfail(r, n, HL_ERR_FORMAT, "strftime_now format too long");
        memcpy(fmt, pos[0].u.s.p, pos[0].u.s.n);
        fmt[pos[0].u.s.n] = 0;
        time_t now = r->opts->now ? (time_t)r->opts->now : time(NULL);
        struct tm tm;
        if (!localtime_r(&now, &tm)) return rfail(r, n, HL_ERR_FORMAT, "strftime_now: bad time");
        size_t len = fmt[0] ? strftime(buf, sizeof buf, fmt, &tm) : 0;
        *out = mk_str(r, buf, len);
        return true;
    }
    case BI_RAISE: {
        tval msg = npos ? pos[0] : tv_str("", 0);
        tval s;
        if (!to_str(r, n, msg, &s)) return false;
        return rfail(r, n, HL_ERR_INVALID, "%.*s", (int)s.u.s.n, s.u.s.p);
    }
    default: return rfail(r, n, HL_ERR_FORMAT, "unknown builtin");
    }
}

static bool call_value(rctx *r, tnode *n, frame *f, tval callee, size_t npos, tval *pos,
                       size_t nkw, const char **kwn, tval *kwv, tval *out) {
    (void)f;
    switch (callee.kind) {
    case TV_UNDEF: return fail_undef(r, n, callee);
    case TV_MACRO: return call_macro(r, n, callee.u.mac, npos, pos, nkw, kwn, kwv, out);
    case TV_BUILTIN: return call_builtin(r, n, callee.u.i, npos, pos, nkw, kwn, kwv, out);
    case TV_METHOD: {
        tval self = callee.u.m->self;
        const char *m = callee.u.m->name;
        if (self.kind == TV_STR) return str_method(r, n, self, m, npos, pos, nkw, kwn, kwv, out);
        if (self.kind == TV_DICT) return dict_method(r, n, self, m, npos, pos, nkw, kwn, kwv, out);
        if (self.kind == TV_LIST) return list_method(r, n, self, m, npos, pos, nkw, kwn, kwv, out);
        if (self.kind == TV_LOOP) {
            if (!npos) return rfail(r, n, HL_ERR_FORMAT, "no items for cycling given");
            *out = pos[self.u.loop->index % npos];
            return true;
        }
        return rfail(r, n, HL_ERR_FORMAT, "bad method call");
    }
    default:
        return rfail(r, n, HL_ERR_FORMAT, "'%s' object is not callable", tv_type_name(callee));
    }
}

/* ---------- tests ---------- */

static const char *const test_names[] = {"defined", "undefined", "none", "string", "mapping",
    "iterable", "sequence", "number", "integer", "float", "boolean", "true", "false", "odd",
    "even", "divisibleby", "equalto", "eq", "==", "ne", "!=", "lt", "<", "le", "<=", "gt", ">",
    "ge", ">=", "in", "callable", "lower", "upper", "sameas", "filter", "test", "escaped", NULL};

bool tmpl_test_known(const char *name) {
    for (int i = 0; test_names[i]; i++)
        if (!strcmp(test_names[i], name)) return true;
    return false;
}

static bool apply_test(rctx *r, tnode *n, frame *f, const char *name, tval v, size_t npos,
                       tval *pos, bool *res) {
    (void)f;
    tval arg = npos ? pos[0] : tv_undef("missing test argument");
    if (!strcmp(name, "defined")) *res = v.kind != TV_UNDEF;
    else if (!strcmp(name, "undefined")) *res = v.kind == TV_UNDEF;
    else if (!strcmp(name, "none")) *res = v.kind == TV_NONE;
    else if (!strcmp(name, "string")) *res = v.kind == TV_STR;
    else if (!strcmp(name, "mapping")) *res = v.kind == TV_DICT;
    else if (!strcmp(name, "iterable"))
        *res = v.kind == TV_STR || v.kind == TV_LIST || v.kind == TV_DICT || v.kind == TV_UNDEF;
    else if (!strcmp(name, "sequence"))
        *res = v.kind == TV_STR || v.kind == TV_LIST || v.kind == TV_DICT || v.kind == TV_UNDEF;
    else if (!strcmp(name, "number")) *res = is_num(v);
    else if (!strcmp(name, "integer")) *res = v.kind == TV_INT;
    else if (!strcmp(name, "float")) *res = v.kind == TV_FLOAT;
    else if (!strcmp(name, "boolean")) *res = v.kind == TV_BOOL;
    else if (!strcmp(name, "true")) *res = v.kind == TV_BOOL && v.u.b;
    else if (!strcmp(name, "false")) *res = v.kind == TV_BOOL && !v.u.b;
    else if (!strcmp(name, "callable"))
        *res = v.kind == TV_MACRO || v.kind == TV_BUILTIN || v.kind == TV_METHOD ||
               v.kind == TV_UNDEF; /* Undefined defines __call__ (to raise) */
    else if (!strcmp(name, "escaped")) *res = v.kind == TV_STR && v.safe;
    else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        tval s, m;
        if (!to_str(r, n, v, &s)) return false;
        if (!str_method(r, n, s, name[0] == 'l' ? "islower" : "isupper", 0, NULL, 0, NULL, NULL, &m))
            return false;
        *res = m.u.b;
    } else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (v.kind == TV_UNDEF) return fail_undef(r, n, v);
        if (v.kind == TV_FLOAT || (npos && arg.kind == TV_FLOAT)) {
            double fd = name[0] == 'd' ? (npos && is_num(arg) ? num_of(arg) : 0) : 2;
            if (!is_num(v) || fd == 0)
                return rfail(r, n, HL_ERR_FORMAT, "test '%s': bad operands", name);
            double m = fmod(num_of(v), fd);
            if (m != 0 && ((m < 0) != (fd < 0))) m += fd; /* python's modulo */
            *res = name[0] == 'o' ? m == 1 : m == 0;
            return true;
        }
        if (v.kind != TV_INT && v.kind != TV_BOOL)
            return rfail(r, n, HL_ERR_FORMAT, "test '%s' needs a number, got '%s'", name,
                         tv_type_name(v));
        int64_t x = v.kind == TV_INT ? v.u.i : v.u.b, d = 2;
        if (name[0] == 'd') {
            if (!npos) return rfail(r, n, HL_ERR_FORMAT, "divisibleby needs an argument");
            if (!arg_int(r, n, arg, "divisibleby argument", &d)) return false;
            if (d == 0) return rfail(r, n, HL_ERR_FORMAT, "integer division or modulo by zero");
            *res = d == -1 || x % d == 0;
        } else {
            *res = (x % 2 != 0) == (name[0] == 'o');
        }
    } else if (!strcmp(name, "sameas")) {
        *res = v.kind == arg.kind && (v.kind == TV_NONE || v.kind == TV_UNDEF ||
                                      (v.kind == TV_BOOL && v.u.b == arg.u.b) ||
                                      (v.kind != TV_BOOL && tv_equal(v, arg) &&
                                       (v.kind <= TV_FLOAT || memcmp(&v.u, &arg.u, sizeof v.u) == 0)));
    } else if (!strcmp(name, "filter") || !strcmp(name, "test")) {
        *res = arg.kind == TV_STR;
    } else {
        int op = -1;
        if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==")) op = CMP_EQ;
        else if (!strcmp(name, "ne") || !strcmp(name, "!=")) op = CMP_NE;
        else if (!strcmp(name, "lt") || !strcmp(name, "<")) op = CMP_LT;
        else if (!strcmp(name, "le") || !strcmp(name, "<=")) op = CMP_LE;
        else if (!strcmp(name, "gt") || !strcmp(name, ">")) op = CMP_GT;
        else if (!strcmp(name, "ge") || !strcmp(name, ">=")) op = CMP_GE;
        else if (!strcmp(name, "in")) op = CMP_IN;
        if (op < 0) return rfail(r, n, HL_ERR_FORMAT, "no test named '%s'", name);
        if (!npos) return rfail(r, n, HL_ERR_FORMAT, "test '%s' needs an argument", name);
        return compare(r, n, op, v, arg, res);
    }
    return true;
}

/* ---------- filters ---------- */

static const char *const filter_names[] = {"tojson", "length", "count", "trim", "string",
    "default", "d", "join", "items", "upper", "lower", "title", "capitalize", "safe", "dictsort",
    "list", "selectattr", "rejectattr", "select", "reject", "indent", "map", "replace", "int",
    "float", "abs", "round", "unique", "sort", "reverse", "first", "last", "escape", "e",
    "wordcount", "batch", "from_json", "sum", "min", "max", "attr", "center", "forceescape",
    NULL};

bool tmpl_filter_known(const char *name) {
    for (int i = 0; filter_names[i]; i++)
        if (!strcmp(filter_names[i], name)) return true;
    return false;
}

/* attribute lookup for selectattr/map/sort: "a.b" paths, integer parts as indexes */
static bool get_path(rctx *r, tnode *n, tval obj, tval attr, tval *out) {
    if (attr.kind != TV_STR) return get_item(r, n, obj, attr, out);
    const char *p = attr.u.s.p;
    size_t len = attr.u.s.n, i = 0;
    *out = obj;
    while (i <= len) {
        const char *dot = memchr(p + i, '.', len - i);
        size_t e = dot ? (size_t)(dot - p) : len;
        tval key = tv_str(p + i, e - i);
        bool digits = e > i;
        for (size_t k = i; k < e; k++)
            if (p[k] < '0' || p[k] > '9') digits = false;
        if (digits) key = tv_int(atoll(p + i));
        if (out->kind == TV_UNDEF) return true;
        if (!get_item(r, n, *out, key, out)) return false;
        if (!dot) break;
        i = e + 1;
    }
    return true;
}

static bool sort_key(rctx *r, tnode *n, tval v, tval attr, bool case_sensitive, tval *key) {
    if (attr.kind != ARG_MISSING && attr.kind != TV_NONE) {
        if (!get_path(r, n, v, attr, &v)) return false;
    }
    if (!case_sensitive && v.kind == TV_STR) return lower_str(r, v, key);
    *key = v;
    return true;
}

static bool lower_str(rctx *r, tval v, tval *out) { return case_map(r, NULL, v, 1, out); }

static bool sort_pairs(rctx *r, tnode *n, tval *keys, tval *vals, size_t cnt, bool reverse) {
    tval *tk = ta_alloc(&r->a, (cnt + 1) * sizeof(tval)), *tv = ta_alloc(&r->a, (cnt + 1) * sizeof(tval));
    if (!tk || !tv) return oom(r, n);
    sort_ctx sc = {r, true, reverse};
    merge_sort(&sc, keys, vals, tk, tv, cnt);
    if (!sc.ok) return rfail(r, n, HL_ERR_FORMAT, "'<' not supported between these sort keys");
    return true;
}

static bool select_common(rctx *r, tnode *n, frame *f, tval in, bool use_attr, bool want,
                          size_t npos, tval *pos, tval *out) {
    tlist *items, *res;
    if (!tv_truthy(in)) in = mk_list(tl_new(&r->a, 0)); /* jinja: `if value:` guards the loop */
    if (!in.u.l || !to_list(r, n, in, &items)) return r->failed ? false : oom(r, n);
    res = tl_new(&r->a, 0);
    if (!res) return oom(r, n);
    size_t k = 0;
    tval attr = tv_none();
    if (use_attr) {
        if (!npos) return rfail(r, n, HL_ERR_FORMAT, "missing attribute argument");
        attr = pos[k++];
    }
    const char *test = NULL;
    if (k < npos) {
        if (pos[k].kind != TV_STR) return rfail(r, n, HL_ERR_FORMAT, "test name must be a string");
        test = ta_strdup(&r->a, pos[k].u.s.p, pos[k].u.s.n);
        if (!tmpl_test_known(test)) return rfail(r, n, HL_ERR_FORMAT, "no test named '%s'", test);
        k++;
    }
    for (size_t i = 0; i < items->n; i++) {
        tval v = items->items[i];
        if (use_attr && !get_path(r, n, v, attr, &v)) return false;
        bool ok;
        if (test) {
            if (!apply_test(r, n, f, test, v, npos - k, pos + k, &ok)) return false;
        } else {
            ok = tv_truthy(v);
        }
        if (ok == want && !tl_push(&r->a, res, items->items[i])) return oom(r, n);
    }
    *out = mk_list(res);
    return true;
}

static bool do_indent(rctx *r, tnode *n, tval s, tval width, bool first, bool blank, tval *out) {
    tval ind;
    if (width.kind == TV_STR) ind = width;
    else {
        int64_t w = 4;
        if (width.kind != ARG_MISSING && !arg_int(r, n, width, "indent width", &w)) return false;
        if (w < 0) w = 0;
        if (w > 1000) return rfail(r, n, HL_ERR_INVALID, "indent width too large");
        char *sp = ta_alloc(&r->a, (size_t)w + 1);
        if (!sp) return oom(r, n);
        memset(sp, ' ', (size_t)w);
        ind = tv_str(sp, (size_t)w);
    }
    /* s += "\n"; lines = s.splitlines() */
    tlist *lines = tl_new(&r->a, 0);
    if (!lines) return oom(r, n);
    const char *p = s.u.s.p;
    size_t len = s.u.s.n, st = 0, i = 0;
    while (i <= len) {
        /* the virtual trailing "\n" */
        if (i == len) {
            if (!tl_push(&r->a, lines, tv_str(p + st, i - st))) return oom(r, n);
            break;
        }
        char c = p[i];
        size_t brk = 0;
        if (c == '\n' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) brk = 1;
        else if (c == '\r') brk = (i + 1 < len && p[i + 1] == '\n') ? 2 : 1;
        else if ((unsigned char)c == 0xC2 && i + 1 < len && (unsigned char)p[i + 1] == 0x85) brk = 2;
        else if ((unsigned char)c == 0xE2 && i + 2 < len && (unsigned char)p[i + 1] == 0x80 &&
                 ((unsigned char)p[i + 2] == 0xA8 || (unsigned char)p[i + 2] == 0xA9))
            brk = 3;
        if (brk) {
            if (!tl_push(&r->a, lines, tv_str(p + st, i - st))) return oom(r, n);
            i += brk;
            st = i;
        } else {
            i++;
        }
    }
    tval_buf b = {0};
    if (first && !tb_put(&r->a, &b, ind.u.s.p, ind.u.s.n)) return oom(r, n);
    for (size_t k = 0; k < lines->n; k++) {
        tval line = lines->items[k];
        if (k) {
            if (!tb_puts(&r->a, &b, "\n")) return oom(r, n);
            if ((blank || line.u.s.n) && !tb_put(&r->a, &b, ind.u.s.p, ind.u.s.n)) return oom(r, n);
        }
        if (!tb_put(&r->a, &b, line.u.s.p, line.u.s.n)) return oom(r, n);
        if (b.n > r->lim.max_output) return rfail(r, n, HL_ERR_INVALID, "indent result too large");
    }
    *out = tv_str(b.p ? b.p : "", b.n);
    return true;
}

static bool to_json_val(rctx *r, tnode *n, tval in, size_t npos, tval *pos, size_t nkw,
                        const char **kwn, tval *kwv, tval *out) {
    static const char *const ps[] = {"indent", "ensure_ascii", "separators", "sort_keys", NULL};
    tval a[4];
    if (!bind(r, n, "tojson", ps, npos, pos, nkw, kwn, kwv, a)) return false;
    int64_t indent = -1;
    if (present(a[0]) && a[0].kind != TV_NONE) {
        if (!arg_int(r, n, a[0], "tojson indent", &indent)) return false;
        if (indent < 0) indent = 0;
        if (indent > 100) return rfail(r, n, HL_ERR_INVALID, "tojson indent too large");
    }
    const char *item_sep = NULL, *key_sep = NULL;
    if (present(a[2]) && a[2].kind == TV_LIST && a[2].u.l->n == 2 &&
        a[2].u.l->items[0].kind == TV_STR && a[2].u.l->items[1].kind == TV_STR) {
        item_sep = ta_strdup(&r->a, a[2].u.l->items[0].u.s.p, a[2].u.l->items[0].u.s.n);
        key_sep = ta_strdup(&r->a, a[2].u.l->items[1].u.s.p, a[2].u.l->items[1].u.s.n);
    }
    bool ascii = present(a[1]) && tv_truthy(a[1]);
    bool sort = present(a[3]) && tv_truthy(a[3]);
    tval_buf b = {0};
    tval bad;
    int rc = tv_write_json(&r->a, &b, in, (int)indent, item_sep, key_sep, ascii, sort, 0, &bad);
    if (rc == -2) {
        if (bad.kind == TV_UNDEF) return fail_undef(r, n, bad);
        return rfail(r, n, HL_ERR_FORMAT, "Object of type %s is not JSON serializable",
                     tv_type_name(bad));
    }
    if (rc) return r->a.over ? oom(r, n) : rfail(r, n, HL_ERR_INVALID, "value too deeply nested for tojson");
    *out = tv_str(b.p ? b.p : "", b.n);
    return true;
}

static bool do_round(rctx *r, tnode *n, tval v, int64_t prec, const char *method, tval *out) {
    if (!is_num(v)) return rfail(r, n, HL_ERR_FORMAT, "type %s doesn't define __round__", tv_type_name(v));
    double x = num_of(v), m = pow(10.0, (double)prec), y;
    if (!strcmp(method, "common") && v.kind != TV_FLOAT) {
        *out = v.kind == TV_BOOL ? tv_int(v.u.b) : v; /* round(int, n) stays an int */
        return true;
    }
    if (!strcmp(method, "common")) {
        if (prec >= 0) {
            /* python rounds the exact binary value to prec decimals, half to even: that is
             * what printf's %.*f does; then back to the nearest double */
            size_t cap = 340 + (size_t)prec;
            char *buf = ta_alloc(&r->a, cap);
            if (!buf) return oom(r, n);
            snprintf(buf, cap, "%.*f", (int)prec, x);
            y = strtod(buf, NULL);
        } else {
            double q = x / pow(10.0, (double)-prec), fl = floor(q), diff = q - fl;
            if (diff > 0.5 || (diff == 0.5 && fmod(fl, 2) != 0)) fl += 1;
            y = fl * pow(10.0, (double)-prec);
            if (y == 0) y = copysign(0.0, x);
        }
    } else if (!strcmp(method, "ceil")) y = (ceil(x * m) + 0.0) / m; /* python: int, so no -0 */
    else if (!strcmp(method, "floor")) y = (floor(x * m) + 0.0) / m;
    else return rfail(r, n, HL_ERR_FORMAT, "method must be common, ceil or floor");
    *out = tv_float(y);
    return true;
}

static bool parse_int_str(tval s, int64_t base, int64_t *out) {
    char buf[80];
    tval t = do_strip(s, tv_none(), true, true);
    if (t.u.s.n == 0 || t.u.s.n >= sizeof buf) return false;
    size_t k = 0;
    for (size_t i = 0; i < t.u.s.n; i++)
        if (t.u.s.p[i] != '_') buf[k++] = t.u.s.p[i];
    buf[k] = 0;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, (int)base);
    if (*end || errno) return false;
    *out = v;
    return true;
}

static bool parse_float_str(tval s, double *out) {
    char buf[80];
    tval t = do_strip(s, tv_none(), true, true);
    if (t.u.s.n == 0 || t.u.s.n >= sizeof buf) return false;
    memcpy(buf, t.u.s.p, t.u.s.n);
    buf[t.u.s.n] = 0;
    char *end;
    double v = strtod(buf, &end);
    if (*end) return false;
    *out = v;
    return true;
}

static bool apply_filter(rctx *r, tnode *n, frame *f, const char *name, tval in, size_t npos,
                         tval *pos, size_t nkw, const char **kwn, tval *kwv, tval *out) {
    tval a[4];
    size_t work = in.kind == TV_STR ? in.u.s.n : in.kind == TV_LIST ? in.u.l->n * 8
                : in.kind == TV_DICT ? in.u.d->n * 8 : 0;
    if (!charge(r, n, work)) return false;
#define BIND(...)                                                                  \
    do {                                                                           \
        static const char *const ps_[] = {__VA_ARGS__, NULL};                      \
        if (!bind(r, n, name, ps_, npos, pos, nkw, kwn, kwv, a)) return false;     \
    } while (0)
    if (!strcmp(name, "tojson")) return to_json_val(r, n, in, npos, pos, nkw, kwn, kwv, out);
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        switch (in.kind) {
        case TV_UNDEF: *out = tv_int(0); return true;
        case TV_STR: *out = tv_int((int64_t)u8_len(in.u.s.p, in.u.s.n)); return true;
        case TV_LIST: *out = tv_int((int64_t)in.u.l->n); return true;
        case TV_DICT: *out = tv_int((int64_t)in.u.d->n); return true;
        default: return rfail(r, n, HL_ERR_FORMAT, "object of type '%s' has no len()", tv_type_name(in));
        }
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        BIND("default_value", "boolean");
        bool boolean = present(a[1]) && tv_truthy(a[1]);
        if (in.kind == TV_UNDEF || (boolean && !tv_truthy(in)))
            *out = present(a[0]) ? a[0] : tv_str("", 0);
        else
            *out = in;
        return true;
    }
    if (!strcmp(name, "safe")) {
        if (!to_str(r, n, in, out)) return false;
        out->safe = 1;
        return true;
    }
    if (!strcmp(name, "string")) {
        bool safe = in.kind == TV_STR && in.safe;
        if (!to_str(r, n, in, out)) return false;
        out->safe = safe;
        return true;
    }
    if (!strcmp(name, "escape") || !strcmp(name, "e") || !strcmp(name, "forceescape")) {
        if (name[0] == 'f') in.safe = 0;
        return html_escape(r, n, in, out);
    }
    if (!strcmp(name, "trim")) {
        BIND("chars");
        tval s;
        if (!to_str(r, n, in, &s)) return false;
        tval chars = present(a[0]) ? a[0] : tv_none();
        *out = do_strip(s, chars.kind == TV_STR ? chars : tv_none(), true, true);
        return true;
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") ||
        !strcmp(name, "capitalize")) {
        tval s;
        if (!to_str(r, n, in, &s)) return false;
        return case_map(r, n, s, name[0] == 'u' ? 0 : name[0] == 'l' ? 1 : name[0] == 't' ? 4 : 3, out);
    }
    if (!strcmp(name, "replace")) {
        BIND("old", "new", "count");
        tval s, o, nw;
        int64_t count = -1;
        if (!to_str(r, n, in, &s)) return false;
        if (!present(a[0]) || !present(a[1])) return rfail(r, n, HL_ERR_FORMAT, "replace needs old and new");
        if (!to_str(r, n, a[0], &o) || !to_str(r, n, a[1], &nw)) return false;
        if (present(a[2]) && a[2].kind != TV_NONE && !arg_int(r, n, a[2], "count", &count)) return false;
        return do_replace(r, n, s, o, nw, count, out);
    }
    if (!strcmp(name, "join")) {
        BIND("d", "attribute");
        tlist *items;
        if (!to_list(r, n, in, &items)) return false;
        tval sep = tv_str("", 0);
        if (present(a[0]) && !to_str(r, n, a[0], &sep)) return false;
        if (present(a[1]) && a[1].kind != TV_NONE)
            for (size_t i = 0; i < items->n; i++)
                if (!get_path(r, n, items->items[i], a[1], &items->items[i])) return false;
        return join_values(r, n, items, sep, out);
    }
    if (!strcmp(name, "items")) {
        if (in.kind == TV_UNDEF) {
            tlist *l = tl_new(&r->a, 0);
            if (!l) return oom(r, n);
            *out = mk_list(l);
            return true;
        }
        if (in.kind != TV_DICT && in.kind != TV_NS)
            return rfail(r, n, HL_ERR_FORMAT, "Can only get item pairs from a mapping.");
        return dict_items(r, n, in.u.d, out);
    }
    if (!strcmp(name, "dictsort")) {
        BIND("case_sensitive", "by", "reverse");
        if (in.kind != TV_DICT && in.kind != TV_NS)
            return rfail(r, n, HL_ERR_FORMAT, "dictsort: value must be a mapping, not '%s'", tv_type_name(in));
        bool cs = present(a[0]) && tv_truthy(a[0]);
        bool by_value = present(a[1]) && a[1].kind == TV_STR && a[1].u.s.n == 5 &&
                        !memcmp(a[1].u.s.p, "value", 5);
        if (present(a[1]) && !by_value && !(a[1].kind == TV_STR && a[1].u.s.n == 3 && !memcmp(a[1].u.s.p, "key", 3)))
            return rfail(r, n, HL_ERR_FORMAT, "You can only sort by either \"key\" or \"value\"");
        size_t cnt = in.u.d->n;
        tval *keys = ta_alloc(&r->a, (cnt + 1) * sizeof(tval)), *vals = ta_alloc(&r->a, (cnt + 1) * sizeof(tval));
        if (!keys || !vals) return oom(r, n);
        for (size_t i = 0; i < cnt; i++) {
            vals[i] = mk_pair(r, in.u.d->keys[i], in.u.d->vals[i]);
            if (!sort_key(r, n, by_value ? in.u.d->vals[i] : in.u.d->keys[i], tv_none(), cs, &keys[i]))
                return false;
        }
        if (r->a.over) return oom(r, n);
        if (!sort_pairs(r, n, keys, vals, cnt, present(a[2]) && tv_truthy(a[2]))) return false;
        tlist *l = tl_new(&r->a, cnt);
        if (!l) return oom(r, n);
        memcpy(l->items, vals, cnt * sizeof(tval));
        l->n = cnt;
        *out = mk_list(l);
        return true;
    }
    if (!strcmp(name, "list")) {
        tlist *l;
        if (!to_list(r, n, in, &l)) return false;
        *out = mk_list(l);
        return true;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        tlist *l;
        if (!to_list(r, n, in, &l)) return false;
        if (!l->n) *out = undef_fmt(r, "No %s item, sequence was empty.", name);
        else *out = l->items[name[0] == 'f' ? 0 : l->n - 1];
        return true;
    }
    if (!strcmp(name, "reverse")) {
        if (in.kind == TV_STR) {
            tval_buf b = {0};
            size_t cnt;
            size_t *off = u8_offsets(r, in.u.s.p, in.u.s.n, &cnt);
            for (size_t i = cnt; i-- > 0;) {
                size_t s = off ? off[i] : i, e = off ? off[i + 1] : i + 1;
                if (!tb_put(&r->a, &b, in.u.s.p + s, e - s)) return oom(r, n);
            }
            *out = tv_str(b.p ? b.p : "", b.n);
            return true;
        }
        tlist *l;
        if (!to_list(r, n, in, &l)) return false;
        for (size_t i = 0; i < l->n / 2; i++) {
            tval t = l->items[i];
            l->items[i] = l->items[l->n - 1 - i];
            l->items[l->n - 1 - i] = t;
        }
        *out = mk_list(l);
        return true;
    }
    if (!strcmp(name, "select") || !strcmp(name, "reject") || !strcmp(name, "selectattr") ||
        !strcmp(name, "rejectattr")) {
        if (nkw) return rfail(r, n, HL_ERR_FORMAT, "%s takes no keyword arguments", name);
        return select_common(r, n, f, in, strstr(name, "attr") != NULL, name[0] == 's', npos, pos, out);
    }
    if (!strcmp(name, "map")) {
        tlist *items, *res;
        if (!tv_truthy(in)) in = mk_list(tl_new(&r->a, 0));
        if (!in.u.l || !to_list(r, n, in, &items)) return r->failed ? false : oom(r, n);
        res = tl_new(&r->a, items->n);
        if (!res) return oom(r, n);
        tval attr = {0}, def = {0};
        attr.kind = def.kind = ARG_MISSING;
        for (size_t k = 0; k < nkw; k++) {
            if (!strcmp(kwn[k], "attribute")) attr = kwv[k];
            else if (!strcmp(kwn[k], "default")) def = kwv[k];
            else return rfail(r, n, HL_ERR_FORMAT, "map: unexpected keyword argument '%s'", kwn[k]);
        }
        if (present(attr)) {
            for (size_t i = 0; i < items->n; i++) {
                tval v;
                if (!get_path(r, n, items->items[i], attr, &v)) return false;
                if (v.kind == TV_UNDEF && present(def)) v = def;
                res->items[res->n++] = v;
            }
        } else {
            if (!npos || pos[0].kind != TV_STR)
                return rfail(r, n, HL_ERR_FORMAT, "map requires a filter name or attribute=");
            const char *fname = ta_strdup(&r->a, pos[0].u.s.p, pos[0].u.s.n);
            if (!fname) return oom(r, n);
            if (!tmpl_filter_known(fname)) return rfail(r, n, HL_ERR_FORMAT, "no filter named '%s'", fname);
            for (size_t i = 0; i < items->n; i++)
                if (!apply_filter(r, n, f, fname, items->items[i], npos - 1, pos + 1, 0, NULL, NULL,
                                  &res->items[res->n++]))
                    return false;
        }
        *out = mk_list(res);
        return true;
    }
    if (!strcmp(name, "sort") || !strcmp(name, "unique")) {
        bool is_sort = name[0] == 's';
        if (is_sort) BIND("reverse", "case_sensitive", "attribute");
        else {
            BIND("case_sensitive", "attribute");
            a[2] = a[1];
            a[1] = a[0];
            a[0].kind = ARG_MISSING;
        }
        tlist *items;
        if (!to_list(r, n, in, &items)) return false;
        bool cs = present(a[1]) && tv_truthy(a[1]);
        tval *keys = ta_alloc(&r->a, (items->n + 1) * sizeof(tval));
        if (!keys) return oom(r, n);
        for (size_t i = 0; i < items->n; i++)
            if (!sort_key(r, n, items->items[i], a[2], cs, &keys[i])) return false;
        if (is_sort) {
            if (!sort_pairs(r, n, keys, items->items, items->n, present(a[0]) && tv_truthy(a[0])))
                return false;
            *out = mk_list(items);
            return true;
        }
        tlist *res = tl_new(&r->a, items->n);
        if (!res) return oom(r, n);
        for (size_t i = 0; i < items->n; i++) {
            bool seen = false;
            for (size_t j = 0; j < i && !seen; j++) seen = tv_equal(keys[j], keys[i]);
            if (!seen) res->items[res->n++] = items->items[i];
        }
        *out = mk_list(res);
        return true;
    }
    if (!strcmp(name, "indent")) {
        BIND("width", "first", "blank");
        tval s;
        if (!to_str(r, n, in, &s)) return false;
        return do_indent(r, n, s, a[0], present(a[1]) && tv_truthy(a[1]),
                         present(a[2]) && tv_truthy(a[2]), out);
    }
    if (!strcmp(name, "int")) {
        BIND("default", "base");
        int64_t base = 10, iv;
        if (present(a[1]) && !arg_int(r, n, a[1], "base", &base)) return false;
        tval def = present(a[0]) ? a[0] : tv_int(0);
        double fv;
        if (in.kind == TV_INT) *out = in;
        else if (in.kind == TV_BOOL) *out = tv_int(in.u.b);
        else if (in.kind == TV_FLOAT) *out = isfinite(in.u.f) && fabs(in.u.f) < 9.2e18 ? tv_int((int64_t)in.u.f) : def;
        else if (in.kind == TV_STR && parse_int_str(in, base, &iv)) *out = tv_int(iv);
        else if (in.kind == TV_STR && parse_float_str(in, &fv) && isfinite(fv) && fabs(fv) < 9.2e18)
            *out = tv_int((int64_t)fv);
        else *out = def;
        return true;
    }
    if (!strcmp(name, "float")) {
        BIND("default");
        tval def = present(a[0]) ? a[0] : tv_float(0.0);
        double fv;
        if (is_num(in)) *out = tv_float(num_of(in));
        else if (in.kind == TV_STR && parse_float_str(in, &fv)) *out = tv_float(fv);
        else *out = def;
        return true;
    }
    if (!strcmp(name, "abs")) {
        if (in.kind == TV_INT) {
            if (in.u.i == INT64_MIN) return rfail(r, n, HL_ERR_FORMAT, "integer overflow in abs");
            *out = tv_int(in.u.i < 0 ? -in.u.i : in.u.i);
        } else if (in.kind == TV_BOOL) *out = tv_int(in.u.b);
        else if (in.kind == TV_FLOAT) *out = tv_float(fabs(in.u.f));
        else return rfail(r, n, HL_ERR_FORMAT, "bad operand type for abs(): '%s'", tv_type_name(in));
        return true;
    }
    if (!strcmp(name, "round")) {
        BIND("precision", "method");
        int64_t prec = 0;
        if (present(a[0]) && !arg_int(r, n, a[0], "precision", &prec)) return false;
        if (prec < -300 || prec > 300) return rfail(r, n, HL_ERR_FORMAT, "precision out of range");
        const char *method = "common";
        if (present(a[1])) {
            if (a[1].kind != TV_STR) return rfail(r, n, HL_ERR_FORMAT, "method must be a string");
            method = ta_strdup(&r->a, a[1].u.s.p, a[1].u.s.n);
        }
        return do_round(r, n, in, prec, method, out);
    }
    if (!strcmp(name, "wordcount")) {
        tval s;
        if (!to_str(r, n, in, &s)) return false;
        int64_t c = 0;
        bool inw = false;
        for (size_t i = 0; i < s.u.s.n;) {
            int32_t cp;
            i += u8_next(s.u.s.p, s.u.s.n, i, &cp);
            const utf8proc_property_t *pr = utf8proc_get_property(cp);
            bool w = (pr->category >= UTF8PROC_CATEGORY_LU && pr->category <= UTF8PROC_CATEGORY_NO) ||
                     cp == '_';
            if (w && !inw) c++;
            inw = w;
        }
        *out = tv_int(c);
        return true;
    }
    if (!strcmp(name, "batch")) {
        BIND("linecount", "fill_with");
        int64_t k;
        if (!present(a[0]) || !arg_int(r, n, a[0], "linecount", &k)) return present(a[0]) ? false : rfail(r, n, HL_ERR_FORMAT, "batch needs linecount");
        if (k <= 0) return rfail(r, n, HL_ERR_FORMAT, "batch linecount must be positive");
        tlist *items, *res = tl_new(&r->a, 0), *cur = NULL;
        if (!res || !to_list(r, n, in, &items)) return r->failed ? false : oom(r, n);
        for (size_t i = 0; i < items->n; i++) {
            if (!cur || (int64_t)cur->n == k) {
                cur = tl_new(&r->a, 0);
                if (!cur || !tl_push(&r->a, res, mk_list(cur))) return oom(r, n);
            }
            if (!tl_push(&r->a, cur, items->items[i])) return oom(r, n);
        }
        if (cur && present(a[1]) && a[1].kind != TV_NONE)
            while ((int64_t)cur->n < k)
                if (!tl_push(&r->a, cur, a[1])) return oom(r, n);
        *out = mk_list(res);
        return true;
    }
    if (!strcmp(name, "from_json")) {
        tval s;
        if (!to_str(r, n, in, &s)) return false;
        json_error_t je;
        json_t *j = json_loadb(s.u.s.p, s.u.s.n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!j) return rfail(r, n, HL_ERR_FORMAT, "from_json: invalid JSON: %s", je.text);
        bool ok = from_json(r, j, out, 0);
        json_decref(j);
        if (ok) return true;
        return r->a.over ? oom(r, n) : rfail(r, n, HL_ERR_INVALID, "from_json: value nested too deeply");
    }
    if (!strcmp(name, "sum")) {
        BIND("attribute", "start");
        tlist *items;
        if (!to_list(r, n, in, &items)) return false;
        tval acc = present(a[1]) ? a[1] : tv_int(0);
        for (size_t i = 0; i < items->n; i++) {
            tval v = items->items[i];
            if (present(a[0]) && a[0].kind != TV_NONE && !get_path(r, n, v, a[0], &v)) return false;
            if (!binop(r, n, '+', acc, v, &acc)) return false;
        }
        *out = acc;
        return true;
    }
    if (!strcmp(name, "min") || !strcmp(name, "max")) {
        BIND("case_sensitive", "attribute");
        tlist *items;
        if (!to_list(r, n, in, &items)) return false;
        if (!items->n) {
            *out = undef_fmt(r, "No aggregated item, sequence was empty.");
            return true;
        }
        bool cs = present(a[0]) && tv_truthy(a[0]);
        size_t best = 0;
        tval bk;
        if (!sort_key(r, n, items->items[0], a[1], cs, &bk)) return false;
        for (size_t i = 1; i < items->n; i++) {
            tval k;
            bool ok = true;
            if (!sort_key(r, n, items->items[i], a[1], cs, &k)) return false;
            int c = tv_cmp(k, bk, &ok);
            if (!ok) return rfail(r, n, HL_ERR_FORMAT, "values are not comparable");
            if (name[1] == 'i' ? c < 0 : c > 0) {
                best = i;
                bk = k;
            }
        }
        *out = items->items[best];
        return true;
    }
    if (!strcmp(name, "attr")) {
        if (npos != 1 || pos[0].kind != TV_STR) return rfail(r, n, HL_ERR_FORMAT, "attr needs a name");
        const char *nm = ta_strdup(&r->a, pos[0].u.s.p, pos[0].u.s.n);
        if (!nm) return oom(r, n);
        if (in.kind == TV_DICT) {
            *out = undef_attr(r, in, nm, pos[0].u.s.n);
            return true;
        }
        return get_attr(r, n, in, nm, pos[0].u.s.n, out);
    }
    if (!strcmp(name, "center")) {
        BIND("width");
        tval s;
        int64_t w = 80;
        if (!to_str(r, n, in, &s)) return false;
        if (present(a[0]) && !arg_int(r, n, a[0], "width", &w)) return false;
        if (w > 100000) return rfail(r, n, HL_ERR_INVALID, "center width too large");
        int64_t len = (int64_t)u8_len(s.u.s.p, s.u.s.n);
        if (w <= len) {
            *out = s;
            return true;
        }
        int64_t marg = w - len, left = marg / 2 + (marg & w & 1);
        tval_buf b = {0};
        for (int64_t i = 0; i < left; i++) if (!tb_puts(&r->a, &b, " ")) return oom(r, n);
        if (!tb_put(&r->a, &b, s.u.s.p, s.u.s.n)) return oom(r, n);
        for (int64_t i = 0; i < marg - left; i++) if (!tb_puts(&r->a, &b, " ")) return oom(r, n);
        *out = tv_str(b.p, b.n);
        return true;
    }
#undef BIND
    return rfail(r, n, HL_ERR_FORMAT, "no filter named '%s'", name);
}

/* Applies a filter chain parsed as N_FILTER nodes whose innermost input is NULL. */
static bool apply_chain(rctx *r, tnode *chain, frame *f, tval in, tval *out) {
    if (!chain) {
        *out = in;
        return true;
    }
    tval v;
    if (!apply_chain(r, chain->a, f, in, &v)) return false;
    tval *pos, *kwv;
    if (!eval_args(r, chain, f, &pos, &kwv)) return false;
    return apply_filter(r, chain, f, chain->str, v, chain->n, pos, chain->n_names, chain->names,
                        kwv, out);
}

/* ---------- statements ---------- */

static bool assign_targets(rctx *r, tnode *n, frame *f, const char **names, size_t cnt, tval v) {
    if (cnt == 1) return frame_set(r, f, names[0], v) ? true : oom(r, n);
    tlist *items;
    if (v.kind == TV_UNDEF) return fail_undef(r, n, v);
    if (!to_list(r, n, v, &items)) return false;
    if (items->n != cnt)
        return rfail(r, n, HL_ERR_FORMAT, "%s values to unpack (expected %zu, got %zu)",
                     items->n > cnt ? "too many" : "not enough", cnt, items->n);
    for (size_t i = 0; i < cnt; i++)
        if (!frame_set(r, f, names[i], items->items[i])) return oom(r, n);
    return true;
}

static exec_rc exec_for(rctx *r, tnode *n, frame *f) {
    tval seq;
    if (!eval(r, n->a, f, &seq)) return EX_ERR;
    tlist *items;
    if (seq.kind == TV_LIST) {
        items = seq.u.l; /* iterated live, like Python: appends in the body are visited */
    } else if (seq.kind == TV_DICT || seq.kind == TV_STR || seq.kind == TV_UNDEF) {
        if (!to_list(r, n, seq, &items)) return EX_ERR;
    } else {
        rfail(r, n, HL_ERR_FORMAT, "'%s' object is not iterable", tv_type_name(seq));
        return EX_ERR;
    }
    if (n->b) {
        /* loop filter: evaluated per item before the loop proper (loop.* sees the result) */
        tlist *kept = tl_new(&r->a, 0);
        if (!kept) return oom(r, n), EX_ERR;
        frame *lf = frame_new(r, f);
        if (!lf) return oom(r, n), EX_ERR;
        for (size_t i = 0; i < items->n; i++) {
            if (++r->iterations > r->lim.max_iterations) {
                rfail(r, n, HL_ERR_INVALID, "template exceeded %llu loop iterations",
                      (unsigned long long)r->lim.max_iterations);
                return EX_ERR;
            }
            tval c;
            lf->n = 0;
            if (!assign_targets(r, n, lf, n->names, n->n_names, items->items[i]))
                return r->failed ? EX_ERR : (oom(r, n), EX_ERR);
            if (!eval(r, n->b, lf, &c)) return EX_ERR;
            if (tv_truthy(c) && !tl_push(&r->a, kept, items->items[i])) return oom(r, n), EX_ERR;
        }
        items = kept;
    }
    if (items->n == 0) return exec_body(r, n->list2, n->n2, f);
    tloop *lp = ta_alloc(&r->a, sizeof *lp);
    if (!lp) return oom(r, n), EX_ERR;
    lp->items = items;
    tval loopv = {0};
    loopv.kind = TV_LOOP;
    loopv.u.loop = lp;
    /* one frame for all iterations, emptied each time (sets do not survive an iteration) */
    frame *lf = frame_new(r, f);
    if (!lf) return oom(r, n), EX_ERR;
    for (size_t i = 0; i < items->n; i++) {
        if (++r->iterations > r->lim.max_iterations) {
            rfail(r, n, HL_ERR_INVALID, "template exceeded %llu loop iterations",
                  (unsigned long long)r->lim.max_iterations);
            return EX_ERR;
        }
        lp->index = i;
        lf->n = 0;
        if (!frame_set(r, lf, "loop", loopv)) return oom(r, n), EX_ERR;
        if (!assign_targets(r, n, lf, n->names, n->n_names, items->items[i])) return EX_ERR;
        exec_rc rc = exec_body(r, n->list, n->n, lf);
        if (rc == EX_ERR) return EX_ERR;
        if (rc == EX_BREAK) break;
    }
    return EX_OK;
}

static exec_rc exec_stmt(rctx *r, tnode *n, frame *f) {
    switch (n->kind) {
    case N_TEXT: return emit(r, n, n->str, n->len) ? EX_OK : EX_ERR;
    case N_OUTPUT: {
        tval v, s;
        if (!eval(r, n->a, f, &v) || !to_str(r, n, v, &s)) return EX_ERR;
        return emit(r, n, s.u.s.p, s.u.s.n) ? EX_OK : EX_ERR;
    }
    case N_IF: {
        tval c;
        if (!eval(r, n->a, f, &c)) return EX_ERR;
        if (tv_truthy(c)) return exec_body(r, n->list, n->n, f);
        return exec_body(r, n->list2, n->n2, f);
    }
    case N_FOR: return exec_for(r, n, f);
    case N_SET: {
        tval v;
        if (!eval(r, n->a, f, &v)) return EX_ERR;
        if (n->op) {
            tval ns = lookup(r, f, n->str);
            if (ns.kind != TV_NS) {
                rfail(r, n, HL_ERR_FORMAT, "can only set attributes on namespace objects ('%s' is %s)",
                      n->str, ns.kind == TV_UNDEF ? "undefined" : tv_type_name(ns));
                return EX_ERR;
            }
            const char *attr = n->names[0];
            if (!td_set(&r->a, ns.u.d, mk_str(r, attr, strlen(attr)), v)) return oom(r, n), EX_ERR;
            return EX_OK;
        }
        return assign_targets(r, n, f, n->names, n->n_names, v) ? EX_OK : EX_ERR;
    }
    case N_SETBLOCK:
    case N_FILTERBLOCK: {
        tval_buf buf = {0}, *saved = r->out;
        r->out = &buf;
        exec_rc rc = exec_body(r, n->list, n->n, f);
        r->out = saved;
        if (rc == EX_ERR) return EX_ERR;
        tval v = tv_str(buf.p ? buf.p : "", buf.n);
        if (!apply_chain(r, n->b, f, v, &v)) return EX_ERR;
        if (n->kind == N_SETBLOCK) return frame_set(r, f, n->str, v) ? EX_OK : (oom(r, n), EX_ERR);
        tval s;
        if (!to_str(r, n, v, &s)) return EX_ERR;
        if (!emit(r, n, s.u.s.p, s.u.s.n)) return EX_ERR;
        return rc;
    }
    case N_MACRO: {
        tmacro *m = ta_alloc(&r->a, sizeof *m);
        if (!m) return oom(r, n), EX_ERR;
        m->def = n;
        m->closure = f;
        tval v = {0};
        v.kind = TV_MACRO;
        v.u.mac = m;
        return frame_set(r, f, n->str, v) ? EX_OK : (oom(r, n), EX_ERR);
    }
    case N_BREAK: return EX_BREAK;
    case N_CONTINUE: return EX_CONTINUE;
    case N_BLOCK: return exec_body(r, n->list, n->n, f);
    default: rfail(r, n, HL_ERR_FORMAT, "expression used as a statement"); return EX_ERR;
    }
}

static exec_rc exec_body(rctx *r, tnode **body, size_t nb, frame *f) {
    if (++r->depth > MAX_EVAL_DEPTH) {
        r->depth--;
        rfail(r, nb ? body[0] : NULL, HL_ERR_INVALID, "template evaluation nested too deeply");
        return EX_ERR;
    }
    exec_rc rc = EX_OK;
    for (size_t i = 0; i < nb; i++) {
        rc = exec_stmt(r, body[i], f);
        if (rc == EX_OK && (r->failed || r->a.over)) rc = EX_ERR;
        if (rc == EX_ERR && !r->failed) oom(r, body[i]);
        if (rc != EX_OK) break;
    }
    r->depth--;
    return rc;
}

/* ---------- entry points ---------- */

tmpl_limits tmpl_default_limits(void) {
    tmpl_limits l = {.max_output = 16u << 20, .max_memory = 256u << 20,
                     .max_iterations = 10000000, .max_call_depth = 200, .max_steps = 100000000};
    return l;
}

hl_status tmpl_render(const tmpl *t, const json_t *context, char **out, size_t *out_len,
                      hl_err *err) {
    tmpl_limits l = tmpl_default_limits();
    return tmpl_render_limited(t, context, &l, out, out_len, err);
}

tmpl_options tmpl_default_options(void) {
    tmpl_options o = {.limits = tmpl_default_limits()};
    return o;
}

hl_status tmpl_render_limited(const tmpl *t, const json_t *context, const tmpl_limits *limits,
                              char **out, size_t *out_len, hl_err *err) {
    tmpl_options o = tmpl_default_options();
    if (limits) o.limits = *limits;
    return tmpl_render_opts(t, context, &o, out, out_len, err);
}

hl_status tmpl_render_opts(const tmpl *t, const json_t *context, const tmpl_options *opts,
                           char **out, size_t *out_len, hl_err *err) {
    tmpl_options defaults = tmpl_default_options();
    if (!opts) opts = &defaults;
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!t) return hl_fail(err, HL_ERR_INVALID, "no template");
    if (context && !json_is_object(context))
        return hl_fail(err, HL_ERR_INVALID, "template context must be a JSON object");
    hl_err local;
    rctx r = {.lim = opts->limits, .opts = opts, .err = err ? err : &local};
    r.a.cap = r.lim.max_memory;
    tval_buf buf = {0};
    r.out = &buf;
    r.root = frame_new(&r, NULL);
    hl_status st = HL_OK;
    if (!r.root) {
        oom(&r, NULL);
    } else if (context) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)context, k, v) {
            tval tv;
            if (!from_json(&r, v, &tv, 0)) {
                if (r.a.over) oom(&r, NULL);
                else rfail(&r, NULL, HL_ERR_INVALID, "template context is nested too deeply");
                break;
            }
            const char *name = ta_strdup(&r.a, k, strlen(k));
            if (!name || !frame_set(&r, r.root, name, tv)) {
                oom(&r, NULL);
                break;
            }
        }
    }
    if (!r.failed) {
        exec_rc rc = exec_body(&r, t->body, t->n_body, r.root);
        if (rc == EX_ERR && !r.failed) oom(&r, NULL);
    }
    if (!r.failed) {
        char *s = malloc(buf.n + 1);
        if (!s) {
            oom(&r, NULL);
        } else {
            if (buf.n) memcpy(s, buf.p, buf.n);
            s[buf.n] = 0;
            *out = s;
            if (out_len) *out_len = buf.n;
        }
    }
    if (r.failed) st = r.err->code ? r.err->code : HL_ERR_FORMAT;
    ta_free_all(&r.a);
    return st;
}
