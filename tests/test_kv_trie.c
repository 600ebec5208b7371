/*
 * test_kv_trie.c - the prefix trie: the reference's trie gold vectors and cache scenarios
 * (research/mlxrunner-internals.md 2.3, 2.6, 2.8-2.11) over fake caches that record
 * token ids, in three environments: Transformer (one rewindable cache), SlidingWindow
 * (rewindable + window 4), Recurrent (rewindable + recurrent).
 */
#include <stdlib.h>

#include "kv/trie.h"
#include "test.h"

#define FK_MAX 256

typedef enum fk_kind { FK_KV, FK_ROT, FK_REC } fk_kind;

typedef struct fake_cache {
    fk_kind kind;
    int32_t toks[FK_MAX];
    int32_t off;
    int32_t window;
    int *open_snaps; /* shared counter of snapshots alive */
} fake_cache;

typedef struct fake_snap {
    fk_kind kind;
    int32_t from, to;
    int32_t toks[FK_MAX]; /* KV: rows [from,to) at toks[0..); others: the whole history */
    size_t bytes;          /* 0: 4 bytes per token */
} fake_snap;

static int32_t fk_offset(void *self) { return ((fake_cache *)self)->off; }

static fake_snap *fk_snap_new(fake_cache *c) {
    fake_snap *s = calloc(1, sizeof *s);
    if (s && c->open_snaps) (*c->open_snaps)++;
    return s;
}

static void fk_close(void *self, void *snap) {
    fake_cache *c = self;
    if (!snap) return;
    if (c->open_snaps) (*c->open_snaps)--;
    free(snap);
}

static void *fk_snapshot(void *self, int32_t from) {
    fake_cache *c = self;
    if (from < 0) from = 0;
    if (c->kind == FK_KV && from >= c->off) return NULL;
    if (c->kind != FK_KV && c->off == 0) return NULL;
    fake_snap *s = fk_snap_new(c);
    s->kind = c->kind;
    s->from = from;
    s->to = c->off;
    if (c->kind == FK_KV)
        memcpy(s->toks, c->toks + from, (size_t)(c->off - from) * sizeof(int32_t));
    else
        memcpy(s->toks, c->toks, (size_t)c->off * sizeof(int32_t));
    return s;
}

static bool fk_restore(void *self, void *snap, int32_t t) {
    fake_cache *c = self;
    fake_snap *s = snap;
    if (!s) {
        switch (c->kind) {
        case FK_KV: if (t < 0 || t > c->off) return false; break;
        case FK_ROT:
            if (t == c->off) return true;
            if (t > c->off || c->off > c->window) return false;
            break;
        case FK_REC: return t == c->off;
        }
        c->off = t;
        return true;
    }
    switch (c->kind) {
    case FK_KV:
        if (t > s->to || c->off < s->from) return false;
        memcpy(c->toks + s->from, s->toks, (size_t)(s->to - s->from) * sizeof(int32_t));
        c->off = t;
        return true;
    case FK_ROT:
        if (t > s->to || (t < s->to && s->to > c->window)) return false;
        memcpy(c->toks, s->toks, (size_t)s->to * sizeof(int32_t));
        c->off = t;
        return true;
    case FK_REC:
        if (t != s->to) return false;
        memcpy(c->toks, s->toks, (size_t)s->to * sizeof(int32_t));
        c->off = t;
        return true;
    }
    return false;
}

static void fk_free_state(void *self) { ((fake_cache *)self)->off = 0; }

static void fk_split(void *self, void *snap, int32_t at, void **head, void **tail) {
    fake_cache *c = self;
    fake_snap *s = snap;
    *head = *tail = NULL;
    if (s->kind != FK_KV) {
        *tail = s;
        return;
    }
    if (at <= s->from) {
        *tail = s;
        return;
    }
    if (at >= s->to) {
        *head = s;
        return;
    }
    fake_snap *h = fk_snap_new(c), *t = fk_snap_new(c);
    h->kind = t->kind = FK_KV;
    h->from = s->from, h->to = at;
    t->from = at, t->to = s->to;
    memcpy(h->toks, s->toks, (size_t)(at - s->from) * sizeof(int32_t));
    memcpy(t->toks, s->toks + (at - s->from), (size_t)(s->to - at) * sizeof(int32_t));
    fk_close(c, s);
    *head = h;
    *tail = t;
}

static void *fk_merge(void *self, void *parent, void *child) {
    fake_cache *c = self;
    fake_snap *a = parent, *b = child;
    if (c->kind != FK_KV) {
        fk_close(c, a);
        return b;
    }
    if (!a || !b) {
        fk_close(c, a);
        fk_close(c, b);
        return NULL;
    }
    fake_snap *m = fk_snap_new(c);
    m->kind = FK_KV;
    m->from = a->from;
    m->to = b->to;
    memcpy(m->toks, a->toks, (size_t)(a->to - a->from) * sizeof(int32_t));
    memcpy(m->toks + (a->to - a->from), b->toks, (size_t)(b->to - b->from) * sizeof(int32_t));
    fk_close(c, a);
    fk_close(c, b);
    return m;
}

static size_t fk_bytes(void *self, const void *snap) {
    (void)self;
    const fake_snap *s = snap;
    return s->bytes ? s->bytes : (size_t)(s->to - s->from) * 4;
}

static const kv_cache_ops fk_ops = {fk_offset, fk_snapshot, fk_restore, fk_free_state,
                                    fk_split,  fk_merge,    fk_bytes,   fk_close};

/* ---- environments ---- */

typedef enum env_kind { ENV_TRANSFORMER, ENV_SLIDING, ENV_RECURRENT } env_kind;

typedef struct env {
    fake_cache fc[2];
    kv_cache caches[2];
    int n;
    int open_snaps;
    uint64_t clock;
    kv_prefix *pc;
} env;

static uint64_t env_clock(void *ctx) { return ((env *)ctx)->clock; }

static env *env_new(env_kind kind) {
    env *e = calloc(1, sizeof *e);
    e->n = kind == ENV_TRANSFORMER ? 1 : 2;
    e->fc[0] = (fake_cache){.kind = FK_KV, .open_snaps = &e->open_snaps};
    e->fc[1] = (fake_cache){.kind = kind == ENV_SLIDING ? FK_ROT : FK_REC, .window = 4,
                            .open_snaps = &e->open_snaps};
    for (int i = 0; i < e->n; i++) e->caches[i] = (kv_cache){&fk_ops, &e->fc[i]};
    e->clock = 1000;
    kv_prefix_config cfg = {.caches = e->caches, .n_caches = e->n, .clock = env_clock,
                            .clock_ctx = e};
    if (kv_prefix_create(&cfg, &e->pc, NULL) != HL_OK) abort();
    return e;
}

static void env_free(env *e) {
    kv_prefix_destroy(e->pc);
    free(e);
}

static void feed(env *e, int32_t tok) {
    for (int i = 0; i < e->n; i++) e->fc[i].toks[e->fc[i].off++] = tok;
}

typedef struct req_result {
    int32_t remaining;
    int32_t pending; /* pending snapshots right after begin */
    bool caches_ok;  /* after begin every cache held exactly inputs[:prefix] */
    hl_status st;
} req_result;

/* One request the way the pipeline drives it: begin, prefill with snapshots at pending
 * offsets, generated tokens, close. user_snap > 0 requests a user snapshot there. */
static req_result run_req(env *e, const int32_t *in, int n, const int32_t *gen, int ng,
                          int32_t user_snap) {
    req_result r = {0};
    kv_session s;
    r.st = kv_prefix_begin(e->pc, in, n, &s, NULL);
    if (r.st) return r;
    r.remaining = n - s.prefix;
    r.pending = s.n_pending;
    r.caches_ok = true;
    for (int i = 0; i < e->n; i++) {
        if (e->fc[i].off != s.prefix) r.caches_ok = false;
        for (int32_t j = 0; j < s.prefix && j < e->fc[i].off; j++)
            if (e->fc[i].toks[j] != in[j]) r.caches_ok = false;
    }
    if (user_snap > 0) kv_session_request_snapshot(&s, user_snap, true);
    for (int32_t p = s.prefix; p < n; p++) {
        feed(e, in[p]);
        int32_t next = kv_session_next_snapshot(&s);
        if (next >= 0 && next <= p + 1) kv_session_snapshot(&s, NULL);
    }
    for (int i = 0; i < ng; i++) {
        kv_session_add_outputs(&s, &gen[i], 1, NULL);
        feed(e, gen[i]);
    }
    r.st = kv_session_close(&s, NULL);
    e->clock += 10;
    return r;
}

static int32_t find_len(env *e, const int32_t *t, int n) {
    kv_path p = {0};
    int32_t m = -1;
    kv_trie_find_best_match(kv_prefix_root(e->pc), t, n, &p, &m, NULL);
    kv_path_free(&p);
    return m;
}

static int32_t find_len_pc(kv_prefix *pc, const int32_t *t, int n) {
    kv_path p = {0};
    int32_t m = -1;
    kv_trie_find_best_match(kv_prefix_root(pc), t, n, &p, &m, NULL);
    kv_path_free(&p);
    return m;
}

static bool cache_holds(const env *e, const int32_t *t, int n) {
    for (int i = 0; i < e->n; i++) {
        if (e->fc[i].off != n) return false;
        for (int j = 0; j < n; j++)
            if (e->fc[i].toks[j] != t[j]) return false;
    }
    return true;
}

static kv_node *child(kv_node *n, int32_t i) { return n->children[i]; }

/* ---- 2.3 gold vectors ---- */

static kv_node *add(env *e, kv_node *parent, const int32_t *t, int n) {
    kv_node *c = NULL;
    kv_trie_append_child(e->pc, parent, t, n, &c, NULL);
    return c;
}

TEST(kv_trie_find_best_match_branches) {
    env *e = env_new(ENV_TRANSFORMER);
    kv_node *root = kv_prefix_root(e->pc);
    add(e, root, (int32_t[]){1, 2, 3}, 3);
    kv_node *b2 = add(e, root, (int32_t[]){4, 5, 6}, 3);
    kv_path p = {0};
    int32_t m;
    CHECK_OK(kv_trie_find_best_match(root, (int32_t[]){1, 2, 3, 7}, 4, &p, &m, NULL), NULL);
    CHECK_EQ_INT(m, 3);
    CHECK(p.nodes[1] == child(root, 0));
    CHECK_OK(kv_trie_find_best_match(root, (int32_t[]){4, 5, 6, 8}, 4, &p, &m, NULL), NULL);
    CHECK_EQ_INT(m, 3);
    CHECK(p.nodes[1] == b2);
    CHECK_OK(kv_trie_find_best_match(root, (int32_t[]){7, 8, 9}, 3, &p, &m, NULL), NULL);
    CHECK_EQ_INT(m, 0);
    CHECK_EQ_INT(p.n, 1);
    kv_path_free(&p);
    env_free(e);
}

TEST(kv_trie_prefers_full_edge_and_longer_partial) {
    env *e = env_new(ENV_TRANSFORMER);
    kv_node *root = kv_prefix_root(e->pc);
    kv_node *a = add(e, root, (int32_t[]){1, 2, 3}, 3);
    add(e, a, (int32_t[]){10, 11, 12, 13, 14}, 5);
    kv_node *short_edge = add(e, a, (int32_t[]){10, 11, 12}, 3); /* defensive: same first token */
    kv_path p = {0};
    int32_t m;
    CHECK_OK(kv_trie_find_best_match(root, (int32_t[]){1, 2, 3, 10, 11, 12, 99, 100}, 8, &p, &m,
                                     NULL), NULL);
    CHECK_EQ_INT(m, 6);
    CHECK_EQ_INT(p.n, 3);
    CHECK(p.nodes[2] == short_edge);
    env_free(e);

    e = env_new(ENV_TRANSFORMER);
    root = kv_prefix_root(e->pc);
    add(e, root, (int32_t[]){1, 2, 9}, 3);
    kv_node *longer = add(e, root, (int32_t[]){1, 2, 3, 4, 5}, 5);
    CHECK_OK(kv_trie_find_best_match(root, (int32_t[]){1, 2, 3, 7, 8}, 5, &p, &m, NULL), NULL);
    CHECK_EQ_INT(m, 3);
    CHECK(p.nodes[1] == longer);
    kv_path_free(&p);
    env_free(e);
}

TEST(kv_trie_split_then_append) {
    env *e = env_new(ENV_TRANSFORMER);
    kv_node *root = kv_prefix_root(e->pc);
    kv_node *n = add(e, root, (int32_t[]){1, 2, 3, 4, 5}, 5);
    kv_node *p = NULL;
    CHECK_OK(kv_trie_split(e->pc, n, 3, &p, NULL), NULL);
    add(e, p, (int32_t[]){6, 7}, 2);
    CHECK_EQ_INT(root->n_children, 1);
    CHECK_EQ_INT(child(root, 0)->n_tokens, 3);
    CHECK_EQ_INT(child(root, 0)->n_children, 2);
    CHECK_EQ_INT(find_len(e, (int32_t[]){1, 2, 3, 4, 5}, 5), 5);
    CHECK_EQ_INT(find_len(e, (int32_t[]){1, 2, 3, 6, 7}, 5), 5);
    CHECK_EQ_INT(find_len(e, (int32_t[]){1, 2, 3, 9, 9}, 5), 3);
    CHECK_OK(kv_trie_check(e->pc, NULL), NULL);
    env_free(e);
}

TEST(kv_trie_repeated_branching) {
    env *e = env_new(ENV_TRANSFORMER);
    int32_t A[] = {1, 2, 3, 4, 5}, B[] = {1, 2, 3, 6, 7}, C[] = {1, 2, 8, 9};
    kv_node *root = kv_prefix_root(e->pc);
    add(e, root, A, 5);
    kv_path path = {0};
    int32_t m;
    CHECK_OK(kv_trie_find_best_match(root, B, 5, &path, &m, NULL), NULL);
    CHECK_EQ_INT(m, 3);
    kv_node *p = NULL;
    CHECK_OK(kv_trie_split(e->pc, path.nodes[1], 3, &p, NULL), NULL);
    add(e, p, B + 3, 2);
    CHECK_OK(kv_trie_find_best_match(root, C, 4, &path, &m, NULL), NULL);
    CHECK_EQ_INT(m, 2);
    CHECK_OK(kv_trie_split(e->pc, path.nodes[1], 2, &p, NULL), NULL);
    add(e, p, C + 2, 2);
    CHECK_EQ_INT(find_len(e, A, 5), 5);
    CHECK_EQ_INT(find_len(e, B, 5), 5);
    CHECK_EQ_INT(find_len(e, C, 4), 4);
    CHECK_OK(kv_trie_check(e->pc, NULL), NULL);
    kv_path_free(&path);
    env_free(e);
}

static void **one_snap(env *e, int32_t from, int32_t to, int32_t base) {
    fake_snap *s = fk_snap_new(&e->fc[0]);
    s->kind = FK_KV;
    s->from = from;
    s->to = to;
    for (int32_t i = from; i < to; i++) s->toks[i - from] = base + i;
    void **snaps = calloc(1, sizeof(void *));
    snaps[0] = s;
    return snaps;
}

TEST(kv_trie_split_user_node) {
    env *e = env_new(ENV_TRANSFORMER);
    kv_node *n = add(e, kv_prefix_root(e->pc), (int32_t[]){1, 2, 3, 4, 5}, 5);
    n->user = true;
    kv_trie_set_snaps(e->pc, n, one_snap(e, 0, 5, 100));
    kv_node *p = NULL;
    CHECK_OK(kv_trie_split(e->pc, n, 2, &p, NULL), NULL);
    CHECK(!p->user);
    CHECK(n->user);
    CHECK(p->snaps && p->snaps[0] && n->snaps && n->snaps[0]);
    fake_snap *h = p->snaps[0], *t = n->snaps[0];
    CHECK_EQ_INT(h->from, 0);
    CHECK_EQ_INT(h->to, 2);
    CHECK_EQ_INT(t->from, 2);
    CHECK_EQ_INT(t->to, 5);
    CHECK_EQ_INT(t->toks[0], 102);
    CHECK_EQ_INT(kv_prefix_snapshot_bytes(e->pc), 20);
    CHECK_EQ_INT(e->open_snaps, 2);
    env_free(e);
}

TEST(kv_trie_merge_with_child) {
    env *e = env_new(ENV_TRANSFORMER);
    kv_node *a = add(e, kv_prefix_root(e->pc), (int32_t[]){1, 2, 3}, 3);
    kv_node *b = add(e, a, (int32_t[]){4, 5}, 2);
    kv_node *g1 = add(e, b, (int32_t[]){6}, 1), *g2 = add(e, b, (int32_t[]){7}, 1);
    kv_trie_set_snaps(e->pc, a, one_snap(e, 0, 3, 100));
    kv_trie_set_snaps(e->pc, b, one_snap(e, 3, 5, 100));
    a->last_used = 50;
    b->last_used = 70;
    b->user = true;
    CHECK_OK(kv_trie_merge_with_child(e->pc, a, NULL), NULL);
    CHECK_EQ_INT(a->n_tokens, 5);
    CHECK_EQ_INT(a->tokens[3], 4);
    CHECK_EQ_INT(a->end, 5);
    CHECK_EQ_INT(a->n_children, 2);
    CHECK(g1->parent == a && g2->parent == a);
    CHECK(a->user);
    CHECK_EQ_INT(a->last_used, 70);
    fake_snap *m = a->snaps[0];
    CHECK_EQ_INT(m->from, 0);
    CHECK_EQ_INT(m->to, 5);
    CHECK_EQ_INT(m->toks[4], 104);
    CHECK_EQ_INT(e->open_snaps, 1);
    CHECK_OK(kv_trie_check(e->pc, NULL), NULL);
    hl_err err;
    CHECK(kv_trie_merge_with_child(e->pc, a, &err) == HL_ERR_INVALID);
    CHECK_STR(err.msg, "mergeWithChild called on node with 2 children");
    env_free(e);
}

TEST(kv_trie_remove_and_split_errors) {
    env *e = env_new(ENV_TRANSFORMER);
    kv_node *root = kv_prefix_root(e->pc);
    kv_node *a = add(e, root, (int32_t[]){1, 2, 3}, 3);
    kv_node *b = add(e, a, (int32_t[]){4}, 1);
    kv_trie_set_snaps(e->pc, b, one_snap(e, 3, 4, 0));
    hl_err err;
    CHECK(kv_trie_remove(e->pc, root, &err) == HL_ERR_INVALID);
    CHECK_STR(err.msg, "removeNode called on root");
    CHECK(kv_trie_remove(e->pc, a, &err) == HL_ERR_INVALID);
    CHECK_STR(err.msg, "removeNode called on non-leaf node");
    CHECK(kv_trie_split(e->pc, a, 0, NULL, &err) == HL_ERR_INVALID);
    CHECK_STR(err.msg, "splitNode: invalid split offset 0 for node with 3 tokens");
    CHECK(kv_trie_split(e->pc, a, 3, NULL, &err) == HL_ERR_INVALID);
    CHECK_OK(kv_trie_remove(e->pc, b, NULL), NULL);
    CHECK_EQ_INT(a->n_children, 0);
    CHECK_EQ_INT(e->open_snaps, 0);
    CHECK_EQ_INT(kv_prefix_snapshot_bytes(e->pc), 0);
    env_free(e);
}

/* ---- 2.11 scenarios ---- */

static void branch_creation_and_reuse(env_kind kind) {
    env *e = env_new(kind);
    int32_t A[] = {1, 2, 3, 4, 5, 6, 7, 8}, genA[] = {20, 21};
    req_result r = run_req(e, A, 8, genA, 2, 0);
    CHECK_OK(r.st, NULL);
    CHECK_EQ_INT(r.remaining, 8);
    int32_t Afull[] = {1, 2, 3, 4, 5, 6, 7, 8, 20, 21};
    CHECK_EQ_INT(find_len(e, Afull, 10), 10);
    int32_t B[] = {1, 2, 3, 4, 5, 10, 11, 12}, genB[] = {30, 31};
    r = run_req(e, B, 8, genB, 2, 0);
    CHECK_OK(r.st, NULL);
    CHECK(r.caches_ok);
    if (kind == ENV_TRANSFORMER) {
        CHECK_EQ_INT(r.pending, 0);
        CHECK_EQ_INT(r.remaining, 3);
    } else {
        CHECK_EQ_INT(r.pending, 1);
        CHECK_EQ_INT(r.remaining, 8);
    }
    CHECK(find_len(e, Afull, 10) >= 5);
    int32_t Bfull[] = {1, 2, 3, 4, 5, 10, 11, 12, 30, 31};
    CHECK(find_len(e, Bfull, 10) >= 5);
    int32_t C[] = {1, 2, 3, 4, 5, 6, 7, 8, 40, 41};
    r = run_req(e, C, 10, NULL, 0, 0);
    CHECK_OK(r.st, NULL);
    CHECK(r.caches_ok);
    CHECK(r.remaining < 10);
    CHECK_OK(kv_trie_check(e->pc, NULL), NULL);
    env_free(e);
}

TEST(kv_trie_branch_creation_and_reuse) {
    branch_creation_and_reuse(ENV_TRANSFORMER);
    if (test_failed()) return;
    branch_creation_and_reuse(ENV_SLIDING);
    if (test_failed()) return;
    branch_creation_and_reuse(ENV_RECURRENT);
}

static void conversation_resumption(env_kind kind) {
    env *e = env_new(kind);
    int32_t t1[] = {1, 2, 3, 4, 5}, g1[] = {10, 11, 12};
    CHECK_OK(run_req(e, t1, 5, g1, 3, 0).st, NULL);
    int32_t t2[] = {1, 2, 3, 4, 5, 10, 11, 12, 20, 21}, g2[] = {30, 31};
    req_result r = run_req(e, t2, 10, g2, 2, 0);
    CHECK(r.caches_ok);
    CHECK(r.remaining <= 5);
    int32_t t3[] = {1, 2, 3, 4, 5, 10, 11, 12, 20, 21, 30, 31, 40, 41};
    r = run_req(e, t3, 14, NULL, 0, 0);
    CHECK(r.caches_ok);
    CHECK(r.remaining <= 5);
    env_free(e);
}

TEST(kv_trie_conversation_resumption) {
    conversation_resumption(ENV_TRANSFORMER);
    if (test_failed()) return;
    conversation_resumption(ENV_SLIDING);
    if (test_failed()) return;
    conversation_resumption(ENV_RECURRENT);
}

static kv_node *node_ending_at(kv_node *n, int32_t end) {
    if (n->end == end && n->parent) return n;
    for (int32_t i = 0; i < n->n_children; i++) {
        kv_node *f = node_ending_at(n->children[i], end);
        if (f) return f;
    }
    return NULL;
}

static void user_snapshot_preserves_restore_point(env_kind kind) {
    env *e = env_new(kind);
    int32_t t1[] = {1, 2, 3, 4, 5}, g1[] = {10, 11};
    CHECK_OK(run_req(e, t1, 5, g1, 2, 5).st, NULL);
    kv_node *u = node_ending_at(kv_prefix_root(e->pc), 5);
    CHECK(u && u->user);
    CHECK_EQ_INT(u->n_children, 1); /* the generated tokens went into a child */
    int32_t t2[] = {1, 2, 3, 4, 5, 10, 11, 12}, g2[] = {13};
    CHECK(run_req(e, t2, 8, g2, 1, 0).caches_ok);
    int32_t t3[] = {7, 8, 9};
    CHECK(run_req(e, t3, 3, NULL, 0, 0).caches_ok);
    int32_t t4[] = {1, 2, 3, 4, 5, 50};
    req_result r = run_req(e, t4, 6, NULL, 0, 0);
    CHECK(r.caches_ok);
    CHECK_EQ_INT(r.remaining, 1); /* restored at the user node for every cache kind */
    CHECK_OK(kv_trie_check(e->pc, NULL), NULL);
    env_free(e);
}

TEST(kv_trie_user_snapshot_preserves_restore_point) {
    user_snapshot_preserves_restore_point(ENV_TRANSFORMER);
    if (test_failed()) return;
    user_snapshot_preserves_restore_point(ENV_SLIDING);
    if (test_failed()) return;
    user_snapshot_preserves_restore_point(ENV_RECURRENT);
}

static void inflate_all(const env *e, kv_node *n, size_t bytes) {
    if (n->snaps)
        for (int i = 0; i < e->n; i++) {
            fake_snap *s = n->snaps[i];
            if (s) s->bytes = bytes;
        }
    for (int32_t i = 0; i < n->n_children; i++) inflate_all(e, n->children[i], bytes);
}

static void user_snapshot_resists_auto_merge(env_kind kind) {
    env *e = env_new(kind);
    int32_t t1[] = {1, 2, 3, 4, 5}, g1[] = {10};
    CHECK_OK(run_req(e, t1, 5, g1, 1, 3).st, NULL);
    int32_t t2[] = {1, 2, 3, 7, 8}, g2[] = {11};
    CHECK_OK(run_req(e, t2, 5, g2, 1, 0).st, NULL);
    kv_node *u = node_ending_at(kv_prefix_root(e->pc), 3);
    CHECK(u && u->user);
    CHECK_EQ_INT(u->n_children, 2);
    inflate_all(e, kv_prefix_root(e->pc), (size_t)5 << 30);
    kv_prefix_recount(e->pc);
    kv_prefix_evict(e->pc);
    u = node_ending_at(kv_prefix_root(e->pc), 3);
    CHECK(u && u->user);
    CHECK_OK(kv_trie_check(e->pc, NULL), NULL);
    env_free(e);
}

TEST(kv_trie_user_snapshot_resists_auto_merge) {
    user_snapshot_resists_auto_merge(ENV_TRANSFORMER);
    if (test_failed()) return;
    user_snapshot_resists_auto_merge(ENV_SLIDING);
    if (test_failed()) return;
    user_snapshot_resists_auto_merge(ENV_RECURRENT);
}

static void branch_switch_restores_state(env_kind kind) {
    env *e = env_new(kind);
    int32_t A[] = {1, 2, 3, 4, 5}, gA[] = {10, 11};
    int32_t B[] = {1, 2, 3, 6, 7}, gB[] = {12, 13};
    CHECK_OK(run_req(e, A, 5, gA, 2, 0).st, NULL);
    CHECK_OK(run_req(e, B, 5, gB, 2, 0).st, NULL);
    CHECK(cache_holds(e, (int32_t[]){1, 2, 3, 6, 7, 12, 13}, 7));
    int32_t C[] = {1, 2, 3, 4, 5, 10, 11, 20};
    req_result r = run_req(e, C, 8, NULL, 0, 0);
    CHECK(r.caches_ok);
    CHECK(cache_holds(e, C, 8));
    if (kind == ENV_TRANSFORMER) CHECK_EQ_INT(r.remaining, 1);
    env_free(e);
}

TEST(kv_trie_branch_switch_restores_correct_state) {
    branch_switch_restores_state(ENV_TRANSFORMER);
    if (test_failed()) return;
    branch_switch_restores_state(ENV_SLIDING);
    if (test_failed()) return;
    branch_switch_restores_state(ENV_RECURRENT);
}

static void set_all_used(kv_node *n, uint64_t t) {
    n->last_used = t;
    for (int32_t i = 0; i < n->n_children; i++) set_all_used(n->children[i], t);
}

TEST(kv_trie_lru_only_updates_used_nodes) {
    env *e = env_new(ENV_TRANSFORMER);
    int32_t A[] = {1, 2, 3, 4, 5}, gA[] = {10, 11};
    int32_t B[] = {1, 2, 3, 6, 7}, gB[] = {20, 21};
    CHECK_OK(run_req(e, A, 5, gA, 2, 0).st, NULL);
    CHECK_OK(run_req(e, B, 5, gB, 2, 0).st, NULL);
    e->clock = 1000000;
    set_all_used(kv_prefix_root(e->pc), 1); /* "an hour ago" */
    int32_t C[] = {1, 2, 3, 6, 7, 20, 21, 30};
    kv_session s;
    CHECK_OK(kv_prefix_begin(e->pc, C, 8, &s, NULL), NULL);
    feed(e, 30);
    CHECK_OK(kv_session_close(&s, NULL), NULL);
    const kv_path *act = kv_prefix_active(e->pc);
    CHECK(act->n >= 3);
    CHECK_EQ_INT(act->nodes[act->n - 1]->last_used, 1000000);
    for (int32_t i = 0; i < act->n - 1; i++) CHECK_EQ_INT(act->nodes[i]->last_used, 1);
    /* the other branch was not touched either */
    kv_node *a = node_ending_at(kv_prefix_root(e->pc), 7);
    CHECK(a && a->last_used == 1);
    env_free(e);
}

TEST(kv_trie_eviction_preserves_active_conversations) {
    env *e = env_new(ENV_TRANSFORMER);
    for (int c = 0; c < 5; c++) {
        int32_t in[] = {1, 2, 3, 4, 5, 100 + c, 200 + c}, g[] = {300 + c};
        CHECK_OK(run_req(e, in, 7, g, 1, 0).st, NULL);
    }
    inflate_all(e, kv_prefix_root(e->pc), (size_t)2 << 30);
    kv_prefix_recount(e->pc);
    CHECK(kv_prefix_snapshot_bytes(e->pc) > ((size_t)8 << 30));
    kv_prefix_evict(e->pc);
    CHECK(kv_prefix_snapshot_bytes(e->pc) <= ((size_t)8 << 30));
    const kv_path *act = kv_prefix_active(e->pc);
    CHECK(act->n >= 2);
    CHECK_EQ_INT(act->nodes[act->n - 1]->end, 8);
    CHECK(find_len(e, (int32_t[]){1, 2, 3, 4, 5}, 5) == 5);
    kv_node *sys = node_ending_at(kv_prefix_root(e->pc), 5);
    CHECK(sys && sys->n_children > 1);
    CHECK_OK(kv_trie_check(e->pc, NULL), NULL);
    env_free(e);
}

TEST(kv_trie_eviction_order_oldest_then_deepest) {
    /* budget 20 bytes of 24: one eviction. Oldest tie -> the deepest (c, end 5). */
    env *e = env_new(ENV_TRANSFORMER);
    kv_prefix_destroy(e->pc);
    kv_prefix_config cfg = {.caches = e->caches, .n_caches = 1, .budget_bytes = 20,
                            .clock = env_clock, .clock_ctx = e};
    CHECK_OK(kv_prefix_create(&cfg, &e->pc, NULL), NULL);
    kv_node *root = kv_prefix_root(e->pc);
    kv_node *a = add(e, root, (int32_t[]){1, 2}, 2), *b = add(e, root, (int32_t[]){3}, 1);
    kv_node *c = add(e, a, (int32_t[]){5, 6, 7}, 3);
    kv_trie_set_snaps(e->pc, a, one_snap(e, 0, 2, 0));
    kv_trie_set_snaps(e->pc, b, one_snap(e, 0, 1, 0));
    kv_trie_set_snaps(e->pc, c, one_snap(e, 2, 5, 0));
    a->last_used = b->last_used = c->last_used = 5;
    CHECK_EQ_INT(kv_prefix_snapshot_bytes(e->pc), 24);
    kv_prefix_evict(e->pc);
    CHECK_EQ_INT(kv_prefix_snapshot_bytes(e->pc), 12);
    CHECK_EQ_INT(a->n_children, 0); /* c went first */
    CHECK_EQ_INT(root->n_children, 2);
    /* now older b loses to nothing newer: make a older and force one more eviction */
    a->last_used = 1;
    kv_trie_set_snaps(e->pc, b, one_snap(e, 0, 5, 0)); /* b: 20 bytes, total 28 */
    kv_prefix_evict(e->pc);
    CHECK_EQ_INT(root->n_children, 1);
    CHECK(child(root, 0) == b);
    env_free(e);
}

TEST(kv_trie_evicts_single_child_interior_by_merging) {
    env *e = env_new(ENV_TRANSFORMER);
    kv_prefix_destroy(e->pc);
    kv_prefix_config cfg = {.caches = e->caches, .n_caches = 1, .budget_bytes = 100,
                            .clock = env_clock, .clock_ctx = e};
    CHECK_OK(kv_prefix_create(&cfg, &e->pc, NULL), NULL);
    kv_node *root = kv_prefix_root(e->pc);
    kv_node *a = add(e, root, (int32_t[]){1, 2}, 2);
    kv_node *c = add(e, a, (int32_t[]){5, 6, 7}, 3);
    kv_trie_set_snaps(e->pc, a, one_snap(e, 0, 2, 0));
    kv_trie_set_snaps(e->pc, c, one_snap(e, 2, 5, 0));
    ((fake_snap *)a->snaps[0])->bytes = 200;
    kv_prefix_recount(e->pc);
    a->last_used = 1;
    c->last_used = 9;
    kv_prefix_evict(e->pc); /* a is oldest and has one child: merged, the KV snapshots join */
    CHECK_EQ_INT(root->n_children, 1);
    kv_node *m = child(root, 0);
    CHECK_EQ_INT(m->n_tokens, 5);
    CHECK_EQ_INT(m->last_used, 9);
    /* merged [0,5) counts 20 bytes again (the fake's merge does not keep the inflation) */
    CHECK_EQ_INT(kv_prefix_snapshot_bytes(e->pc), 20);
    env_free(e);
}

static void exact_match(env_kind kind) {
    env *e = env_new(kind);
    int32_t P[] = {1, 2, 3, 4, 5};
    CHECK_OK(run_req(e, P, 5, NULL, 0, 0).st, NULL);
    kv_session s;
    CHECK_OK(kv_prefix_begin(e->pc, P, 5, &s, NULL), NULL);
    CHECK_EQ_INT(s.matched, 5);
    if (kind == ENV_TRANSFORMER) {
        CHECK_EQ_INT(s.prefix, 4);
        CHECK_EQ_INT(s.n_pending, 0);
    } else {
        CHECK_EQ_INT(s.prefix, 0);
        CHECK_EQ_INT(s.n_pending, 1);
        CHECK_EQ_INT(s.pending[0].offset, 4);
        CHECK(!s.pending[0].user);
    }
    CHECK_OK(kv_session_close(&s, NULL), NULL);
    env_free(e);
}

TEST(kv_trie_exact_match_holds_back_last_token) {
    exact_match(ENV_TRANSFORMER);
    if (test_failed()) return;
    exact_match(ENV_SLIDING);
    if (test_failed()) return;
    exact_match(ENV_RECURRENT);
}

TEST(kv_trie_empty_prompt_rejected) {
    env *e = env_new(ENV_TRANSFORMER);
    kv_session s;
    hl_err err;
    CHECK(kv_prefix_begin(e->pc, NULL, 0, &s, &err) == HL_ERR_INVALID);
    CHECK_STR(err.msg, "empty prompt");
    CHECK_OK(kv_session_close(&s, NULL), NULL); /* closing a failed session is harmless */
    env_free(e);
}

TEST(kv_trie_snapshot_schedule) {
    env *e = env_new(ENV_RECURRENT);
    static int32_t in[20000];
    for (int i = 0; i < 20000; i++) in[i] = i % 1000;
    kv_session s;
    CHECK_OK(kv_prefix_begin(e->pc, in, 20000, &s, NULL), NULL);
    kv_session_schedule_prefill(&s);
    CHECK_EQ_INT(s.n_pending, 3);
    CHECK_EQ_INT(s.pending[0].offset, 8192);
    CHECK_EQ_INT(s.pending[1].offset, 16384);
    CHECK_EQ_INT(s.pending[2].offset, 19996);
    CHECK(s.pending[0].user && s.pending[2].user);
    kv_session_request_snapshot(&s, 0, true);     /* <= prefix: ignored */
    kv_session_request_snapshot(&s, 20001, true); /* > len: ignored */
    CHECK_EQ_INT(s.n_pending, 3);
    CHECK_OK(kv_session_close(&s, NULL), NULL);
    /* tiny prompt: len - 4 <= 0 schedules nothing */
    CHECK_OK(kv_prefix_begin(e->pc, (int32_t[]){1, 2, 3}, 3, &s, NULL), NULL);
    kv_session_schedule_prefill(&s);
    CHECK_EQ_INT(s.n_pending, 0);
    CHECK_OK(kv_session_close(&s, NULL), NULL);
    env_free(e);
}

TEST(kv_trie_retry_restores_from_pre_thinking_snapshot) {
    /* A recurrent model retrying the same prompt recomputes only the last 4 tokens. */
    env *e = env_new(ENV_RECURRENT);
    int32_t P[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    kv_session s;
    CHECK_OK(kv_prefix_begin(e->pc, P, 10, &s, NULL), NULL);
    kv_session_schedule_prefill(&s);
    for (int32_t p = 0; p < 10; p++) {
        feed(e, P[p]);
        if (kv_session_next_snapshot(&s) == p + 1) CHECK_OK(kv_session_snapshot(&s, NULL), NULL);
    }
    kv_session_add_outputs(&s, (int32_t[]){77}, 1, NULL);
    feed(e, 77);
    CHECK_OK(kv_session_close(&s, NULL), NULL);
    req_result r = run_req(e, P, 10, NULL, 0, 0);
    CHECK(r.caches_ok);
    CHECK_EQ_INT(r.remaining, 4);
    env_free(e);
}

TEST(kv_trie_snapshots_are_not_leaked) {
    env *e = env_new(ENV_SLIDING);
    for (int c = 0; c < 6; c++) {
        int32_t in[] = {1, 2, 3, 10 + c, 11 + c}, g[] = {50 + c, 51};
        CHECK_OK(run_req(e, in, 5, g, 2, c % 2 ? 3 : 0).st, NULL);
    }
    CHECK(e->open_snaps > 0);
    kv_prefix_destroy(e->pc);
    e->pc = NULL;
    CHECK_EQ_INT(e->open_snaps, 0);
    free(e);
}

/* ---- lanes: several live sequences over one trie ---- */

static bool g_evict_all;
static bool evict_flag(void *ctx, const kv_prefix *pc) {
    (void)ctx;
    (void)pc;
    return g_evict_all;
}

static bool on_path(const kv_path *p, const kv_node *n) {
    for (int32_t i = 0; i < p->n; i++)
        if (p->nodes[i] == n) return true;
    return false;
}

TEST(kv_trie_lanes_run_sequences_side_by_side) {
    int open_snaps = 0;
    fake_cache fc[3];
    kv_cache caches[3];
    for (int i = 0; i < 3; i++) {
        fc[i] = (fake_cache){.kind = FK_KV, .open_snaps = &open_snaps};
        caches[i] = (kv_cache){&fk_ops, &fc[i]};
    }
    kv_prefix_config cfg = {.caches = &caches[0], .n_caches = 1, .over_budget = evict_flag,
                            .page_out_on_close = true};
    kv_prefix *pc;
    CHECK_OK(kv_prefix_create(&cfg, &pc, NULL), NULL);
    kv_lane *l1, *l2;
    CHECK_OK(kv_prefix_add_lane(pc, &caches[1], &l1, NULL), NULL);
    CHECK_OK(kv_prefix_add_lane(pc, &caches[2], &l2, NULL), NULL);
    kv_cache wrong = {NULL, &fc[2]};
    kv_lane *bad;
    hl_err err;
    CHECK(kv_prefix_add_lane(pc, &wrong, &bad, &err) == HL_ERR_INVALID);

    /* a shared prefix recorded by lane 0 */
    int32_t sys[12], a[16], b[16];
    for (int i = 0; i < 12; i++) sys[i] = 100 + i;
    memcpy(a, sys, sizeof sys);
    memcpy(b, sys, sizeof sys);
    for (int i = 12; i < 16; i++) a[i] = 200 + i, b[i] = 300 + i;
    kv_session s0, s1, s2;
    CHECK_OK(kv_prefix_begin_lane(pc, NULL, sys, 12, &s0, NULL), NULL);
    for (int i = 0; i < 12; i++) fc[0].toks[fc[0].off++] = sys[i];
    CHECK_OK(kv_session_close(&s0, NULL), NULL);
    kv_lane_reset(pc, NULL);
    CHECK_EQ_INT(fc[0].off, 0);

    /* two lanes open at once, each restoring the prefix into its own cache */
    CHECK_OK(kv_prefix_begin_lane(pc, l1, a, 16, &s1, NULL), NULL);
    CHECK_OK(kv_prefix_begin_lane(pc, l2, b, 16, &s2, NULL), NULL);
    CHECK(kv_prefix_begin_lane(pc, l1, a, 16, &s0, &err) == HL_ERR_INVALID); /* one per lane */
    CHECK_EQ_INT(s1.prefix, 12);
    CHECK_EQ_INT(s2.prefix, 12);
    for (int i = 0; i < 12; i++) CHECK(fc[1].toks[i] == sys[i] && fc[2].toks[i] == sys[i]);
    /* interleaved computation; lane 1 reaches a snapshot point and branches the trie */
    kv_session_request_snapshot(&s1, 14, true);
    for (int i = 12; i < 16; i++) {
        fc[1].toks[fc[1].off++] = a[i];
        fc[2].toks[fc[2].off++] = b[i];
        if (fc[1].off == 14) CHECK_OK(kv_session_snapshot(&s1, NULL), NULL);
    }
    /* eviction while both are live spares every node on their paths */
    g_evict_all = true;
    kv_prefix_evict(pc);
    g_evict_all = false;
    const kv_path *p1 = kv_lane_active(l1), *p2 = kv_lane_active(l2);
    CHECK_EQ_INT(p1->n, 3); /* root, the shared prefix [0,12), lane 1's [12,14) */
    CHECK_EQ_INT(p2->n, 2); /* root, the shared prefix */
    CHECK(p1->nodes[1] == p2->nodes[1]);
    CHECK_EQ_INT(p1->nodes[1]->end, 12);
    CHECK_EQ_INT(p1->nodes[2]->end, 14);
    CHECK(on_path(p1, p2->nodes[1]));
    /* exactly the nodes on live paths are left, still linked into the trie */
    CHECK_EQ_INT(kv_prefix_count_nodes(pc), 3);
    CHECK(p1->nodes[2]->parent == p1->nodes[1] && p1->nodes[1]->parent == kv_prefix_root(pc));
    CHECK_OK(kv_trie_check(pc, NULL), NULL);
    /* lane 2 closes while lane 1 is still open: its node is not extended in place */
    CHECK_OK(kv_session_close(&s2, NULL), NULL);
    kv_lane_reset(pc, l2);
    CHECK_OK(kv_session_close(&s1, NULL), NULL);
    kv_lane_reset(pc, l1);
    CHECK_OK(kv_trie_check(pc, NULL), NULL);
    /* both conversations are found in full, and restore exactly */
    CHECK_EQ_INT(find_len_pc(pc, a, 16), 16);
    CHECK_EQ_INT(find_len_pc(pc, b, 16), 16);
    int32_t a2[18];
    memcpy(a2, a, sizeof a);
    a2[16] = 1, a2[17] = 2;
    CHECK_OK(kv_prefix_begin_lane(pc, l2, a2, 18, &s2, NULL), NULL);
    CHECK_EQ_INT(s2.prefix, 16);
    for (int i = 0; i < 16; i++) CHECK_EQ_INT(fc[2].toks[i], a[i]);
    CHECK_OK(kv_session_close(&s2, NULL), NULL);
    kv_prefix_destroy(pc);
    CHECK_EQ_INT(open_snaps, 0);
}
