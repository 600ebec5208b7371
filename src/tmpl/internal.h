/*
 * internal.h - the pieces shared by the template parser (parse.c), the value helpers
 * (value.c) and the renderer (render.c). Not for use outside src/tmpl/.
 *
 * Memory: everything (AST nodes, runtime values, intermediate strings) lives in an
 * arena. The compiled template owns one arena for its AST; each render makes its own
 * arena, with a byte cap, and frees it at the end; values never need freeing one by one.
 */
#ifndef HL_TMPL_INTERNAL_H
#define HL_TMPL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* ---- arena ---- */
typedef struct tarena_chunk tarena_chunk;
typedef struct tarena {
    tarena_chunk *head;
    size_t used_total; /* bytes handed out from malloc (chunks) */
    size_t cap;        /* 0 = unlimited */
    bool over;         /* an allocation hit the cap or malloc failed */
} tarena;

void *ta_alloc(tarena *a, size_t n); /* zeroed; NULL on cap/OOM (sets a->over) */
char *ta_strdup(tarena *a, const char *s, size_t n);
void ta_free_all(tarena *a);

/* ---- values ---- */
typedef enum tv_kind {
    TV_UNDEF, /* u.s holds the message an error about it would show */
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST,  /* lists and tuples */
    TV_DICT,
    TV_NS,    /* namespace(): a dict with attribute assignment */
    TV_MACRO,
    TV_BUILTIN, /* u.i: builtin function id */
    TV_METHOD,  /* a bound method: u.m */
    TV_LOOP,    /* the loop variable: u.loop */
} tv_kind;

typedef struct tlist tlist;
typedef struct tdict tdict;
typedef struct tmacro tmacro;
typedef struct tmethod tmethod;
typedef struct tloop tloop;

typedef struct tval {
    uint8_t kind;
    uint8_t safe;  /* a str marked safe (Markup) */
    uint8_t tuple; /* a list that is a tuple (repr only) */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        tlist *l;
        tdict *d;
        tmacro *mac;
        tmethod *m;
        tloop *loop;
    } u;
} tval;

struct tlist {
    tval *items;
    size_t n, cap;
};

struct tdict {
    tval *keys, *vals;
    size_t n, cap;
};

struct tmethod {
    tval self;
    const char *name;
};

typedef struct tval_buf {
    char *p;
    size_t n, cap;
} tval_buf;

static inline tval tv_none(void) { tval v = {0}; v.kind = TV_NONE; return v; }
static inline tval tv_bool(bool b) { tval v = {0}; v.kind = TV_BOOL; v.u.b = b; return v; }
static inline tval tv_int(int64_t i) { tval v = {0}; v.kind = TV_INT; v.u.i = i; return v; }
static inline tval tv_float(double f) { tval v = {0}; v.kind = TV_FLOAT; v.u.f = f; return v; }
static inline tval tv_str(const char *p, size_t n) {
    tval v = {0};
    v.kind = TV_STR;
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
static inline tval tv_undef(const char *msg) {
    tval v = {0};
    v.kind = TV_UNDEF;
    v.u.s.p = msg;
    v.u.s.n = msg ? __builtin_strlen(msg) : 0;
    return v;
}

tlist *tl_new(tarena *a, size_t cap);
bool tl_push(tarena *a, tlist *l, tval v);
tdict *td_new(tarena *a, size_t cap);
/* Inserts or replaces (keeps the first insertion's position). */
bool td_set(tarena *a, tdict *d, tval key, tval val);
tval *td_get(const tdict *d, tval key);
tval *td_get_str(const tdict *d, const char *k, size_t n);

bool tv_truthy(tval v);
bool tv_equal(tval a, tval b);
const char *tv_type_name(tval v); /* python's type name: 'str', 'int', 'dict'... */

/* Growable text in the arena. */
bool tb_put(tarena *a, tval_buf *b, const char *s, size_t n);
static inline bool tb_puts(tarena *a, tval_buf *b, const char *s) {
    return tb_put(a, b, s, __builtin_strlen(s));
}
/* str(v) and repr(v) as Python prints them (false = out of memory / too deep). */
bool tv_write_str(tarena *a, tval_buf *b, tval v, int depth);
bool tv_write_repr(tarena *a, tval_buf *b, tval v, int depth);
void tv_format_float(double f, char *out, size_t cap); /* python repr(float) */

/* json.dumps: indent < 0 = none; item_sep/key_sep NULL = the defaults.
 * Returns 0, or -1 out of memory / too deep, or -2 with *bad set to a value that is not
 * JSON serializable. */
int tv_write_json(tarena *a, tval_buf *b, tval v, int indent, const char *item_sep,
                  const char *key_sep, bool ensure_ascii, bool sort_keys, int level,
                  tval *bad);

/* ---- AST ---- */
typedef enum tnode_kind {
    /* expressions */
    N_CONST,   /* val */
    N_NAME,    /* str */
    N_ATTR,    /* a . str */
    N_ITEM,    /* a [ b ] */
    N_SLICE,   /* a [ b : c : d ] (any of b, c, d may be NULL) */
    N_CALL,    /* a ( list ; names/list2 kwargs ) */
    N_FILTER,  /* a | str ( list ; kwargs ); a NULL in a filter block */
    N_TEST,    /* a is [not] str ( list ); op = negated */
    N_NEG,     /* - a */
    N_POS,     /* + a */
    N_NOT,     /* not a */
    N_AND,
    N_OR,
    N_BINOP,   /* a op b: op is a char: + - * / % ~ and 'f' (//) 'p' (**) */
    N_COMPARE, /* a then (ops[i], list[i])...: chain */
    N_COND,    /* b if a else c (c may be NULL) */
    N_LIST,
    N_TUPLE,
    N_DICT,    /* list = keys, list2 = values */
    /* statements */
    N_TEXT,    /* str */
    N_OUTPUT,  /* {{ a }} */
    N_IF,      /* if a: list else list2 */
    N_FOR,     /* names (targets) in a [if b]: list else list2 */
    N_SET,     /* names (targets, or str = namespace var + names[0] attr when op) = a */
    N_SETBLOCK,/* str = body list, with optional filter chain b (a N_FILTER chain) */
    N_MACRO,   /* str ( names = defaults list2 ): list */
    N_BREAK,
    N_CONTINUE,
    N_FILTERBLOCK, /* b: filter chain applied to the body list */
    N_BLOCK,   /* a body with no effect ({% generation %}) */
} tnode_kind;

/* compare ops */
enum { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

typedef struct tnode tnode;
struct tnode {
    uint8_t kind;
    int op;
    int line;
    tnode *a, *b, *c, *d;
    tnode **list;
    size_t n;
    tnode **list2;
    size_t n2;
    const char **names; /* NUL-terminated names (targets, params, kwarg names) */
    size_t n_names;
    int *ops;
    const char *str;
    size_t len;
    tval val;
};

struct tmpl {
    tarena arena;
    tnode **body;
    size_t n_body;
};

/* The filter and test names render.c implements. An unknown one is an error only when it
 * is evaluated: jinja 3.1 also defers it when it sits in a conditional branch, and real
 * templates do use extension filters (from_json) in branches rarely taken. */
bool tmpl_filter_known(const char *name);
bool tmpl_test_known(const char *name);

#define TMPL_MAX_NEST 200 /* parser nesting (brackets, blocks) */

#endif
