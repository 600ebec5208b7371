/* match.c - the byte-level recognizer (gram_internal.h): a set of up to GRAM_MAX_THREADS
 * pushdown stacks, one per live reading of the text so far (anyOf branches, a literal
 * that may end or go on); a byte advances every thread and identical ones merge. */
#include <stddef.h>
#include <string.h>

#include "grammar/gram_internal.h"

enum { FR_ROOT, FR_OBJ, FR_KEY, FR_ARR, FR_STR, FR_NUM, FR_LIT };
enum { R_START, R_DONE };
enum { O_OPEN, O_NEXT, O_COLON, O_VALUE, O_AFTER };
enum { A_FIRST, A_VALUE, A_AFTER };
enum { L_BODY, L_ESC, L_HEX0 }; /* L_HEX0 + k: k hex digits read */
enum { N_START, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

#define PROP_EXTRA 0xFFFFFFFFu
#define KEY_ESCAPED 1 /* FR_KEY flag: an escape was used (the key must stay a known name) */
#define HEX_D 2       /* FR_STR/FR_KEY flag: the \u escape began with D (no surrogates) */
#define NUM_NEG 1
#define INT_DIGITS 18 /* an int64 for every parser */
#define BOUNDED_DIGITS 18
#define FRAC_DIGITS 20
#define EXP_DIGITS 3
#define MAX_NEST 48 /* anyOf/$ref chains followed at one value start */

typedef struct mctx {
    const gram_schema *s;
    gstate *dst;
} mctx;

static bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

static void commit(mctx *m, const gthread *t) {
    gstate *d = m->dst;
    size_t sz = (size_t)t->depth * sizeof(gframe);
    for (uint8_t i = 0; i < d->n; i++)
        if (d->t[i].depth == t->depth && !memcmp(d->t[i].f, t->f, sz)) return;
    if (d->n == GRAM_MAX_THREADS) return; /* dropping a reading only narrows the language */
    d->t[d->n].depth = t->depth;
    memcpy(d->t[d->n].f, t->f, sz);
    d->n++;
}

static void copy_thread(gthread *dst, const gthread *src) {
    dst->depth = src->depth;
    memcpy(dst->f, src->f, (size_t)src->depth * sizeof(gframe));
}

static gframe *push(gthread *t, uint8_t kind, int32_t node) {
    if (t->depth >= GRAM_MAX_DEPTH) return NULL;
    gframe *f = &t->f[t->depth++];
    memset(f, 0, sizeof *f);
    f->kind = kind;
    f->node = (uint16_t)node;
    return f;
}

/* The top frame's value is complete: pop it and move its container on. */
static void value_done(const gram_schema *s, gthread *t) {
    t->depth--;
    gframe *p = &t->f[t->depth - 1];
    p->ws = 0;
    switch (p->kind) {
    case FR_ROOT: p->st = R_DONE; break;
    case FR_OBJ:
        if (p->a < s->nodes[p->node].n) p->b |= 1ull << p->a;
        p->st = O_AFTER;
        break;
    case FR_ARR:
        p->a++;
        p->st = A_AFTER;
        break;
    default: break;
    }
}

static void step(mctx *m, gthread *t, uint8_t c);
static bool value_accepting(const gram_schema *s, const gstate *st);
static bool value_complete(const gstate *st);

/* ---- numbers ---- */

static int64_t pow10i(int k) {
    int64_t p = 1;
    while (k-- > 0) p *= 10;
    return p;
}

/* Whether some integer written with this sign and these leading digits (v, nd of them)
 * lies in the node's bounds. */
static bool int_feasible(const gram_node *n, bool neg, int64_t v, int nd) {
    if (!n->has_lo && !n->has_hi) return true;
    int64_t lo = n->has_lo ? n->lo : INT64_MIN, hi = n->has_hi ? n->hi : INT64_MAX;
    if (nd == 0) return neg ? lo <= 0 : hi >= 0;
    if (v == 0) return lo <= 0 && hi >= 0; /* "0" and "-0" end there */
    for (int k = 0; nd + k <= BOUNDED_DIGITS; k++) {
        int64_t p = pow10i(k);
        int64_t a = v * p, b = (v + 1) * p - 1; /* every value with this prefix and k more digits */
        if (neg) {
            int64_t t = -b;
            b = -a;
            a = t;
        }
        if (a <= hi && b >= lo) return true;
        if (v > 900000000000000000 / (p * 10)) break;
    }
    return false;
}

static bool int_in(const gram_node *n, bool neg, int64_t v) {
    int64_t x = neg ? -v : v;
    return (!n->has_lo || x >= n->lo) && (!n->has_hi || x <= n->hi);
}

/* A fraction after the integer part v is allowed only when every value it can give
 * lies inside the bounds: [v, v + 1) for a positive number, (-v - 1, -v] for a negative
 * one (lo/hi are the integer bounds, flo/fhi the real ones rounded inwards). */
static bool frac_allowed(const gram_node *n, bool neg, int64_t v) {
    if (n->integer) return false;
    if (neg) return (!n->has_lo || -v - 1 >= n->flo) && (!n->has_hi || -v <= n->hi);
    return (!n->has_lo || v >= n->lo) && (!n->has_hi || v + 1 <= n->fhi);
}

static bool num_bounded(const gram_node *n) { return n->has_lo || n->has_hi; }

static bool num_accepting(const gram_schema *s, const gframe *f) {
    const gram_node *n = &s->nodes[f->node];
    switch (f->st) {
    case N_ZERO:
    case N_INT: return int_in(n, f->flag & NUM_NEG, (int64_t)f->b);
    case N_FRAC:
    case N_EXP: return true;
    default: return false;
    }
}

static void num_step(mctx *m, gthread *t, uint8_t c) {
    gframe *f = &t->f[t->depth - 1];
    const gram_node *n = &m->s->nodes[f->node];
    bool neg = f->flag & NUM_NEG;
    int cap = num_bounded(n) ? BOUNDED_DIGITS : INT_DIGITS;
    switch (f->st) {
    case N_START:
        if (c == '-') {
            if (!int_feasible(n, true, 0, 0)) return;
            f->flag |= NUM_NEG;
            f->st = N_MINUS;
            break;
        }
        /* fall through */
    case N_MINUS:
        if (!is_digit(c) || !int_feasible(n, neg, c - '0', 1)) return;
        f->st = c == '0' ? N_ZERO : N_INT;
        f->a = 1;
        f->b = (uint64_t)(c - '0');
        break;
    case N_ZERO:
    case N_INT:
        if (is_digit(c) && f->st == N_INT) {
            int64_t v = (int64_t)f->b * 10 + (c - '0');
            if ((int)f->a >= cap || !int_feasible(n, neg, v, (int)f->a + 1)) return;
            f->b = (uint64_t)v;
            f->a++;
            break;
        }
        if (c == '.') {
            if (!frac_allowed(n, neg, (int64_t)f->b)) return;
            f->st = N_DOT;
            break;
        }
        if ((c == 'e' || c == 'E') && !n->integer && !num_bounded(n)) {
            f->st = N_E;
            break;
        }
        goto end;
    case N_DOT:
        if (!is_digit(c)) return;
        f->st = N_FRAC;
        f->a = 1;
        break;
    case N_FRAC:
        if (is_digit(c)) {
            if (f->a >= FRAC_DIGITS) return;
            f->a++;
            break;
        }
        if ((c == 'e' || c == 'E') && !num_bounded(n)) {
            f->st = N_E;
            break;
        }
        goto end;
    case N_E:
        if (c == '+' || c == '-') {
            f->st = N_ESIGN;
            break;
        }
        /* fall through */
    case N_ESIGN:
        if (!is_digit(c)) return;
        f->st = N_EXP;
        f->a = 1;
        break;
    case N_EXP:
        if (is_digit(c)) {
            if (f->a >= EXP_DIGITS) return;
            f->a++;
            break;
        }
        goto end;
    default: return;
    }
    commit(m, t);
    return;
end: /* the byte after a number belongs to its container */
    if (!num_accepting(m->s, f)) return;
    value_done(m->s, t);
    step(m, t, c);
}

/* ---- literals (enum, const, true/false/null) ---- */

static void lit_step(mctx *m, gthread *t, uint8_t c) {
    gframe *f = &t->f[t->depth - 1];
    const gram_lit *L = m->s->lits;
    uint32_t pos = f->a, lo = (uint32_t)f->b, hi = (uint32_t)(f->b >> 32);
    bool can_end = false;
    uint32_t nlo = hi, nhi = hi;
    for (uint32_t i = lo; i < hi; i++) {
        if (L[i].len == pos) can_end = true;
        else if ((uint8_t)L[i].s[pos] == c) {
            if (nlo == hi) nlo = i;
            nhi = i + 1;
        }
    }
    if (can_end && pos > 0) { /* a number such as 1 in [1, 12]: the byte may end it */
        gthread e;
        copy_thread(&e, t);
        value_done(m->s, &e);
        step(m, &e, c);
    }
    if (nlo == nhi) return;
    f->a = pos + 1;
    f->b = (uint64_t)nlo | (uint64_t)nhi << 32;
    if (nhi - nlo == 1 && L[nlo].len == pos + 1) value_done(m->s, t); /* nothing longer */
    commit(m, t);
}

static bool lit_accepting(const gram_schema *s, const gframe *f) {
    uint32_t lo = (uint32_t)f->b, hi = (uint32_t)(f->b >> 32);
    for (uint32_t i = lo; i < hi; i++)
        if (s->lits[i].len == f->a && f->a > 0) return true;
    return false;
}

/* ---- strings and keys ---- */

enum { LEX_REJECT = -1, LEX_CONTENT = 0, LEX_QUOTE = 1 };

/* One byte of a string body; *nchar = 1 when it starts a character. UTF-8 state lives in
 * f->ws: pending continuation bytes (bits 0-1) and the range of the next one (bits 2-4). */
static int lex(gframe *f, uint8_t c, int *nchar) {
    *nchar = 0;
    if (f->st == L_ESC) {
        if (c == 'u') f->st = L_HEX0;
        else if (c && strchr("\"\\/bfnrt", c)) f->st = L_BODY;
        else return LEX_REJECT;
        return LEX_CONTENT;
    }
    if (f->st >= L_HEX0) {
        bool hex = is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
        if (!hex) return LEX_REJECT;
        int k = f->st - L_HEX0;
        if (k == 0) f->flag = (uint8_t)((f->flag & ~HEX_D) | ((c | 0x20) == 'd' ? HEX_D : 0));
        if (k == 1 && (f->flag & HEX_D) && (is_digit(c) ? c >= '8' : true)) return LEX_REJECT;
        f->st = k == 3 ? L_BODY : (uint8_t)(f->st + 1);
        return LEX_CONTENT;
    }
    uint8_t pend = f->ws & 3, rng = f->ws >> 2;
    if (pend) {
        static const uint8_t lo[] = {0x80, 0xA0, 0x80, 0x90, 0x80};
        static const uint8_t hi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
        if (c < lo[rng] || c > hi[rng]) return LEX_REJECT;
        f->ws = (uint8_t)(pend - 1);
        return LEX_CONTENT;
    }
    if (c == '"') return LEX_QUOTE;
    *nchar = 1;
    if (c == '\\') {
        f->st = L_ESC;
        return LEX_CONTENT;
    }
    if (c < 0x20) return LEX_REJECT;
    if (c < 0x80) return LEX_CONTENT;
    if (c >= 0xC2 && c <= 0xDF) f->ws = 1;
    else if (c == 0xE0) f->ws = 2 | 1 << 2;
    else if (c == 0xED) f->ws = 2 | 2 << 2;
    else if (c >= 0xE1 && c <= 0xEF) f->ws = 2;
    else if (c == 0xF0) f->ws = 3 | 3 << 2;
    else if (c >= 0xF1 && c <= 0xF3) f->ws = 3;
    else if (c == 0xF4) f->ws = 3 | 4 << 2;
    else return LEX_REJECT;
    return LEX_CONTENT;
}

static bool in_body(const gframe *f) { return f->st == L_BODY && (f->ws & 3) == 0; }

/* b: the pattern's state set (regex.c), strings under a pattern have no escapes */
static void str_step(mctx *m, gthread *t, uint8_t c) {
    gframe *f = &t->f[t->depth - 1];
    const gram_node *n = &m->s->nodes[f->node];
    const gram_regex *re = n->pattern >= 0 ? &m->s->regexes[n->pattern] : NULL;
    int nc;
    if (re && c == '\\') return;
    int r = lex(f, c, &nc);
    if (r == LEX_REJECT) return;
    if (r == LEX_QUOTE) {
        if (f->a < n->min || (re && !(f->b & GRAM_RE_ACCEPT))) return;
        value_done(m->s, t);
    } else {
        if (nc) {
            if (f->a >= n->max) return;
            f->a++;
        }
        if (re && !(f->b = gram_regex_step(re, f->b, c))) return;
    }
    commit(m, t);
}

static void key_step(mctx *m, gthread *t, uint8_t c) {
    gframe *f = &t->f[t->depth - 1];
    gframe *obj = &t->f[t->depth - 2];
    const gram_node *n = &m->s->nodes[f->node];
    const gram_lit *P = m->s->lits + n->first;
    uint32_t pos = f->a, lo = (uint32_t)f->b, hi = (uint32_t)(f->b >> 32);
    bool was_body = in_body(f);
    int nc;
    int r = lex(f, c, &nc);
    if (r == LEX_REJECT) return;
    if (r == LEX_QUOTE) {
        uint32_t idx = PROP_EXTRA;
        for (uint32_t i = lo; i < hi; i++)
            if (P[i].len == pos) idx = i;
        if (idx != PROP_EXTRA) {
            if (obj->b >> idx & 1) return; /* no duplicate keys */
        } else if (n->additional < 0 || (f->flag & KEY_ESCAPED)) {
            return;
        }
        t->depth--;
        obj->a = idx;
        obj->st = O_COLON;
        obj->ws = 0;
        commit(m, t);
        return;
    }
    uint32_t nlo = hi, nhi = hi;
    bool unseen = false;
    for (uint32_t i = lo; i < hi; i++)
        if (P[i].len > pos && (uint8_t)P[i].s[pos] == c) {
            if (nlo == hi) nlo = i;
            nhi = i + 1;
            if (!(obj->b >> i & 1)) unseen = true;
        }
    /* an escaped key could spell a known name another way: only while it follows one */
    if (c == '\\' && was_body && n->n > 0) f->flag |= KEY_ESCAPED;
    if (!unseen && (n->additional < 0 || (f->flag & KEY_ESCAPED))) return;
    if (nlo == nhi) nlo = nhi = 0;
    f->a = pos + 1;
    f->b = (uint64_t)nlo | (uint64_t)nhi << 32;
    commit(m, t);
}

/* ---- values and containers ---- */

static void start_value(mctx *m, gthread *t, int32_t node, uint8_t c, int nest) {
    const gram_schema *s = m->s;
    const gram_node *n = &s->nodes[node];
    if (nest > MAX_NEST) return;
    switch (n->kind) {
    case GK_ALT:
        if (n->n == 1) {
            start_value(m, t, s->alts[n->first], c, nest + 1);
            return;
        }
        for (uint32_t i = 0; i < n->n; i++) {
            gthread b;
            copy_thread(&b, t);
            start_value(m, &b, s->alts[n->first + i], c, nest + 1);
        }
        return;
    case GK_ANY: {
        int32_t k = c == '{'   ? GRAM_NODE_ANY_OBJ
                    : c == '[' ? GRAM_NODE_ANY_ARR
                    : c == '"' ? GRAM_NODE_ANY_STR
                    : c == '-' || is_digit(c) ? GRAM_NODE_ANY_NUM
                    : c == 't' || c == 'f' || c == 'n' ? GRAM_NODE_ANY_LIT : -1;
        if (k >= 0) start_value(m, t, k, c, nest + 1);
        return;
    }
    case GK_OBJ:
        if (c != '{' || !push(t, FR_OBJ, node)) return;
        break;
    case GK_ARR: {
        if (c != '[') return;
        if (!push(t, FR_ARR, node)) return;
        break;
    }
    case GK_STR: {
        gframe *f = c == '"' ? push(t, FR_STR, node) : NULL;
        if (!f) return;
        if (n->pattern >= 0) f->b = s->regexes[n->pattern].start;
        break;
    }
    case GK_NUM:
        if (!push(t, FR_NUM, node)) return;
        num_step(m, t, c);
        return;
    case GK_LIT: {
        gframe *f = push(t, FR_LIT, node);
        if (!f) return;
        f->b = (uint64_t)n->first | (uint64_t)(n->first + n->n) << 32;
        lit_step(m, t, c);
        return;
    }
    default: return; /* GK_NEVER */
    }
    commit(m, t);
}

static bool key_possible(const gram_schema *s, const gframe *f) {
    const gram_node *n = &s->nodes[f->node];
    uint64_t all = n->n >= 64 ? ~0ull : (1ull << n->n) - 1;
    return n->additional >= 0 || (all & ~f->b) != 0;
}

static bool obj_may_close(const gram_schema *s, const gframe *f) {
    return (s->nodes[f->node].required & ~f->b) == 0;
}

static void step(mctx *m, gthread *t, uint8_t c) {
    const gram_schema *s = m->s;
    gframe *f = &t->f[t->depth - 1];
    switch (f->kind) {
    case FR_STR: str_step(m, t, c); return;
    case FR_KEY: key_step(m, t, c); return;
    case FR_NUM: num_step(m, t, c); return;
    case FR_LIT: lit_step(m, t, c); return;
    default: break;
    }
    /* between tokens of a container: whitespace as llama.cpp's JSON grammars allow it,
     * one space or a newline and at most GRAM_WS_MAX blanks of indentation (ws: 0 none
     * yet, 1 a space, 2 + k a newline and k blanks) */
    if (f->kind == FR_ROOT && f->st == R_DONE) return;
    if (is_ws(c)) {
        if (f->ws == 0 && (c == ' ' || c == '\n')) f->ws = c == ' ' ? 1 : 2;
        else if (f->ws >= 2 && (c == ' ' || c == '\t') && f->ws - 2 < GRAM_WS_MAX) f->ws++;
        else return;
        commit(m, t);
        return;
    }
    f->ws = 0;
    const gram_node *n = &s->nodes[f->node];
    switch (f->kind) {
    case FR_ROOT: start_value(m, t, s->root, c, 0); return;
    case FR_OBJ:
        switch (f->st) {
        case O_OPEN:
        case O_AFTER:
            if (c == '}') {
                if (!obj_may_close(s, f)) return;
                value_done(s, t);
                break;
            }
            if (f->st == O_AFTER) {
                if (c != ',' || !key_possible(s, f)) return;
                f->st = O_NEXT;
                break;
            }
            /* fall through */
        case O_NEXT: {
            if (c != '"' || !key_possible(s, f)) return;
            gframe *k = push(t, FR_KEY, f->node);
            if (!k) return;
            k->b = (uint64_t)n->n << 32;
            break;
        }
        case O_COLON:
            if (c != ':') return;
            f->st = O_VALUE;
            break;
        case O_VALUE:
            start_value(m, t, f->a == PROP_EXTRA ? n->additional : s->lits[n->first + f->a].node,
                        c, 0);
            return;
        default: return;
        }
        break;
    case FR_ARR:
        if (c == ']' && f->st != A_VALUE) {
            if (f->a < n->min) return;
            value_done(s, t);
            break;
        }
        if (f->st == A_AFTER) {
            if (c != ',' || f->a >= n->max) return;
            f->st = A_VALUE;
            break;
        }
        if (f->a >= n->max) return;
        start_value(m, t, n->items, c, 0);
        return;
    default: return;
    }
    commit(m, t);
}

/* ---- state ---- */

void gram_state_copy(gstate *dst, const gstate *src) {
    dst->gate = src->gate;
    dst->gate_k = src->gate_k;
    dst->gate_ws = src->gate_ws;
    dst->bare = src->bare;
    dst->n = src->n;
    for (uint8_t i = 0; i < src->n; i++) copy_thread(&dst->t[i], &src->t[i]);
}

static bool lazy(const gram_think *think) { return think && think->trigger && *think->trigger; }

/* Where the output goes after the thinking part. */
static uint8_t after_think(const gram_think *think) {
    return !lazy(think) ? GATE_JSON : think->trigger_now ? GATE_MUST : GATE_FREE;
}

void gram_state_init(const gram_schema *s, gstate *st, const gram_think *think) {
    (void)s;
    memset(st, 0, offsetof(gstate, t));
    st->n = 1;
    st->t[0].depth = 1;
    memset(&st->t[0].f[0], 0, sizeof(gframe));
    st->t[0].f[0].kind = FR_ROOT;
    st->gate = after_think(think);
    if (think && think->close && *think->close) {
        if (think->in_think) st->gate = GATE_THINK;
        else if (think->open && *think->open) st->gate = GATE_OPEN;
    }
}

static void reset_threads(gstate *st) {
    st->n = 1;
    st->t[0].depth = 1;
    memset(&st->t[0].f[0], 0, sizeof(gframe));
    st->t[0].f[0].kind = FR_ROOT;
}

/* The length of the longest prefix of pat that ends the text matched so far (k bytes of
 * pat) followed by c: how far a search for pat has come. */
static uint8_t scan(const char *pat, uint8_t k, uint8_t c) {
    if ((uint8_t)pat[k] == c) return (uint8_t)(k + 1);
    for (uint8_t j = k; j > 0; j--) { /* a shorter prefix: pat[k-j+1..k) c == pat[0..j) */
        if ((uint8_t)pat[j - 1] != c) continue;
        if (!memcmp(pat, pat + k - j + 1, (size_t)j - 1)) return j;
    }
    return 0;
}

/* Free text of a lazy grammar: one byte (the state is GATE_FREE in dst). */
static void free_step(const gram_think *think, gstate *dst, uint8_t c) {
    dst->gate_k = scan(think->trigger, dst->gate_k, c);
    if (think->trigger[dst->gate_k] == 0) {
        dst->gate = GATE_CALL;
        dst->gate_k = 0;
        dst->gate_ws = 0;
        dst->bare = !think->trigger_end || !*think->trigger_end;
        reset_threads(dst);
    }
}

/* A lazy grammar's value is over: c is the first byte after it. */
static bool end_step(const gram_think *think, gstate *dst, uint8_t c) {
    dst->gate_k = 0;
    dst->gate_ws = 0;
    reset_threads(dst);
    if (think->trigger_end && *think->trigger_end) {
        dst->gate = GATE_END;
        if (is_ws(c)) return (dst->gate_ws = 1);
        if ((uint8_t)think->trigger_end[0] != c) return false;
        dst->gate_k = 1;
        if (think->trigger_end[1] == 0) dst->gate = GATE_FREE, dst->gate_k = 0;
        return true;
    }
    dst->gate = GATE_FREE;
    free_step(think, dst, c);
    return true;
}

static bool feed_threads(const gram_schema *s, const gstate *src, uint8_t c, gstate *dst) {
    mctx m = {.s = s, .dst = dst};
    dst->n = 0;
    for (uint8_t i = 0; i < src->n; i++) {
        gthread t;
        copy_thread(&t, &src->t[i]);
        step(&m, &t, c);
    }
    return dst->n > 0;
}

bool gram_state_feed(const gram_schema *s, const gram_think *think, const gstate *src, uint8_t c,
                     gstate *dst) {
    dst->gate = src->gate;
    dst->gate_k = src->gate_k;
    dst->gate_ws = src->gate_ws;
    dst->bare = src->bare;
    switch (src->gate) {
    case GATE_JSON: return feed_threads(s, src, c, dst);
    case GATE_FREE:
        gram_state_copy(dst, src);
        free_step(think, dst, c);
        return true;
    case GATE_MUST: /* blanks, then the trigger */
        gram_state_copy(dst, src);
        if (src->gate_k == 0 && is_ws(c)) return src->gate_ws < GRAM_WS_MAX && ++dst->gate_ws;
        if ((uint8_t)think->trigger[src->gate_k] != c) return false;
        free_step(think, dst, c);
        return true;
    case GATE_CALL:
        if (value_complete(src)) return end_step(think, dst, c);
        if (feed_threads(s, src, c, dst)) return true;
        if (!value_accepting(s, src)) return false;
        return end_step(think, dst, c);
    case GATE_END:
        gram_state_copy(dst, src);
        if (src->gate_k == 0 && is_ws(c)) return src->gate_ws < GRAM_WS_MAX && ++dst->gate_ws;
        if ((uint8_t)think->trigger_end[src->gate_k] != c) return false;
        if (think->trigger_end[++dst->gate_k] == 0) dst->gate = GATE_FREE, dst->gate_k = 0;
        return true;
    default: break;
    }
    if (src->gate == GATE_OPEN) {
        const char *open = think->open;
        if (src->gate_k == 0 && is_ws(c)) {
            if (src->gate_ws >= GRAM_WS_MAX) return false;
            gram_state_copy(dst, src);
            dst->gate_ws++;
            return true;
        }
        if ((uint8_t)open[src->gate_k] == c) {
            gram_state_copy(dst, src);
            if (open[++dst->gate_k] == 0) dst->gate = GATE_THINK, dst->gate_k = 0;
            return true;
        }
        if (lazy(think)) { /* no thinking part: what was read of the tag is text */
            gstate a, b;
            gram_state_copy(&a, src);
            a.gate = after_think(think);
            a.gate_k = 0;
            a.gate_ws = 0;
            for (uint8_t i = 0; i < src->gate_k; i++) {
                if (!gram_state_feed(s, think, &a, (uint8_t)open[i], &b)) return false;
                gram_state_copy(&a, &b);
            }
            return gram_state_feed(s, think, &a, c, dst);
        }
        if (src->gate_k > 0) return false;
        dst->gate = GATE_JSON;
        return feed_threads(s, src, c, dst);
    }
    /* GATE_THINK: free text until the closing tag */
    const char *close = think->close;
    gram_state_copy(dst, src);
    if ((uint8_t)close[src->gate_k] == c) {
        if (close[++dst->gate_k] == 0)
            dst->gate = after_think(think), dst->gate_k = 0, dst->gate_ws = 0;
    } else {
        dst->gate_k = (uint8_t)close[0] == c ? 1 : 0;
    }
    return true;
}

static bool thread_accepting(const gram_schema *s, const gthread *t) {
    if (t->depth == 1) return t->f[0].st == R_DONE;
    if (t->depth != 2) return false;
    const gframe *f = &t->f[1];
    if (f->kind == FR_NUM) return num_accepting(s, f);
    if (f->kind == FR_LIT) return lit_accepting(s, f);
    return false;
}

static bool value_accepting(const gram_schema *s, const gstate *st) {
    for (uint8_t i = 0; i < st->n; i++)
        if (thread_accepting(s, &st->t[i])) return true;
    return false;
}

static bool value_complete(const gstate *st) {
    if (st->n == 0) return false;
    for (uint8_t i = 0; i < st->n; i++)
        if (st->t[i].depth != 1 || st->t[i].f[0].st != R_DONE) return false;
    return true;
}

bool gram_state_accepting(const gram_schema *s, const gstate *st) {
    if (st->gate == GATE_FREE) return true;
    return (st->gate == GATE_JSON || (st->gate == GATE_CALL && st->bare)) &&
           value_accepting(s, st);
}

bool gram_state_complete(const gram_schema *s, const gstate *st) {
    (void)s;
    return st->gate == GATE_JSON && value_complete(st);
}

int gram_plain_chars(const char *s, size_t n) {
    gframe f;
    memset(&f, 0, sizeof f);
    int chars = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        int nc;
        if (c == '\\' || lex(&f, c, &nc) != LEX_CONTENT) return -1;
        chars += nc;
    }
    return in_body(&f) && chars > 0 ? chars : -1;
}

bool gram_state_free_string(const gram_schema *s, const gstate *st, uint32_t *room) {
    if ((st->gate != GATE_JSON && st->gate != GATE_CALL) || st->n != 1) return false;
    const gthread *t = &st->t[0];
    const gframe *f = &t->f[t->depth - 1];
    if (!in_body(f)) return false;
    const gram_node *n = &s->nodes[f->node];
    if (f->kind == FR_STR && n->pattern < 0) {
        *room = n->max == UINT32_MAX ? UINT32_MAX : n->max - f->a;
        return true;
    }
    if (f->kind == FR_KEY && n->n == 0 && n->additional >= 0) {
        *room = UINT32_MAX;
        return true;
    }
    return false;
}
