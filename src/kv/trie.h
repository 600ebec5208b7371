/*
 * trie.h - the prefix cache shared across conversations: a compressed trie over token
 * ids whose nodes hold cache snapshots, and the live caches of each running sequence
 * (a lane: its caches and the path of nodes they hold; see "several live sequences").
 *
 * Behaviour follows Ollama's MLX runner prefix cache (research/mlxrunner-internals.md
 * section 2, seed era): a request matches its longest cached prefix (findBestMatch),
 * switches the live caches to that path (rewind, page in snapshots, align), computes
 * only the rest, takes snapshots at scheduled offsets, and records what the caches
 * reached when it ends. Eviction removes least recently used leaves and merges away
 * single-child interior nodes while the budget is exceeded; branch points and the
 * active path are never evicted.
 *
 * Cache kinds. Each model layer group owns one live cache behind kv_cache_ops (a NULL
 * ops is a stateless slot). The kinds differ in what they can restore:
 *   - full-attention KV (kv/kvcache.h, blocks): rewinds to any token; snapshots are block
 *     references (shared, copy-on-write) and split/merge at any offset;
 *   - whole-state kinds (recurrent, or a sliding window that wrapped): restore only
 *     exactly at a snapshot's end; a snapshot is a compact copy of the state (never a
 *     view of a larger buffer); split gives everything to the tail, merge keeps the child.
 *
 * Ownership: kv_prefix_create borrows the caches (they must outlive the prefix cache);
 * the prefix cache owns the trie and every snapshot in it (closed through the kind's
 * snap_close). A kv_session is caller storage initialised by kv_prefix_begin and
 * released by kv_session_close, which must run on every exit path (it is what keeps
 * the trie consistent with the live caches). One session at a time per lane (below).
 * Not thread-safe.
 */
#ifndef HL_KV_TRIE_H
#define HL_KV_TRIE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define KV_SNAPSHOT_INTERVAL 8192 /* periodic prefill snapshots */
#define KV_PRE_THINKING 4         /* snapshot at len - 4: retries recompute only the tail */
#define KV_DEFAULT_SNAPSHOT_BUDGET ((size_t)8 << 30)

typedef struct kv_cache_ops {
    /* Tokens the live cache represents. */
    int32_t (*offset)(void *self);
    /* A new snapshot of [from, offset), owned by the caller; NULL when there is nothing
     * to copy (or on allocation failure: the node then simply lacks it). */
    void *(*snapshot)(void *self, int32_t from);
    /* snap NULL: rewind the live cache to target (false if it cannot). Otherwise install
     * snap (which stays owned by the trie) and clamp to target; false when target is not
     * reachable from it. */
    bool (*restore)(void *self, void *snap, int32_t target);
    /* Drops all live state (offset becomes 0). */
    void (*free_state)(void *self);
    /* Splits [a,c) at absolute offset b, consuming snap: *head = [a,b) or NULL, *tail =
     * [b,c) or NULL. */
    void (*split)(void *self, void *snap, int32_t at, void **head, void **tail);
    /* Combines adjacent snapshots, consuming both (either may be NULL). */
    void *(*merge)(void *self, void *parent, void *child);
    size_t (*snap_bytes)(void *self, const void *snap);
    void (*snap_close)(void *self, void *snap);
} kv_cache_ops;

typedef struct kv_cache {
    const kv_cache_ops *ops; /* NULL: a stateless slot */
    void *self;
} kv_cache;

typedef struct kv_node {
    struct kv_node *parent;
    struct kv_node **children; /* in insertion order */
    int32_t n_children, cap_children;
    int32_t *tokens; /* the edge: tokens from the parent's end to this node's end */
    int32_t n_tokens;
    int32_t end;     /* absolute offset of this node's end; start = end - n_tokens */
    uint64_t last_used;
    bool user;       /* explicit restore point */
    void **snaps;    /* one per cache slot, or NULL when the node has none */
} kv_node;

static inline int32_t kv_node_start(const kv_node *n) { return n->end - n->n_tokens; }

/* A root-first list of nodes. */
typedef struct kv_path {
    kv_node **nodes;
    int32_t n, cap;
} kv_path;

void kv_path_free(kv_path *p);

typedef struct kv_prefix kv_prefix;

typedef struct kv_prefix_config {
    kv_cache *caches; /* n_caches live caches, borrowed */
    int32_t n_caches;
    /* Eviction runs while over_budget(ctx, pc) is true; when NULL: while the snapshot
     * bytes held by the trie exceed budget_bytes (0: KV_DEFAULT_SNAPSHOT_BUDGET). */
    bool (*over_budget)(void *ctx, const kv_prefix *pc);
    void *budget_ctx;
    size_t budget_bytes;
    /* Time source for LRU (ns); NULL: hl_time_ns. */
    uint64_t (*clock)(void *ctx);
    void *clock_ctx;
    /* Take snapshots of a request's final node when it ends (the runner's block KV makes
     * this a few reference counts); when false the live tail is paged out lazily by the
     * next switch, as in the reference. */
    bool page_out_on_close;
} kv_prefix_config;

hl_status kv_prefix_create(const kv_prefix_config *cfg, kv_prefix **out, hl_err *err);
void kv_prefix_destroy(kv_prefix *pc); /* accepts NULL; closes every snapshot */

kv_node *kv_prefix_root(const kv_prefix *pc);
const kv_path *kv_prefix_active(const kv_prefix *pc);
size_t kv_prefix_snapshot_bytes(const kv_prefix *pc); /* sum over all nodes' snapshots */
size_t kv_prefix_count_nodes(const kv_prefix *pc);
/* Recomputes the snapshot byte counter (when a kind's sizes changed in place). */
void kv_prefix_recount(kv_prefix *pc);
/* Nodes removed or merged away by eviction so far. */
uint64_t kv_prefix_evictions(const kv_prefix *pc);
uint64_t kv_prefix_now(const kv_prefix *pc);
/* Minimum offset over the live (non-stateless) caches. */
int32_t kv_prefix_cache_offset(const kv_prefix *pc);

/* Longest cached prefix of tokens below `from` (NULL: the root). path gets from, then
 * the traversed nodes; *matched counts matched tokens below from. A whole-edge match is
 * preferred over a partial one, then the longer match. */
hl_status kv_trie_find_best_match(kv_node *from, const int32_t *tokens, int32_t n,
                                  kv_path *path, int32_t *matched, hl_err *err);

/* Trie surgery (exposed for tests and the prefix cache). Errors carry the reference's
 * messages: "splitNode: invalid split offset %d for node with %d tokens",
 * "mergeWithChild called on node with %d children", "removeNode called on root",
 * "removeNode called on non-leaf node". */
hl_status kv_trie_split(kv_prefix *pc, kv_node *node, int32_t at, kv_node **parent_out,
                        hl_err *err);
hl_status kv_trie_merge_with_child(kv_prefix *pc, kv_node *node, hl_err *err);
hl_status kv_trie_remove(kv_prefix *pc, kv_node *node, hl_err *err);
/* Adds tokens below node as a new child (which copies node's last_used). */
hl_status kv_trie_append_child(kv_prefix *pc, kv_node *node, const int32_t *tokens, int32_t n,
                               kv_node **child_out, hl_err *err);
/* Replaces the snapshots of node (old ones closed); snaps has n_caches entries or is NULL. */
void kv_trie_set_snaps(kv_prefix *pc, kv_node *node, void **snaps);
/* Checks parent links, offsets, edge lengths, distinct first tokens among siblings. */
hl_status kv_trie_check(const kv_prefix *pc, hl_err *err);

/* Runs the eviction policy now (it also runs after every switch and snapshot). */
void kv_prefix_evict(kv_prefix *pc);

/* ---- a request ---- */

typedef struct kv_pending {
    int32_t offset;
    bool user;
} kv_pending;

typedef struct kv_lane kv_lane;

typedef struct kv_session {
    kv_prefix *pc;
    kv_lane *lane;
    int32_t *stored; /* inputs, then outputs */
    int32_t n_inputs, n_stored, cap_stored;
    int32_t prefix;  /* tokens the caches hold after begin: compute stored[prefix:] */
    int32_t matched; /* tokens the trie matched (before hold-back) */
    kv_pending *pending;
    int32_t n_pending, cap_pending;
    bool open;
} kv_session;

/* Matches inputs (n >= 1) against the trie, holds back a fully matched prompt's last
 * token, switches the live caches to the matched path and schedules a branch snapshot
 * when the caches could not reach the match point. Afterwards every cache is at
 * s->prefix and the caller computes inputs[prefix:]. */
hl_status kv_prefix_begin(kv_prefix *pc, const int32_t *inputs, int32_t n, kv_session *s,
                          hl_err *err);

/* ---- several live sequences ----
 * A lane is one set of live caches (of the config's kinds, slot by slot) with its own
 * active path; the config's caches are the first lane (kv_prefix_begin). Each lane can
 * have one open session, so as many sequences as lanes run at once over one trie: each
 * matches and restores its own prefix (sharing blocks through the snapshots), and
 * records its tokens at close. Nodes on any lane's path are never evicted, extended in
 * place or re-snapshotted by another lane; splits keep every lane's path valid. Lanes are
 * owned by the prefix cache (freed by kv_prefix_destroy); their caches are borrowed.
 * Still not thread-safe: one thread (or a lock) drives the prefix cache. */
hl_status kv_prefix_add_lane(kv_prefix *pc, kv_cache *caches, kv_lane **out, hl_err *err);
/* lane NULL: the first lane (the config's caches), as kv_prefix_begin. */
hl_status kv_prefix_begin_lane(kv_prefix *pc, kv_lane *lane, const int32_t *inputs, int32_t n,
                               kv_session *s, hl_err *err);
/* Drops the lane's live state and path (back to the root), so it pins no node: for a
 * lane whose session closed (the trie then holds its tokens). No-op during a session. */
void kv_lane_reset(kv_prefix *pc, kv_lane *lane);
const kv_path *kv_lane_active(const kv_lane *lane);

/* The caller moved the lane's live caches forward along the inputs from outside the trie
 * (blocks found by hash in kv/store.h): the session's prefix becomes their offset, which
 * must stay below n_inputs (the last prompt token is always computed). The trie learns
 * those tokens at the next snapshot or at close, like computed ones. */
hl_status kv_session_advance(kv_session *s, hl_err *err);

/* Schedules a user snapshot at offset (ignored when <= prefix or > n_inputs). */
void kv_session_request_snapshot(kv_session *s, int32_t offset, bool user);
/* The reference's schedule: every KV_SNAPSHOT_INTERVAL tokens below n_inputs, and
 * n_inputs - KV_PRE_THINKING when > 0. */
void kv_session_schedule_prefill(kv_session *s);
/* The smallest pending offset, or -1. */
int32_t kv_session_next_snapshot(const kv_session *s);
/* Consumes pending offsets the caches reached and attaches snapshots there. */
hl_status kv_session_snapshot(kv_session *s, hl_err *err);
/* Makes room for n more stored tokens, so kv_session_add_outputs does not allocate. */
hl_status kv_session_reserve_outputs(kv_session *s, int32_t n, hl_err *err);
/* Records generated tokens (the caches may hold them). */
hl_status kv_session_add_outputs(kv_session *s, const int32_t *tokens, int32_t n, hl_err *err);
/* Records what the caches reached in the trie and frees the session. Safe to call on a
 * zeroed or already closed session. */
hl_status kv_session_close(kv_session *s, hl_err *err);

#endif
