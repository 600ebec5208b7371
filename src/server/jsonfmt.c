/* jsonfmt.c - JSON-prefix recognizer and the format "json" logits mask (jsonfmt.h). */
#include "server/jsonfmt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
    S_START,         /* before the root object */
    S_OBJ_FIRST,     /* after '{': key or '}' */
    S_OBJ_KEY,       /* after ',' in an object: key */
    S_COLON,         /* after a key */
    S_VALUE,         /* a value */
    S_ARR_FIRST,     /* after '[': value or ']' */
    S_AFTER,         /* after a value in a container: ',' or the closer */
    S_STR,           /* in a string (lit: 1 = key) */
    S_ESC,
    S_HEX,
    S_NUM_MINUS,
    S_NUM_ZERO,
    S_NUM_INT,
    S_NUM_DOT,
    S_NUM_FRAC,
    S_NUM_E,
    S_NUM_ESIGN,
    S_NUM_EXP,
    S_LIT,
    S_DONE,
};

#define MAX_WS_RUN 8

static const char *const k_lits[3] = {"true", "false", "null"};

void json_prefix_init(json_prefix *p) { memset(p, 0, sizeof *p); }

static bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* A value just ended. */
static void value_done(json_prefix *p) {
    p->state = p->depth == 0 ? S_DONE : S_AFTER;
}

static bool push(json_prefix *p, char c) {
    if (p->depth >= JSON_PREFIX_MAX_DEPTH) return false;
    p->stack[p->depth++] = c;
    p->state = c == '{' ? S_OBJ_FIRST : S_ARR_FIRST;
    return true;
}

static bool pop(json_prefix *p, char closer) {
    if (p->depth == 0 || p->stack[p->depth - 1] != (closer == '}' ? '{' : '[')) return false;
    p->depth--;
    value_done(p);
    return true;
}

static bool start_value(json_prefix *p, uint8_t c) {
    switch (c) {
    case '{': return push(p, '{');
    case '[': return push(p, '[');
    case '"': p->state = S_STR, p->lit = 0; return true;
    case '-': p->state = S_NUM_MINUS; return true;
    case '0': p->state = S_NUM_ZERO; return true;
    case 't': case 'f': case 'n':
        p->lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
        p->lit_pos = 1;
        p->state = S_LIT;
        return true;
    default:
        if (c >= '1' && c <= '9') {
            p->state = S_NUM_INT;
            return true;
        }
        return false;
    }
}

static bool feed(json_prefix *p, uint8_t c) {
    /* whitespace between tokens */
    switch (p->state) {
    case S_START: case S_OBJ_FIRST: case S_OBJ_KEY: case S_COLON: case S_VALUE:
    case S_ARR_FIRST: case S_AFTER:
        if (is_ws(c)) {
            if (p->ws_run >= MAX_WS_RUN) return false;
            p->ws_run++;
            return true;
        }
        p->ws_run = 0;
        break;
    default: break;
    }
    switch (p->state) {
    case S_START: return c == '{' && push(p, '{');
    case S_OBJ_FIRST:
        if (c == '}') return pop(p, '}');
        /* fall through */
    case S_OBJ_KEY:
        if (c != '"') return false;
        p->state = S_STR;
        p->lit = 1;
        return true;
    case S_COLON:
        if (c != ':') return false;
        p->state = S_VALUE;
        return true;
    case S_ARR_FIRST:
        if (c == ']') return pop(p, ']');
        return start_value(p, c);
    case S_VALUE: return start_value(p, c);
    case S_AFTER:
        if (c == ',') {
            p->state = p->stack[p->depth - 1] == '{' ? S_OBJ_KEY : S_VALUE;
            return true;
        }
        if (c == '}' || c == ']') return pop(p, (char)c);
        return false;
    case S_STR:
        if (c == '"') {
            if (p->lit == 1) p->state = S_COLON;
            else value_done(p);
            return true;
        }
        if (c == '\\') {
            p->state = S_ESC;
            return true;
        }
        return c >= 0x20;
    case S_ESC:
        if (c == 'u') {
            p->state = S_HEX;
            p->hex_left = 4;
            return true;
        }
        if (!strchr("\"\\/bfnrt", c) || c == 0) return false;
        p->state = S_STR;
        return true;
    case S_HEX:
        if (!is_digit(c) && !((c | 0x20) >= 'a' && (c | 0x20) <= 'f')) return false;
        if (--p->hex_left == 0) p->state = S_STR;
        return true;
    case S_NUM_MINUS:
        if (c == '0') p->state = S_NUM_ZERO;
        else if (is_digit(c)) p->state = S_NUM_INT;
        else return false;
        return true;
    case S_NUM_ZERO:
    case S_NUM_INT:
    case S_NUM_FRAC:
        if (is_digit(c) && p->state != S_NUM_ZERO) return true;
        if (c == '.' && p->state != S_NUM_FRAC) {
            p->state = S_NUM_DOT;
            return true;
        }
        if (c == 'e' || c == 'E') {
            p->state = S_NUM_E;
            return true;
        }
        goto end_number;
    case S_NUM_DOT:
        if (!is_digit(c)) return false;
        p->state = S_NUM_FRAC;
        return true;
    case S_NUM_E:
        if (c == '+' || c == '-') {
            p->state = S_NUM_ESIGN;
            return true;
        }
        /* fall through */
    case S_NUM_ESIGN:
        if (!is_digit(c)) return false;
        p->state = S_NUM_EXP;
        return true;
    case S_NUM_EXP:
        if (is_digit(c)) return true;
        goto end_number;
    case S_LIT: {
        const char *w = k_lits[p->lit];
        if ((uint8_t)w[p->lit_pos] != c) return false;
        if (w[++p->lit_pos] == '\0') value_done(p);
        return true;
    }
    default: return false; /* S_DONE: nothing may follow */
    }
end_number: {
    /* the byte after a number belongs to the container */
    json_prefix save = *p;
    value_done(p);
    if (feed(p, c)) return true;
    *p = save;
    return false;
}
}

bool json_prefix_feed(json_prefix *p, uint8_t c) {
    json_prefix save = *p;
    if (feed(p, c)) {
        p->done = p->state == S_DONE;
        return true;
    }
    *p = save;
    return false;
}

bool json_prefix_feed_all(json_prefix *p, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!json_prefix_feed(p, (uint8_t)s[i])) return false;
    return true;
}

/* ---- the mask ---- */

struct jsonfmt {
    const tok_vocab *vocab;
    int32_t n_tokens;
    uint32_t *off; /* token i's bytes: bytes[off[i] .. off[i+1]) */
    char *bytes;
    bool *eog;
    json_prefix state;
    bool *allowed; /* scratch, one per token */
};

hl_status jsonfmt_create(const tok_vocab *v, jsonfmt **out, hl_err *err) {
    jsonfmt *j = calloc(1, sizeof *j);
    if (!j) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    j->vocab = v;
    j->n_tokens = tok_vocab_n_tokens(v);
    size_t n = (size_t)j->n_tokens, total = 0;
    j->off = malloc((n + 1) * sizeof *j->off);
    j->eog = calloc(n ? n : 1, sizeof *j->eog);
    j->allowed = calloc(n ? n : 1, sizeof *j->allowed);
    if (!j->off || !j->eog || !j->allowed) goto oom;
    for (int32_t i = 0; i < j->n_tokens; i++) {
        int32_t len = tok_token_to_piece(v, i, false, NULL, 0);
        total += len > 0 ? (size_t)len : 0;
        j->eog[i] = tok_is_eog(v, i);
    }
    j->bytes = malloc(total ? total : 1);
    if (!j->bytes) goto oom;
    size_t pos = 0;
    for (int32_t i = 0; i < j->n_tokens; i++) {
        j->off[i] = (uint32_t)pos;
        int32_t len = tok_token_to_piece(v, i, false, j->bytes + pos, total - pos);
        if (len > 0 && pos + (size_t)len <= total) pos += (size_t)len;
    }
    j->off[n] = (uint32_t)pos;
    json_prefix_init(&j->state);
    *out = j;
    return HL_OK;
oom:
    jsonfmt_free(j);
    return hl_fail(err, HL_ERR_NOMEM, "out of memory");
}

void jsonfmt_free(jsonfmt *j) {
    if (!j) return;
    free(j->off);
    free(j->bytes);
    free(j->eog);
    free(j->allowed);
    free(j);
}

void jsonfmt_mask(jsonfmt *j, float *logits, int32_t n_vocab) {
    int32_t n = n_vocab < j->n_tokens ? n_vocab : j->n_tokens;
    bool any = false;
    for (int32_t i = 0; i < n; i++) {
        bool ok;
        uint32_t a = j->off[i], b = j->off[i + 1];
        if (j->eog[i]) {
            ok = j->state.done;
        } else if (j->state.done || a == b) {
            ok = false; /* nothing after the object; no empty pieces */
        } else {
            json_prefix t = j->state;
            ok = json_prefix_feed_all(&t, j->bytes + a, b - a);
        }
        j->allowed[i] = ok;
        any |= ok;
    }
    if (!any) return;
    for (int32_t i = 0; i < n_vocab; i++)
        if (i >= n || !j->allowed[i]) logits[i] = -INFINITY;
}

void jsonfmt_accept(jsonfmt *j, int32_t token) {
    if (token < 0 || token >= j->n_tokens || j->eog[token]) return;
    json_prefix t = j->state;
    if (json_prefix_feed_all(&t, j->bytes + j->off[token], j->off[token + 1] - j->off[token]))
        j->state = t;
}

bool jsonfmt_complete(const jsonfmt *j) { return j->state.done; }
