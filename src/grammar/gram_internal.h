/*
 * gram_internal.h - the compiled schema (a table of nodes) and the recognizer's state,
 * shared by schema.c (compiler), match.c (byte recognizer) and mask.c (trie and mask).
 */
#ifndef HL_GRAMMAR_INTERNAL_H
#define HL_GRAMMAR_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "grammar/grammar.h"

enum {
    GK_ANY,   /* any JSON value */
    GK_OBJ,
    GK_ARR,
    GK_STR,
    GK_NUM,   /* number; integer when `integer` */
    GK_LIT,   /* one of a sorted set of literal JSON texts (enum, const, true/false/null) */
    GK_ALT,   /* anyOf */
    GK_NEVER, /* nothing (false schema) */
};

#define GRAM_MAX_PROPS 64
#define GRAM_NODE_ANY 0     /* fixed nodes present in every schema */
#define GRAM_NODE_ANY_OBJ 1
#define GRAM_NODE_ANY_ARR 2
#define GRAM_NODE_ANY_STR 3
#define GRAM_NODE_ANY_NUM 4
#define GRAM_NODE_ANY_LIT 5 /* true, false, null */
#define GRAM_NODE_FIXED 6

typedef struct gram_lit {
    const char *s; /* for properties: the key as written, quotes included */
    uint32_t len;
    int32_t node;  /* properties: the value's node */
} gram_lit;

typedef struct gram_node {
    uint8_t kind;
    bool integer;
    bool has_lo, has_hi;     /* numbers: bounds on the integer part (see match.c) */
    int64_t lo, hi;          /* inclusive bounds on integers / on the integer part */
    int64_t flo, fhi;        /* ceil(minimum), floor(maximum): where fractions may go */
    bool frac_ok;            /* numbers with bounds: fractions allowed */
    uint32_t first, n;       /* OBJ: props (sorted); LIT: lits (sorted); ALT: alts */
    int32_t additional;      /* OBJ: node of extra properties, -1 none */
    uint64_t required;       /* OBJ: bit i = props[first + i] required */
    int32_t items;           /* ARR: node of the items */
    uint32_t min, max;       /* ARR: items; STR: characters */
    int32_t pattern;         /* STR: index into regexes, -1 none */
} gram_node;

/* A `pattern` (regex.c): bit k of a state set = byte state k; GRAM_RE_ACCEPT: the string
 * may end. next[k]: the set after a byte in cls[k]. */
#define GRAM_RE_ACCEPT (1ull << 63)
typedef struct gram_regex {
    uint8_t n;
    uint64_t start;
    uint64_t next[63];
    uint64_t cls[63][4];
} gram_regex;

/* false with a reason in why when the pattern is outside the supported subset */
bool gram_regex_compile(const char *pat, size_t len, gram_regex *re, char *why, size_t cap);
uint64_t gram_regex_step(const gram_regex *re, uint64_t set, uint8_t c);

struct gram_schema {
    gram_node *nodes;
    uint32_t n_nodes, cap_nodes;
    gram_lit *lits; /* props and literals */
    uint32_t n_lits, cap_lits;
    int32_t *alts;
    uint32_t n_alts, cap_alts;
    gram_regex *regexes;
    uint32_t n_regexes, cap_regexes;
    char **strs; /* owned literal texts */
    uint32_t n_strs, cap_strs;
    int32_t root;
};

/* ---- recognizer state ---- */

#define GRAM_MAX_DEPTH 24
#define GRAM_MAX_THREADS 16

typedef struct gframe {
    uint16_t node;
    uint8_t kind; /* FR_* */
    uint8_t st;
    uint8_t ws;   /* containers: whitespace run; strings: UTF-8 state */
    uint8_t flag;
    uint16_t pad;
    uint32_t a;
    uint64_t b;
} gframe;

typedef struct gthread {
    uint8_t depth;
    gframe f[GRAM_MAX_DEPTH];
} gthread;

typedef struct gstate {
    uint8_t gate;   /* GATE_* (thinking) */
    uint8_t gate_k; /* bytes of the open/close tag matched */
    uint8_t gate_ws;
    uint8_t n;      /* threads */
    bool bare;      /* GATE_CALL: no trigger_end, the output may end with the value */
    gthread t[GRAM_MAX_THREADS];
} gstate;

/* GATE_JSON: the value of a plain grammar; lazy ones (grammar.h) go GATE_FREE (free text,
 * gate_k: bytes of the trigger matched) -> GATE_CALL (a value) -> GATE_END (blanks and
 * trigger_end) -> GATE_FREE; GATE_MUST: the trigger must come now (trigger_now). */
enum { GATE_OPEN, GATE_THINK, GATE_JSON, GATE_FREE, GATE_CALL, GATE_END, GATE_MUST };

/* match.c */
void gram_state_init(const gram_schema *s, gstate *st, const gram_think *think);
/* dst = src after byte c; false when no thread survives (dst then undefined). */
bool gram_state_feed(const gram_schema *s, const gram_think *think, const gstate *src, uint8_t c,
                     gstate *dst);
bool gram_state_accepting(const gram_schema *s, const gstate *st);
bool gram_state_complete(const gram_schema *s, const gstate *st);
void gram_state_copy(gstate *dst, const gstate *src);
/* Characters in s when every byte is plain string content (no quote, backslash or control
 * byte; whole UTF-8 sequences only), else -1. */
int gram_plain_chars(const char *s, size_t n);
/* Whether the state is one thread inside a string whose content is free (no enum or
 * property names to follow); room: characters it may still take (UINT32_MAX: any). Then
 * a plain token's effect is only its character count. */
bool gram_state_free_string(const gram_schema *s, const gstate *st, uint32_t *room);

#endif
