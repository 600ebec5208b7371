/* mask.c - a vocabulary's byte trie and the per-sequence matcher (grammar.h).
 *
 * The trie is stored in preorder (node i's subtree is [i, end[i])), so the mask is one
 * loop over the nodes that keeps the recognizer state of every depth on a stack: a byte
 * the state rejects skips the node's whole subtree, and every token that ends on an
 * accepted node is allowed. Tokens sharing a prefix share its work.
 *
 * Two fast paths skip most of the walk where nearly every token passes: inside a string
 * whose content is free, a "plain" token (string content only: no quote, backslash or
 * control byte, whole UTF-8 characters) only adds its character count, so plain tokens
 * are allowed from a precomputed table and only the others are walked (their own trie);
 * inside the thinking part, tokens without the closing tag's first byte pass as they
 * are and only the others are fed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gram_internal.h"

#define PLAIN_BUCKETS 16

typedef struct trie {
    uint32_t n_nodes;
    uint8_t *nbyte;
    uint16_t *ndepth;
    uint32_t *nend;
    uint32_t *ntok; /* tokens ending at node i: toks[ntok[i] .. ntok[i+1]) */
    int32_t *toks;
} trie;

struct gram_vocab {
    int32_t n_tokens;
    uint32_t *off; /* token i's bytes: bytes[off[i] .. off[i+1]) */
    char *bytes;
    uint8_t *eog;
    int32_t *eog_ids;
    int32_t n_eog;
    uint32_t max_len;
    trie all;            /* every token with bytes */
    trie special;        /* the tokens that are not plain string content */
    uint8_t *plain;      /* characters of a plain token (0: not plain) */
    uint64_t *plain_bits;
    /* plain_le[k - 1]: the plain tokens of at most k characters (k <= PLAIN_BUCKETS); the
     * longer ones in long_ids, by character count */
    uint64_t *plain_le[PLAIN_BUCKETS];
    int32_t *long_ids;
    int32_t n_long;
    uint64_t *piece_bits; /* tokens with bytes (not end-of-generation) */
};

int32_t gram_vocab_n_tokens(const gram_vocab *gv) { return gv->n_tokens; }

static void trie_free(trie *t) {
    free(t->nbyte);
    free(t->ndepth);
    free(t->nend);
    free(t->ntok);
    free(t->toks);
}

void gram_vocab_free(gram_vocab *gv) {
    if (!gv) return;
    free(gv->off);
    free(gv->bytes);
    free(gv->eog);
    free(gv->eog_ids);
    trie_free(&gv->all);
    trie_free(&gv->special);
    free(gv->plain);
    free(gv->plain_bits);
    free(gv->piece_bits);
    for (int k = 0; k < PLAIN_BUCKETS; k++) free(gv->plain_le[k]);
    free(gv->long_ids);
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

/* The trie of the given tokens (ids: reordered), in preorder. */
static bool trie_build(const gram_vocab *g, int32_t *ids, int32_t n, trie *t) {
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) total += g->off[ids[i] + 1] - g->off[ids[i]];
    t->toks = malloc(((size_t)n + 1) * sizeof *t->toks);
    t->nbyte = malloc(total + 1);
    t->ndepth = malloc((total + 1) * sizeof *t->ndepth);
    t->nend = malloc((total + 1) * sizeof *t->nend);
    t->ntok = malloc((total + 2) * sizeof *t->ntok);
    uint32_t *path = malloc((g->max_len + 1) * sizeof *path);
    uint32_t *tnode = malloc(((size_t)n + 1) * sizeof *tnode);
    if (!t->toks || !t->nbyte || !t->ndepth || !t->nend || !t->ntok || !path || !tnode) {
        free(path);
        free(tnode);
        return false;
    }
    memcpy(t->toks, ids, (size_t)n * sizeof *ids);
    pthread_mutex_lock(&g_sort_mu);
    g_sort_vocab = g;
    qsort(t->toks, (size_t)n, sizeof *t->toks, tok_cmp);
    pthread_mutex_unlock(&g_sort_mu);
    uint32_t nn = 0, depth = 0, prev_len = 0;
    const char *prev = NULL;
    for (int32_t k = 0; k < n; k++) {
        int32_t id = t->toks[k];
        const char *s = g->bytes + g->off[id];
        uint32_t len = g->off[id + 1] - g->off[id], l = 0;
        while (prev && l < len && l < prev_len && s[l] == prev[l]) l++;
        while (depth > l) t->nend[path[--depth]] = nn; /* close the nodes below the common prefix */
        for (uint32_t d = l; d < len; d++) {
            t->nbyte[nn] = (uint8_t)s[d];
            t->ndepth[nn] = (uint16_t)(d + 1);
            path[depth++] = nn++;
        }
        tnode[k] = path[len - 1]; /* where the token ends */
        prev = s;
        prev_len = len;
    }
    while (depth > 0) t->nend[path[--depth]] = nn;
    t->n_nodes = nn;
    /* sorted order is preorder of the end nodes: a node's tokens are contiguous */
    for (int32_t k = 0, i = 0; i <= (int32_t)nn; i++) {
        while (k < n && tnode[k] < (uint32_t)i) k++;
        t->ntok[i] = (uint32_t)k;
    }
    free(path);
    free(tnode);
    return true;
}

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
    size_t words = ((size_t)n + 63) / 64 + 1;
    g->plain = calloc((size_t)n + 1, 1);
    g->plain_bits = calloc(words, sizeof *g->plain_bits);
    g->piece_bits = calloc(words, sizeof *g->piece_bits);
    int32_t *ids = malloc(((size_t)n_piece + 1) * sizeof *ids);
    if (!g->plain || !g->plain_bits || !g->piece_bits || !ids) {
        free(ids);
        goto oom;
    }
    int32_t k = 0, ks = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t len = g->off[i + 1] - g->off[i];
        if (!len) continue;
        if (len > g->max_len) g->max_len = len;
        ids[k++] = i;
        g->piece_bits[i >> 6] |= 1ull << (i & 63);
        int c = gram_plain_chars(g->bytes + g->off[i], len);
        if (c > 0 && c < 256) {
            g->plain[i] = (uint8_t)c;
            g->plain_bits[i >> 6] |= 1ull << (i & 63);
        }
    }
    for (int b = 0; b < PLAIN_BUCKETS; b++)
        if (!(g->plain_le[b] = calloc(words, sizeof *g->plain_le[b]))) {
            free(ids);
            goto oom;
        }
    g->long_ids = malloc(((size_t)n + 1) * sizeof *g->long_ids);
    if (!g->long_ids) {
        free(ids);
        goto oom;
    }
    int32_t start[257] = {0}; /* counting sort of the long ones by character count */
    for (int32_t i = 0; i < n; i++)
        if (g->plain[i] > PLAIN_BUCKETS) start[g->plain[i] + 1]++;
    for (int c = 1; c < 257; c++) start[c] += start[c - 1];
    for (int32_t i = 0; i < n; i++)
        if (g->plain[i] > PLAIN_BUCKETS) g->long_ids[start[g->plain[i]]++] = i, g->n_long++;
    for (int32_t i = 0; i < n; i++)
        for (int b = g->plain[i] - 1; g->plain[i] && b < PLAIN_BUCKETS; b++)
            g->plain_le[b][i >> 6] |= 1ull << (i & 63);
    bool ok = trie_build(g, ids, k, &g->all);
    for (int32_t i = 0; i < k; i++)
        if (!g->plain[ids[i]]) ids[ks++] = ids[i];
    ok = ok && trie_build(g, ids, ks, &g->special);
    free(ids);
    if (!ok) goto oom;
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
    char *open, *close, *trigger, *trigger_end;
    gstate *cur;
    gstate *stack; /* one state per trie depth (max_len + 1), and scratch for accept */
    uint32_t n_stack;
    uint64_t *allowed;
    /* thinking: tokens without the closing tag's first byte (pass as they are), and the
     * others (fed one by one) */
    uint64_t *think_free;
    int32_t *think_check;
    int32_t n_think_check;
    /* lazy grammars' free text: the same split by the trigger's first byte (tokens
     * without bytes pass too: control tokens are text there) */
    uint64_t *free_free;
    int32_t *free_check;
    int32_t n_free_check;
};

/* The tokens of gv that hold byte c (fed one by one) and the others (bits in pass). */
static bool split_by_byte(const gram_vocab *gv, char c, bool empty_pass, uint64_t **pass,
                          int32_t **check, int32_t *n_check) {
    size_t words = ((size_t)gv->n_tokens + 63) / 64 + 1;
    *pass = calloc(words, sizeof **pass);
    *check = malloc(((size_t)gv->n_tokens + 1) * sizeof **check);
    if (!*pass || !*check) return false;
    for (int32_t i = 0; i < gv->n_tokens; i++) {
        uint32_t a = gv->off[i], b = gv->off[i + 1];
        if (a == b) {
            if (empty_pass && !gv->eog[i]) (*pass)[i >> 6] |= 1ull << (i & 63);
            continue;
        }
        if (memchr(gv->bytes + a, c, b - a)) (*check)[(*n_check)++] = i;
        else (*pass)[i >> 6] |= 1ull << (i & 63);
    }
    return true;
}

hl_status gram_matcher_create(const gram_schema *s, const gram_vocab *gv, const gram_think *think,
                              gram_matcher **out, hl_err *err) {
    *out = NULL;
    gram_matcher *m = calloc(1, sizeof *m);
    if (!m) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    m->s = s;
    m->gv = gv;
    if (think) { /* the gates count tag bytes in a uint8_t */
        const char *tags[] = {think->open, think->close, think->trigger, think->trigger_end};
        for (int i = 0; i < 4; i++)
            if (tags[i] && strlen(tags[i]) > 200) {
                gram_matcher_free(m);
                return hl_fail(err, HL_ERR_INVALID, "grammar tag longer than 200 bytes");
            }
    }
    if (think && think->close && *think->close) {
        m->close = strdup(think->close);
        m->open = think->open ? strdup(think->open) : NULL;
        if (!m->close || (think->open && !m->open)) goto oom;
        m->think = (gram_think){.open = m->open, .close = m->close, .in_think = think->in_think};
    }
    if (think && think->trigger && *think->trigger) {
        m->trigger = strdup(think->trigger);
        m->trigger_end = strdup(think->trigger_end ? think->trigger_end : "");
        if (!m->trigger || !m->trigger_end) goto oom;
        m->think.trigger = m->trigger;
        m->think.trigger_end = m->trigger_end;
        m->think.trigger_now = think->trigger_now;
    }
    m->n_stack = (gv ? gv->max_len : 0) + 3;
    m->cur = malloc(sizeof *m->cur);
    m->stack = malloc(m->n_stack * sizeof *m->stack);
    if (gv) m->allowed = calloc(((size_t)gv->n_tokens + 63) / 64 + 1, sizeof *m->allowed);
    if (!m->cur || !m->stack || (gv && !m->allowed)) goto oom;
    if (gv && m->close &&
        !split_by_byte(gv, m->close[0], false, &m->think_free, &m->think_check, &m->n_think_check))
        goto oom;
    if (gv && m->trigger &&
        !split_by_byte(gv, m->trigger[0], true, &m->free_free, &m->free_check, &m->n_free_check))
        goto oom;
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
    free(m->think_free);
    free(m->think_check);
    free(m->trigger);
    free(m->trigger_end);
    free(m->free_free);
    free(m->free_check);
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

bool gram_matcher_allows(gram_matcher *m, int32_t token) {
    const gram_vocab *gv = m->gv;
    if (token < 0 || token >= gv->n_tokens) return false;
    if (gv->eog[token]) return gram_state_accepting(m->s, m->cur);
    uint32_t a = gv->off[token], b = gv->off[token + 1];
    if (a == b) return m->free_free && m->cur->gate == GATE_FREE && m->cur->gate_k == 0;
    return feed_into(m, gv->bytes + a, b - a, &m->stack[2]);
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

/* Allows every token of t whose bytes the state (st[0]) accepts. */
static bool walk(gram_matcher *m, const trie *t, uint64_t *al) {
    gstate *st = m->stack;
    bool any = false;
    uint32_t i = 0;
    while (i < t->n_nodes) {
        uint32_t d = t->ndepth[i];
        if (!gram_state_feed(m->s, &m->think, &st[d - 1], t->nbyte[i], &st[d])) {
            i = t->nend[i];
            continue;
        }
        for (uint32_t k = t->ntok[i]; k < t->ntok[i + 1]; k++) {
            int32_t id = t->toks[k];
            al[id >> 6] |= 1ull << (id & 63);
            any = true;
        }
        i++;
    }
    return any;
}

/* Free text waiting for a tag: the tokens without its first byte pass as they are,
 * the others are fed. */
static bool split_mask(gram_matcher *m, const uint64_t *pass, const int32_t *check,
                       int32_t n_check, uint64_t *al, size_t words) {
    const gram_vocab *gv = m->gv;
    bool any = false;
    for (size_t w = 0; w < words; w++) any |= (al[w] = pass[w]) != 0;
    gstate *tmp = &m->stack[m->n_stack - 1];
    for (int32_t k = 0; k < n_check; k++) {
        int32_t id = check[k];
        if (feed_into(m, gv->bytes + gv->off[id], gv->off[id + 1] - gv->off[id], tmp)) {
            al[id >> 6] |= 1ull << (id & 63);
            any = true;
        }
    }
    return any;
}

void gram_matcher_mask(gram_matcher *m, float *logits, int32_t n_vocab) {
    const gram_vocab *gv = m->gv;
    uint64_t *al = m->allowed;
    size_t words = ((size_t)gv->n_tokens + 63) / 64;
    memset(al, 0, words * sizeof *al);
    bool any = false;
    uint32_t room;
    if (gram_state_complete(m->s, m->cur)) {
        /* only the end */
    } else if (gram_state_free_string(m->s, m->cur, &room)) {
        if (room == UINT32_MAX) {
            for (size_t w = 0; w < words; w++) any |= (al[w] = gv->plain_bits[w]) != 0;
        } else if (room > 0) {
            const uint64_t *le = gv->plain_le[(room < PLAIN_BUCKETS ? room : PLAIN_BUCKETS) - 1];
            for (size_t w = 0; w < words; w++) any |= (al[w] = le[w]) != 0;
            for (int32_t k = 0; k < gv->n_long && gv->plain[gv->long_ids[k]] <= room; k++) {
                int32_t id = gv->long_ids[k];
                al[id >> 6] |= 1ull << (id & 63);
                any = true;
            }
        }
        gram_state_copy(&m->stack[0], m->cur);
        any |= walk(m, &gv->special, al);
    } else if (m->cur->gate == GATE_THINK && m->cur->gate_k == 0 && m->think_free) {
        any = split_mask(m, m->think_free, m->think_check, m->n_think_check, al, words);
    } else if (m->cur->gate == GATE_FREE && m->cur->gate_k == 0 && m->free_free) {
        any = split_mask(m, m->free_free, m->free_check, m->n_free_check, al, words);
    } else {
        gram_state_copy(&m->stack[0], m->cur);
        any = walk(m, &gv->all, al);
    }
    if (gram_state_accepting(m->s, m->cur))
        for (int32_t e = 0; e < gv->n_eog; e++) {
            int32_t id = gv->eog_ids[e];
            al[id >> 6] |= 1ull << (id & 63);
            any = true;
        }
    if (!any) return;
    int32_t n = n_vocab < gv->n_tokens ? n_vocab : gv->n_tokens;
    for (int32_t w = 0; w * 64 < n; w++) { /* whole words of allowed or banned tokens at once */
        uint64_t bits = al[w];
        int32_t lo = w * 64, hi = lo + 64 < n ? lo + 64 : n;
        if (bits == ~0ull && hi - lo == 64) continue;
        for (int32_t i = lo; i < hi; i++)
            if (!(bits >> (i - lo) & 1)) logits[i] = -INFINITY;
    }
    for (int32_t i = n; i < n_vocab; i++) logits[i] = -INFINITY;
}
