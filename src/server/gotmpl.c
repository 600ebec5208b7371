/* gotmpl.c - a Go text/template subset over JSON data (gotmpl.h). */
#define _GNU_SOURCE
#include "server/gotmpl.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_OUTPUT (16u << 20)
#define MAX_ITER 100000
#define MAX_DEPTH 64
#define MAX_ARGS 16
#define MAX_FIELDS 8

/* ---------------- AST ---------------- */

typedef enum akind { A_FIELD, A_VAR, A_STR, A_INT, A_BOOL, A_NIL, A_FUNC, A_PIPE } akind;

struct pipe;

typedef struct arg {
    akind k;
    char *s;                 /* A_VAR name ("" = $), A_STR text, A_FUNC name */
    long long i;             /* A_INT, A_BOOL */
    char *fields[MAX_FIELDS]; /* A_FIELD (from .) / A_VAR chain */
    int nf;
    struct pipe *sub;        /* A_PIPE */
} arg;

typedef struct cmd {
    arg args[MAX_ARGS];
    int n;
} cmd;

typedef struct pipe {
    cmd *cmds;
    int n;
    char *decl[2]; /* range $i, $v := / $x := */
    int n_decl;
    bool assign;   /* $x = (not :=) */
} pipe;

typedef enum nkind { N_TEXT, N_OUT, N_IF, N_RANGE, N_WITH, N_SET, N_BREAK, N_CONTINUE } nkind;

typedef struct node node;
typedef struct list {
    node *v;
    size_t n, cap;
} list;

struct node {
    nkind k;
    char *text;
    pipe *p;
    list body, els;
};

struct gotmpl {
    list root;
};

static void pipe_free(pipe *p);

static void arg_free(arg *a) {
    free(a->s);
    for (int i = 0; i < a->nf; i++) free(a->fields[i]);
    if (a->sub) pipe_free(a->sub);
}

static void pipe_free(pipe *p) {
    if (!p) return;
    for (int c = 0; c < p->n; c++)
        for (int i = 0; i < p->cmds[c].n; i++) arg_free(&p->cmds[c].args[i]);
    free(p->cmds);
    for (int i = 0; i < p->n_decl; i++) free(p->decl[i]);
    free(p);
}

static void list_free(list *l) {
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].text);
        pipe_free(l->v[i].p);
        list_free(&l->v[i].body);
        list_free(&l->v[i].els);
    }
    free(l->v);
}

static node *list_push(list *l) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        node *v = realloc(l->v, cap * sizeof *v);
        if (!v) return NULL;
        l->v = v;
        l->cap = cap;
    }
    node *n = &l->v[l->n++];
    memset(n, 0, sizeof *n);
    return n;
}

/* ---------------- lexing the template into text and actions ---------------- */

typedef struct chunk {
    bool action;
    char *s;
} chunk;

static hl_status split(const char *src, chunk **out, size_t *n_out, hl_err *err) {
    size_t cap = 16, n = 0;
    chunk *t = malloc(cap * sizeof *t);
    if (!t) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    const char *p = src;
    bool trim_next = false;
    hl_status st = HL_OK;
    for (;;) {
        const char *open = strstr(p, "{{");
        size_t tl = open ? (size_t)(open - p) : strlen(p);
        const char *ts = p;
        if (trim_next)
            while (tl > 0 && isspace((unsigned char)*ts)) ts++, tl--;
        bool trim_prev = open && open[2] == '-' && open[3] && isspace((unsigned char)open[3]);
        if (trim_prev)
            while (tl > 0 && isspace((unsigned char)ts[tl - 1])) tl--;
        if (n + 2 > cap) {
            cap *= 2;
            chunk *g = realloc(t, cap * sizeof *t);
            if (!g) {
                st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
                break;
            }
            t = g;
        }
        if (tl) {
            t[n].action = false;
            if (!(t[n].s = strndup(ts, tl))) {
                st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
                break;
            }
            n++;
        }
        if (!open) break;
        const char *in = open + 2 + (trim_prev ? 1 : 0);
        /* the action ends at the first }} outside a string literal */
        const char *q = in, *close = NULL;
        char quote = 0;
        for (; *q; q++) {
            if (quote) {
                if (*q == '\\' && quote == '"' && q[1]) q++;
                else if (*q == quote) quote = 0;
            } else if (*q == '"' || *q == '`') {
                quote = *q;
            } else if (q[0] == '}' && q[1] == '}') {
                close = q;
                break;
            }
        }
        if (!close) {
            st = hl_fail(err, HL_ERR_FORMAT, "template: unclosed action");
            break;
        }
        const char *e = close;
        trim_next = false;
        if (e - in >= 2 && e[-1] == '-' && isspace((unsigned char)e[-2])) {
            trim_next = true;
            e--;
        }
        while (in < e && isspace((unsigned char)*in)) in++;
        while (e > in && isspace((unsigned char)e[-1])) e--;
        t[n].action = true;
        if (!(t[n].s = strndup(in, (size_t)(e - in)))) {
            st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
            break;
        }
        n++;
        p = close + 2;
    }
    if (st) {
        for (size_t i = 0; i < n; i++) free(t[i].s);
        free(t);
        return st;
    }
    *out = t;
    *n_out = n;
    return HL_OK;
}

/* ---------------- parsing one action's pipeline ---------------- */

typedef struct lexer {
    const char *p;
    hl_err *err;
    hl_status st;
    int depth;
} lexer;

static void skip_sp(lexer *lx) {
    while (*lx->p && isspace((unsigned char)*lx->p)) lx->p++;
}

static hl_status lx_fail(lexer *lx, hl_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static hl_status lx_fail(lexer *lx, hl_status code, const char *fmt, ...) {
    if (lx->st) return lx->st;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return lx->st = hl_fail(lx->err, code, "template: %s", msg);
}

static bool ident_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* .A.B or $x.A: the field chain after the current position (which is at a '.') */
static bool parse_chain(lexer *lx, arg *a) {
    while (*lx->p == '.' && ident_char(lx->p[1])) {
        lx->p++;
        const char *s = lx->p;
        while (ident_char(*lx->p)) lx->p++;
        if (a->nf == MAX_FIELDS) return lx_fail(lx, HL_ERR_UNSUPPORTED, "field chain too long"), false;
        if (!(a->fields[a->nf++] = strndup(s, (size_t)(lx->p - s))))
            return lx_fail(lx, HL_ERR_NOMEM, "out of memory"), false;
    }
    return true;
}

static pipe *parse_pipe(lexer *lx, bool allow_decl);

static bool parse_string(lexer *lx, arg *a) {
    char q = *lx->p++;
    size_t cap = 32, n = 0;
    char *s = malloc(cap);
    if (!s) return lx_fail(lx, HL_ERR_NOMEM, "out of memory"), false;
    while (*lx->p && *lx->p != q) {
        char c = *lx->p++;
        if (q == '"' && c == '\\') {
            char e = *lx->p++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case '\\': c = '\\'; break;
            case '"': c = '"'; break;
            case '\'': c = '\''; break;
            default:
                free(s);
                return lx_fail(lx, HL_ERR_FORMAT, "bad escape in string"), false;
            }
        }
        if (n + 2 > cap) {
            char *b = realloc(s, cap *= 2);
            if (!b) {
                free(s);
                return lx_fail(lx, HL_ERR_NOMEM, "out of memory"), false;
            }
            s = b;
        }
        s[n++] = c;
    }
    if (*lx->p != q) {
        free(s);
        return lx_fail(lx, HL_ERR_FORMAT, "unterminated string"), false;
    }
    lx->p++;
    s[n] = '\0';
    a->k = A_STR;
    a->s = s;
    return true;
}

/* One operand or function name. */
static bool parse_arg(lexer *lx, arg *a) {
    memset(a, 0, sizeof *a);
    skip_sp(lx);
    char c = *lx->p;
    if (c == '"' || c == '`') return parse_string(lx, a);
    if (c == '(') {
        lx->p++;
        if (++lx->depth > MAX_DEPTH) return lx_fail(lx, HL_ERR_INVALID, "nesting too deep"), false;
        a->k = A_PIPE;
        a->sub = parse_pipe(lx, false);
        lx->depth--;
        if (!a->sub) return false;
        skip_sp(lx);
        if (*lx->p != ')') return lx_fail(lx, HL_ERR_FORMAT, "missing )"), false;
        lx->p++;
        return parse_chain(lx, a);
    }
    if (c == '.') {
        a->k = A_FIELD;
        if (!ident_char(lx->p[1])) {
            lx->p++; /* "." itself */
            return true;
        }
        return parse_chain(lx, a);
    }
    if (c == '$') {
        lx->p++;
        const char *s = lx->p;
        while (ident_char(*lx->p)) lx->p++;
        a->k = A_VAR;
        if (!(a->s = strndup(s, (size_t)(lx->p - s)))) return lx_fail(lx, HL_ERR_NOMEM, "out of memory"), false;
        return parse_chain(lx, a);
    }
    if (c == '-' || isdigit((unsigned char)c)) {
        char *end;
        a->k = A_INT;
        a->i = strtoll(lx->p, &end, 10);
        if (end == lx->p) return lx_fail(lx, HL_ERR_FORMAT, "bad number"), false;
        if (*end == '.' || *end == 'e') return lx_fail(lx, HL_ERR_UNSUPPORTED, "floating-point constants"), false;
        lx->p = end;
        return true;
    }
    if (isalpha((unsigned char)c)) {
        const char *s = lx->p;
        while (ident_char(*lx->p)) lx->p++;
        size_t n = (size_t)(lx->p - s);
        if (n == 4 && !strncmp(s, "true", 4)) return a->k = A_BOOL, a->i = 1, true;
        if (n == 5 && !strncmp(s, "false", 5)) return a->k = A_BOOL, a->i = 0, true;
        if (n == 3 && !strncmp(s, "nil", 3)) return a->k = A_NIL, true;
        static const char *fns[] = {"eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not",
                                    "len", "index", "slice", "json", "print", "printf", "println"};
        for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
            if (strlen(fns[i]) == n && !strncmp(s, fns[i], n)) {
                a->k = A_FUNC;
                a->s = strndup(s, n);
                return a->s || (lx_fail(lx, HL_ERR_NOMEM, "out of memory"), false);
            }
        return lx_fail(lx, HL_ERR_UNSUPPORTED, "function \"%.*s\" is not supported", (int)n, s), false;
    }
    return lx_fail(lx, HL_ERR_FORMAT, "unexpected \"%c\" in action", c), false;
}

static pipe *parse_pipe(lexer *lx, bool allow_decl) {
    pipe *p = calloc(1, sizeof *p);
    if (!p) return lx_fail(lx, HL_ERR_NOMEM, "out of memory"), NULL;
    skip_sp(lx);
    /* declarations: $x := / $i, $v := / $x = */
    if (allow_decl && *lx->p == '$') {
        const char *save = lx->p;
        char *names[2] = {NULL, NULL};
        int nn = 0;
        for (;;) {
            if (*lx->p != '$') break;
            lx->p++;
            const char *s = lx->p;
            while (ident_char(*lx->p)) lx->p++;
            names[nn++] = strndup(s, (size_t)(lx->p - s));
            skip_sp(lx);
            if (*lx->p == ',' && nn < 2) {
                lx->p++;
                skip_sp(lx);
                continue;
            }
            break;
        }
        if (lx->p[0] == ':' && lx->p[1] == '=') {
            lx->p += 2;
            p->n_decl = nn;
            p->decl[0] = names[0];
            p->decl[1] = names[1];
        } else if (lx->p[0] == '=' && nn == 1) {
            lx->p++;
            p->n_decl = 1;
            p->decl[0] = names[0];
            p->assign = true;
        } else {
            free(names[0]);
            free(names[1]);
            lx->p = save;
        }
    }
    for (;;) {
        cmd *cs = realloc(p->cmds, (size_t)(p->n + 1) * sizeof *cs);
        if (!cs) {
            pipe_free(p);
            return lx_fail(lx, HL_ERR_NOMEM, "out of memory"), NULL;
        }
        p->cmds = cs;
        cmd *c = &p->cmds[p->n++];
        c->n = 0;
        for (;;) {
            skip_sp(lx);
            if (!*lx->p || *lx->p == '|' || *lx->p == ')') break;
            if (c->n == MAX_ARGS) {
                pipe_free(p);
                return lx_fail(lx, HL_ERR_UNSUPPORTED, "too many arguments"), NULL;
            }
            if (!parse_arg(lx, &c->args[c->n])) {
                arg_free(&c->args[c->n]);
                pipe_free(p);
                return NULL;
            }
            c->n++;
        }
        if (c->n == 0) {
            pipe_free(p);
            return lx_fail(lx, HL_ERR_FORMAT, "missing value in action"), NULL;
        }
        if (*lx->p != '|') break;
        lx->p++;
    }
    return p;
}

static pipe *parse_action_pipe(const char *text, bool allow_decl, hl_err *err, hl_status *st) {
    lexer lx = {.p = text, .err = err};
    pipe *p = parse_pipe(&lx, allow_decl);
    if (p) {
        skip_sp(&lx);
        if (*lx.p) {
            lx_fail(&lx, HL_ERR_FORMAT, "unexpected \"%s\" in action", lx.p);
            pipe_free(p);
            p = NULL;
        }
    }
    *st = lx.st;
    return p;
}

/* ---------------- parsing the structure ---------------- */

typedef struct parser {
    chunk *ch;
    size_t n, pos;
    hl_err *err;
    hl_status st;
    int depth;
} parser;

static bool kw(const char *a, const char *word, const char **rest) {
    size_t n = strlen(word);
    if (strncmp(a, word, n) != 0 || (a[n] && !isspace((unsigned char)a[n]))) return false;
    *rest = a + n;
    return true;
}

static void parse_list(parser *ps, list *l, const char **stop);

/* Parses the body and branches of an if/range/with whose pipeline is in nd->p. */
static void parse_block(parser *ps, node *nd) {
    const char *stop;
    parse_list(ps, &nd->body, &stop);
    if (ps->st) return;
    const char *rest;
    if (stop && kw(stop, "else", &rest)) {
        while (*rest && isspace((unsigned char)*rest)) rest++;
        if (*rest) { /* else if P / else with P: a nested block in the else branch */
            const char *r2;
            node *inner = list_push(&nd->els);
            if (!inner) {
                ps->st = hl_fail(ps->err, HL_ERR_NOMEM, "out of memory");
                return;
            }
            if (kw(rest, "if", &r2)) inner->k = N_IF;
            else if (kw(rest, "with", &r2)) inner->k = N_WITH;
            else {
                ps->st = hl_fail(ps->err, HL_ERR_FORMAT, "template: bad else: %s", rest);
                return;
            }
            inner->p = parse_action_pipe(r2, false, ps->err, &ps->st);
            if (!inner->p) return;
            parse_block(ps, inner); /* consumes the shared end */
            return;
        }
        parse_list(ps, &nd->els, &stop);
        if (ps->st) return;
    }
    if (!stop || strcmp(stop, "end") != 0)
        ps->st = hl_fail(ps->err, HL_ERR_FORMAT, "template: unexpected EOF (missing {{ end }})");
}

static void parse_list(parser *ps, list *l, const char **stop) {
    *stop = NULL;
    if (++ps->depth > MAX_DEPTH) {
        ps->st = hl_fail(ps->err, HL_ERR_INVALID, "template: nesting too deep");
        return;
    }
    while (ps->pos < ps->n && !ps->st) {
        chunk *c = &ps->ch[ps->pos++];
        node *nd;
        if (!c->action) {
            if (!(nd = list_push(l))) break;
            nd->k = N_TEXT;
            nd->text = c->s;
            c->s = NULL;
            continue;
        }
        const char *a = c->s, *rest;
        if (a[0] == '/' && a[1] == '*') continue;
        if (kw(a, "end", &rest) || kw(a, "else", &rest)) {
            *stop = a;
            break;
        }
        if (!(nd = list_push(l))) break;
        if (kw(a, "if", &rest) || kw(a, "range", &rest) || kw(a, "with", &rest)) {
            nd->k = a[0] == 'i' ? N_IF : a[0] == 'r' ? N_RANGE : N_WITH;
            nd->p = parse_action_pipe(rest, nd->k == N_RANGE, ps->err, &ps->st);
            if (!nd->p) break;
            parse_block(ps, nd);
            continue;
        }
        if (kw(a, "break", &rest)) {
            nd->k = N_BREAK;
            continue;
        }
        if (kw(a, "continue", &rest)) {
            nd->k = N_CONTINUE;
            continue;
        }
        if (kw(a, "define", &rest) || kw(a, "template", &rest) || kw(a, "block", &rest)) {
            ps->st = hl_fail(ps->err, HL_ERR_UNSUPPORTED, "template: {{ %s }} is not supported", a);
            break;
        }
        nd->p = parse_action_pipe(a, true, ps->err, &ps->st);
        if (!nd->p) break;
        nd->k = nd->p->n_decl ? N_SET : N_OUT;
    }
    if (!ps->st && l->n && !l->v) ps->st = hl_fail(ps->err, HL_ERR_NOMEM, "out of memory");
    ps->depth--;
}

hl_status gotmpl_compile(const char *src, gotmpl **out, hl_err *err) {
    chunk *ch = NULL;
    size_t n = 0;
    hl_status st = split(src, &ch, &n, err);
    if (st) return st;
    gotmpl *t = calloc(1, sizeof *t);
    parser ps = {.ch = ch, .n = n, .err = err};
    if (!t) ps.st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
    const char *stop = NULL;
    if (!ps.st) parse_list(&ps, &t->root, &stop);
    if (!ps.st && stop) ps.st = hl_fail(err, HL_ERR_FORMAT, "template: unexpected {{ %s }}", stop);
    for (size_t i = 0; i < n; i++) free(ch[i].s);
    free(ch);
    if (ps.st) {
        gotmpl_free(t);
        return ps.st;
    }
    *out = t;
    return HL_OK;
}

void gotmpl_free(gotmpl *t) {
    if (!t) return;
    list_free(&t->root);
    free(t);
}

/* ---------------- uses ---------------- */

static bool pipe_uses(const pipe *p, const char *f);

static bool arg_uses(const arg *a, const char *f) {
    if (a->k == A_FIELD && a->nf > 0 && !strcmp(a->fields[0], f)) return true;
    if (a->k == A_VAR && a->s && !*a->s && a->nf > 0 && !strcmp(a->fields[0], f)) return true;
    return a->sub && pipe_uses(a->sub, f);
}

static bool pipe_uses(const pipe *p, const char *f) {
    if (!p) return false;
    for (int c = 0; c < p->n; c++)
        for (int i = 0; i < p->cmds[c].n; i++)
            if (arg_uses(&p->cmds[c].args[i], f)) return true;
    return false;
}

static bool list_uses(const list *l, const char *f) {
    for (size_t i = 0; i < l->n; i++)
        if (pipe_uses(l->v[i].p, f) || list_uses(&l->v[i].body, f) || list_uses(&l->v[i].els, f))
            return true;
    return false;
}

bool gotmpl_uses(const gotmpl *t, const char *field) { return list_uses(&t->root, field); }

/* Ollama's Template.Vars(): every field name of every field or variable chain
 * (.A.B, $.A, $x.A), compared case-insensitively. */
static bool pipe_mentions(const pipe *p, const char *f);

static bool arg_mentions(const arg *a, const char *f) {
    if (a->k == A_FIELD || a->k == A_VAR)
        for (int i = 0; i < a->nf; i++)
            if (!strcasecmp(a->fields[i], f)) return true;
    return a->sub && pipe_mentions(a->sub, f);
}

static bool pipe_mentions(const pipe *p, const char *f) {
    if (!p) return false;
    for (int c = 0; c < p->n; c++)
        for (int i = 0; i < p->cmds[c].n; i++)
            if (arg_mentions(&p->cmds[c].args[i], f)) return true;
    return false;
}

static bool list_mentions(const list *l, const char *f) {
    for (size_t i = 0; i < l->n; i++)
        if (pipe_mentions(l->v[i].p, f) || list_mentions(&l->v[i].body, f) ||
            list_mentions(&l->v[i].els, f))
            return true;
    return false;
}

bool gotmpl_mentions(const gotmpl *t, const char *name) { return list_mentions(&t->root, name); }

/* ---------------- execution ---------------- */

typedef struct var {
    char *name;
    json_t *val;
} var;

typedef struct exec {
    const json_t *root;
    var vars[64];
    int n_vars;
    char *out;
    size_t len, cap;
    hl_err *err;
    hl_status st;
    bool cut, stopped;
    int brk; /* 1 break, 2 continue */
    long iters;
} exec;

static void ex_fail(exec *x, hl_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void ex_fail(exec *x, hl_status code, const char *fmt, ...) {
    if (x->st) return;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    x->st = hl_fail(x->err, code, "template: %s", msg);
}

static void emit(exec *x, const char *s, size_t n) {
    if (x->st || x->stopped || n == 0) return;
    if (x->len + n + 1 > MAX_OUTPUT) {
        ex_fail(x, HL_ERR_INVALID, "output too large");
        return;
    }
    if (x->len + n + 1 > x->cap) {
        size_t cap = x->cap ? x->cap : 256;
        while (cap < x->len + n + 1) cap *= 2;
        char *p = realloc(x->out, cap);
        if (!p) {
            ex_fail(x, HL_ERR_NOMEM, "out of memory");
            return;
        }
        x->out = p;
        x->cap = cap;
    }
    memcpy(x->out + x->len, s, n);
    x->len += n;
    x->out[x->len] = '\0';
}

static bool truth(const json_t *v) {
    if (!v || json_is_null(v) || json_is_false(v)) return false;
    if (json_is_string(v)) return json_string_length(v) > 0;
    if (json_is_integer(v)) return json_integer_value(v) != 0;
    if (json_is_real(v)) return json_real_value(v) != 0;
    if (json_is_array(v)) return json_array_size(v) > 0;
    if (json_is_object(v)) return json_object_size(v) > 0;
    return true;
}

/* The text a value prints as (malloc'd). */
static char *to_text(const json_t *v) {
    if (!v || json_is_null(v)) return strdup("");
    if (json_is_string(v)) return strndup(json_string_value(v), json_string_length(v));
    return json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
}

/* Go field names over API JSON: "ToolCalls" finds "ToolCalls", else "tool_calls". */
static json_t *get_field(json_t *obj, const char *name) {
    if (!json_is_object(obj)) return NULL;
    json_t *v = json_object_get(obj, name);
    if (v) return v;
    char snake[96];
    size_t n = 0;
    for (size_t i = 0; name[i] && n + 2 < sizeof snake; i++) {
        char c = name[i];
        if (isupper((unsigned char)c)) {
            if (i > 0 && islower((unsigned char)name[i - 1])) snake[n++] = '_';
            c = (char)tolower((unsigned char)c);
        }
        snake[n++] = c;
    }
    snake[n] = '\0';
    return json_object_get(obj, snake);
}

static json_t *field_of(json_t *v, char *const *fields, int nf) {
    json_t *cur = v ? json_incref(v) : NULL;
    for (int i = 0; i < nf && cur; i++) {
        json_t *next = get_field(cur, fields[i]);
        if (next) json_incref(next);
        json_decref(cur);
        cur = next;
    }
    return cur ? cur : json_null();
}

static json_t *lookup_var(exec *x, const char *name) {
    if (!*name) return (json_t *)x->root;
    for (int i = x->n_vars - 1; i >= 0; i--)
        if (!strcmp(x->vars[i].name, name)) return x->vars[i].val;
    ex_fail(x, HL_ERR_INVALID, "undefined variable: $%s", name);
    return NULL;
}

static json_t *eval_pipe(exec *x, const pipe *p, json_t *dot);

static json_t *eval_arg(exec *x, const arg *a, json_t *dot) {
    switch (a->k) {
    case A_FIELD: return field_of(dot, a->fields, a->nf);
    case A_VAR: {
        json_t *v = lookup_var(x, a->s);
        return v ? field_of(v, a->fields, a->nf) : json_null();
    }
    case A_STR: return json_string(a->s);
    case A_INT: return json_integer(a->i);
    case A_BOOL: return json_boolean(a->i);
    case A_NIL: return json_null();
    case A_PIPE: {
        json_t *v = eval_pipe(x, a->sub, dot);
        json_t *r = field_of(v, a->fields, a->nf);
        json_decref(v);
        return r;
    }
    default: ex_fail(x, HL_ERR_INVALID, "%s is a function, not a value", a->s); return json_null();
    }
}

static int cmp_values(exec *x, const json_t *a, const json_t *b) {
    if (json_is_number(a) && json_is_number(b)) {
        double d = json_number_value(a) - json_number_value(b);
        return d < 0 ? -1 : d > 0;
    }
    if (json_is_string(a) && json_is_string(b)) return strcmp(json_string_value(a), json_string_value(b));
    ex_fail(x, HL_ERR_INVALID, "incompatible types for comparison");
    return 0;
}

static bool eq_values(const json_t *a, const json_t *b) {
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    return json_equal((json_t *)a, (json_t *)b);
}

static void append_fmt(char **s, size_t *n, const char *add, size_t an) {
    char *r = realloc(*s, *n + an + 1);
    if (!r) return;
    memcpy(r + *n, add, an);
    *n += an;
    r[*n] = '\0';
    *s = r;
}

static json_t *call(exec *x, const char *fn, json_t **v, int n) {
    if (!strcmp(fn, "not")) return n == 1 ? json_boolean(!truth(v[0])) : (ex_fail(x, HL_ERR_INVALID, "not takes one argument"), json_null());
    if (!strcmp(fn, "and") || !strcmp(fn, "or")) {
        bool want = fn[0] == 'o';
        for (int i = 0; i < n; i++)
            if (truth(v[i]) == want || i == n - 1) return json_incref(v[i]);
        return json_null();
    }
    if (!strcmp(fn, "eq") || !strcmp(fn, "ne")) {
        if (n < 2) return ex_fail(x, HL_ERR_INVALID, "%s needs two arguments", fn), json_null();
        bool any = false;
        for (int i = 1; i < n; i++) any |= eq_values(v[0], v[i]);
        return json_boolean(fn[0] == 'e' ? any : !any);
    }
    if (!strcmp(fn, "lt") || !strcmp(fn, "le") || !strcmp(fn, "gt") || !strcmp(fn, "ge")) {
        if (n != 2) return ex_fail(x, HL_ERR_INVALID, "%s needs two arguments", fn), json_null();
        int c = cmp_values(x, v[0], v[1]);
        bool r = fn[0] == 'l' ? (fn[1] == 't' ? c < 0 : c <= 0) : (fn[1] == 't' ? c > 0 : c >= 0);
        return json_boolean(r);
    }
    if (!strcmp(fn, "len")) {
        if (n != 1) return ex_fail(x, HL_ERR_INVALID, "len takes one argument"), json_null();
        if (json_is_string(v[0])) return json_integer((json_int_t)json_string_length(v[0]));
        if (json_is_array(v[0])) return json_integer((json_int_t)json_array_size(v[0]));
        if (json_is_object(v[0])) return json_integer((json_int_t)json_object_size(v[0]));
        if (json_is_null(v[0])) return json_integer(0);
        return ex_fail(x, HL_ERR_INVALID, "len of a non-collection"), json_null();
    }
    if (!strcmp(fn, "index")) {
        json_t *cur = n > 0 ? json_incref(v[0]) : json_null();
        for (int i = 1; i < n; i++) {
            json_t *next = NULL;
            if (json_is_array(cur) && json_is_integer(v[i])) {
                json_int_t k = json_integer_value(v[i]);
                if (k < 0 || (size_t)k >= json_array_size(cur)) {
                    json_decref(cur);
                    return ex_fail(x, HL_ERR_INVALID, "index out of range"), json_null();
                }
                next = json_array_get(cur, (size_t)k);
            } else if (json_is_object(cur) && json_is_string(v[i])) {
                next = json_object_get(cur, json_string_value(v[i]));
            }
            json_t *nx = next ? json_incref(next) : json_null();
            json_decref(cur);
            cur = nx;
        }
        return cur;
    }
    if (!strcmp(fn, "slice")) {
        if (n < 1 || n > 3) return ex_fail(x, HL_ERR_INVALID, "slice takes 1 to 3 arguments"), json_null();
        size_t len = json_is_array(v[0]) ? json_array_size(v[0])
                     : json_is_string(v[0]) ? json_string_length(v[0]) : 0;
        if (!json_is_array(v[0]) && !json_is_string(v[0]))
            return ex_fail(x, HL_ERR_INVALID, "slice of a non-sequence"), json_null();
        json_int_t lo = n > 1 ? json_integer_value(v[1]) : 0, hi = n > 2 ? json_integer_value(v[2]) : (json_int_t)len;
        if ((n > 1 && !json_is_integer(v[1])) || (n > 2 && !json_is_integer(v[2])) || lo < 0 ||
            hi < lo || (size_t)hi > len)
            return ex_fail(x, HL_ERR_INVALID, "slice index out of range"), json_null();
        if (json_is_string(v[0])) return json_stringn(json_string_value(v[0]) + lo, (size_t)(hi - lo));
        json_t *r = json_array();
        for (json_int_t i = lo; i < hi; i++) json_array_append(r, json_array_get(v[0], (size_t)i));
        return r;
    }
    if (!strcmp(fn, "json")) {
        if (n != 1) return ex_fail(x, HL_ERR_INVALID, "json takes one argument"), json_null();
        char *s = json_dumps(v[0], JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
        json_t *r = json_string(s ? s : "null");
        free(s);
        return r;
    }
    /* print, println, printf */
    char *s = NULL;
    size_t sl = 0;
    append_fmt(&s, &sl, "", 0);
    int first = 0;
    if (!strcmp(fn, "printf")) {
        if (n < 1 || !json_is_string(v[0])) {
            free(s);
            return ex_fail(x, HL_ERR_INVALID, "printf needs a format string"), json_null();
        }
        const char *f = json_string_value(v[0]);
        int ai = 1;
        for (; *f; f++) {
            if (*f != '%' || !f[1]) {
                append_fmt(&s, &sl, f, 1);
                continue;
            }
            char conv = *++f;
            if (conv == '%') {
                append_fmt(&s, &sl, "%", 1);
                continue;
            }
            char *t = ai < n ? to_text(v[ai++]) : strdup("%!(MISSING)");
            if (conv == 'q') {
                json_t *q = json_string(t ? t : "");
                char *qs = q ? json_dumps(q, JSON_ENCODE_ANY) : NULL;
                if (qs) append_fmt(&s, &sl, qs, strlen(qs));
                free(qs);
                json_decref(q);
            } else if (t) {
                append_fmt(&s, &sl, t, strlen(t));
            }
            free(t);
        }
        first = n;
    }
    for (int i = first; i < n; i++) {
        char *t = to_text(v[i]);
        if (i > first && (strcmp(fn, "println") == 0 || (!json_is_string(v[i]) && !json_is_string(v[i - 1]))))
            append_fmt(&s, &sl, " ", 1);
        if (t) append_fmt(&s, &sl, t, strlen(t));
        free(t);
    }
    if (!strcmp(fn, "println")) append_fmt(&s, &sl, "\n", 1);
    json_t *r = json_string(s ? s : "");
    free(s);
    return r;
}

static json_t *eval_cmd(exec *x, const cmd *c, json_t *dot, json_t *piped) {
    if (c->args[0].k != A_FUNC) {
        if (c->n != 1 || piped) {
            ex_fail(x, HL_ERR_INVALID, "can't give arguments to a non-function");
            return json_null();
        }
        return eval_arg(x, &c->args[0], dot);
    }
    json_t *v[MAX_ARGS + 1];
    int n = 0;
    const char *fn = c->args[0].s;
    /* and/or short-circuit: evaluate lazily */
    bool lazy = !strcmp(fn, "and") || !strcmp(fn, "or");
    for (int i = 1; i < c->n && !x->st; i++) {
        v[n++] = eval_arg(x, &c->args[i], dot);
        if (lazy && truth(v[n - 1]) == (fn[0] == 'o')) break;
    }
    if (piped && !(lazy && n > 0 && truth(v[n - 1]) == (fn[0] == 'o'))) v[n++] = json_incref(piped);
    json_t *r = x->st ? json_null() : call(x, fn, v, n);
    for (int i = 0; i < n; i++) json_decref(v[i]);
    return r;
}

static json_t *eval_pipe(exec *x, const pipe *p, json_t *dot) {
    json_t *val = NULL;
    for (int i = 0; i < p->n && !x->st; i++) {
        json_t *next = eval_cmd(x, &p->cmds[i], dot, val);
        json_decref(val);
        val = next;
    }
    return val ? val : json_null();
}

static void set_var(exec *x, const char *name, json_t *val, bool assign) {
    if (assign) {
        for (int i = x->n_vars - 1; i >= 0; i--)
            if (!strcmp(x->vars[i].name, name)) {
                json_decref(x->vars[i].val);
                x->vars[i].val = json_incref(val);
                return;
            }
        ex_fail(x, HL_ERR_INVALID, "undefined variable: $%s", name);
        return;
    }
    if (x->n_vars == (int)(sizeof x->vars / sizeof x->vars[0])) {
        ex_fail(x, HL_ERR_INVALID, "too many variables");
        return;
    }
    x->vars[x->n_vars].name = (char *)name;
    x->vars[x->n_vars].val = json_incref(val);
    x->n_vars++;
}

static void pop_vars(exec *x, int to) {
    while (x->n_vars > to) json_decref(x->vars[--x->n_vars].val);
}

static void exec_list(exec *x, const list *l, json_t *dot);

static void exec_range(exec *x, const node *nd, json_t *dot) {
    json_t *coll = eval_pipe(x, nd->p, dot);
    size_t n = json_is_array(coll) ? json_array_size(coll) : json_is_object(coll) ? json_object_size(coll) : 0;
    if (!x->st && !json_is_array(coll) && !json_is_object(coll) && !json_is_null(coll)) {
        if (json_is_integer(coll) && json_integer_value(coll) >= 0)
            n = (size_t)json_integer_value(coll); /* range N */
        else
            ex_fail(x, HL_ERR_INVALID, "range can't iterate over this value");
    }
    if (n == 0 || x->st) {
        if (!x->st) exec_list(x, &nd->els, dot);
        json_decref(coll);
        return;
    }
    void *it = json_is_object(coll) ? json_object_iter(coll) : NULL;
    for (size_t i = 0; i < n && !x->st && !x->stopped; i++) {
        if (++x->iters > MAX_ITER) {
            ex_fail(x, HL_ERR_INVALID, "too many loop iterations");
            break;
        }
        json_t *key, *elem;
        if (json_is_array(coll)) {
            key = json_integer((json_int_t)i);
            elem = json_incref(json_array_get(coll, i));
        } else if (it) {
            key = json_string(json_object_iter_key(it));
            elem = json_incref(json_object_iter_value(it));
            it = json_object_iter_next(coll, it);
        } else {
            key = json_integer((json_int_t)i);
            elem = json_integer((json_int_t)i);
        }
        int mark = x->n_vars;
        if (nd->p->n_decl == 1) set_var(x, nd->p->decl[0], elem, false);
        else if (nd->p->n_decl == 2) {
            set_var(x, nd->p->decl[0], key, false);
            set_var(x, nd->p->decl[1], elem, false);
        }
        exec_list(x, &nd->body, elem);
        pop_vars(x, mark);
        json_decref(key);
        json_decref(elem);
        if (x->brk == 1) {
            x->brk = 0;
            break;
        }
        x->brk = 0;
    }
    json_decref(coll);
}

static void exec_list(exec *x, const list *l, json_t *dot) {
    int mark = x->n_vars;
    for (size_t i = 0; i < l->n && !x->st && !x->stopped && !x->brk; i++) {
        const node *nd = &l->v[i];
        switch (nd->k) {
        case N_TEXT: emit(x, nd->text, strlen(nd->text)); break;
        case N_OUT: {
            json_t *v = eval_pipe(x, nd->p, dot);
            char *t = x->st ? NULL : to_text(v);
            if (t) emit(x, t, strlen(t));
            free(t);
            json_decref(v);
            const cmd *c = &nd->p->cmds[0];
            if (x->cut && nd->p->n == 1 && c->n == 1 && c->args[0].k == A_FIELD && c->args[0].nf == 1 &&
                !strcmp(c->args[0].fields[0], "Response"))
                x->stopped = true;
            break;
        }
        case N_SET: {
            json_t *v = eval_pipe(x, nd->p, dot);
            set_var(x, nd->p->decl[0], v, nd->p->assign);
            json_decref(v);
            break;
        }
        case N_IF:
        case N_WITH: {
            json_t *v = eval_pipe(x, nd->p, dot);
            if (x->st) {
                json_decref(v);
                break;
            }
            if (truth(v)) exec_list(x, &nd->body, nd->k == N_WITH ? v : dot);
            else exec_list(x, &nd->els, dot);
            json_decref(v);
            break;
        }
        case N_RANGE: exec_range(x, nd, dot); break;
        case N_BREAK: x->brk = 1; break;
        case N_CONTINUE: x->brk = 2; break;
        }
    }
    pop_vars(x, mark);
}

hl_status gotmpl_exec(const gotmpl *t, const json_t *data, bool cut_after_response, char **out,
                      hl_err *err) {
    exec x = {.root = data, .err = err, .cut = cut_after_response};
    exec_list(&x, &t->root, (json_t *)data);
    pop_vars(&x, 0);
    if (x.st) {
        free(x.out);
        return x.st;
    }
    if (!x.out) {
        x.out = strdup("");
        if (!x.out) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    *out = x.out;
    return HL_OK;
}
