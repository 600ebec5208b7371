/*
 * block.c - KV blocks: allocation with a recycle list, copy-on-write tables, and the
 * three memory tiers (resident, zstd-compressed in RAM, spilled to disk).
 */
#include "kv/block.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

#define KV_MAX_RECYCLED 8

struct kv_block {
    uint64_t id;
    int32_t refs;
    int32_t table_refs; /* held by live tables: pinned resident */
    int32_t n_valid;
    kv_tier tier;
    void *data;
    uint8_t *zdata; /* compressed bytes (tier COMPRESSED) */
    size_t zlen;    /* compressed size (also the spill file's size) */
    uint64_t last_used;
    kv_block *prev, *next; /* all alive blocks of the pool */
};

struct kv_pool {
    kv_layout layout; /* layers points at geom.dims */
    kv_geom geom;
    size_t block_bytes;
    size_t budget;
    char *spill_dir;
    size_t spill_max;
    unsigned pool_id;
    uint64_t next_id;
    uint64_t tick;
    kv_block *head; /* alive blocks */
    void *recycled[KV_MAX_RECYCLED];
    int n_recycled;
    kv_block *free_structs; /* recycled kv_block structs, linked through next */
    uint8_t *scratch; /* block_bytes, for shuffling */
    kv_block **cands; /* paging candidates */
    size_t cap_cands;
    kv_pool_stats st;
};

hl_status kv_layout_geom(const kv_layout *l, kv_geom *out, hl_err *err) {
    if (l->layers) return kv_geom_init(out, l->n_layer, l->layers, l->k_type, l->v_type, err);
    if (l->n_layer <= 0 || l->n_layer > 65536 || l->n_head_kv <= 0)
        return hl_fail(err, HL_ERR_INVALID, "invalid KV layout: %d layers, %d KV heads",
                       l->n_layer, l->n_head_kv);
    kv_layer_dims *dims = malloc((size_t)l->n_layer * sizeof *dims);
    if (!dims) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < l->n_layer; i++)
        dims[i] = (kv_layer_dims){l->n_head_kv, l->head_dim_k, l->head_dim_v};
    hl_status st = kv_geom_init(out, l->n_layer, dims, l->k_type, l->v_type, err);
    free(dims);
    return st;
}

size_t kv_layout_block_bytes(const kv_layout *l) {
    kv_geom g;
    if (l->block_tokens <= 0 || kv_layout_geom(l, &g, NULL)) return 0;
    size_t n = 0;
    if (__builtin_mul_overflow(g.bytes_per_pos, (size_t)l->block_tokens, &n)) n = 0;
    kv_geom_free(&g);
    return n;
}

size_t kv_default_budget(void) {
    size_t budget = (size_t)1 << 30;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                budget = (size_t)(kb / 2 * 1024);
                break;
            }
        fclose(f);
    }
    if (budget < ((size_t)64 << 20)) budget = (size_t)64 << 20;
    return budget;
}

hl_status kv_pool_create(const kv_pool_config *cfg, kv_pool **out, hl_err *err) {
    static unsigned next_pool_id;
    *out = NULL;
    size_t bb = kv_layout_block_bytes(&cfg->layout);
    if (bb == 0)
        return hl_fail(err, HL_ERR_INVALID,
                       "invalid KV layout: %d layers, %d KV heads, head dims %d/%d, %d tokens "
                       "per block",
                       cfg->layout.n_layer, cfg->layout.n_head_kv, cfg->layout.head_dim_k,
                       cfg->layout.head_dim_v, cfg->layout.block_tokens);
    kv_pool *p = calloc(1, sizeof *p);
    if (!p) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    hl_status st = kv_layout_geom(&cfg->layout, &p->geom, err);
    if (st) {
        free(p);
        return st;
    }
    p->layout = cfg->layout;
    p->layout.layers = p->geom.dims;
    p->block_bytes = bb;
    p->budget = cfg->budget_bytes ? cfg->budget_bytes : kv_default_budget();
    p->spill_max = cfg->spill_max_bytes ? cfg->spill_max_bytes : SIZE_MAX;
    p->pool_id = __atomic_fetch_add(&next_pool_id, 1, __ATOMIC_RELAXED);
    p->scratch = malloc(bb);
    if (cfg->spill_dir) p->spill_dir = strdup(cfg->spill_dir);
    if (!p->scratch || (cfg->spill_dir && !p->spill_dir)) {
        kv_pool_destroy(p);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    p->st.block_bytes = bb;
    *out = p;
    return HL_OK;
}

static void spill_path(const kv_pool *p, const kv_block *b, char *buf, size_t n) {
    snprintf(buf, n, "%s/hearth-kv-%ld-%u-%llu.z", p->spill_dir, (long)getpid(), p->pool_id,
             (unsigned long long)b->id);
}

/* Releases a block's storage in whatever tier it is; the struct stays. */
static void block_drop_storage(kv_pool *p, kv_block *b) {
    switch (b->tier) {
    case KV_TIER_RESIDENT:
        if (b->data) {
            if (p->n_recycled < KV_MAX_RECYCLED) {
                p->recycled[p->n_recycled++] = b->data;
                p->st.n_free++;
            } else {
                free(b->data);
                p->st.ram_bytes -= p->block_bytes;
            }
            p->st.n_resident--;
        }
        break;
    case KV_TIER_COMPRESSED:
        free(b->zdata);
        p->st.ram_bytes -= b->zlen;
        p->st.n_compressed--;
        break;
    case KV_TIER_SPILLED: {
        char path[4096];
        spill_path(p, b, path, sizeof path);
        unlink(path);
        p->st.disk_bytes -= b->zlen;
        p->st.n_spilled--;
        break;
    }
    }
    b->data = NULL;
    b->zdata = NULL;
    b->zlen = 0;
}

static void block_destroy(kv_pool *p, kv_block *b) {
    block_drop_storage(p, b);
    if (b->prev) b->prev->next = b->next;
    else p->head = b->next;
    if (b->next) b->next->prev = b->prev;
    p->st.n_blocks--;
    b->next = p->free_structs; /* decode needs a block every B tokens: no malloc for it */
    p->free_structs = b;
}

void kv_pool_destroy(kv_pool *p) {
    if (!p) return;
    while (p->head) block_destroy(p, p->head);
    while (p->free_structs) {
        kv_block *n = p->free_structs->next;
        free(p->free_structs);
        p->free_structs = n;
    }
    for (int i = 0; i < p->n_recycled; i++) free(p->recycled[i]);
    free(p->scratch);
    free(p->cands);
    free(p->spill_dir);
    kv_geom_free(&p->geom);
    free(p);
}

const kv_layout *kv_pool_layout(const kv_pool *p) { return &p->layout; }
const kv_geom *kv_pool_geom(const kv_pool *p) { return &p->geom; }
size_t kv_pool_budget(const kv_pool *p) { return p->budget; }
size_t kv_pool_spill_max(const kv_pool *p) { return p->spill_max; }
void kv_pool_set_budget(kv_pool *p, size_t budget_bytes) { p->budget = budget_bytes; }
kv_pool_stats kv_pool_get_stats(const kv_pool *p) { return p->st; }

static void *data_alloc(kv_pool *p) {
    if (p->n_recycled > 0) {
        p->st.n_free--;
        return p->recycled[--p->n_recycled];
    }
    void *d = malloc(p->block_bytes);
    if (d) p->st.ram_bytes += p->block_bytes;
    return d;
}

static kv_block *block_new(kv_pool *p) {
    kv_block *b = p->free_structs;
    if (b) {
        p->free_structs = b->next;
        *b = (kv_block){0};
    } else if (!(b = calloc(1, sizeof *b))) {
        return NULL;
    }
    b->data = data_alloc(p);
    if (!b->data) {
        b->next = p->free_structs;
        p->free_structs = b;
        return NULL;
    }
    b->id = p->next_id++;
    b->refs = 1;
    b->tier = KV_TIER_RESIDENT;
    b->last_used = ++p->tick;
    b->next = p->head;
    if (p->head) p->head->prev = b;
    p->head = b;
    p->st.n_blocks++;
    p->st.n_resident++;
    return b;
}

kv_block *kv_block_ref(kv_block *b) {
    if (!b) return NULL;
    b->refs++;
    return b;
}

void kv_block_unref(kv_pool *p, kv_block *b) {
    if (!b) return;
    if (--b->refs == 0) block_destroy(p, b);
}

int32_t kv_block_refs(const kv_block *b) { return b->refs; }
int32_t kv_block_valid(const kv_block *b) { return b->n_valid; }
kv_tier kv_block_tier(const kv_block *b) { return b->tier; }
void *kv_block_data(const kv_block *b) { return b->data; }

void *kv_block_k_row(const kv_pool *p, void *data, int32_t layer, int32_t head, int32_t row) {
    return kv_geom_k(&p->geom, data, p->layout.block_tokens, layer, head, row);
}

void *kv_block_v_row(const kv_pool *p, void *data, int32_t layer, int32_t head, int32_t row) {
    return kv_geom_v(&p->geom, data, p->layout.block_tokens, layer, head, row);
}

/* Copies (or zeroes, src NULL) `bytes` at dst from src. */
static void copy_or_zero(uint8_t *dst, const uint8_t *src, size_t bytes) {
    if (src) memcpy(dst, src, bytes);
    else memset(dst, 0, bytes);
}

/* Keys by columns (layout.h): positions [row, row + n) of one head, tile by tile, each
 * tile's elements one short run per key element. */
static void key_cols(const kv_geom *g, int32_t B, int32_t layer, int32_t h, void *dst,
                     const void *src, int32_t row, int32_t n) {
    const int32_t dk = g->dims[layer].head_dim_k;
    for (int32_t r = row, end = row + n; r < end;) {
        const int32_t w = kv_geom_k_stride(g, B, r), in_tile = w - r % KV_K_TILE;
        const int32_t m = end - r < in_tile ? end - r : in_tile;
        uint8_t *d = kv_geom_k(g, dst, B, layer, h, r);
        const uint8_t *s = src ? kv_geom_k(g, (void *)src, B, layer, h, r) : NULL;
        for (int32_t e = 0; e < dk; e++)
            copy_or_zero(d + (size_t)e * (size_t)w * sizeof(uint16_t),
                         s ? s + (size_t)e * (size_t)w * sizeof(uint16_t) : NULL,
                         (size_t)m * sizeof(uint16_t));
        r += m;
    }
}

/* Copies (or zeroes, src NULL) K and V of positions [row, row + n) of a block, every layer
 * and head. */
static void block_rows(const kv_pool *p, void *dst, const void *src, int32_t row, int32_t n) {
    const kv_geom *g = &p->geom;
    const int32_t B = p->layout.block_tokens;
    for (int32_t layer = 0; layer < g->n_layer; layer++)
        for (int32_t h = 0; h < g->dims[layer].n_head_kv; h++) {
            if (kv_geom_k_cols(g))
                key_cols(g, B, layer, h, dst, src, row, n);
            else
                copy_or_zero(kv_geom_k(g, dst, B, layer, h, row),
                             src ? kv_geom_k(g, (void *)src, B, layer, h, row) : NULL,
                             (size_t)n * g->k_row[layer]);
            copy_or_zero(kv_geom_v(g, dst, B, layer, h, row),
                         src ? kv_geom_v(g, (void *)src, B, layer, h, row) : NULL,
                         (size_t)n * g->v_row[layer]);
        }
}

void kv_block_copy_rows(const kv_pool *p, void *dst, const void *src, int32_t rows) {
    const int32_t B = p->layout.block_tokens;
    if (rows < 0) rows = 0;
    if (rows > B) rows = B;
    if (rows > 0) block_rows(p, dst, src, 0, rows);
    if (rows < B) block_rows(p, dst, NULL, rows, B - rows);
}

/* ---- tiers ---- */

/* f32 keys/values compress poorly as bytes; grouping byte i of every float together puts
 * the similar sign/exponent bytes next to each other (f16 pairs alike). Bytes past the
 * last whole group (q8_0 blocks need not fill one) are copied as they are. */
static void shuffle(const uint8_t *src, uint8_t *dst, size_t n_bytes) {
    size_t n = n_bytes / 4;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < 4; j++) dst[j * n + i] = src[i * 4 + j];
    memcpy(dst + n * 4, src + n * 4, n_bytes - n * 4);
}

static void unshuffle(const uint8_t *src, uint8_t *dst, size_t n_bytes) {
    size_t n = n_bytes / 4;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < 4; j++) dst[i * 4 + j] = src[j * n + i];
    memcpy(dst + n * 4, src + n * 4, n_bytes - n * 4);
}

/* Rows >= n_valid are read by nobody; zeroing them makes the block compress better (and
 * never feeds uninitialised bytes to the compressor). */
static void zero_invalid_rows(kv_pool *p, kv_block *b) {
    const int32_t rows = p->layout.block_tokens - b->n_valid;
    if (rows > 0) block_rows(p, b->data, NULL, b->n_valid, rows);
}

static bool block_compress(kv_pool *p, kv_block *b) {
    if (b->tier != KV_TIER_RESIDENT || b->table_refs > 0) return false;
    zero_invalid_rows(p, b);
    shuffle((const uint8_t *)b->data, p->scratch, p->block_bytes);
    /* zstd level 1: deflate's ratio on KV data at ~10x its speed (README, dependencies) */
    const size_t bound = ZSTD_compressBound(p->block_bytes);
    uint8_t *z = malloc(bound);
    if (!z) return false;
    const size_t zlen = ZSTD_compress(z, bound, p->scratch, p->block_bytes, 1);
    if (ZSTD_isError(zlen)) {
        free(z);
        return false;
    }
    uint8_t *shrunk = realloc(z, zlen ? zlen : 1);
    if (shrunk) z = shrunk;
    block_drop_storage(p, b); /* data buffer goes to the recycle list or is freed */
    b->tier = KV_TIER_COMPRESSED;
    b->zdata = z;
    b->zlen = zlen;
    p->st.ram_bytes += zlen;
    p->st.n_compressed++;
    p->st.n_paged_out++;
    return true;
}

static bool block_spill(kv_pool *p, kv_block *b) {
    if (b->tier != KV_TIER_COMPRESSED || !p->spill_dir) return false;
    if (p->st.disk_bytes + b->zlen > p->spill_max) return false;
    char path[4096];
    spill_path(p, b, path, sizeof path);
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(b->zdata, 1, b->zlen, f) == b->zlen;
    if (fclose(f) != 0) ok = false;
    if (!ok) {
        unlink(path);
        return false;
    }
    free(b->zdata);
    b->zdata = NULL;
    p->st.ram_bytes -= b->zlen;
    p->st.n_compressed--;
    b->tier = KV_TIER_SPILLED;
    p->st.disk_bytes += b->zlen;
    p->st.n_spilled++;
    return true;
}

hl_status kv_block_make_resident(kv_pool *p, kv_block *b, hl_err *err) {
    if (b->tier == KV_TIER_RESIDENT) return HL_OK;
    uint8_t *z = b->zdata;
    bool from_disk = b->tier == KV_TIER_SPILLED;
    char path[4096] = "";
    if (from_disk) {
        spill_path(p, b, path, sizeof path);
        z = malloc(b->zlen ? b->zlen : 1);
        if (!z) return hl_fail(err, HL_ERR_NOMEM, "out of memory reading a spilled KV block");
        FILE *f = fopen(path, "rb");
        bool ok = f && fread(z, 1, b->zlen, f) == b->zlen;
        if (f) fclose(f);
        if (!ok) {
            free(z);
            return hl_fail(err, HL_ERR_IO, "cannot read spilled KV block %s: %s", path,
                           strerror(errno ? errno : EIO));
        }
    }
    void *d = data_alloc(p);
    if (!d) {
        if (from_disk) free(z);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory restoring a KV block");
    }
    const size_t n = ZSTD_decompress(p->scratch, p->block_bytes, z, b->zlen);
    if (ZSTD_isError(n) || n != p->block_bytes) {
        if (from_disk) free(z);
        if (p->n_recycled < KV_MAX_RECYCLED) {
            p->recycled[p->n_recycled++] = d;
            p->st.n_free++;
        } else {
            free(d);
            p->st.ram_bytes -= p->block_bytes;
        }
        return hl_fail(err, HL_ERR_FORMAT, "a paged-out KV block is corrupt");
    }
    unshuffle(p->scratch, (uint8_t *)d, p->block_bytes);
    if (from_disk) {
        free(z);
        unlink(path);
        p->st.disk_bytes -= b->zlen;
        p->st.n_spilled--;
    } else {
        free(b->zdata);
        p->st.ram_bytes -= b->zlen;
        p->st.n_compressed--;
    }
    b->zdata = NULL;
    b->zlen = 0;
    b->data = d;
    b->tier = KV_TIER_RESIDENT;
    p->st.n_resident++;
    p->st.n_paged_in++;
    return HL_OK;
}

bool kv_pool_within_budget(const kv_pool *p) {
    return p->st.ram_bytes <= p->budget && p->st.disk_bytes <= p->spill_max;
}

size_t kv_pool_cold_ram_bytes(const kv_pool *p) {
    size_t n = 0;
    for (const kv_block *b = p->head; b; b = b->next) {
        if (b->table_refs > 0) continue;
        if (b->tier == KV_TIER_RESIDENT) n += p->block_bytes;
        else if (b->tier == KV_TIER_COMPRESSED) n += b->zlen;
    }
    return n;
}

static int cmp_lru(const void *a, const void *b) {
    const kv_block *x = *(kv_block *const *)a, *y = *(kv_block *const *)b;
    return x->last_used < y->last_used ? -1 : x->last_used > y->last_used;
}

/* Collects blocks in `tier` that no table holds, least recently used first. */
static size_t collect(kv_pool *p, kv_tier tier) {
    size_t n = 0;
    for (kv_block *b = p->head; b; b = b->next) {
        if (b->tier != tier || b->table_refs > 0) continue;
        if (n == p->cap_cands) {
            size_t cap = p->cap_cands ? p->cap_cands * 2 : 64;
            kv_block **c = realloc(p->cands, cap * sizeof *c);
            if (!c) break;
            p->cands = c;
            p->cap_cands = cap;
        }
        p->cands[n++] = b;
    }
    if (n > 1) qsort(p->cands, n, sizeof *p->cands, cmp_lru);
    return n;
}

static void drop_recycled(kv_pool *p) {
    while (p->n_recycled > 0) {
        free(p->recycled[--p->n_recycled]);
        p->st.ram_bytes -= p->block_bytes;
        p->st.n_free--;
    }
}

bool kv_pool_page(kv_pool *p) {
    if (p->st.ram_bytes <= p->budget) return kv_pool_within_budget(p);
    drop_recycled(p);
    if (p->st.ram_bytes > p->budget) {
        size_t n = collect(p, KV_TIER_RESIDENT);
        for (size_t i = 0; i < n && p->st.ram_bytes > p->budget; i++) {
            block_compress(p, p->cands[i]);
            drop_recycled(p);
        }
    }
    if (p->st.ram_bytes > p->budget && p->spill_dir) {
        size_t n = collect(p, KV_TIER_COMPRESSED);
        for (size_t i = 0; i < n && p->st.ram_bytes > p->budget; i++) block_spill(p, p->cands[i]);
    }
    return kv_pool_within_budget(p);
}

void kv_pool_page_out_cold(kv_pool *p) {
    size_t n = collect(p, KV_TIER_RESIDENT);
    for (size_t i = 0; i < n; i++) block_compress(p, p->cands[i]);
    drop_recycled(p);
    if (p->spill_dir) {
        n = collect(p, KV_TIER_COMPRESSED);
        for (size_t i = 0; i < n; i++) block_spill(p, p->cands[i]);
    }
}

/* ---- tables ---- */

void kv_table_init(kv_table *t, kv_pool *p) { *t = (kv_table){.pool = p}; }

static void table_release(kv_table *t, int32_t from_block) {
    for (int32_t i = from_block; i < t->n_blocks; i++) {
        if (!t->blocks[i]) continue; /* dropped below a window */
        t->blocks[i]->table_refs--;
        kv_block_unref(t->pool, t->blocks[i]);
        t->blocks[i] = NULL;
        t->data[i] = NULL;
    }
    if (from_block < t->n_blocks) t->n_blocks = from_block;
}

void kv_table_free(kv_table *t) {
    table_release(t, 0);
    free(t->blocks);
    free(t->data);
    *t = (kv_table){.pool = t->pool};
}

static int32_t blocks_for(const kv_table *t, int32_t len) {
    const int32_t B = t->pool->layout.block_tokens;
    return (int32_t)(((int64_t)len + B - 1) / B);
}

void kv_table_truncate(kv_table *t, int32_t n) {
    if (n < 0) n = 0;
    if (n > t->len) n = t->len;
    t->len = n;
    table_release(t, blocks_for(t, n));
}

static hl_status table_grow(kv_table *t, int32_t n_blocks, hl_err *err) {
    if (n_blocks <= t->cap) return HL_OK;
    int32_t cap = t->cap ? t->cap : 16;
    while (cap < n_blocks) cap *= 2;
    kv_block **nb = realloc(t->blocks, (size_t)cap * sizeof *nb);
    if (!nb) return hl_fail(err, HL_ERR_NOMEM, "out of memory for a KV block table");
    t->blocks = nb;
    void **nd = realloc(t->data, (size_t)cap * sizeof *nd);
    if (!nd) return hl_fail(err, HL_ERR_NOMEM, "out of memory for a KV block table");
    t->data = nd;
    t->cap = cap;
    return HL_OK;
}

kv_block *kv_block_new_full(kv_pool *p) {
    kv_block *b = block_new(p);
    if (b) b->n_valid = p->layout.block_tokens;
    return b;
}

/* A private copy of rows [0, rows) of b. */
static kv_block *block_copy_prefix(kv_pool *p, kv_block *b, int32_t rows) {
    kv_block *c = block_new(p);
    if (!c) return NULL;
    block_rows(p, c->data, b->data, 0, rows);
    c->n_valid = rows;
    p->st.n_cow++;
    return c;
}

hl_status kv_table_reserve(kv_table *t, int32_t n, hl_err *err) {
    kv_pool *p = t->pool;
    const int32_t B = p->layout.block_tokens;
    if (n <= 0) return HL_OK;
    int64_t end = (int64_t)t->len + n;
    if (end > INT32_MAX) return hl_fail(err, HL_ERR_INVALID, "KV table position overflow");
    int32_t need = blocks_for(t, (int32_t)end);
    hl_status st = table_grow(t, need, err);
    if (st) return st;
    bool added = false;
    for (int32_t k = t->len / B; k < need; k++) {
        int32_t lo = t->len > k * B ? t->len - k * B : 0;
        int32_t hi = end < (int64_t)(k + 1) * B ? (int32_t)(end - (int64_t)k * B) : B;
        if (k >= t->n_blocks) {
            kv_block *b = block_new(p);
            if (!b) return hl_fail(err, HL_ERR_NOMEM, "out of memory for a KV block");
            b->table_refs = 1;
            b->n_valid = hi;
            t->blocks[k] = b;
            t->data[k] = b->data;
            t->n_blocks = k + 1;
            added = true;
            continue;
        }
        kv_block *b = t->blocks[k];
        b->last_used = ++p->tick;
        if (b->refs == 1 || lo == b->n_valid) {
            b->n_valid = hi; /* in place: nobody else reads rows >= lo */
            continue;
        }
        kv_block *c = block_copy_prefix(p, b, lo);
        if (!c) return hl_fail(err, HL_ERR_NOMEM, "out of memory for a KV block");
        c->table_refs = 1;
        c->n_valid = hi;
        b->table_refs--;
        kv_block_unref(p, b);
        t->blocks[k] = c;
        t->data[k] = c->data;
        added = true;
    }
    if (added && p->st.ram_bytes > p->budget) kv_pool_page(p);
    return HL_OK;
}

void kv_table_commit(kv_table *t, int32_t n) { t->len += n; }

hl_status kv_table_prealloc(kv_table *t, int32_t n_positions, hl_err *err) {
    return table_grow(t, blocks_for(t, n_positions), err);
}

hl_status kv_table_set(kv_table *t, int32_t index, kv_block *b, hl_err *err) {
    if (index < 0 || index > t->n_blocks)
        return hl_fail(err, HL_ERR_INVALID, "block index %d outside a table of %d blocks", index,
                       t->n_blocks);
    if (index < t->n_blocks && t->blocks[index] == b) return HL_OK;
    hl_status st = table_grow(t, index + 1, err);
    if (st) return st;
    st = kv_block_make_resident(t->pool, b, err);
    if (st) return st;
    kv_block_ref(b);
    b->table_refs++;
    b->last_used = ++t->pool->tick;
    if (index < t->n_blocks) {
        if (t->blocks[index]) {
            t->blocks[index]->table_refs--;
            kv_block_unref(t->pool, t->blocks[index]);
        }
    } else {
        t->n_blocks = index + 1;
    }
    t->blocks[index] = b;
    t->data[index] = b->data;
    return HL_OK;
}

hl_status kv_table_set_len(kv_table *t, int32_t len, hl_err *err) {
    const int32_t B = t->pool->layout.block_tokens;
    int32_t need = blocks_for(t, len);
    if (len < 0 || need > t->n_blocks ||
        (need > 0 && (!t->blocks[need - 1] || t->blocks[need - 1]->n_valid < len - (need - 1) * B)))
        return hl_fail(err, HL_ERR_INVALID, "KV table has no valid rows up to position %d", len);
    t->len = len;
    table_release(t, need);
    return HL_OK;
}

void kv_table_drop_below(kv_table *t, int32_t pos) {
    const int32_t B = t->pool->layout.block_tokens;
    int32_t n = pos > 0 ? pos / B : 0; /* blocks whose rows all lie below pos */
    if (n > t->n_blocks) n = t->n_blocks;
    for (int32_t k = 0; k < n; k++) {
        if (!t->blocks[k]) continue;
        t->blocks[k]->table_refs--;
        kv_block_unref(t->pool, t->blocks[k]);
        t->blocks[k] = NULL;
        t->data[k] = NULL;
    }
}

hl_status kv_table_set_hole(kv_table *t, int32_t index, hl_err *err) {
    if (index < 0 || index > t->n_blocks)
        return hl_fail(err, HL_ERR_INVALID, "block index %d outside a table of %d blocks", index,
                       t->n_blocks);
    hl_status st = table_grow(t, index + 1, err);
    if (st) return st;
    if (index < t->n_blocks && t->blocks[index]) {
        t->blocks[index]->table_refs--;
        kv_block_unref(t->pool, t->blocks[index]);
    }
    if (index == t->n_blocks) t->n_blocks = index + 1;
    t->blocks[index] = NULL;
    t->data[index] = NULL;
    return HL_OK;
}

bool kv_table_covers(const kv_table *t, int32_t from, int32_t to) {
    const int32_t B = t->pool->layout.block_tokens;
    if (from < 0) from = 0;
    if (to > t->len || from > to) return false;
    if (from == to) return true;
    for (int32_t k = from / B; k <= (to - 1) / B; k++)
        if (k >= t->n_blocks || !t->blocks[k]) return false;
    return true;
}
