/* prompt.c - prompt rendering: Jinja via tmpl, a Go-template subset, Ollama's rules. */
#define _GNU_SOURCE
#include "server/prompt.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tmpl/tmpl.h"

/* ---------------- a growable string ---------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}
static void sb_str(sbuf *b, const char *s) { sb_add(b, s ? s : "", s ? strlen(s) : 0); }

/* ---------------- Go template subset ---------------- */

typedef enum gnode_kind { GN_TEXT, GN_FIELD, GN_IF } gnode_kind;

typedef struct gexpr {
    int op;          /* 0 field, 'n' not, '&' and, '|' or */
    char fields[4][16];
    int n;
} gexpr;

typedef struct gnode {
    gnode_kind kind;
    char *text; /* GN_TEXT (malloc'd) */
    char field[16];
    gexpr cond;
    struct glist *then_, *else_; /* GN_IF */
} gnode;

typedef struct glist {
    gnode *nodes;
    size_t n, cap;
} glist;

static void glist_free(glist *l) {
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) {
        free(l->nodes[i].text);
        glist_free(l->nodes[i].then_);
        glist_free(l->nodes[i].else_);
    }
    free(l->nodes);
    free(l);
}

static gnode *glist_push(glist *l) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        gnode *p = realloc(l->nodes, cap * sizeof *p);
        if (!p) return NULL;
        l->nodes = p;
        l->cap = cap;
    }
    gnode *n = &l->nodes[l->n++];
    memset(n, 0, sizeof *n);
    return n;
}

/* The lexed template: alternating text and actions. */
typedef struct gtok {
    bool action;
    char *s; /* text, or the action's inside (trimmed) */
} gtok;

typedef struct gparser {
    gtok *toks;
    size_t n, pos;
    hl_err *err;
    hl_status st;
} gparser;

static hl_status go_lex(const char *src, gtok **out, size_t *n_out, hl_err *err) {
    size_t cap = 16, n = 0;
    gtok *t = malloc(cap * sizeof *t);
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
        bool trim_prev = open && open[2] == '-' && (open[3] == ' ' || open[3] == '\t' ||
                                                    open[3] == '\n' || open[3] == '\r');
        if (trim_prev)
            while (tl > 0 && isspace((unsigned char)ts[tl - 1])) tl--;
        if (n + 2 > cap) {
            cap *= 2;
            gtok *g = realloc(t, cap * sizeof *t);
            if (!g) {
                st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
                break;
            }
            t = g;
        }
        if (tl) {
            t[n].action = false;
            t[n].s = strndup(ts, tl);
            if (!t[n].s) {
                st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
                break;
            }
            n++;
        }
        if (!open) break;
        const char *in = open + 2 + (trim_prev ? 1 : 0);
        const char *close = strstr(in, "}}");
        if (!close) {
            st = hl_fail(err, HL_ERR_FORMAT, "template: unclosed action");
            break;
        }
        const char *e = close;
        trim_next = false;
        if (e > in && e[-1] == '-' && e - 1 > in && isspace((unsigned char)e[-2])) {
            trim_next = true;
            e--;
        }
        while (in < e && isspace((unsigned char)*in)) in++;
        while (e > in && isspace((unsigned char)e[-1])) e--;
        t[n].action = true;
        t[n].s = strndup(in, (size_t)(e - in));
        if (!t[n].s) {
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

static bool parse_field(const char *w, char out[16]) {
    if (w[0] == '$' && w[1] == '.') w++;
    if (w[0] != '.' || !w[1] || strlen(w + 1) >= 16) return false;
    for (const char *c = w + 1; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '_') return false;
    strcpy(out, w + 1);
    return true;
}

static bool parse_expr(const char *s, gexpr *e) {
    char buf[256];
    if (strlen(s) >= sizeof buf) return false;
    strcpy(buf, s);
    char *words[6];
    int n = 0;
    for (char *w = strtok(buf, " \t\n"); w; w = strtok(NULL, " \t\n")) {
        if (n == 6) return false;
        words[n++] = w;
    }
    if (n == 0) return false;
    memset(e, 0, sizeof *e);
    int first = 0;
    if (!strcmp(words[0], "not")) e->op = 'n', first = 1;
    else if (!strcmp(words[0], "and")) e->op = '&', first = 1;
    else if (!strcmp(words[0], "or")) e->op = '|', first = 1;
    if (n - first < 1 || n - first > 4 || (e->op == 'n' && n != 2) || (e->op == 0 && n != 1))
        return false;
    for (int i = first; i < n; i++)
        if (!parse_field(words[i], e->fields[e->n++])) return false;
    return true;
}

static hl_status unsupported(gparser *g, const char *what) {
    return g->st = hl_fail(g->err, HL_ERR_UNSUPPORTED,
                           "template: {{ %s }} is outside the Go-template subset hearth renders",
                           what);
}

/* Parses until {{ end }} / {{ else }} (returned through *stop) or the end. */
static glist *go_parse_list(gparser *g, const char **stop) {
    glist *l = calloc(1, sizeof *l);
    if (!l) {
        g->st = hl_fail(g->err, HL_ERR_NOMEM, "out of memory");
        return NULL;
    }
    *stop = NULL;
    while (g->pos < g->n && !g->st) {
        gtok *t = &g->toks[g->pos++];
        if (!t->action) {
            gnode *nd = glist_push(l);
            if (!nd) break;
            nd->kind = GN_TEXT;
            nd->text = t->s;
            t->s = NULL;
            continue;
        }
        const char *a = t->s;
        if (a[0] == '/' && a[1] == '*') continue; /* comment */
        if (!strcmp(a, "end") || !strcmp(a, "else") || !strncmp(a, "else if ", 8)) {
            *stop = a;
            return l;
        }
        if (!strncmp(a, "if ", 3)) {
            gnode *nd = glist_push(l);
            if (!nd) break;
            nd->kind = GN_IF;
            if (!parse_expr(a + 3, &nd->cond)) {
                unsupported(g, a);
                break;
            }
            const char *st;
            nd->then_ = go_parse_list(g, &st);
            if (g->st) break;
            gnode *cur = nd;
            while (st && strncmp(st, "else if ", 8) == 0) {
                /* else if: a nested if in the else branch, closed by the same end */
                cur->else_ = calloc(1, sizeof(glist));
                gnode *inner = cur->else_ ? glist_push(cur->else_) : NULL;
                if (!inner) {
                    g->st = hl_fail(g->err, HL_ERR_NOMEM, "out of memory");
                    break;
                }
                inner->kind = GN_IF;
                if (!parse_expr(st + 8, &inner->cond)) {
                    unsupported(g, st);
                    break;
                }
                inner->then_ = go_parse_list(g, &st);
                if (g->st) break;
                cur = inner;
            }
            if (g->st) break;
            if (st && !strcmp(st, "else")) {
                cur->else_ = go_parse_list(g, &st);
                if (g->st) break;
            }
            if (!st || strcmp(st, "end") != 0) {
                g->st = hl_fail(g->err, HL_ERR_FORMAT, "template: unexpected EOF (missing end)");
                break;
            }
            continue;
        }
        gnode *nd = glist_push(l);
        if (!nd) break;
        nd->kind = GN_FIELD;
        if (!parse_field(a, nd->field)) {
            unsupported(g, a);
            break;
        }
    }
    if (!g->st && l->n > 0 && !l->nodes) g->st = hl_fail(g->err, HL_ERR_NOMEM, "out of memory");
    return l;
}

typedef struct gotmpl {
    glist *root;
    bool uses_messages;
} gotmpl;

static void gotmpl_free(gotmpl *t) {
    if (!t) return;
    glist_free(t->root);
    free(t);
}

static hl_status gotmpl_compile(const char *src, gotmpl **out, hl_err *err) {
    gtok *toks = NULL;
    size_t n = 0;
    hl_status st = go_lex(src, &toks, &n, err);
    if (st) return st;
    gparser g = {.toks = toks, .n = n, .err = err};
    const char *stop;
    glist *root = go_parse_list(&g, &stop);
    if (!g.st && stop) g.st = hl_fail(err, HL_ERR_FORMAT, "template: unexpected {{ %s }}", stop);
    for (size_t i = 0; i < n; i++) free(toks[i].s);
    free(toks);
    if (g.st) {
        glist_free(root);
        return g.st;
    }
    gotmpl *t = calloc(1, sizeof *t);
    if (!t) {
        glist_free(root);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    t->root = root;
    *out = t;
    return HL_OK;
}

typedef struct gvars {
    const char *system, *prompt, *response, *suffix;
    bool think;
    bool cut;     /* stop output after .Response */
    bool stopped;
} gvars;

static const char *gvar(const gvars *v, const char *f) {
    if (!strcmp(f, "System")) return v->system;
    if (!strcmp(f, "Prompt")) return v->prompt;
    if (!strcmp(f, "Response")) return v->response;
    if (!strcmp(f, "Suffix")) return v->suffix;
    if (!strcmp(f, "Think") || !strcmp(f, "IsThinkSet")) return v->think ? "true" : "";
    return "";
}

static bool gtruth(const gvars *v, const char *f) {
    const char *s = gvar(v, f);
    return s && *s;
}

static bool geval(const gvars *v, const gexpr *e) {
    switch (e->op) {
    case 'n': return !gtruth(v, e->fields[0]);
    case '&':
        for (int i = 0; i < e->n; i++)
            if (!gtruth(v, e->fields[i])) return false;
        return true;
    case '|':
        for (int i = 0; i < e->n; i++)
            if (gtruth(v, e->fields[i])) return true;
        return false;
    default: return gtruth(v, e->fields[0]);
    }
}

static void gexec(const glist *l, gvars *v, sbuf *b) {
    if (!l) return;
    for (size_t i = 0; i < l->n && !v->stopped; i++) {
        const gnode *nd = &l->nodes[i];
        switch (nd->kind) {
        case GN_TEXT: sb_str(b, nd->text); break;
        case GN_FIELD:
            if (strcmp(nd->field, "Think") && strcmp(nd->field, "IsThinkSet"))
                sb_str(b, gvar(v, nd->field));
            if (v->cut && !strcmp(nd->field, "Response")) v->stopped = true;
            break;
        case GN_IF: gexec(geval(v, &nd->cond) ? nd->then_ : nd->else_, v, b); break;
        }
    }
}

static bool glist_uses(const glist *l, const char *field) {
    if (!l) return false;
    for (size_t i = 0; i < l->n; i++) {
        const gnode *nd = &l->nodes[i];
        if (nd->kind == GN_FIELD && !strcmp(nd->field, field)) return true;
        if (nd->kind == GN_IF) {
            for (int k = 0; k < nd->cond.n; k++)
                if (!strcmp(nd->cond.fields[k], field)) return true;
            if (glist_uses(nd->then_, field) || glist_uses(nd->else_, field)) return true;
        }
    }
    return false;
}

hl_status prompt_render_go(const char *go_template, const char *system, const char *prompt,
                           const char *suffix, char **out, hl_err *err) {
    gotmpl *t;
    hl_status st = gotmpl_compile(go_template, &t, err);
    if (st) return st;
    gvars v = {.system = system, .prompt = prompt, .response = "", .suffix = suffix, .cut = true};
    sbuf b = {0};
    sb_add(&b, "", 0);
    gexec(t->root, &v, &b);
    gotmpl_free(t);
    if (b.oom) {
        free(b.p);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    *out = b.p;
    return HL_OK;
}

bool prompt_go_uses_suffix(const char *go_template) {
    gotmpl *t;
    if (gotmpl_compile(go_template, &t, NULL) != HL_OK) return strstr(go_template, ".Suffix");
    bool r = glist_uses(t->root, "Suffix");
    gotmpl_free(t);
    return r;
}

/* ---------------- the renderer ---------------- */

struct prompt_renderer {
    tmpl *jinja;      /* when rendering with Jinja */
    gotmpl *go;       /* when rendering with the Go subset */
    prompt_caps caps;
    char tool_tag[32];
    char bos[64], eos[64];
};

static void token_text(const tok_vocab *v, tok_special which, char *buf, size_t cap) {
    buf[0] = '\0';
    if (!v) return;
    int32_t id = tok_vocab_special(v, which);
    size_t len = 0;
    const char *s = id >= 0 ? tok_token_text(v, id, &len) : NULL;
    if (s && len < cap) {
        memcpy(buf, s, len);
        buf[len] = '\0';
    }
}

hl_status prompt_renderer_create(const char *modelfile_template, const char *gguf_template,
                                 const tok_vocab *vocab, prompt_renderer **out, hl_err *err) {
    prompt_renderer *p = calloc(1, sizeof *p);
    if (!p) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    token_text(vocab, TOK_SPECIAL_BOS, p->bos, sizeof p->bos);
    token_text(vocab, TOK_SPECIAL_EOS, p->eos, sizeof p->eos);
    hl_status st = HL_OK;
    const char *jinja_src = NULL;
    if (modelfile_template && *modelfile_template) {
        if (strstr(modelfile_template, "{%")) {
            jinja_src = modelfile_template;
        } else {
            hl_err gerr;
            st = gotmpl_compile(modelfile_template, &p->go, &gerr);
            if (st) {
                /* outside the subset: the GGUF's own template, else report why */
                if (!gguf_template || !*gguf_template) {
                    *err = gerr;
                    prompt_renderer_free(p);
                    return st;
                }
                st = HL_OK;
            } else {
                p->caps.insert = glist_uses(p->go->root, "Suffix");
            }
        }
    }
    if (!p->go && !jinja_src && gguf_template && *gguf_template) jinja_src = gguf_template;
    if (jinja_src) {
        st = tmpl_compile(jinja_src, strlen(jinja_src), &p->jinja, err);
        if (st) {
            prompt_renderer_free(p);
            return st;
        }
        p->caps.tools = strstr(jinja_src, "tools") || strstr(jinja_src, "tool_call");
        p->caps.thinking = strstr(jinja_src, "<think>") && strstr(jinja_src, "</think>");
        snprintf(p->tool_tag, sizeof p->tool_tag, "%s",
                 strstr(jinja_src, "<tool_call>") ? "<tool_call>" : "{");
    }
    if (!p->go && !p->jinja) { /* default template {{ .Prompt }} */
        st = gotmpl_compile("{{ .Prompt }}", &p->go, err);
        if (st) {
            prompt_renderer_free(p);
            return st;
        }
    }
    *out = p;
    return HL_OK;
}

void prompt_renderer_free(prompt_renderer *p) {
    if (!p) return;
    tmpl_destroy(p->jinja);
    gotmpl_free(p->go);
    free(p);
}

prompt_caps prompt_renderer_caps(const prompt_renderer *p) { return p->caps; }
const char *prompt_tool_tag(const prompt_renderer *p) { return p->tool_tag[0] ? p->tool_tag : "{"; }

static const char *msg_str(const json_t *m, const char *k) {
    const char *s = json_string_value(json_object_get(m, k));
    return s ? s : "";
}

/* Ollama's legacy execution: one run per user/assistant turn, the last cut after
 * .Response. System messages collate into .System. */
static hl_status render_go_chat(const prompt_renderer *p, const json_t *messages, int think,
                                char **out, hl_err *err) {
    sbuf b = {0}, sys = {0};
    sb_add(&b, "", 0);
    sb_add(&sys, "", 0);
    const char *prompt = "", *response = "";
    bool have_sys = false;
    gvars v = {.think = think > 0};
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        const char *role = msg_str(m, "role"), *content = msg_str(m, "content");
        bool flush = (!strcmp(role, "system") && (*prompt || *response)) ||
                     (!strcmp(role, "user") && *response);
        if (flush) {
            v.system = sys.p, v.prompt = prompt, v.response = response;
            gexec(p->go->root, &v, &b);
            sys.len = 0, sys.p[0] = '\0', have_sys = false;
            prompt = response = "";
        }
        if (!strcmp(role, "system")) {
            if (have_sys) sb_str(&sys, "\n\n");
            sb_str(&sys, content);
            have_sys = true;
        } else if (!strcmp(role, "user")) {
            prompt = content;
        } else if (!strcmp(role, "assistant")) {
            response = content;
        }
    }
    v.system = sys.p, v.prompt = prompt, v.response = response, v.cut = true;
    gexec(p->go->root, &v, &b);
    bool oom = b.oom || sys.oom;
    free(sys.p);
    if (oom) {
        free(b.p);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    *out = b.p;
    return HL_OK;
}

hl_status prompt_render_chat(const prompt_renderer *p, const json_t *messages,
                             const json_t *tools, int think, const char *think_level,
                             char **out, hl_err *err) {
    if (!p->jinja) return render_go_chat(p, messages, think, out, err);
    json_t *ctx = json_pack("{s:O, s:b, s:s, s:s}", "messages", messages,
                            "add_generation_prompt", 1, "bos_token", p->bos, "eos_token", p->eos);
    if (!ctx) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    if (tools && json_array_size(tools) > 0) json_object_set(ctx, "tools", (json_t *)tools);
    if (think >= 0) json_object_set_new(ctx, "enable_thinking", json_boolean(think > 0));
    if (think > 0 && think_level) json_object_set_new(ctx, "reasoning_effort", json_string(think_level));
    size_t len;
    hl_status st = tmpl_render(p->jinja, ctx, out, &len, err);
    json_decref(ctx);
    return st;
}
