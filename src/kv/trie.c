/*
 * trie.c - the prefix trie and the request lifecycle over it (begin, switch, snapshot,
 * close, eviction). See trie.h and research/mlxrunner-internals.md section 2.
 */
#include "kv/trie.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/file.h"

/* One set of live caches and the path of nodes they hold. */
struct kv_lane {
    kv_cache *caches;
    kv_path active;
    bool in_session;
};

struct kv_prefix {
    kv_cache *caches;
    int32_t n_caches;
    bool (*over_budget)(void *ctx, const kv_prefix *pc);
    void *budget_ctx;
    size_t budget;
    uint64_t (*clock)(void *ctx);
    void *clock_ctx;
    bool page_out_on_close;
    kv_node *root;
    kv_lane lane0; /* the config's caches */
    kv_lane **lanes; /* lane0, then the added ones */
    int32_t n_lanes, cap_lanes;
    size_t snap_bytes;
    uint64_t n_evicted;
};

/* ---- small helpers ---- */

void kv_path_free(kv_path *p) {
    free(p->nodes);
    *p = (kv_path){0};
}

static bool path_push(kv_path *p, kv_node *n) {
    if (p->n == p->cap) {
        int32_t cap = p->cap ? p->cap * 2 : 8;
        kv_node **nn = realloc(p->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return false;
        p->nodes = nn;
        p->cap = cap;
    }
    p->nodes[p->n++] = n;
    return true;
}

static bool path_contains(const kv_path *p, const kv_node *n) {
    for (int32_t i = 0; i < p->n; i++)
        if (p->nodes[i] == n) return true;
    return false;
}

uint64_t kv_prefix_now(const kv_prefix *pc) {
    return pc->clock ? pc->clock(pc->clock_ctx) : hl_time_ns();
}

static bool cache_live(const kv_prefix *pc, int32_t i) { return pc->caches[i].ops != NULL; }

static int32_t cache_offset(const kv_lane *ln, int32_t i) {
    return ln->caches[i].ops->offset(ln->caches[i].self);
}

static int32_t lane_offset(const kv_prefix *pc, const kv_lane *ln) {
    int32_t m = -1;
    for (int32_t i = 0; i < pc->n_caches; i++) {
        if (!cache_live(pc, i)) continue;
        int32_t o = cache_offset(ln, i);
        if (m < 0 || o < m) m = o;
    }
    return m < 0 ? 0 : m;
}

int32_t kv_prefix_cache_offset(const kv_prefix *pc) { return lane_offset(pc, &pc->lane0); }

/* Whether a lane other than `except` holds node on its path (nodes there must stay). */
static bool on_other_path(const kv_prefix *pc, const kv_node *n, const kv_lane *except) {
    for (int32_t l = 0; l < pc->n_lanes; l++)
        if (pc->lanes[l] != except && path_contains(&pc->lanes[l]->active, n)) return true;
    return false;
}

static kv_node *lane_frontier(const kv_lane *ln) { return ln->active.nodes[ln->active.n - 1]; }

static size_t node_bytes(const kv_prefix *pc, const kv_node *n) {
    size_t b = 0;
    if (!n->snaps) return 0;
    for (int32_t i = 0; i < pc->n_caches; i++)
        if (n->snaps[i] && cache_live(pc, i))
            b += pc->caches[i].ops->snap_bytes(pc->caches[i].self, n->snaps[i]);
    return b;
}

static bool has_any_snaps(const kv_prefix *pc, const kv_node *n) {
    if (!n->snaps) return false;
    for (int32_t i = 0; i < pc->n_caches; i++)
        if (n->snaps[i]) return true;
    return false;
}

/* Ignores stateless slots. */
static bool has_all_snaps(const kv_prefix *pc, const kv_node *n) {
    for (int32_t i = 0; i < pc->n_caches; i++)
        if (cache_live(pc, i) && (!n->snaps || !n->snaps[i])) return false;
    return true;
}

static void close_snaps(kv_prefix *pc, kv_node *n) {
    if (!n->snaps) return;
    pc->snap_bytes -= node_bytes(pc, n);
    for (int32_t i = 0; i < pc->n_caches; i++)
        if (n->snaps[i] && cache_live(pc, i))
            pc->caches[i].ops->snap_close(pc->caches[i].self, n->snaps[i]);
    free(n->snaps);
    n->snaps = NULL;
}

void kv_trie_set_snaps(kv_prefix *pc, kv_node *node, void **snaps) {
    close_snaps(pc, node);
    node->snaps = snaps;
    pc->snap_bytes += node_bytes(pc, node);
}

static kv_node *node_new(kv_node *parent, const int32_t *tokens, int32_t n, int32_t end) {
    kv_node *node = calloc(1, sizeof *node);
    if (!node) return NULL;
    if (n > 0) {
        node->tokens = malloc((size_t)n * sizeof *tokens);
        if (!node->tokens) {
            free(node);
            return NULL;
        }
        memcpy(node->tokens, tokens, (size_t)n * sizeof *tokens);
    }
    node->n_tokens = n;
    node->end = end;
    node->parent = parent;
    return node;
}

static void node_free(kv_prefix *pc, kv_node *n) {
    close_snaps(pc, n);
    free(n->tokens);
    free(n->children);
    free(n);
}

static bool child_add(kv_node *parent, kv_node *child) {
    if (parent->n_children == parent->cap_children) {
        int32_t cap = parent->cap_children ? parent->cap_children * 2 : 2;
        kv_node **c = realloc(parent->children, (size_t)cap * sizeof *c);
        if (!c) return false;
        parent->children = c;
        parent->cap_children = cap;
    }
    parent->children[parent->n_children++] = child;
    child->parent = parent;
    return true;
}

static void child_remove(kv_node *parent, kv_node *child) {
    for (int32_t i = 0; i < parent->n_children; i++)
        if (parent->children[i] == child) {
            memmove(&parent->children[i], &parent->children[i + 1],
                    (size_t)(parent->n_children - i - 1) * sizeof *parent->children);
            parent->n_children--;
            return;
        }
}

/* ---- lifecycle ---- */

hl_status kv_prefix_create(const kv_prefix_config *cfg, kv_prefix **out, hl_err *err) {
    *out = NULL;
    if (cfg->n_caches < 0 || (cfg->n_caches > 0 && !cfg->caches))
        return hl_fail(err, HL_ERR_INVALID, "prefix cache needs its caches");
    kv_prefix *pc = calloc(1, sizeof *pc);
    if (!pc) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    pc->caches = cfg->caches;
    pc->n_caches = cfg->n_caches;
    pc->over_budget = cfg->over_budget;
    pc->budget_ctx = cfg->budget_ctx;
    pc->budget = cfg->budget_bytes ? cfg->budget_bytes : KV_DEFAULT_SNAPSHOT_BUDGET;
    pc->clock = cfg->clock;
    pc->clock_ctx = cfg->clock_ctx;
    pc->page_out_on_close = cfg->page_out_on_close;
    pc->root = node_new(NULL, NULL, 0, 0);
    pc->lane0.caches = cfg->caches;
    pc->lanes = malloc(4 * sizeof *pc->lanes);
    if (pc->lanes) {
        pc->lanes[pc->n_lanes++] = &pc->lane0;
        pc->cap_lanes = 4;
    }
    if (!pc->root || !pc->lanes || !path_push(&pc->lane0.active, pc->root)) {
        kv_prefix_destroy(pc);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    pc->root->last_used = kv_prefix_now(pc);
    *out = pc;
    return HL_OK;
}

static void subtree_free(kv_prefix *pc, kv_node *n) {
    for (int32_t i = 0; i < n->n_children; i++) subtree_free(pc, n->children[i]);
    node_free(pc, n);
}

void kv_prefix_destroy(kv_prefix *pc) {
    if (!pc) return;
    if (pc->root) subtree_free(pc, pc->root);
    for (int32_t l = 0; l < pc->n_lanes; l++) {
        kv_path_free(&pc->lanes[l]->active);
        if (pc->lanes[l] != &pc->lane0) free(pc->lanes[l]);
    }
    if (!pc->lanes) kv_path_free(&pc->lane0.active);
    free(pc->lanes);
    free(pc);
}

kv_node *kv_prefix_root(const kv_prefix *pc) { return pc->root; }
const kv_path *kv_prefix_active(const kv_prefix *pc) { return &pc->lane0.active; }
const kv_path *kv_lane_active(const kv_lane *lane) { return &lane->active; }

hl_status kv_prefix_add_lane(kv_prefix *pc, kv_cache *caches, kv_lane **out, hl_err *err) {
    *out = NULL;
    if (pc->n_caches > 0 && !caches) return hl_fail(err, HL_ERR_INVALID, "a lane needs its caches");
    for (int32_t i = 0; i < pc->n_caches; i++)
        if (caches[i].ops != pc->caches[i].ops)
            return hl_fail(err, HL_ERR_INVALID, "lane cache %d is not of the prefix cache's kind", i);
    if (pc->n_lanes == pc->cap_lanes) {
        kv_lane **l = realloc(pc->lanes, (size_t)pc->cap_lanes * 2 * sizeof *l);
        if (!l) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
        pc->lanes = l;
        pc->cap_lanes *= 2;
    }
    kv_lane *ln = calloc(1, sizeof *ln);
    if (!ln || !path_push(&ln->active, pc->root)) {
        free(ln);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    ln->caches = caches;
    pc->lanes[pc->n_lanes++] = ln;
    *out = ln;
    return HL_OK;
}

void kv_lane_reset(kv_prefix *pc, kv_lane *lane) {
    if (!lane) lane = &pc->lane0;
    if (lane->in_session) return;
    for (int32_t i = 0; i < pc->n_caches; i++)
        if (cache_live(pc, i)) lane->caches[i].ops->free_state(lane->caches[i].self);
    lane->active.n = 1; /* the root */
    lane->active.nodes[0] = pc->root;
}
size_t kv_prefix_snapshot_bytes(const kv_prefix *pc) { return pc->snap_bytes; }

static size_t count_nodes(const kv_node *n) {
    size_t c = 1;
    for (int32_t i = 0; i < n->n_children; i++) c += count_nodes(n->children[i]);
    return c;
}

size_t kv_prefix_count_nodes(const kv_prefix *pc) { return count_nodes(pc->root); }

static size_t sum_bytes(const kv_prefix *pc, const kv_node *n) {
    size_t b = node_bytes(pc, n);
    for (int32_t i = 0; i < n->n_children; i++) b += sum_bytes(pc, n->children[i]);
    return b;
}

uint64_t kv_prefix_evictions(const kv_prefix *pc) { return pc->n_evicted; }

void kv_prefix_recount(kv_prefix *pc) { pc->snap_bytes = sum_bytes(pc, pc->root); }

/* ---- matching ---- */

hl_status kv_trie_find_best_match(kv_node *from, const int32_t *tokens, int32_t n,
                                  kv_path *path, int32_t *matched, hl_err *err) {
    path->n = 0;
    *matched = 0;
    if (!path_push(path, from)) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    kv_node *node = from;
    int32_t pos = 0;
    while (pos < n) {
        kv_node *best = NULL;
        int32_t best_len = 0;
        bool best_full = false;
        for (int32_t i = 0; i < node->n_children; i++) {
            kv_node *c = node->children[i];
            if (c->n_tokens == 0 || c->tokens[0] != tokens[pos]) continue;
            int32_t k = 0;
            while (k < c->n_tokens && pos + k < n && c->tokens[k] == tokens[pos + k]) k++;
            bool full = k == c->n_tokens;
            if (!best || (full && !best_full) || (full == best_full && k > best_len)) {
                best = c;
                best_len = k;
                best_full = full;
            }
        }
        if (!best) break;
        if (!path_push(path, best)) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
        pos += best_len;
        if (!best_full) break;
        node = best;
    }
    *matched = pos;
    return HL_OK;
}

/* ---- surgery ---- */

hl_status kv_trie_split(kv_prefix *pc, kv_node *node, int32_t at, kv_node **parent_out,
                        hl_err *err) {
    if (at <= 0 || at >= node->n_tokens)
        return hl_fail(err, HL_ERR_INVALID,
                       "splitNode: invalid split offset %d for node with %d tokens", at,
                       node->n_tokens);
    int32_t start = kv_node_start(node);
    kv_node *p = node_new(node->parent, node->tokens, at, start + at);
    int32_t *rest = malloc((size_t)(node->n_tokens - at) * sizeof *rest);
    void **head_snaps = node->snaps ? calloc((size_t)pc->n_caches, sizeof(void *)) : NULL;
    if (!p || !rest || (node->snaps && !head_snaps) || !child_add(p, node)) {
        if (p) node_free(pc, p);
        free(rest);
        free(head_snaps);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    p->last_used = node->last_used;
    p->user = false;
    memcpy(rest, node->tokens + at, (size_t)(node->n_tokens - at) * sizeof *rest);
    free(node->tokens);
    node->tokens = rest;
    node->n_tokens -= at;
    if (node->snaps) {
        pc->snap_bytes -= node_bytes(pc, node);
        for (int32_t i = 0; i < pc->n_caches; i++) {
            if (!node->snaps[i] || !cache_live(pc, i)) continue;
            void *h = NULL, *t = NULL;
            pc->caches[i].ops->split(pc->caches[i].self, node->snaps[i], p->end, &h, &t);
            head_snaps[i] = h;
            node->snaps[i] = t;
        }
        p->snaps = head_snaps;
        pc->snap_bytes += node_bytes(pc, node) + node_bytes(pc, p);
    }
    kv_node *gp = p->parent;
    for (int32_t i = 0; i < gp->n_children; i++)
        if (gp->children[i] == node) gp->children[i] = p;
    node->parent = p;
    for (int32_t l = 0; l < pc->n_lanes; l++) {
        kv_path *act = &pc->lanes[l]->active;
        for (int32_t i = 0; i < act->n; i++)
            if (act->nodes[i] == node) {
                if (!path_push(act, NULL)) break; /* grow; keeps the path valid on OOM */
                memmove(&act->nodes[i + 1], &act->nodes[i],
                        (size_t)(act->n - 1 - i) * sizeof(kv_node *));
                act->nodes[i] = p;
                break;
            }
    }
    if (parent_out) *parent_out = p;
    return HL_OK;
}

hl_status kv_trie_merge_with_child(kv_prefix *pc, kv_node *node, hl_err *err) {
    if (node->n_children != 1)
        return hl_fail(err, HL_ERR_INVALID, "mergeWithChild called on node with %d children",
                       node->n_children);
    kv_node *c = node->children[0];
    int32_t n = node->n_tokens + c->n_tokens;
    int32_t *tok = malloc((size_t)(n ? n : 1) * sizeof *tok);
    void **snaps = NULL;
    if (node->snaps || c->snaps) {
        snaps = calloc((size_t)pc->n_caches, sizeof(void *));
        if (!snaps) {
            free(tok);
            return hl_fail(err, HL_ERR_NOMEM, "out of memory");
        }
    }
    if (!tok) {
        free(snaps);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    memcpy(tok, node->tokens, (size_t)node->n_tokens * sizeof *tok);
    memcpy(tok + node->n_tokens, c->tokens, (size_t)c->n_tokens * sizeof *tok);
    if (snaps) {
        pc->snap_bytes -= node_bytes(pc, node) + node_bytes(pc, c);
        for (int32_t i = 0; i < pc->n_caches; i++) {
            void *a = node->snaps ? node->snaps[i] : NULL, *b = c->snaps ? c->snaps[i] : NULL;
            if (!cache_live(pc, i) || (!a && !b)) continue;
            snaps[i] = pc->caches[i].ops->merge(pc->caches[i].self, a, b);
        }
        free(node->snaps);
        free(c->snaps);
        node->snaps = snaps;
        c->snaps = NULL;
        pc->snap_bytes += node_bytes(pc, node);
    }
    free(node->tokens);
    node->tokens = tok;
    node->n_tokens = n;
    node->end = c->end;
    node->user = c->user;
    if (c->last_used > node->last_used) node->last_used = c->last_used;
    free(node->children);
    node->children = c->children;
    node->n_children = c->n_children;
    node->cap_children = c->cap_children;
    for (int32_t i = 0; i < node->n_children; i++) node->children[i]->parent = node;
    for (int32_t l = 0; l < pc->n_lanes; l++) {
        kv_path *act = &pc->lanes[l]->active;
        for (int32_t i = 0; i < act->n; i++)
            if (act->nodes[i] == c) {
                memmove(&act->nodes[i], &act->nodes[i + 1],
                        (size_t)(act->n - i - 1) * sizeof(kv_node *));
                act->n--;
                break;
            }
    }
    c->children = NULL;
    c->n_children = 0;
    c->parent = NULL;
    node_free(pc, c);
    return HL_OK;
}

hl_status kv_trie_remove(kv_prefix *pc, kv_node *node, hl_err *err) {
    if (node == pc->root || !node->parent)
        return hl_fail(err, HL_ERR_INVALID, "removeNode called on root");
    if (node->n_children > 0)
        return hl_fail(err, HL_ERR_INVALID, "removeNode called on non-leaf node");
    child_remove(node->parent, node);
    node->parent = NULL;
    node_free(pc, node);
    return HL_OK;
}

hl_status kv_trie_append_child(kv_prefix *pc, kv_node *node, const int32_t *tokens, int32_t n,
                               kv_node **child_out, hl_err *err) {
    (void)pc;
    kv_node *c = node_new(node, tokens, n, node->end + n);
    if (!c || !child_add(node, c)) {
        if (c) node_free(pc, c);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    c->last_used = node->last_used;
    if (child_out) *child_out = c;
    return HL_OK;
}

static hl_status check_node(const kv_node *n, hl_err *err) {
    for (int32_t i = 0; i < n->n_children; i++) {
        const kv_node *c = n->children[i];
        if (c->parent != n)
            return hl_fail(err, HL_ERR_INVALID, "node ending at %d has a wrong parent", c->end);
        if (kv_node_start(c) != n->end)
            return hl_fail(err, HL_ERR_INVALID, "node [%d,%d) does not start at its parent's end %d",
                           kv_node_start(c), c->end, n->end);
        if (c->n_tokens <= 0)
            return hl_fail(err, HL_ERR_INVALID, "node ending at %d has an empty edge", c->end);
        for (int32_t j = 0; j < i; j++)
            if (n->children[j]->tokens[0] == c->tokens[0])
                return hl_fail(err, HL_ERR_INVALID, "siblings below offset %d share token %d",
                               n->end, c->tokens[0]);
        hl_status st = check_node(c, err);
        if (st) return st;
    }
    return HL_OK;
}

hl_status kv_trie_check(const kv_prefix *pc, hl_err *err) {
    if (pc->root->end != 0 || pc->root->n_tokens != 0)
        return hl_fail(err, HL_ERR_INVALID, "root is not empty");
    return check_node(pc->root, err);
}

/* ---- eviction ---- */

static bool over_budget(kv_prefix *pc) {
    if (pc->over_budget) return pc->over_budget(pc->budget_ctx, pc);
    return pc->snap_bytes > pc->budget;
}

static void pick_victim(kv_prefix *pc, kv_node *n, kv_node **best, size_t *best_bytes) {
    for (int32_t i = 0; i < n->n_children; i++) pick_victim(pc, n->children[i], best, best_bytes);
    if (n == pc->root || n->n_children > 1 || on_other_path(pc, n, NULL)) return;
    size_t bytes = node_bytes(pc, n);
    kv_node *b = *best;
    if (!b || n->last_used < b->last_used ||
        (n->last_used == b->last_used &&
         (n->end > b->end || (n->end == b->end && bytes > *best_bytes)))) {
        *best = n;
        *best_bytes = bytes;
    }
}

void kv_prefix_evict(kv_prefix *pc) {
    while (over_budget(pc)) {
        kv_node *victim = NULL;
        size_t bytes = 0;
        pick_victim(pc, pc->root, &victim, &bytes);
        if (!victim) break;
        hl_status st = victim->n_children == 0 ? kv_trie_remove(pc, victim, NULL)
                                               : kv_trie_merge_with_child(pc, victim, NULL);
        if (st) break; /* out of memory merging: stop rather than spin */
        pc->n_evicted++;
    }
}

/* ---- switching the live caches to a path ---- */

static void **take_snapshots(kv_prefix *pc, kv_lane *ln, int32_t from) {
    void **snaps = calloc((size_t)(pc->n_caches ? pc->n_caches : 1), sizeof(void *));
    if (!snaps) return NULL;
    for (int32_t i = 0; i < pc->n_caches; i++)
        if (cache_live(pc, i)) snaps[i] = ln->caches[i].ops->snapshot(ln->caches[i].self, from);
    return snaps;
}

static bool caches_at(const kv_prefix *pc, const kv_lane *ln, int32_t off) {
    for (int32_t i = 0; i < pc->n_caches; i++)
        if (cache_live(pc, i) && cache_offset(ln, i) != off) return false;
    return true;
}

static hl_status switch_to_path(kv_prefix *pc, kv_lane *ln, const kv_path *path, int32_t matched,
                                hl_err *err) {
    kv_path *active = &ln->active;
    kv_cache *caches = ln->caches;
    int32_t common = 0;
    while (common < active->n && common < path->n &&
           active->nodes[common] == path->nodes[common])
        common++;
    int32_t ancestor_off = common > 0 ? active->nodes[common - 1]->end : 0;

    /* Page out the old leaf; inner nodes got their snapshots when they were created. */
    kv_node *leaf = active->nodes[active->n - 1];
    if (leaf != pc->root && (!path_contains(path, leaf) || matched < leaf->end) &&
        !has_all_snaps(pc, leaf) && caches_at(pc, ln, leaf->end)) {
        void **snaps = take_snapshots(pc, ln, kv_node_start(leaf));
        if (snaps) kv_trie_set_snaps(pc, leaf, snaps);
    }

    int32_t rewind = ancestor_off < matched ? ancestor_off : matched;
    for (int32_t i = 0; i < pc->n_caches; i++)
        if (cache_live(pc, i) && !caches[i].ops->restore(caches[i].self, NULL, rewind))
            caches[i].ops->free_state(caches[i].self);

    for (int32_t k = 0; k < path->n; k++) {
        kv_node *node = path->nodes[k];
        if (!has_any_snaps(pc, node)) continue;
        int32_t target = node->end < matched ? node->end : matched;
        bool failed = false;
        for (int32_t i = 0; i < pc->n_caches && !failed; i++) {
            if (!cache_live(pc, i) || !node->snaps[i]) continue;
            if (cache_offset(ln, i) >= target) continue;
            if (!caches[i].ops->restore(caches[i].self, node->snaps[i], target))
                failed = true;
        }
        if (failed) break;
    }

    int32_t min_off = lane_offset(pc, ln);
    for (int32_t i = 0; i < pc->n_caches; i++) {
        if (!cache_live(pc, i) || cache_offset(ln, i) == min_off) continue;
        if (!caches[i].ops->restore(caches[i].self, NULL, min_off)) {
            HL_WARN("kv: failed to restore cache, freeing all caches (offset %d)", min_off);
            for (int32_t j = 0; j < pc->n_caches; j++)
                if (cache_live(pc, j)) caches[j].ops->free_state(caches[j].self);
            min_off = 0;
            break;
        }
    }

    active->n = 0;
    for (int32_t k = 0; k < path->n && path->nodes[k]->end <= min_off; k++)
        if (!path_push(active, path->nodes[k])) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    if (active->n == 0 && !path_push(active, pc->root))
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    active->nodes[active->n - 1]->last_used = kv_prefix_now(pc);
    kv_prefix_evict(pc);
    return HL_OK;
}

/* ---- advancing the trie along the active path ---- */

static hl_status advance_path(kv_prefix *pc, kv_lane *ln, kv_node *frontier,
                              const int32_t *tokens, int32_t n, hl_err *err) {
    kv_path *active = &ln->active;
    kv_path path = {0};
    int32_t matched = 0;
    hl_status st = kv_trie_find_best_match(frontier, tokens, n, &path, &matched, err);
    if (st) goto done;
    if (path.n > 1) {
        kv_node *last = path.nodes[path.n - 1];
        int32_t in_edge = frontier->end + matched - kv_node_start(last);
        if (in_edge > 0 && in_edge < last->n_tokens) {
            kv_node *p = NULL;
            st = kv_trie_split(pc, last, in_edge, &p, err);
            if (st) goto done;
            path.nodes[path.n - 1] = p;
        }
    }
    for (int32_t k = 1; k < path.n; k++)
        if (!path_push(active, path.nodes[k])) {
            st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
            goto done;
        }
    if (matched < n) {
        kv_node *dest = active->nodes[active->n - 1];
        const int32_t *rest = tokens + matched;
        int32_t n_rest = n - matched;
        /* a node on another lane's path keeps its range: that lane's caches hold it */
        const bool pinned = dest != pc->root && on_other_path(pc, dest, ln);
        if (dest != pc->root && dest->n_children == 0 && !dest->user && !pinned)
            close_snaps(pc, dest);
        if (dest == pc->root || dest->n_children > 0 || dest->user || pinned ||
            has_any_snaps(pc, dest)) {
            kv_node *c = NULL;
            st = kv_trie_append_child(pc, dest, rest, n_rest, &c, err);
            if (st) goto done;
            if (!path_push(active, c)) {
                st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
                goto done;
            }
        } else { /* extend the leaf in place */
            int32_t *tok = realloc(dest->tokens, (size_t)(dest->n_tokens + n_rest) * sizeof *tok);
            if (!tok) {
                st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
                goto done;
            }
            memcpy(tok + dest->n_tokens, rest, (size_t)n_rest * sizeof *tok);
            dest->tokens = tok;
            dest->n_tokens += n_rest;
            dest->end += n_rest;
        }
    }
done:
    kv_path_free(&path);
    return st;
}

/* ---- sessions ---- */

static hl_status stored_reserve(kv_session *s, int32_t extra, hl_err *err) {
    int64_t need = (int64_t)s->n_stored + extra;
    if (need > INT32_MAX) return hl_fail(err, HL_ERR_INVALID, "sequence too long");
    if (need <= s->cap_stored) return HL_OK;
    int64_t cap = s->cap_stored ? s->cap_stored : 64;
    while (cap < need) cap *= 2;
    if (cap > INT32_MAX) cap = INT32_MAX;
    int32_t *p = realloc(s->stored, (size_t)cap * sizeof *p);
    if (!p) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    s->stored = p;
    s->cap_stored = (int32_t)cap;
    return HL_OK;
}

static void session_free(kv_session *s) {
    free(s->stored);
    free(s->pending);
    if (s->lane) s->lane->in_session = false;
    *s = (kv_session){0};
}

hl_status kv_prefix_begin(kv_prefix *pc, const int32_t *inputs, int32_t n, kv_session *s,
                          hl_err *err) {
    return kv_prefix_begin_lane(pc, &pc->lane0, inputs, n, s, err);
}

hl_status kv_prefix_begin_lane(kv_prefix *pc, kv_lane *ln, const int32_t *inputs, int32_t n,
                               kv_session *s, hl_err *err) {
    *s = (kv_session){0};
    if (!ln) ln = &pc->lane0;
    if (n <= 0) return hl_fail(err, HL_ERR_INVALID, "empty prompt");
    if (ln->in_session)
        return hl_fail(err, HL_ERR_INVALID, "the prefix cache already has an open request");
    s->pc = pc;
    hl_status st = stored_reserve(s, n, err);
    if (st) {
        *s = (kv_session){0};
        return st;
    }
    memcpy(s->stored, inputs, (size_t)n * sizeof *inputs);
    s->n_inputs = s->n_stored = n;

    kv_path path = {0};
    int32_t matched = 0;
    st = kv_trie_find_best_match(pc->root, inputs, n, &path, &matched, err);
    s->matched = matched;
    if (!st && matched == n) /* hold back one token to seed generation */
        st = kv_trie_find_best_match(pc->root, inputs, n - 1, &path, &matched, err);
    if (!st) st = switch_to_path(pc, ln, &path, matched, err);
    kv_path_free(&path);
    if (st) {
        session_free(s);
        return st;
    }
    ln->in_session = true;
    s->lane = ln;
    s->open = true;
    s->prefix = lane_offset(pc, ln);
    if (s->prefix < matched) kv_session_request_snapshot(s, matched, false);
    return HL_OK;
}

hl_status kv_session_advance(kv_session *s, hl_err *err) {
    if (!s->open) return HL_OK;
    int32_t off = lane_offset(s->pc, s->lane);
    if (off >= s->n_inputs)
        return hl_fail(err, HL_ERR_INVALID, "cache: offset %d reaches the end of %d inputs", off,
                       s->n_inputs);
    if (off > s->prefix) s->prefix = off;
    return HL_OK;
}

void kv_session_request_snapshot(kv_session *s, int32_t offset, bool user) {
    if (!s->open || offset <= s->prefix || offset > s->n_inputs) return;
    for (int32_t i = 0; i < s->n_pending; i++)
        if (s->pending[i].offset == offset) {
            s->pending[i].user |= user;
            return;
        }
    if (s->n_pending == s->cap_pending) {
        int32_t cap = s->cap_pending ? s->cap_pending * 2 : 4;
        kv_pending *p = realloc(s->pending, (size_t)cap * sizeof *p);
        if (!p) return; /* a missed snapshot only costs recomputation later */
        s->pending = p;
        s->cap_pending = cap;
    }
    int32_t i = s->n_pending++;
    while (i > 0 && s->pending[i - 1].offset > offset) {
        s->pending[i] = s->pending[i - 1];
        i--;
    }
    s->pending[i] = (kv_pending){offset, user};
}

void kv_session_schedule_prefill(kv_session *s) {
    for (int32_t off = KV_SNAPSHOT_INTERVAL; off < s->n_inputs; off += KV_SNAPSHOT_INTERVAL)
        kv_session_request_snapshot(s, off, true);
    if (s->n_inputs - KV_PRE_THINKING > 0)
        kv_session_request_snapshot(s, s->n_inputs - KV_PRE_THINKING, true);
}

int32_t kv_session_next_snapshot(const kv_session *s) {
    return s->n_pending > 0 ? s->pending[0].offset : -1;
}

static hl_status attach_snapshots(kv_prefix *pc, kv_lane *ln, kv_node *node, hl_err *err) {
    for (int32_t i = 0; i < pc->n_caches; i++)
        if (cache_live(pc, i) && cache_offset(ln, i) != node->end)
            return hl_fail(err, HL_ERR_INVALID,
                           "attachSnapshots: cache offset mismatch layer %d: expected %d, got %d",
                           i, node->end, cache_offset(ln, i));
    if (lane_frontier(ln) != node) return HL_OK; /* not the frontier */
    void **snaps = take_snapshots(pc, ln, kv_node_start(node));
    if (!snaps) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    kv_trie_set_snaps(pc, node, snaps);
    node->last_used = kv_prefix_now(pc);
    kv_prefix_evict(pc);
    return HL_OK;
}

hl_status kv_session_snapshot(kv_session *s, hl_err *err) {
    if (!s->open) return HL_OK;
    kv_prefix *pc = s->pc;
    kv_lane *ln = s->lane;
    int32_t off = lane_offset(pc, ln);
    bool user = false;
    int32_t used = 0;
    while (used < s->n_pending && s->pending[used].offset <= off) user |= s->pending[used++].user;
    if (used == 0) return HL_OK;
    memmove(s->pending, s->pending + used, (size_t)(s->n_pending - used) * sizeof *s->pending);
    s->n_pending -= used;
    if (off > s->n_stored)
        return hl_fail(err, HL_ERR_INVALID, "cache: offset %d exceeds %d stored keys", off,
                       s->n_stored);
    kv_node *frontier = lane_frontier(ln);
    if (frontier->end == off) {
        if (user) frontier->user = true;
        if (frontier != pc->root && !has_all_snaps(pc, frontier))
            return attach_snapshots(pc, ln, frontier, err);
        return HL_OK;
    }
    if (frontier->end > off) return HL_OK; /* snapshot skipped: cache is behind the frontier */
    hl_status st =
        advance_path(pc, ln, frontier, s->stored + frontier->end, off - frontier->end, err);
    if (st) return st;
    kv_node *node = lane_frontier(ln);
    if (user) node->user = true;
    return attach_snapshots(pc, ln, node, err);
}

hl_status kv_session_reserve_outputs(kv_session *s, int32_t n, hl_err *err) {
    return n > 0 ? stored_reserve(s, n, err) : HL_OK;
}

hl_status kv_session_add_outputs(kv_session *s, const int32_t *tokens, int32_t n, hl_err *err) {
    if (n <= 0) return HL_OK;
    hl_status st = stored_reserve(s, n, err);
    if (st) return st;
    memcpy(s->stored + s->n_stored, tokens, (size_t)n * sizeof *tokens);
    s->n_stored += n;
    return HL_OK;
}

hl_status kv_session_close(kv_session *s, hl_err *err) {
    if (!s->open) {
        session_free(s);
        return HL_OK;
    }
    kv_prefix *pc = s->pc;
    kv_lane *ln = s->lane;
    hl_status st = HL_OK;
    int32_t off = lane_offset(pc, ln);
    if (off > s->n_stored) {
        /* the caches hold tokens nobody recorded: forget them rather than lie */
        st = hl_fail(err, HL_ERR_INVALID, "cache: offset %d exceeds %d stored keys", off,
                     s->n_stored);
        kv_node *frontier = lane_frontier(ln);
        for (int32_t i = 0; i < pc->n_caches; i++)
            if (cache_live(pc, i) &&
                !ln->caches[i].ops->restore(ln->caches[i].self, NULL, frontier->end))
                ln->caches[i].ops->free_state(ln->caches[i].self);
        off = lane_offset(pc, ln);
    }
    if (off > 0) {
        kv_node *frontier = lane_frontier(ln);
        if (off > frontier->end) {
            hl_status a = advance_path(pc, ln, frontier, s->stored + frontier->end,
                                       off - frontier->end, err);
            if (a && !st) st = a;
        }
        frontier = lane_frontier(ln);
        frontier->last_used = kv_prefix_now(pc);
        if (pc->page_out_on_close && frontier != pc->root && frontier->end == off &&
            !has_all_snaps(pc, frontier)) {
            void **snaps = take_snapshots(pc, ln, kv_node_start(frontier));
            if (snaps) kv_trie_set_snaps(pc, frontier, snaps);
        }
        kv_prefix_evict(pc);
    }
    session_free(s);
    return st;
}
