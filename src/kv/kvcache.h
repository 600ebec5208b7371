/*
 * kvcache.h - the cache kinds behind the prefix trie's kv_cache_ops (trie.h).
 *
 * Block KV (full attention): the live cache is a kv_table (block.h). A snapshot of
 * [from, to) holds references to the blocks covering it (no copy: blocks are immutable
 * below their n_valid rows and copied on write), so a snapshot keeps alive exactly the
 * blocks its rows live in, never a whole-cache buffer. Restores to any token: a rewind
 * truncates the table; restoring a snapshot installs its blocks (paging them back in
 * when needed) and clamps to the target. Split and merge are reference bookkeeping.
 *
 * Sliding-window KV: block KV whose live table drops the blocks its window has left;
 * restorable only where the window [t - W, t) is held (see kv_window_cache below).
 *
 * Whole state (recurrent layers, or any state that cannot be rewound): a fixed-size
 * float state the model updates in place plus the offset it represents. A snapshot is a
 * compact copy of exactly the state (state_floats floats), restorable only at exactly its
 * offset; split gives it to the tail, merge keeps the child. With a kv_state_pager the
 * snapshots are paged like KV blocks: under memory pressure the least recently used go
 * compressed (zstd level 1 over 4-byte planes), then to a spill file; restoring one
 * brings it back to RAM. Only when paging cannot get under the budget does the trie evict.
 *
 * Ownership: the caller owns the kv_table / kv_state_cache; snapshots are owned by the
 * trie and released through snap_close.
 */
#ifndef HL_KV_KVCACHE_H
#define HL_KV_KVCACHE_H

#include "kv/block.h"
#include "kv/trie.h"

/* ops for a kv_table (self = kv_table *). */
extern const kv_cache_ops kv_block_cache_ops;

/* Sliding-window KV (self = kv_window_cache *): a kv_table of the windowed layers whose
 * blocks below the window are dropped as the sequence advances (kv_window_trim), so a
 * sequence holds about W + 2B positions of them, not its whole length. Snapshots are
 * block references like full KV's (blocks already dropped are absent); a position t is
 * restorable, from the live table or a snapshot, only when [t - W, t) is held. */
typedef struct kv_window_cache {
    kv_table *table;
    int32_t window; /* W */
} kv_window_cache;
extern const kv_cache_ops kv_window_cache_ops;
/* Drops the blocks the window has left (keeping one block of slack). */
void kv_window_trim(kv_window_cache *w);

/* Several pools behind one over_budget hook (ctx = kv_pool_set *): evict while any is,
 * or while the trie's snapshots exceed snapshot_budget (when set: whole-state snapshots
 * live outside the pools, so they are bounded by their bytes in the trie). */
typedef struct kv_state_pager kv_state_pager;
typedef struct kv_pool_set {
    kv_pool *pools[2];
    int n;
    size_t snapshot_budget; /* 0: not bounded here */
    /* When set, whole-state snapshots are paged by it (and bounded by its budget) instead
     * of by snapshot_budget: over budget only while it cannot page under its budgets. */
    kv_state_pager *state_pager;
} kv_pool_set;
bool kv_pool_set_over_budget(void *ctx, const kv_prefix *pc);

/* An over_budget hook for kv_prefix_config: pages the pool (ctx = kv_pool *) and says
 * whether evicting trie nodes is still needed: RAM over budget while blocks no live table
 * holds remain in RAM (no spill directory, or the disk cap is reached), or the disk over
 * its cap. Blocks of the live sequence may exceed the budget on their own; evicting
 * cached conversations would not help that. */
bool kv_pool_over_budget(void *ctx, const kv_prefix *pc);

/* A block snapshot's range and blocks (for tests and statistics). */
typedef struct kv_block_snap {
    int32_t from, to;
    int32_t first; /* block index of blocks[0] */
    int32_t n;
    kv_pool *pool;
    kv_block *blocks[];
} kv_block_snap;

typedef struct kv_state_cache {
    float *state;
    size_t n_floats;
    int32_t offset;
    kv_state_pager *pager; /* set by the caller after init; NULL: snapshots stay in RAM */
} kv_state_cache;

/* The pager of whole-state snapshots: the RAM they may use, and where they spill. */
typedef struct kv_state_pager_config {
    size_t budget_bytes;    /* RAM for snapshots (resident + compressed); 0: unbounded */
    const char *spill_dir;  /* NULL: no disk tier (copied) */
    size_t spill_max_bytes; /* 0: unlimited */
} kv_state_pager_config;

typedef struct kv_state_stats {
    size_t n_snaps, n_resident, n_compressed, n_spilled;
    size_t ram_bytes;  /* resident copies + compressed bytes */
    size_t disk_bytes; /* spill files */
    uint64_t n_paged_out, n_paged_in;
    uint64_t n_lost; /* restores refused because a paged-out copy could not be read */
} kv_state_stats;

hl_status kv_state_pager_create(const kv_state_pager_config *cfg, kv_state_pager **out,
                                hl_err *err);
/* Accepts NULL; every snapshot made through it must be closed first. */
void kv_state_pager_destroy(kv_state_pager *p);
/* Pages least recently used snapshots down a tier (compress, then spill) until RAM is
 * within the budget; true when RAM and disk are within their budgets afterwards. */
bool kv_state_pager_page(kv_state_pager *p);
kv_state_stats kv_state_pager_get_stats(const kv_state_pager *p);
/* Pages every snapshot out (an explicit "conversations went idle"): compress all, and
 * spill all when a spill directory is configured. */
void kv_state_pager_page_out_all(kv_state_pager *p);

extern const kv_cache_ops kv_state_cache_ops;

hl_status kv_state_cache_init(kv_state_cache *c, size_t n_floats, hl_err *err);
void kv_state_cache_free(kv_state_cache *c);

#endif
