/* mask.c - a vocabulary's byte trie and the per-sequence matcher (grammar.h).
 *
 * The trie is stored in preorder (node i's subtree is [i, end[i])), so the mask is one
 * loop over the nodes that keeps the recognizer state of every depth on a stack: a byte
 * the state rejects skips the node's whole subtree, and every token that ends on an
 * accepted node is allowed. Tokens sharing a prefix share its work. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gram_internal.h"

struct gram_vocab {
    int32_t n_tokens;
    uint32_t *off; /* token i's bytes: bytes[off[i] .. off[i+1]) */
    char *bytes;
    uint8_t *eog;
    int32_t *eog_ids;
    int32_t n_eog;
    /* the trie, preorder */
    uint32_t n_nodes;
    uint8_t *nbyte;
    uint16_t *ndepth;
    uint32_t *nend;
    uint32_t *ntok; /* tokens ending at node i: toks[ntok[i] .. ntok[i+1]) */
    int32_t *toks;
    uint32_t max_len;
};

int32_t gram_vocab_n_tokens(const gram_vocab *gv) { return gv->n_tokens; }

void gram_vocab_free(gram_vocab *gv) {
    if (!gv) return;
    free(gv->off);
    free(gv->bytes);
    free(gv->eog);
    free(gv->eog_ids);
    free(gv->nbyte);
    free(gv->ndepth);
    free(gv->nend);
    free(gv->ntok);
    free(gv->toks);
    free(gv);
}

static const gram_vocab *g_sort_vocab; /* qsort has no context argument; guarded below */

static int tok_cmp(const void *a, const void *b) {
    const gram_vocab *v = g_sort_vocab;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int r = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
    if (r) return r;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

#include <pthread.h>
static pthread_mutex_t g_sort_mu = PTHREAD_MUTEX_INITIALIZER;

hl_status gram_vocab_create(const tok_vocab *v, gram_vocab **out, hl_err *err) {
    *out = NULL;
    gram_vocab *g = calloc(1, sizeof *g);
    if (!g) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    int32_t n = tok_vocab_n_tokens(v);
    g->n_tokens = n;
    size_t total = 0;
    g->off = malloc(((size_t)n + 1) * sizeof *g->off);
    g->eog = calloc((size_t)n + 1, 1);
    g->eog_ids = malloc(((size_t)n + 1) * sizeof *g->eog_ids);
    if (!g->off || !g->eog || !g->eog_ids) goto oom;
    for (int32_t i = 0; i < n; i++) {
        int32_t len = tok_token_to_piece(v, i, false, NULL, 0);
        total += len > 0 ? (size_t)len : 0;
        if (tok_is_eog(v, i)) {
            g->eog[i] = 1;
            g->eog_ids[g->n_eog++] = i;
        }
    }
    g->bytes = malloc(total ? total : 1);
    if (!g->bytes) goto oom;
    size_t pos = 0;
    int32_t n_piece = 0;
    for (int32_t i = 0; i < n; i++) {
        g->off[i] = (uint32_t)pos;
        if (g->eog[i]) continue;
        int32_t len = tok_token_to_piece(v, i, false, g->bytes + pos, total - pos);
        if (len > 0 && pos + (size_t)len <= total) {
            pos += (size_t)len;
            n_piece++;
        }
    }
    g->off[n] = (uint32_t)pos;
    /* sort the tokens with bytes, then lay the trie out in preorder */
    g->toks = malloc(((size_t)n_piece + 1) * sizeof *g->toks);
    g->nbyte = malloc(pos + 1);
    g->ndepth = malloc((pos + 1) * sizeof *g->ndepth);
    g->nend = malloc((pos + 1) * sizeof *g->nend);
    g->ntok = malloc((pos + 2) * sizeof *g->ntok);
    uint32_t *path = malloc((pos + 1) * sizeof *path);
    uint32_t *tnode = malloc(((size_t)n_piece + 1) * sizeof *tnode);
    if (!g->toks || !g->nbyte || !g->ndepth || !g->nend || !g->ntok || !path || !tnode) {
        free(path);
        free(tnode);
        goto oom;
    }
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++)
        if (g->off[i + 1] > g->off[i]) g->toks[k++] = i;
    pthread_mutex_lock(&g_sort_mu);
    g_sort_vocab = g;
    qsort(g->toks, (size_t)n_piece, sizeof *g->toks, tok_cmp);
    pthread_mutex_unlock(&g_sort_mu);
    uint32_t nn = 0, depth = 0;
    const char *prev = NULL;
    uint32_t prev_len = 0;
    for (int32_t t = 0; t < n_piece; t++) {
        int32_t id = g->toks[t];
        const char *s = g->bytes + g->off[id];
        uint32_t len = g->off[id + 1] - g->off[id], l = 0;
        while (prev && l < len && l < prev_len && s[l] == prev[l]) l++;
        while (depth > l) g->nend[path[--depth]] = nn; /* close the nodes below the common prefix */
        for (uint32_t d = l; d < len; d++) {
            g->nbyte[nn] = (uint8_t)s[d];
            g->ndepth[nn] = (uint16_t)(d + 1);
            path[depth++] = nn++;
        }
        tnode[t] = path[len - 1]; /* where the token ends */
        if (len > g->max_len) g->max_len = len;
        prev = s;
        prev_len = len;
    }
    while (depth > 0) g->nend[path[--depth]] = nn;
    free(path);
    g->n_nodes = nn;
    /* sorted order is preorder of the end nodes: a node's tokens are contiguous */
    for (int32_t t = 0, i = 0; i <= (int32_t)nn; i++) {
        while (t < n_piece && tnode[t] < (uint32_t)i) t++;
        g->ntok[i] = (uint32_t)t;
    }
    free(tnode);
    *out = g;
    return HL_OK;
oom:
    gram_vocab_free(g);
    return hl_fail(err, HL_ERR_NOMEM, "out of memory");
}

/* ---- the matcher ---- */

struct gram_matcher {
    const gram_schema *s;
    const gram_vocab *gv;
    gram_think think;
    char *open, *close;
    gstate *cur;
    gstate *stack; /* one state per trie depth (max_len + 1), and scratch for accept */
    uint32_t n_stack;
    uint64_t *allowed;
};

hl_status gram_matcher_create(const gram_schema *s, const gram_vocab *gv, const gram_think *think,
                              gram_matcher **out, hl_err *err) {
    *out = NULL;
    gram_matcher *m = calloc(1, sizeof *m);
    if (!m) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    m->s = s;
    m->gv = gv;
    if (think && think->close && *think->close) {
        m->close = strdup(think->close);
        m->open = think->open ? strdup(think->open) : NULL;
        if (!m->close || (think->open && !m->open)) goto oom;
        m->think = (gram_think){.open = m->open, .close = m->close, .in_think = think->in_think};
    }
    m->n_stack = (gv ? gv->max_len : 0) + 2;
    m->cur = malloc(sizeof *m->cur);
    m->stack = malloc(m->n_stack * sizeof *m->stack);
    if (gv) m->allowed = calloc(((size_t)gv->n_tokens + 63) / 64 + 1, sizeof *m->allowed);
    if (!m->cur || !m->stack || (gv && !m->allowed)) goto oom;
    gram_state_init(s, m->cur, &m->think);
    *out = m;
    return HL_OK;
oom:
    gram_matcher_free(m);
    return hl_fail(err, HL_ERR_NOMEM, "out of memory");
}

void gram_matcher_free(gram_matcher *m) {
    if (!m) return;
    free(m->open);
    free(m->close);
    free(m->cur);
    free(m->stack);
    free(m->allowed);
    free(m);
}

static bool feed_into(gram_matcher *m, const char *bytes, size_t n, gstate *out) {
    gstate *a = &m->stack[0], *b = &m->stack[1];
    gram_state_copy(a, m->cur);
    for (size_t i = 0; i < n; i++) {
        if (!gram_state_feed(m->s, &m->think, a, (uint8_t)bytes[i], b)) return false;
        gstate *t = a;
        a = b;
        b = t;
    }
    gram_state_copy(out, a);
    return true;
}

bool gram_matcher_feed(gram_matcher *m, const char *bytes, size_t n) {
    gstate tmp;
    if (!feed_into(m, bytes, n, &tmp)) return false;
    gram_state_copy(m->cur, &tmp);
    return true;
}

bool gram_matcher_accepting(const gram_matcher *m) { return gram_state_accepting(m->s, m->cur); }
bool gram_matcher_complete(const gram_matcher *m) { return gram_state_complete(m->s, m->cur); }

bool gram_matcher_accept(gram_matcher *m, int32_t token) {
    const gram_vocab *gv = m->gv;
    if (token < 0 || token >= gv->n_tokens) return false;
    if (gv->eog[token]) return gram_state_accepting(m->s, m->cur);
    uint32_t a = gv->off[token], b = gv->off[token + 1];
    if (a == b) return false;
    return gram_matcher_feed(m, gv->bytes + a, b - a);
}

void gram_matcher_mask(gram_matcher *m, float *logits, int32_t n_vocab) {
    const gram_vocab *gv = m->gv;
    uint64_t *al = m->allowed;
    size_t words = ((size_t)gv->n_tokens + 63) / 64;
    memset(al, 0, words * sizeof *al);
    bool any = false;
    if (!gram_state_complete(m->s, m->cur)) {
        gstate *st = m->stack;
        gram_state_copy(&st[0], m->cur);
        uint32_t i = 0;
        while (i < gv->n_nodes) {
            uint32_t d = gv->ndepth[i];
            if (!gram_state_feed(m->s, &m->think, &st[d - 1], gv->nbyte[i], &st[d])) {
                i = gv->nend[i];
                continue;
            }
            for (uint32_t t = gv->ntok[i]; t < gv->ntok[i + 1]; t++) {
                int32_t id = gv->toks[t];
                al[id >> 6] |= 1ull << (id & 63);
                any = true;
            }
            i++;
        }
    }
    if (gram_state_accepting(m->s, m->cur))
        for (int32_t e = 0; e < gv->n_eog; e++) {
            int32_t id = gv->eog_ids[e];
            al[id >> 6] |= 1ull << (id & 63);
            any = true;
        }
    if (!any) return;
    int32_t n = n_vocab < gv->n_tokens ? n_vocab : gv->n_tokens;
    for (int32_t i = 0; i < n; i++)
        if (!(al[i >> 6] >> (i & 63) & 1)) logits[i] = -INFINITY;
    for (int32_t i = n; i < n_vocab; i++) logits[i] = -INFINITY;
}
