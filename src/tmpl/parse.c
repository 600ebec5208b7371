/* parse.c - the template lexer (text, {{ }}, {% %}, {# #}, whitespace control,
 * trim_blocks and lstrip_blocks as jinja2 applies them) and the recursive-descent
 * parser that builds the AST in internal.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "tmpl/internal.h"
#include "tmpl/tmpl.h"

typedef enum {
    TK_EOF,
    TK_TEXT,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STRING,
    TK_INT,
    TK_FLOAT,
    TK_OP,
} tk_type;

typedef struct token {
    tk_type type;
    int line, col;
    const char *s; /* text / name / decoded string / op (NUL-terminated, in the arena) */
    size_t n;
    int64_t i;
    double f;
} token;

typedef struct parser {
    tarena *a;
    hl_err *err;
    bool failed;
    token *toks;
    size_t n_toks, cap_toks, pos;
    int depth;
} parser;

static hl_status perr_at(parser *p, int line, int col, const char *fmt, const char *arg) {
    if (!p->failed) {
        char msg[400];
        snprintf(msg, sizeof msg, fmt, arg ? arg : "");
        hl_fail(p->err, HL_ERR_FORMAT, "template syntax error at line %d, column %d: %s", line,
                col, msg);
    }
    p->failed = true;
    return HL_ERR_FORMAT;
}

/* ---------------- lexer ---------------- */

static bool push_tok(parser *p, token t) {
    if (p->n_toks == p->cap_toks) {
        size_t cap = p->cap_toks ? p->cap_toks * 2 : 256;
        token *nt = realloc(p->toks, cap * sizeof *nt);
        if (!nt) return false;
        p->toks = nt;
        p->cap_toks = cap;
    }
    p->toks[p->n_toks++] = t;
    return true;
}

typedef struct lexer {
    const char *src;
    size_t n, pos;
    int line;
    size_t line_start;
} lexer;

static void lx_advance(lexer *lx, size_t to) {
    for (size_t i = lx->pos; i < to; i++)
        if (lx->src[i] == '\n') {
            lx->line++;
            lx->line_start = i + 1;
        }
    lx->pos = to;
}

static bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
static bool is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes a string literal body with python's unicode-escape rules. */
static char *decode_string(tarena *a, const char *s, size_t n, size_t *out_n) {
    char *o = ta_alloc(a, n + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            o[k++] = s[i];
            continue;
        }
        char c = s[++i];
        int digits = 0;
        switch (c) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\n': break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (c >= '0' && c <= '7') {
                uint32_t v = 0;
                int m = 0;
                while (m < 3 && i < n && s[i] >= '0' && s[i] <= '7') v = v * 8 + (uint32_t)(s[i++] - '0'), m++;
                i--;
                k += hl_utf8_put(v, o + k);
            } else {
                o[k++] = '\\';
                o[k++] = c;
            }
        }
        if (digits) {
            uint32_t v = 0;
            int m = 0;
            while (m < digits && i + 1 < n && hexval(s[i + 1]) >= 0) v = v * 16 + (uint32_t)hexval(s[++i]), m++;
            if (m < digits) {
                /* python rejects a short escape; keep the text as written */
                o[k++] = '\\';
                o[k++] = c;
                continue;
            }
            /* the escape never produces more bytes than it took (\xhh: 4 -> <=2) */
            k += hl_utf8_put(v > 0x10FFFF ? 0xFFFD : v, o + k);
        }
    }
    o[k] = 0;
    *out_n = k;
    return o;
}

static const char *const ops2[] = {"//", "**", "==", "!=", ">=", "<=", NULL};
static const char ops1[] = "+-/*%~[](){},.:|=<>;";

/* Tokenizes the inside of a tag up to its end marker. Returns false on error. */
static bool lex_tag(parser *p, lexer *lx, tk_type begin, bool *strip_after, bool *keep_after) {
    int bal = 0;
    for (;;) {
        while (lx->pos < lx->n && is_ws(lx->src[lx->pos])) lx_advance(lx, lx->pos + 1);
        size_t i = lx->pos;
        int col = (int)(i - lx->line_start) + 1;
        if (i >= lx->n) {
            perr_at(p, lx->line, col, "unexpected end of template, expected '%s'",
                    begin == TK_VAR_BEGIN ? "}}" : "%}");
            return false;
        }
        const char *s = lx->src + i;
        size_t rem = lx->n - i;
        if (bal == 0) {
            const char *end = begin == TK_VAR_BEGIN ? "}}" : "%}";
            size_t skip = 0;
            *strip_after = *keep_after = false;
            if (rem >= 3 && (s[0] == '-' || s[0] == '+') && memcmp(s + 1, end, 2) == 0) {
                *strip_after = s[0] == '-';
                *keep_after = s[0] == '+';
                skip = 3;
            } else if (rem >= 2 && memcmp(s, end, 2) == 0) {
                skip = 2;
            }
            if (skip) {
                token t = {.type = begin == TK_VAR_BEGIN ? TK_VAR_END : TK_BLOCK_END,
                           .line = lx->line, .col = col};
                if (!push_tok(p, t)) return false;
                lx_advance(lx, i + skip);
                return true;
            }
        }
        token t = {.line = lx->line, .col = col};
        if (is_name_start(s[0])) {
            size_t k = 1;
            while (k < rem && (is_name_start(s[k]) || is_digit(s[k]))) k++;
            t.type = TK_NAME;
            t.s = ta_strdup(p->a, s, k);
            t.n = k;
            lx_advance(lx, i + k);
        } else if (is_digit(s[0])) {
            size_t k = 0;
            char num[64];
            size_t nn = 0;
            bool is_float = false;
            while (k < rem && (is_digit(s[k]) || s[k] == '_')) {
                if (s[k] != '_' && nn < 60) num[nn++] = s[k];
                k++;
            }
            if (k + 1 < rem && s[k] == '.' && is_digit(s[k + 1])) {
                is_float = true;
                num[nn++] = '.';
                k++;
                while (k < rem && (is_digit(s[k]) || s[k] == '_')) {
                    if (s[k] != '_' && nn < 60) num[nn++] = s[k];
                    k++;
                }
            }
            if (k < rem && (s[k] == 'e' || s[k] == 'E')) {
                size_t e = k + 1;
                if (e < rem && (s[e] == '+' || s[e] == '-')) e++;
                if (e < rem && is_digit(s[e])) {
                    is_float = true;
                    num[nn++] = 'e';
                    for (size_t q = k + 1; q < e; q++) num[nn++] = s[q];
                    k = e;
                    while (k < rem && is_digit(s[k])) {
                        if (nn < 62) num[nn++] = s[k];
                        k++;
                    }
                }
            }
            num[nn] = 0;
            if (is_float) {
                t.type = TK_FLOAT;
                t.f = strtod(num, NULL);
            } else {
                errno = 0;
                long long v = strtoll(num, NULL, 10);
                if (errno || nn >= 60) {
                    perr_at(p, lx->line, col, "integer literal too large", NULL);
                    return false;
                }
                t.type = TK_INT;
                t.i = v;
            }
            lx_advance(lx, i + k);
        } else if (s[0] == '\'' || s[0] == '"') {
            size_t k = 1;
            while (k < rem && s[k] != s[0]) k += s[k] == '\\' ? 2 : 1;
            if (k >= rem) {
                perr_at(p, lx->line, col, "unterminated string literal", NULL);
                return false;
            }
            t.type = TK_STRING;
            t.s = decode_string(p->a, s + 1, k - 1, &t.n);
            lx_advance(lx, i + k + 1);
        } else {
            size_t k = 0;
            for (int q = 0; ops2[q]; q++)
                if (rem >= 2 && memcmp(s, ops2[q], 2) == 0) k = 2;
            if (!k && strchr(ops1, s[0]) && s[0]) k = 1;
            if (!k) {
                char c[2] = {s[0], 0};
                perr_at(p, lx->line, col, "unexpected character '%s'", c);
                return false;
            }
            if (k == 1) {
                if (s[0] == '(' || s[0] == '[' || s[0] == '{') bal++;
                if (s[0] == ')' || s[0] == ']' || s[0] == '}') {
                    if (bal == 0) {
                        perr_at(p, lx->line, col, "unexpected '%s'", s[0] == ')' ? ")" : s[0] == ']' ? "]" : "}");
                        return false;
                    }
                    bal--;
                }
            }
            t.type = TK_OP;
            t.s = ta_strdup(p->a, s, k);
            t.n = k;
            lx_advance(lx, i + k);
        }
        if ((t.type == TK_NAME || t.type == TK_OP || t.type == TK_STRING) && !t.s) return false;
        if (!push_tok(p, t)) return false;
    }
}

static bool is_raw_tag(const char *s, size_t n, size_t i, const char *word, size_t *end) {
    /* s[i] is just after "{%" (and its -/+); matches `\s*word\s*[-+]?%}` */
    while (i < n && is_ws(s[i])) i++;
    size_t wl = strlen(word);
    if (n - i < wl || memcmp(s + i, word, wl) != 0) return false;
    i += wl;
    while (i < n && is_ws(s[i])) i++;
    if (i < n && (s[i] == '-' || s[i] == '+')) i++;
    if (n - i < 2 || s[i] != '%' || s[i + 1] != '}') return false;
    *end = i + 2;
    return true;
}

static bool lex(parser *p, const char *src, size_t n) {
    lexer lx = {.src = src, .n = n, .line = 1};
    bool line_starting = true;
    bool strip_next = false; /* previous tag ended with '-' */
    for (;;) {
        size_t start = lx.pos;
        if (strip_next)
            while (start < n && is_ws(src[start])) start++;
        lx_advance(&lx, start);
        size_t i = start;
        while (i + 1 < n && !(src[i] == '{' && (src[i + 1] == '{' || src[i + 1] == '%' ||
                                                  src[i + 1] == '#')))
            i++;
        if (i + 1 >= n) i = n;
        size_t text_end = i;
        char kind = i < n ? src[i + 1] : 0;
        char mod = i + 2 < n ? src[i + 2] : 0;
        if (kind && mod == '-') {
            while (text_end > start && is_ws(src[text_end - 1])) text_end--;
        } else if ((kind == '%' || kind == '#') && mod != '+') {
            /* lstrip_blocks: drop spaces/tabs between the line start and the tag */
            size_t ls = text_end;
            while (ls > start && (src[ls - 1] == ' ' || src[ls - 1] == '\t')) ls--;
            if ((ls > start && src[ls - 1] == '\n') || (ls == start && line_starting))
                text_end = ls;
        }
        if (text_end > start) {
            token t = {.type = TK_TEXT, .line = lx.line, .col = (int)(start - lx.line_start) + 1};
            t.s = ta_strdup(p->a, src + start, text_end - start);
            t.n = text_end - start;
            if (!t.s || !push_tok(p, t)) return false;
        }
        if (!kind) break;
        lx_advance(&lx, i);
        int col = (int)(i - lx.line_start) + 1;
        size_t after = i + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
        bool strip_after = false, keep_after = false;
        if (kind == '#') {
            size_t j = after;
            while (j + 1 < n && !(src[j] == '#' && src[j + 1] == '}')) j++;
            if (j + 1 >= n) {
                perr_at(p, lx.line, col, "missing end of comment tag", NULL);
                return false;
            }
            strip_after = j > after && src[j - 1] == '-';
            keep_after = j > after && src[j - 1] == '+';
            lx_advance(&lx, j + 2);
        } else {
            size_t raw_end;
            if (kind == '%' && is_raw_tag(src, n, after, "raw", &raw_end)) {
                /* {% raw %}...{% endraw %}: the body is text */
                size_t j = raw_end, body_end = 0, tag_end = 0;
                bool found = false;
                for (; j + 1 < n; j++) {
                    if (src[j] == '{' && src[j + 1] == '%') {
                        size_t a2 = j + 2 + ((j + 2 < n && (src[j + 2] == '-' || src[j + 2] == '+')) ? 1 : 0);
                        if (is_raw_tag(src, n, a2, "endraw", &tag_end)) {
                            found = true;
                            body_end = j;
                            if (src[j + 2] == '-')
                                while (body_end > raw_end && is_ws(src[body_end - 1])) body_end--;
                            break;
                        }
                    }
                }
                if (!found) {
                    perr_at(p, lx.line, col, "missing endraw for raw block", NULL);
                    return false;
                }
                size_t bs = raw_end;
                if (src[raw_end - 3] == '-')
                    while (bs < body_end && is_ws(src[bs])) bs++;
                if (body_end > bs) {
                    token t = {.type = TK_TEXT, .line = lx.line, .col = col};
                    t.s = ta_strdup(p->a, src + bs, body_end - bs);
                    t.n = body_end - bs;
                    if (!t.s || !push_tok(p, t)) return false;
                }
                strip_after = src[tag_end - 3] == '-';
                keep_after = src[tag_end - 3] == '+';
                lx_advance(&lx, tag_end);
            } else {
                token t = {.type = kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, .line = lx.line,
                           .col = col};
                if (!push_tok(p, t)) return false;
                lx_advance(&lx, after);
                if (!lex_tag(p, &lx, t.type, &strip_after, &keep_after)) return false;
            }
        }
        strip_next = strip_after;
        line_starting = false;
        if (!strip_after && !keep_after && kind != '{' && lx.pos < n && src[lx.pos] == '\n') {
            lx_advance(&lx, lx.pos + 1); /* trim_blocks */
            line_starting = true;
        }
    }
    token eof = {.type = TK_EOF, .line = lx.line, .col = (int)(lx.pos - lx.line_start) + 1};
    return push_tok(p, eof);
}

/* ---------------- parser ---------------- */

static token *cur(parser *p) { return &p->toks[p->pos]; }
static token *peek_at(parser *p, size_t k) {
    size_t i = p->pos + k;
    return &p->toks[i < p->n_toks ? i : p->n_toks - 1];
}
static void next(parser *p) {
    if (p->toks[p->pos].type != TK_EOF) p->pos++;
}
static bool is_op(token *t, const char *op) { return t->type == TK_OP && strcmp(t->s, op) == 0; }
static bool is_name(token *t, const char *name) {
    return t->type == TK_NAME && strcmp(t->s, name) == 0;
}

static const char *tok_desc(token *t) {
    switch (t->type) {
    case TK_EOF: return "end of template";
    case TK_TEXT: return "template data";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "'%}'";
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    default: return t->s;
    }
}

static bool unexpected(parser *p, const char *what) {
    token *t = cur(p);
    char msg[300];
    snprintf(msg, sizeof msg, "expected %s, got %s", what, tok_desc(t));
    perr_at(p, t->line, t->col, "%s", msg);
    return false;
}

static bool expect_op(parser *p, const char *op) {
    if (!is_op(cur(p), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        return unexpected(p, w);
    }
    next(p);
    return true;
}

static tnode *new_node(parser *p, int kind, int line) {
    tnode *n = ta_alloc(p->a, sizeof *n);
    if (!n) {
        p->failed = true;
        hl_fail(p->err, HL_ERR_NOMEM, "out of memory parsing template");
        return NULL;
    }
    n->kind = (uint8_t)kind;
    n->line = line;
    return n;
}

/* Growable node arrays, built in the arena. */
typedef struct nvec {
    tnode **v;
    size_t n, cap;
} nvec;

static bool nv_push(parser *p, nvec *v, tnode *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        tnode **nv = ta_alloc(p->a, cap * sizeof *nv);
        if (!nv) {
            p->failed = true;
            hl_fail(p->err, HL_ERR_NOMEM, "out of memory parsing template");
            return false;
        }
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return true;
}

typedef struct svec {
    const char **v;
    size_t n, cap;
} svec;

static bool sv_push(parser *p, svec *v, const char *s) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        const char **nv = ta_alloc(p->a, cap * sizeof *nv);
        if (!nv) {
            p->failed = true;
            return false;
        }
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = s;
    return true;
}

static bool enter(parser *p) {
    if (++p->depth > TMPL_MAX_NEST) {
        token *t = cur(p);
        perr_at(p, t->line, t->col, "template nested too deeply", NULL);
        return false;
    }
    return true;
}
/* Each link of a left-associative chain (a + b + c, a|f|g, a.b.c) adds a level to the
 * evaluator's recursion, so chains count toward the nesting limit too. */
static bool chain_link(parser *p, int *links) {
    (*links)++;
    return enter(p);
}

#define LEAVE(p, x) \
    do {            \
        (p)->depth--; \
        return (x); \
    } while (0)

static tnode *parse_expr(parser *p);
static tnode *parse_or(parser *p);
static tnode *parse_unary(parser *p, bool with_filter);
static tnode *parse_primary(parser *p);
static tnode *parse_postfix(parser *p, tnode *n);
static tnode *parse_filter_expr(parser *p, tnode *n);

/* Parses call arguments after '(' up to ')' into node->list / names+list2 (kwargs). */
static bool parse_args(parser *p, tnode *call) {
    nvec args = {0}, kwvals = {0};
    svec kwnames = {0};
    next(p); /* ( */
    while (!is_op(cur(p), ")")) {
        if (args.n + kwvals.n && !expect_op(p, ",")) return false;
        if (is_op(cur(p), ")")) break;
        if (cur(p)->type == TK_NAME && is_op(peek_at(p, 1), "=")) {
            const char *name = cur(p)->s;
            next(p);
            next(p);
            tnode *v = parse_expr(p);
            if (!v) return false;
            if (!sv_push(p, &kwnames, name) || !nv_push(p, &kwvals, v)) return false;
        } else {
            if (kwvals.n) {
                unexpected(p, "keyword argument (positional after keyword)");
                return false;
            }
            tnode *v = parse_expr(p);
            if (!v || !nv_push(p, &args, v)) return false;
        }
    }
    next(p); /* ) */
    call->list = args.v;
    call->n = args.n;
    call->list2 = kwvals.v;
    call->n2 = kwvals.n;
    call->names = kwnames.v;
    call->n_names = kwnames.n;
    return true;
}

static tnode *parse_filter(parser *p, tnode *input) {
    /* after '|' */
    token *t = cur(p);
    if (t->type != TK_NAME) {
        unexpected(p, "filter name");
        return NULL;
    }
    tnode *f = new_node(p, N_FILTER, t->line);
    if (!f) return NULL;
    f->a = input;
    f->str = t->s;
    next(p);
    while (is_op(cur(p), ".") && peek_at(p, 1)->type == TK_NAME) {
        /* dotted filter names: not supported by us; keep the full name for the error */
        next(p);
        next(p);
    }
    if (is_op(cur(p), "(") && !parse_args(p, f)) return NULL;
    return f;
}

static tnode *parse_filter_expr_links(parser *p, tnode *n, int *links) {
    for (;;) {
        if (!chain_link(p, links)) return NULL;
        token *t = cur(p);
        if (is_op(t, "|")) {
            next(p);
            n = parse_filter(p, n);
            if (!n) return NULL;
        } else if (is_name(t, "is")) {
            next(p);
            tnode *tst = new_node(p, N_TEST, t->line);
            if (!tst) return NULL;
            tst->a = n;
            if (is_name(cur(p), "not")) {
                tst->op = 1;
                next(p);
            }
            token *nt = cur(p);
            if (nt->type != TK_NAME) {
                unexpected(p, "test name");
                return NULL;
            }
            tst->str = nt->s;
            next(p);
            nt = cur(p);
            if (is_op(nt, "(")) {
                if (!parse_args(p, tst)) return NULL;
            } else if ((nt->type == TK_NAME || nt->type == TK_STRING || nt->type == TK_INT ||
                        nt->type == TK_FLOAT || is_op(nt, "[") || is_op(nt, "{")) &&
                       !is_name(nt, "else") && !is_name(nt, "or") && !is_name(nt, "and") &&
                       !is_name(nt, "if")) {
                /* `is divisibleby 3`: one argument without parentheses */
                tnode *arg = parse_primary(p);
                if (!arg) return NULL;
                arg = parse_postfix(p, arg);
                if (!arg) return NULL;
                tnode **l = ta_alloc(p->a, sizeof *l);
                if (!l) return NULL;
                l[0] = arg;
                tst->list = l;
                tst->n = 1;
            }
            n = tst;
        } else if (is_op(t, "(")) {
            tnode *c = new_node(p, N_CALL, t->line);
            if (!c) return NULL;
            c->a = n;
            if (!parse_args(p, c)) return NULL;
            n = c;
        } else {
            return n;
        }
    }
}

static tnode *parse_postfix_links(parser *p, tnode *n, int *links) {
    for (;;) {
        if (!chain_link(p, links)) return NULL;
        token *t = cur(p);
        if (is_op(t, ".")) {
            next(p);
            token *nt = cur(p);
            tnode *x;
            if (nt->type == TK_NAME) {
                x = new_node(p, N_ATTR, t->line);
                if (!x) return NULL;
                x->str = nt->s;
                x->len = nt->n;
            } else if (nt->type == TK_INT) {
                x = new_node(p, N_ITEM, t->line);
                if (!x) return NULL;
                x->b = new_node(p, N_CONST, t->line);
                if (!x->b) return NULL;
                x->b->val = tv_int(nt->i);
            } else {
                unexpected(p, "attribute name");
                return NULL;
            }
            x->a = n;
            next(p);
            n = x;
        } else if (is_op(t, "[")) {
            next(p);
            tnode *parts[3] = {NULL, NULL, NULL};
            int np = 0;
            bool slice = false;
            for (;;) {
                if (is_op(cur(p), ":")) {
                    slice = true;
                    if (++np > 2) {
                        unexpected(p, "']'");
                        return NULL;
                    }
                    next(p);
                    continue;
                }
                if (is_op(cur(p), "]")) break;
                if (parts[np]) {
                    unexpected(p, "']'");
                    return NULL;
                }
                parts[np] = parse_expr(p);
                if (!parts[np]) return NULL;
            }
            next(p);
            tnode *x = new_node(p, slice ? N_SLICE : N_ITEM, t->line);
            if (!x) return NULL;
            x->a = n;
            if (!slice && !parts[0]) {
                unexpected(p, "subscript");
                return NULL;
            }
            x->b = parts[0];
            x->c = parts[1];
            x->d = parts[2];
            n = x;
        } else if (is_op(t, "(")) {
            tnode *c = new_node(p, N_CALL, t->line);
            if (!c) return NULL;
            c->a = n;
            if (!parse_args(p, c)) return NULL;
            n = c;
        } else {
            return n;
        }
    }
}

static tnode *parse_filter_expr(parser *p, tnode *n) {
    int links = 0;
    tnode *r = parse_filter_expr_links(p, n, &links);
    p->depth -= links;
    return r;
}

static tnode *parse_postfix(parser *p, tnode *n) {
    int links = 0;
    tnode *r = parse_postfix_links(p, n, &links);
    p->depth -= links;
    return r;
}

/* Parses comma-separated expressions until `close`; sets *trailing_comma. */
static bool parse_seq(parser *p, nvec *v, const char *close, bool *comma) {
    *comma = false;
    while (!is_op(cur(p), close)) {
        if (v->n) {
            if (!expect_op(p, ",")) return false;
            *comma = true;
            if (is_op(cur(p), close)) break;
            *comma = false;
        }
        tnode *e = parse_expr(p);
        if (!e || !nv_push(p, v, e)) return false;
    }
    next(p);
    return true;
}

static tnode *parse_primary(parser *p) {
    if (!enter(p)) return NULL;
    token *t = cur(p);
    tnode *n = NULL;
    switch (t->type) {
    case TK_NAME:
        n = new_node(p, N_CONST, t->line);
        if (!n) LEAVE(p, NULL);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) n->val = tv_bool(true);
        else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) n->val = tv_bool(false);
        else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) n->val = tv_none();
        else {
            n->kind = N_NAME;
            n->str = t->s;
            n->len = t->n;
        }
        next(p);
        break;
    case TK_STRING: {
        /* adjacent literals concatenate */
        tval_buf b = {0};
        while (cur(p)->type == TK_STRING) {
            if (!tb_put(p->a, &b, cur(p)->s, cur(p)->n)) LEAVE(p, NULL);
            next(p);
        }
        n = new_node(p, N_CONST, t->line);
        if (!n) LEAVE(p, NULL);
        n->val = tv_str(b.p ? b.p : "", b.n);
        break;
    }
    case TK_INT:
    case TK_FLOAT:
        n = new_node(p, N_CONST, t->line);
        if (!n) LEAVE(p, NULL);
        n->val = t->type == TK_INT ? tv_int(t->i) : tv_float(t->f);
        next(p);
        break;
    case TK_OP:
        if (is_op(t, "(")) {
            next(p);
            nvec v = {0};
            bool comma;
            if (!parse_seq(p, &v, ")", &comma)) LEAVE(p, NULL);
            if (v.n == 1 && !comma) {
                n = v.v[0];
            } else {
                n = new_node(p, N_TUPLE, t->line);
                if (!n) LEAVE(p, NULL);
                n->list = v.v;
                n->n = v.n;
            }
        } else if (is_op(t, "[")) {
            next(p);
            nvec v = {0};
            bool comma;
            if (!parse_seq(p, &v, "]", &comma)) LEAVE(p, NULL);
            n = new_node(p, N_LIST, t->line);
            if (!n) LEAVE(p, NULL);
            n->list = v.v;
            n->n = v.n;
        } else if (is_op(t, "{")) {
            next(p);
            nvec keys = {0}, vals = {0};
            while (!is_op(cur(p), "}")) {
                if (keys.n) {
                    if (!expect_op(p, ",")) LEAVE(p, NULL);
                    if (is_op(cur(p), "}")) break;
                }
                tnode *k = parse_expr(p);
                if (!k || !expect_op(p, ":")) LEAVE(p, NULL);
                tnode *v = parse_expr(p);
                if (!v || !nv_push(p, &keys, k) || !nv_push(p, &vals, v)) LEAVE(p, NULL);
            }
            next(p);
            n = new_node(p, N_DICT, t->line);
            if (!n) LEAVE(p, NULL);
            n->list = keys.v;
            n->n = keys.n;
            n->list2 = vals.v;
            n->n2 = vals.n;
        } else {
            unexpected(p, "an expression");
            LEAVE(p, NULL);
        }
        break;
    default: unexpected(p, "an expression"); LEAVE(p, NULL);
    }
    LEAVE(p, n);
}

static tnode *parse_unary(parser *p, bool with_filter) {
    if (!enter(p)) return NULL;
    token *t = cur(p);
    tnode *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        next(p);
        tnode *inner = parse_unary(p, false);
        if (!inner) LEAVE(p, NULL);
        n = new_node(p, is_op(t, "-") ? N_NEG : N_POS, t->line);
        if (!n) LEAVE(p, NULL);
        n->a = inner;
    } else {
        n = parse_primary(p);
    }
    if (!n) LEAVE(p, NULL);
    n = parse_postfix(p, n);
    if (n && with_filter) n = parse_filter_expr(p, n);
    LEAVE(p, n);
}

static tnode *binop(parser *p, int op, tnode *l, tnode *r, int line) {
    if (!l || !r) return NULL;
    tnode *n = new_node(p, N_BINOP, line);
    if (!n) return NULL;
    n->op = op;
    n->a = l;
    n->b = r;
    return n;
}

static tnode *parse_pow(parser *p) {
    tnode *l = parse_unary(p, true);
    int links = 0;
    while (l && is_op(cur(p), "**")) {
        int line = cur(p)->line;
        next(p);
        l = chain_link(p, &links) ? binop(p, 'p', l, parse_unary(p, true), line) : NULL;
    }
    p->depth -= links;
    return l;
}

static tnode *parse_math2(parser *p) {
    tnode *l = parse_pow(p);
    int links = 0;
    for (;;) {
        token *t = cur(p);
        int op = is_op(t, "*") ? '*' : is_op(t, "/") ? '/' : is_op(t, "//") ? 'f'
                 : is_op(t, "%") ? '%' : 0;
        if (!l || !op || !chain_link(p, &links)) {
            p->depth -= links;
            return op ? NULL : l;
        }
        next(p);
        l = binop(p, op, l, parse_pow(p), t->line);
    }
}

static tnode *parse_concat(parser *p) {
    tnode *l = parse_math2(p);
    int links = 0;
    while (l && is_op(cur(p), "~")) {
        int line = cur(p)->line;
        next(p);
        l = chain_link(p, &links) ? binop(p, '~', l, parse_math2(p), line) : NULL;
    }
    p->depth -= links;
    return l;
}

static tnode *parse_math1(parser *p) {
    tnode *l = parse_concat(p);
    int links = 0;
    for (;;) {
        token *t = cur(p);
        int op = is_op(t, "+") ? '+' : is_op(t, "-") ? '-' : 0;
        if (!l || !op || !chain_link(p, &links)) {
            p->depth -= links;
            return op ? NULL : l;
        }
        next(p);
        l = binop(p, op, l, parse_concat(p), t->line);
    }
}

static tnode *parse_compare(parser *p) {
    tnode *l = parse_math1(p);
    if (!l) return NULL;
    nvec rhs = {0};
    int ops[64];
    int n_ops = 0;
    int line = cur(p)->line;
    for (;;) {
        token *t = cur(p);
        int op = -1;
        if (is_op(t, "==")) op = CMP_EQ;
        else if (is_op(t, "!=")) op = CMP_NE;
        else if (is_op(t, "<")) op = CMP_LT;
        else if (is_op(t, "<=")) op = CMP_LE;
        else if (is_op(t, ">")) op = CMP_GT;
        else if (is_op(t, ">=")) op = CMP_GE;
        else if (is_name(t, "in")) op = CMP_IN;
        else if (is_name(t, "not") && is_name(peek_at(p, 1), "in")) {
            op = CMP_NOTIN;
            next(p);
        }
        if (op < 0) break;
        if (n_ops == 64) {
            perr_at(p, t->line, t->col, "comparison chain too long", NULL);
            return NULL;
        }
        next(p);
        tnode *r = parse_math1(p);
        if (!r || !nv_push(p, &rhs, r)) return NULL;
        ops[n_ops++] = op;
    }
    if (!n_ops) return l;
    tnode *n = new_node(p, N_COMPARE, line);
    if (!n) return NULL;
    n->a = l;
    n->list = rhs.v;
    n->n = rhs.n;
    n->ops = ta_alloc(p->a, (size_t)n_ops * sizeof(int));
    if (!n->ops) return NULL;
    memcpy(n->ops, ops, (size_t)n_ops * sizeof(int));
    return n;
}

static tnode *parse_not(parser *p) {
    token *t = cur(p);
    if (is_name(t, "not")) {
        if (!enter(p)) return NULL;
        next(p);
        tnode *inner = parse_not(p);
        if (!inner) LEAVE(p, NULL);
        tnode *n = new_node(p, N_NOT, t->line);
        if (!n) LEAVE(p, NULL);
        n->a = inner;
        LEAVE(p, n);
    }
    return parse_compare(p);
}

static tnode *parse_and(parser *p) {
    tnode *l = parse_not(p);
    int links = 0;
    while (l && is_name(cur(p), "and")) {
        if (!chain_link(p, &links)) {
            l = NULL;
            break;
        }
        int line = cur(p)->line;
        next(p);
        tnode *r = parse_not(p);
        tnode *n = r ? new_node(p, N_AND, line) : NULL;
        if (!n) {
            l = NULL;
            break;
        }
        n->a = l;
        n->b = r;
        l = n;
    }
    p->depth -= links;
    return l;
}

static tnode *parse_or(parser *p) {
    tnode *l = parse_and(p);
    int links = 0;
    while (l && is_name(cur(p), "or")) {
        if (!chain_link(p, &links)) {
            l = NULL;
            break;
        }
        int line = cur(p)->line;
        next(p);
        tnode *r = parse_and(p);
        tnode *n = r ? new_node(p, N_OR, line) : NULL;
        if (!n) {
            l = NULL;
            break;
        }
        n->a = l;
        n->b = r;
        l = n;
    }
    p->depth -= links;
    return l;
}

static tnode *parse_expr(parser *p) {
    if (!enter(p)) return NULL;
    tnode *e = parse_or(p);
    while (e && is_name(cur(p), "if")) {
        int line = cur(p)->line;
        next(p);
        tnode *cond = parse_or(p);
        if (!cond) LEAVE(p, NULL);
        tnode *els = NULL;
        if (is_name(cur(p), "else")) {
            next(p);
            els = parse_expr(p);
            if (!els) LEAVE(p, NULL);
        }
        tnode *n = new_node(p, N_COND, line);
        if (!n) LEAVE(p, NULL);
        n->a = cond;
        n->b = e;
        n->c = els;
        e = n;
    }
    LEAVE(p, e);
}

/* An expression that may be an unparenthesized tuple (`set a = 1, 2`). */
static tnode *parse_tuple_expr(parser *p) {
    int line = cur(p)->line;
    tnode *e = parse_expr(p);
    if (!e || !is_op(cur(p), ",")) return e;
    nvec v = {0};
    if (!nv_push(p, &v, e)) return NULL;
    while (is_op(cur(p), ",")) {
        next(p);
        if (cur(p)->type == TK_BLOCK_END || cur(p)->type == TK_VAR_END) break;
        e = parse_expr(p);
        if (!e || !nv_push(p, &v, e)) return NULL;
    }
    tnode *t = new_node(p, N_TUPLE, line);
    if (!t) return NULL;
    t->list = v.v;
    t->n = v.n;
    return t;
}

/* ---- statements ---- */

static bool parse_body(parser *p, nvec *body, const char *const *ends);

static bool expect_block_end(parser *p) {
    if (cur(p)->type != TK_BLOCK_END) return unexpected(p, "end of statement block");
    next(p);
    return true;
}

/* Parses a body ending in one of ends; leaves p at the end tag's name. */
static bool parse_until(parser *p, nvec *body, const char *const *ends, const char *block,
                        int line) {
    if (!parse_body(p, body, ends)) return false;
    if (cur(p)->type == TK_EOF) {
        char msg[200];
        snprintf(msg, sizeof msg, "unexpected end of template: the '%s' block opened at line %d "
                 "was never closed (looking for '%s')", block, line, ends[0]);
        perr_at(p, cur(p)->line, cur(p)->col, "%s", msg);
        return false;
    }
    return true;
}

static bool parse_targets(parser *p, svec *names) {
    bool paren = is_op(cur(p), "(");
    if (paren) next(p);
    for (;;) {
        if (cur(p)->type != TK_NAME) return unexpected(p, "a variable name");
        if (!sv_push(p, names, cur(p)->s)) return false;
        next(p);
        if (!is_op(cur(p), ",")) break;
        next(p);
        if (paren && is_op(cur(p), ")")) break;
    }
    if (paren && !expect_op(p, ")")) return false;
    return true;
}

static tnode *parse_statement(parser *p) {
    token *t = cur(p); /* the tag name */
    int line = t->line;
    if (t->type != TK_NAME) {
        unexpected(p, "a statement name");
        return NULL;
    }
    const char *kw = t->s;
    next(p);
    if (!strcmp(kw, "if")) {
        tnode *n = new_node(p, N_IF, line);
        if (!n) return NULL;
        tnode *top = n;
        n->a = parse_tuple_expr(p);
        if (!n->a || !expect_block_end(p)) return NULL;
        static const char *const ends[] = {"endif", "elif", "else", NULL};
        for (;;) {
            nvec body = {0};
            if (!parse_until(p, &body, ends, "if", line)) return NULL;
            const char *which = cur(p)->s;
            next(p);
            n->list = body.v;
            n->n = body.n;
            if (!strcmp(which, "elif")) {
                tnode *e = new_node(p, N_IF, cur(p)->line);
                if (!e) return NULL;
                e->a = parse_tuple_expr(p);
                if (!e->a || !expect_block_end(p)) return NULL;
                tnode **l = ta_alloc(p->a, sizeof *l);
                if (!l) return NULL;
                l[0] = e;
                n->list2 = l;
                n->n2 = 1;
                n = e;
                continue;
            }
            if (!strcmp(which, "else")) {
                if (!expect_block_end(p)) return NULL;
                static const char *const ends2[] = {"endif", NULL};
                nvec eb = {0};
                if (!parse_until(p, &eb, ends2, "if", line)) return NULL;
                next(p);
                n->list2 = eb.v;
                n->n2 = eb.n;
            }
            if (!expect_block_end(p)) return NULL;
            return top;
        }
    }
    if (!strcmp(kw, "for")) {
        tnode *n = new_node(p, N_FOR, line);
        if (!n) return NULL;
        svec names = {0};
        if (!parse_targets(p, &names)) return NULL;
        n->names = names.v;
        n->n_names = names.n;
        if (!is_name(cur(p), "in")) {
            unexpected(p, "'in'");
            return NULL;
        }
        next(p);
        /* the iterable may not contain a bare `if` (it starts the loop filter) */
        n->a = parse_or(p);
        if (!n->a) return NULL;
        if (is_op(cur(p), ",")) {
            unexpected(p, "'%}'");
            return NULL;
        }
        if (is_name(cur(p), "if")) {
            next(p);
            n->b = parse_expr(p);
            if (!n->b) return NULL;
        }
        if (is_name(cur(p), "recursive")) {
            perr_at(p, cur(p)->line, cur(p)->col, "recursive loops are not supported", NULL);
            return NULL;
        }
        if (!expect_block_end(p)) return NULL;
        static const char *const ends[] = {"endfor", "else", NULL};
        nvec body = {0};
        if (!parse_until(p, &body, ends, "for", line)) return NULL;
        n->list = body.v;
        n->n = body.n;
        if (is_name(cur(p), "else")) {
            next(p);
            if (!expect_block_end(p)) return NULL;
            static const char *const ends2[] = {"endfor", NULL};
            nvec eb = {0};
            if (!parse_until(p, &eb, ends2, "for", line)) return NULL;
            n->list2 = eb.v;
            n->n2 = eb.n;
        }
        next(p);
        if (!expect_block_end(p)) return NULL;
        return n;
    }
    if (!strcmp(kw, "set")) {
        if (cur(p)->type == TK_NAME && is_op(peek_at(p, 1), ".") &&
            peek_at(p, 2)->type == TK_NAME) {
            /* namespace attribute assignment */
            tnode *n = new_node(p, N_SET, line);
            if (!n) return NULL;
            n->op = 1;
            n->str = cur(p)->s;
            const char **nm = ta_alloc(p->a, sizeof *nm);
            if (!nm) return NULL;
            nm[0] = peek_at(p, 2)->s;
            n->names = nm;
            n->n_names = 1;
            next(p);
            next(p);
            next(p);
            if (!expect_op(p, "=")) return NULL;
            n->a = parse_tuple_expr(p);
            if (!n->a || !expect_block_end(p)) return NULL;
            return n;
        }
        svec names = {0};
        if (!parse_targets(p, &names)) return NULL;
        if (is_op(cur(p), "=")) {
            next(p);
            tnode *n = new_node(p, N_SET, line);
            if (!n) return NULL;
            n->names = names.v;
            n->n_names = names.n;
            n->a = parse_tuple_expr(p);
            if (!n->a || !expect_block_end(p)) return NULL;
            return n;
        }
        if (names.n != 1) {
            unexpected(p, "'='");
            return NULL;
        }
        tnode *n = new_node(p, N_SETBLOCK, line);
        if (!n) return NULL;
        n->str = names.v[0];
        tnode *chain = NULL;
        while (is_op(cur(p), "|")) {
            next(p);
            chain = parse_filter(p, chain);
            if (!chain) return NULL;
        }
        n->b = chain;
        if (!expect_block_end(p)) return NULL;
        static const char *const ends[] = {"endset", NULL};
        nvec body = {0};
        if (!parse_until(p, &body, ends, "set", line)) return NULL;
        next(p);
        if (!expect_block_end(p)) return NULL;
        n->list = body.v;
        n->n = body.n;
        return n;
    }
    if (!strcmp(kw, "macro")) {
        tnode *n = new_node(p, N_MACRO, line);
        if (!n) return NULL;
        if (cur(p)->type != TK_NAME) {
            unexpected(p, "macro name");
            return NULL;
        }
        n->str = cur(p)->s;
        next(p);
        svec params = {0};
        nvec defs = {0};
        if (!expect_op(p, "(")) return NULL;
        while (!is_op(cur(p), ")")) {
            if (params.n && !expect_op(p, ",")) return NULL;
            if (is_op(cur(p), ")")) break;
            if (cur(p)->type != TK_NAME) {
                unexpected(p, "parameter name");
                return NULL;
            }
            if (!sv_push(p, &params, cur(p)->s)) return NULL;
            next(p);
            tnode *def = NULL;
            if (is_op(cur(p), "=")) {
                next(p);
                def = parse_expr(p);
                if (!def) return NULL;
            } else if (defs.n && defs.v[defs.n - 1]) {
                unexpected(p, "'=' (non-default parameter after a default one)");
                return NULL;
            }
            if (!nv_push(p, &defs, def)) return NULL;
        }
        next(p);
        if (!expect_block_end(p)) return NULL;
        n->names = params.v;
        n->n_names = params.n;
        n->list2 = defs.v;
        n->n2 = defs.n;
        static const char *const ends[] = {"endmacro", NULL};
        nvec body = {0};
        if (!parse_until(p, &body, ends, "macro", line)) return NULL;
        next(p);
        if (cur(p)->type == TK_NAME) next(p); /* {% endmacro name %} */
        if (!expect_block_end(p)) return NULL;
        n->list = body.v;
        n->n = body.n;
        return n;
    }
    if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        tnode *n = new_node(p, kw[0] == 'b' ? N_BREAK : N_CONTINUE, line);
        if (!n || !expect_block_end(p)) return NULL;
        return n;
    }
    if (!strcmp(kw, "filter") || !strcmp(kw, "generation")) {
        bool filter = kw[0] == 'f';
        tnode *n = new_node(p, filter ? N_FILTERBLOCK : N_BLOCK, line);
        if (!n) return NULL;
        if (filter) {
            tnode *chain = parse_filter(p, NULL);
            while (chain && is_op(cur(p), "|")) {
                next(p);
                chain = parse_filter(p, chain);
            }
            if (!chain) return NULL;
            n->b = chain;
        }
        if (!expect_block_end(p)) return NULL;
        const char *const ends_f[] = {"endfilter", NULL};
        const char *const ends_g[] = {"endgeneration", NULL};
        nvec body = {0};
        if (!parse_until(p, &body, filter ? ends_f : ends_g, kw, line)) return NULL;
        next(p);
        if (!expect_block_end(p)) return NULL;
        n->list = body.v;
        n->n = body.n;
        return n;
    }
    perr_at(p, t->line, t->col, "unknown tag '%s'", kw);
    return NULL;
}

static bool parse_body(parser *p, nvec *body, const char *const *ends) {
    if (!enter(p)) return false;
    for (;;) {
        token *t = cur(p);
        if (t->type == TK_EOF) LEAVE(p, true);
        if (t->type == TK_TEXT) {
            tnode *n = new_node(p, N_TEXT, t->line);
            if (!n) LEAVE(p, false);
            n->str = t->s;
            n->len = t->n;
            next(p);
            if (!nv_push(p, body, n)) LEAVE(p, false);
        } else if (t->type == TK_VAR_BEGIN) {
            next(p);
            tnode *n = new_node(p, N_OUTPUT, t->line);
            if (!n) LEAVE(p, false);
            n->a = parse_tuple_expr(p);
            if (!n->a) LEAVE(p, false);
            if (cur(p)->type != TK_VAR_END) LEAVE(p, unexpected(p, "'}}'"));
            next(p);
            if (!nv_push(p, body, n)) LEAVE(p, false);
        } else if (t->type == TK_BLOCK_BEGIN) {
            token *name = peek_at(p, 1);
            if (name->type == TK_NAME && ends) {
                for (int i = 0; ends[i]; i++)
                    if (!strcmp(name->s, ends[i])) {
                        next(p); /* leave p at the name */
                        LEAVE(p, true);
                    }
            }
            if (name->type == TK_NAME &&
                (!strncmp(name->s, "end", 3) || !strcmp(name->s, "else") ||
                 !strcmp(name->s, "elif"))) {
                char msg[200];
                snprintf(msg, sizeof msg, "unexpected '%s'%s%s%s", name->s,
                         ends ? " (expected '" : "", ends ? ends[0] : "", ends ? "')" : "");
                perr_at(p, name->line, name->col, "%s", msg);
                LEAVE(p, false);
            }
            next(p);
            tnode *n = parse_statement(p);
            if (!n || !nv_push(p, body, n)) LEAVE(p, false);
        } else {
            LEAVE(p, unexpected(p, "template data or a tag"));
        }
    }
}

hl_status tmpl_compile(const char *source, size_t len, tmpl **out, hl_err *err) {
    *out = NULL;
    if (!source && len) return hl_fail(err, HL_ERR_INVALID, "template source is NULL");
    tmpl *t = calloc(1, sizeof *t);
    if (!t) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    hl_err local;
    if (!err) err = &local;
    parser p = {.a = &t->arena, .err = err};
    /* jinja normalizes \r\n and \r to \n and drops one trailing newline */
    char *src = malloc(len + 1);
    if (!src) {
        free(t);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (source[i] == '\r') {
            src[n++] = '\n';
            if (i + 1 < len && source[i + 1] == '\n') i++;
        } else {
            src[n++] = source[i];
        }
    }
    if (n && src[n - 1] == '\n') n--;
    src[n] = 0;
    bool ok = lex(&p, src, n);
    free(src);
    if (ok) {
        nvec body = {0};
        ok = parse_body(&p, &body, NULL);
        if (ok && cur(&p)->type != TK_EOF) ok = unexpected(&p, "end of template");
        t->body = body.v;
        t->n_body = body.n;
    }
    free(p.toks);
    if (!ok || p.failed) {
        if (!p.failed) hl_fail(err, HL_ERR_NOMEM, "out of memory parsing template");
        hl_status code = err->code ? err->code : HL_ERR_FORMAT;
        tmpl_destroy(t);
        return code;
    }
    *out = t;
    return HL_OK;
}

void tmpl_destroy(tmpl *t) {
    if (!t) return;
    ta_free_all(&t->arena);
    free(t);
}

const char *tmpl_from_tokenizer_config(const json_t *config) {
    json_t *ct = json_object_get(config, "chat_template");
    if (json_is_string(ct)) return json_string_value(ct);
    if (json_is_array(ct)) {
        size_t i;
        json_t *e;
        json_array_foreach(ct, i, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            json_t *tt = json_object_get(e, "template");
            if (name && !strcmp(name, "default") && json_is_string(tt))
                return json_string_value(tt);
        }
    }
    return NULL;
}
