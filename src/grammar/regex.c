/* regex.c - JSON schema `pattern` as a small NFA over bytes (gram_internal.h).
 *
 * The subset clients send: literals, escapes (\d \w \s, \. \- ... and \n \t), classes
 * ([a-z0-9_], negated), '.', groups ( ) and (?: ) with '|', quantifiers * + ? {n} {n,}
 * {n,m}, '^' at the start and '$' at the end. A pattern matches anywhere in the string
 * (ECMA-262 search) unless anchored. Strings under a pattern are written without escapes,
 * so a pattern's bytes are the string's bytes: '"', '\' and control bytes are dropped from
 * every class, and '.' and negated classes match ASCII only (one byte, one character).
 * Thompson's construction, then epsilon closures: the state is a set of at most 63 byte
 * states (bit GRAM_RE_ACCEPT: accepting), stepped by a table of bit sets. States that
 * cannot reach the end are pruned, so a live set can always be completed. */
#include <stdio.h>
#include <string.h>

#include "grammar/gram_internal.h"

#define MAX_NODES 256

enum { N_CHAR, N_SPLIT, N_EPS, N_MATCH };

typedef struct rnode {
    uint8_t kind;
    int16_t out[2];
    uint64_t cls[4];
} rnode;

typedef struct rparse {
    const char *p, *end;
    rnode n[MAX_NODES];
    int nn;
    char *why;
    size_t cap;
    bool bad;
} rparse;

/* A fragment: its start and the list of unset outs (node * 2 + slot), chained through
 * the out fields themselves (-2 - next). */
typedef struct frag {
    int start;
    int outs; /* head of the dangling list, -1 none */
} frag;

static bool err(rparse *r, const char *msg) {
    if (!r->bad) snprintf(r->why, r->cap, "%s", msg);
    r->bad = true;
    return false;
}

static int node(rparse *r, uint8_t kind) {
    if (r->nn >= MAX_NODES) {
        err(r, "too complex (more than 256 states)");
        return -1;
    }
    rnode *n = &r->n[r->nn];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->out[0] = n->out[1] = -1;
    return r->nn++;
}

/* dangling list: the out slot stores -2 - (next entry), -1 ends */
static int list1(rparse *r, int nd, int slot) {
    r->n[nd].out[slot] = -1;
    return nd * 2 + slot;
}

static void patch(rparse *r, int l, int target) {
    while (l >= 0) {
        int16_t *o = &r->n[l / 2].out[l % 2];
        int next = *o <= -2 ? -2 - *o : -1;
        *o = (int16_t)target;
        l = next;
    }
}

static int append(rparse *r, int a, int b) {
    if (a < 0) return b;
    int l = a;
    for (;;) {
        int16_t *o = &r->n[l / 2].out[l % 2];
        if (*o <= -2) l = -2 - *o;
        else break;
    }
    r->n[l / 2].out[l % 2] = (int16_t)(-2 - b);
    return a;
}

static void set_bit(uint64_t *c, int b) { c[b >> 6] |= 1ull << (b & 63); }
static void set_range(uint64_t *c, int a, int b) {
    for (int i = a; i <= b; i++) set_bit(c, i);
}

static void class_escape(uint64_t *c, char e, bool *ok) {
    *ok = true;
    switch (e) {
    case 'd': set_range(c, '0', '9'); break;
    case 'w':
        set_range(c, '0', '9'), set_range(c, 'a', 'z'), set_range(c, 'A', 'Z'), set_bit(c, '_');
        break;
    case 's': set_bit(c, ' '); break; /* the only blank a string holds without escapes */
    case 'n': case 'r': case 't': case 'f': case 'v': break; /* control bytes: never */
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9') ||
            (unsigned char)e >= 0x80)
            *ok = false; /* \D, \b, \1, \u...: not supported */
        else set_bit(c, (unsigned char)e);
    }
}

static frag parse_alt(rparse *r);

static frag char_frag(rparse *r, const uint64_t *cls) {
    int nd = node(r, N_CHAR);
    if (nd < 0) return (frag){-1, -1};
    memcpy(r->n[nd].cls, cls, sizeof r->n[nd].cls);
    return (frag){nd, list1(r, nd, 0)};
}

static frag parse_atom(rparse *r) {
    frag bad = {-1, -1};
    if (r->p >= r->end) return err(r, "unexpected end"), bad;
    char ch = *r->p++;
    uint64_t cls[4] = {0};
    bool ok;
    switch (ch) {
    case '(': {
        if (r->end - r->p >= 2 && r->p[0] == '?') {
            if (r->p[1] != ':') return err(r, "only (?: ) groups are supported"), bad;
            r->p += 2;
        }
        frag f = parse_alt(r);
        if (r->bad) return bad;
        if (r->p >= r->end || *r->p != ')') return err(r, "missing )"), bad;
        r->p++;
        return f;
    }
    case '[': {
        bool neg = r->p < r->end && *r->p == '^';
        if (neg) r->p++;
        bool first = true;
        while (r->p < r->end && (*r->p != ']' || first)) {
            first = false;
            unsigned char a = (unsigned char)*r->p++;
            if (a == '\\') {
                if (r->p >= r->end) return err(r, "unexpected end"), bad;
                class_escape(cls, *r->p++, &ok);
                if (!ok) return err(r, "unsupported escape in a class"), bad;
                continue;
            }
            if (a >= 0x80) return err(r, "non-ASCII characters in a class are not supported"), bad;
            if (r->end - r->p >= 2 && r->p[0] == '-' && r->p[1] != ']') {
                unsigned char b = (unsigned char)r->p[1];
                r->p += 2;
                if (b == '\\' || b >= 0x80 || b < a) return err(r, "bad range in a class"), bad;
                set_range(cls, a, b);
            } else {
                set_bit(cls, a);
            }
        }
        if (r->p >= r->end) return err(r, "missing ]"), bad;
        r->p++;
        if (neg)
            for (int w = 0; w < 2; w++) cls[w] = ~cls[w]; /* ASCII only */
        return char_frag(r, cls);
    }
    case '.':
        set_range(cls, 0x20, 0x7E);
        return char_frag(r, cls);
    case '\\':
        if (r->p >= r->end) return err(r, "unexpected end"), bad;
        class_escape(cls, *r->p++, &ok);
        if (!ok) return err(r, "unsupported escape"), bad;
        return char_frag(r, cls);
    case ')': case '|': case '*': case '+': case '?': case '{': case '}': case ']':
        return err(r, "misplaced operator"), bad;
    case '^': case '$':
        return err(r, "anchors only at the start and the end"), bad;
    default:
        set_bit(cls, (unsigned char)ch); /* UTF-8 literals: one byte at a time */
        return char_frag(r, cls);
    }
}

static frag star(rparse *r, frag f) {
    int s = node(r, N_SPLIT);
    if (s < 0) return (frag){-1, -1};
    r->n[s].out[0] = (int16_t)f.start;
    patch(r, f.outs, s);
    return (frag){s, list1(r, s, 1)};
}

static frag optional(rparse *r, frag f) {
    int s = node(r, N_SPLIT);
    if (s < 0) return (frag){-1, -1};
    r->n[s].out[0] = (int16_t)f.start;
    return (frag){s, append(r, f.outs, list1(r, s, 1))};
}

static frag concat(rparse *r, frag a, frag b) {
    if (a.start < 0) return b;
    patch(r, a.outs, b.start);
    return (frag){a.start, b.outs};
}

static bool read_int(rparse *r, int *v) {
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return false;
    *v = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        *v = *v * 10 + (*r->p++ - '0');
        if (*v > 64) return false;
    }
    return true;
}

static frag parse_repeat(rparse *r) {
    const char *atom_at = r->p;
    frag f = parse_atom(r);
    if (r->bad || r->p >= r->end) return f;
    const char *atom_end = r->p;
    char q = *r->p;
    int lo, hi;
    if (q == '*' || q == '+' || q == '?') {
        r->p++;
        lo = q == '+';
        hi = q == '?' ? 1 : -1;
    } else if (q == '{') {
        r->p++;
        if (!read_int(r, &lo)) return err(r, "bad {n,m}"), f;
        hi = lo;
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            hi = -1;
            if (r->p < r->end && *r->p != '}' && !read_int(r, &hi)) return err(r, "bad {n,m}"), f;
        }
        if (r->p >= r->end || *r->p != '}' || (hi >= 0 && hi < lo)) return err(r, "bad {n,m}"), f;
        r->p++;
    } else {
        return f;
    }
    if (r->p < r->end && *r->p == '?') r->p++; /* lazy: the same language */
    const char *after = r->p;
    /* copies of the atom, parsed again from its text */
    frag out = {-1, -1};
    int copies = hi < 0 ? (lo > 0 ? lo : 1) : hi;
    for (int i = 0; i < copies && !r->bad; i++) {
        frag c = f;
        if (i > 0) {
            r->p = atom_at;
            c = parse_atom(r);
            r->p = atom_end;
        }
        if (r->bad) break;
        if (hi < 0 && i == copies - 1) { /* the last copy, then any number more */
            if (lo > 0) {
                r->p = atom_at;
                frag more = parse_atom(r);
                c = concat(r, c, star(r, more));
            } else {
                c = star(r, c);
            }
        } else if (i >= lo) {
            c = optional(r, c);
        }
        out = concat(r, out, c);
    }
    r->p = after;
    if (copies == 0 || (hi == 0)) { /* x{0}: the empty string */
        int e = node(r, N_EPS);
        if (e < 0) return f;
        return (frag){e, list1(r, e, 0)};
    }
    return out;
}

static frag parse_concat(rparse *r) {
    frag f = {-1, -1};
    while (!r->bad && r->p < r->end && *r->p != '|' && *r->p != ')') {
        if (*r->p == '$' && r->p + 1 == r->end) break;
        f = concat(r, f, parse_repeat(r));
    }
    if (f.start < 0 && !r->bad) { /* empty */
        int e = node(r, N_EPS);
        if (e >= 0) f = (frag){e, list1(r, e, 0)};
    }
    return f;
}

static frag parse_alt(rparse *r) {
    frag f = parse_concat(r);
    while (!r->bad && r->p < r->end && *r->p == '|') {
        r->p++;
        frag g = parse_concat(r);
        int s = node(r, N_SPLIT);
        if (s < 0 || r->bad) break;
        r->n[s].out[0] = (int16_t)f.start;
        r->n[s].out[1] = (int16_t)g.start;
        f = (frag){s, append(r, f.outs, g.outs)};
    }
    return f;
}

/* Epsilon closure of node i into the set of char nodes (and match). */
static void closure(const rparse *r, int i, uint64_t *seen, uint64_t *set, const int *cidx,
                    int match) {
    if (i < 0 || (seen[i >> 6] >> (i & 63) & 1)) return;
    seen[i >> 6] |= 1ull << (i & 63);
    const rnode *n = &r->n[i];
    if (n->kind == N_CHAR) *set |= 1ull << cidx[i];
    else if (i == match) *set |= GRAM_RE_ACCEPT;
    else {
        closure(r, n->out[0], seen, set, cidx, match);
        if (n->kind == N_SPLIT) closure(r, n->out[1], seen, set, cidx, match);
    }
}

static uint64_t closure_of(const rparse *r, int i, const int *cidx, int match) {
    uint64_t seen[MAX_NODES / 64] = {0}, set = 0;
    closure(r, i, seen, &set, cidx, match);
    return set;
}

bool gram_regex_compile(const char *pat, size_t len, gram_regex *re, char *why, size_t cap) {
    rparse r;
    memset(&r, 0, sizeof r);
    r.p = pat;
    r.end = pat + len;
    r.why = why;
    r.cap = cap;
    /* ^a|b$ anchors each branch, not the whole: refuse it rather than misread it */
    int depth = 0;
    bool in_cls = false, top_alt = false;
    for (size_t i = 0; i < len; i++) {
        char ch = pat[i];
        if (ch == '\\') i++;
        else if (in_cls) in_cls = ch != ']';
        else if (ch == '[') in_cls = true;
        else if (ch == '(') depth++;
        else if (ch == ')') depth--;
        else if (ch == '|' && depth == 0) top_alt = true;
    }
    if (top_alt && len > 0 && (pat[0] == '^' || pat[len - 1] == '$')) {
        snprintf(why, cap, "anchors next to a top-level | (group the alternatives)");
        return false;
    }
    bool head = r.p < r.end && *r.p == '^';
    if (head) r.p++;
    bool tail = len > 0 && pat[len - 1] == '$' && (len < 2 || pat[len - 2] != '\\');
    uint64_t any[4] = {0};
    set_range(any, 0x20, 0x7E);
    frag f = {-1, -1};
    if (!head) f = star(&r, char_frag(&r, any)); /* search: anything may come first */
    f = concat(&r, f, parse_alt(&r));
    if (!r.bad && tail) r.p++;
    if (!r.bad && r.p != r.end)
        err(&r, r.p < r.end && *r.p == ')' ? "unbalanced )" : "unexpected text");
    if (!r.bad && !tail) f = concat(&r, f, star(&r, char_frag(&r, any)));
    int match = r.bad ? -1 : node(&r, N_MATCH);
    if (r.bad || f.start < 0) return false;
    patch(&r, f.outs, match);
    /* number the char nodes */
    int cidx[MAX_NODES], nc = 0;
    for (int i = 0; i < r.nn; i++) cidx[i] = r.n[i].kind == N_CHAR ? nc++ : -1;
    if (nc > 63) {
        snprintf(why, cap, "too complex (more than 63 character states)");
        return false;
    }
    memset(re, 0, sizeof *re);
    re->n = (uint8_t)nc;
    for (int i = 0; i < r.nn; i++) {
        if (r.n[i].kind != N_CHAR) continue;
        int k = cidx[i];
        memcpy(re->cls[k], r.n[i].cls, sizeof re->cls[k]);
        /* bytes a string holds only escaped never match */
        re->cls[k][0] &= ~0xFFFFFFFFull;
        re->cls[k][0] &= ~(1ull << '"');
        re->cls[k][1] &= ~(1ull << ('\\' - 64));
        re->cls[k][1] &= ~(1ull << (0x7F - 64));
        re->next[k] = closure_of(&r, r.n[i].out[0], cidx, match);
    }
    re->start = closure_of(&r, f.start, cidx, match);
    /* prune states that cannot reach the end */
    uint64_t live = GRAM_RE_ACCEPT;
    for (bool grew = true; grew;) {
        grew = false;
        for (int k = 0; k < nc; k++) {
            bool any_byte = re->cls[k][0] | re->cls[k][1] | re->cls[k][2] | re->cls[k][3];
            if (!(live >> k & 1) && any_byte && (re->next[k] & live)) {
                live |= 1ull << k;
                grew = true;
            }
        }
    }
    for (int k = 0; k < nc; k++) re->next[k] &= live;
    re->start &= live;
    if (!re->start) {
        snprintf(why, cap, "no JSON string without escapes matches it");
        return false;
    }
    return true;
}

uint64_t gram_regex_step(const gram_regex *re, uint64_t set, uint8_t c) {
    uint64_t out = 0;
    for (uint64_t s = set & ~GRAM_RE_ACCEPT; s; s &= s - 1) {
        int k = __builtin_ctzll(s);
        if (re->cls[k][c >> 6] >> (c & 63) & 1) out |= re->next[k];
    }
    return out;
}
