/*
 * block.h - fixed-size KV blocks, their pool (memory budget, paging) and per-sequence
 * block tables.
 *
 * A block holds the keys and values of `block_tokens` consecutive positions
 * [k*B, (k+1)*B) for every layer and KV head, laid out as kv/layout.h says (per layer
 * K rows [n_head_kv][B][row], then the V rows likewise; f32 unless the layout names f16
 * or q8_0), so attention reads each head's keys contiguously inside a block.
 *
 * Sharing and copy-on-write. A block is reference counted: the live block table of a
 * sequence (kv_table) and any number of prefix-trie snapshots may hold it. Rows
 * [0, n_valid) of a block, once written, are never changed while someone else holds the
 * block. A holder whose logical length inside the block equals n_valid may append in
 * place (other holders only read rows below their own, shorter, length); a holder that
 * rewound below n_valid and writes again gets a private copy of the rows it keeps
 * (kv_table_reserve does this). Two conversations sharing a system prompt therefore
 * share all of its blocks except at most the one where they diverge.
 *
 * Memory. The pool counts every block it owns in one of three tiers: resident (f32 data),
 * compressed in RAM (byte-plane shuffle + zstd level 1; lossless), spilled to a file in the
 * spill directory. ram_bytes = resident blocks * block_bytes + compressed bytes.
 * kv_pool_page() moves the least recently used blocks that no live table holds down a
 * tier (compress, then spill) until ram_bytes <= budget; blocks come back on demand when a
 * table takes them (kv_table_set). When paging cannot get under budget, the prefix cache
 * evicts trie nodes (trie.h), which releases blocks.
 *
 * Ownership: kv_pool_create allocates the pool; blocks are created by kv_table_reserve
 * and freed when their last reference goes (kv_block_unref). kv_pool_destroy frees every
 * block still alive and removes spill files. A kv_table is caller-owned storage
 * (kv_table_init / kv_table_free). Not thread-safe: one thread drives a pool.
 */
#ifndef HL_KV_BLOCK_H
#define HL_KV_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "kv/layout.h"

typedef struct kv_layout {
    int32_t n_layer;
    int32_t n_head_kv; /* the same for every layer, unless `layers` is set */
    int32_t head_dim_k;
    int32_t head_dim_v;
    int32_t block_tokens; /* B: positions per block (> 0) */
    /* Optional: per-layer heads and head sizes ([n_layer], copied by kv_pool_create);
     * NULL: every layer has the uniform fields above. */
    const kv_layer_dims *layers;
    hl_type k_type, v_type; /* element types (0: f32) */
} kv_layout;

/* Bytes of one block's data; 0 when the layout is invalid or overflows. */
size_t kv_layout_block_bytes(const kv_layout *l);
/* The layout's geometry (kv/layout.h); the caller frees it with kv_geom_free. */
hl_status kv_layout_geom(const kv_layout *l, kv_geom *out, hl_err *err);

typedef enum kv_tier {
    KV_TIER_RESIDENT = 0,
    KV_TIER_COMPRESSED, /* zstd-compressed in RAM */
    KV_TIER_SPILLED,    /* in a file of the spill directory */
} kv_tier;

typedef struct kv_pool_config {
    kv_layout layout;
    size_t budget_bytes;    /* RAM for all cached blocks; 0: kv_default_budget() */
    const char *spill_dir;  /* NULL: no disk tier (copied) */
    size_t spill_max_bytes; /* disk cap for spilled blocks; 0: unlimited */
} kv_pool_config;

typedef struct kv_pool_stats {
    size_t block_bytes;
    size_t n_blocks;     /* alive, all tiers */
    size_t n_resident;
    size_t n_compressed;
    size_t n_spilled;
    size_t ram_bytes;    /* resident data + compressed bytes */
    size_t disk_bytes;   /* spilled bytes */
    size_t n_free;       /* recycled buffers kept for reuse (counted in ram_bytes) */
    uint64_t n_cow;      /* copy-on-write copies made */
    uint64_t n_paged_out, n_paged_in;
} kv_pool_stats;

typedef struct kv_pool kv_pool;
typedef struct kv_block kv_block;

/* Half of MemAvailable from /proc/meminfo (1 GiB when unknown), at least 64 MiB. */
size_t kv_default_budget(void);

hl_status kv_pool_create(const kv_pool_config *cfg, kv_pool **out, hl_err *err);
void kv_pool_destroy(kv_pool *p); /* accepts NULL */
const kv_layout *kv_pool_layout(const kv_pool *p); /* its `layers` is the pool's copy */
const kv_geom *kv_pool_geom(const kv_pool *p);
size_t kv_pool_budget(const kv_pool *p);
size_t kv_pool_spill_max(const kv_pool *p); /* SIZE_MAX when unlimited */
void kv_pool_set_budget(kv_pool *p, size_t budget_bytes);
kv_pool_stats kv_pool_get_stats(const kv_pool *p);

/* Pages out cold blocks (held by no live table), least recently used first: compress
 * while ram_bytes > budget, then spill compressed blocks to disk (if configured and the
 * disk cap allows). Drops recycled buffers first. Returns true when the pool is within
 * its budgets afterwards (ram <= budget and disk <= spill cap). IO errors while spilling
 * leave the block compressed in RAM. */
bool kv_pool_page(kv_pool *p);
/* Like kv_pool_page's result without doing anything. */
bool kv_pool_within_budget(const kv_pool *p);
/* RAM held by blocks no live table holds (resident or compressed): what evicting trie
 * nodes can give back. */
size_t kv_pool_cold_ram_bytes(const kv_pool *p);

/* Pages out every block no live table holds (an explicit "conversation went idle"):
 * compress all, and spill all when a spill directory is configured. */
void kv_pool_page_out_cold(kv_pool *p);

kv_block *kv_block_ref(kv_block *b); /* accepts NULL */
void kv_block_unref(kv_pool *p, kv_block *b); /* accepts NULL */
int32_t kv_block_refs(const kv_block *b);
int32_t kv_block_valid(const kv_block *b); /* rows written from the block start */
kv_tier kv_block_tier(const kv_block *b);
/* The resident data (NULL when paged out). */
void *kv_block_data(const kv_block *b);
/* A new resident block with all block_tokens rows valid (one reference, held by no
 * table), for data from outside the pool (kv/store.h): the caller fills
 * kv_block_data() and installs it with kv_table_set, or drops it with kv_block_unref.
 * NULL when out of memory. */
kv_block *kv_block_new_full(kv_pool *p);
/* Copies rows [0, rows) of a block's data src into dst and zeroes the rest (both
 * block_bytes, laid out for the pool): the first rows of a partly filled block as a
 * self-contained record (kv/store.h's snapshots of a hybrid model). */
void kv_block_copy_rows(const kv_pool *p, void *dst, const void *src, int32_t rows);
/* Brings a block back to RAM (decompress / read the spill file). */
hl_status kv_block_make_resident(kv_pool *p, kv_block *b, hl_err *err);

/* Row pointers inside a resident block's data; for f16 keys (stored by columns,
 * kv/layout.h) the key's first element, its others kv_geom_k_stride elements apart. */
void *kv_block_k_row(const kv_pool *p, void *data, int32_t layer, int32_t head, int32_t row);
void *kv_block_v_row(const kv_pool *p, void *data, int32_t layer, int32_t head, int32_t row);

/* ---- per-sequence block table ---- */

/* blocks[i] covers positions [i*B, (i+1)*B); data[i] is its resident data (tables pin
 * their blocks resident). len positions are valid. A sliding-window cache drops the blocks
 * its window has left (kv_table_drop_below): those entries are NULL holes, always below
 * the positions still read. */
typedef struct kv_table {
    kv_pool *pool;
    kv_block **blocks;
    void **data;
    int32_t n_blocks; /* == ceil(len / B) after reserve/truncate, or more after reserve */
    int32_t cap;
    int32_t len;
} kv_table;

void kv_table_init(kv_table *t, kv_pool *p);
void kv_table_free(kv_table *t); /* releases every block; t can be re-initialised */

/* Forgets positions >= n (0 <= n <= len); blocks past the new end are released. */
void kv_table_truncate(kv_table *t, int32_t n);

/* Makes positions [len, len+n) writable: allocates blocks, copies a shared block whose
 * rows past len someone else wrote (copy-on-write), marks the rows valid. len is not
 * changed: the caller writes the rows, then calls kv_table_commit(t, n). Pages the pool
 * first when new blocks push it over budget (it never fails for budget reasons). */
hl_status kv_table_reserve(kv_table *t, int32_t n, hl_err *err);
void kv_table_commit(kv_table *t, int32_t n);
/* Sizes the table's arrays for n_positions (no blocks are allocated), so growing up to
 * there never reallocates. */
hl_status kv_table_prealloc(kv_table *t, int32_t n_positions, hl_err *err);

/* Installs block b (made resident first; the table takes its own reference) at block
 * index `index` <= n_blocks, replacing the block there. len is not changed. */
hl_status kv_table_set(kv_table *t, int32_t index, kv_block *b, hl_err *err);
/* Sets len (<= what the table's blocks hold valid rows for; else HL_ERR_INVALID) and
 * releases blocks past it. */
hl_status kv_table_set_len(kv_table *t, int32_t len, hl_err *err);
/* Releases every block whose rows all lie below pos (they become holes). */
void kv_table_drop_below(kv_table *t, int32_t pos);
/* Makes block index `index` <= n_blocks a hole (releasing a block there). */
hl_status kv_table_set_hole(kv_table *t, int32_t index, hl_err *err);
/* True when positions [from, to) (from clamped to 0) are all held: to <= len, no hole. */
bool kv_table_covers(const kv_table *t, int32_t from, int32_t to);

#endif
