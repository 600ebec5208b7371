/*
 * kvcache.c - block KV and whole-state cache kinds for the prefix trie.
 */
#include "kv/kvcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

/* ---- block KV ---- */

static int32_t blk_offset(void *self) { return ((kv_table *)self)->len; }

static kv_block_snap *blk_snap_new(kv_pool *p, int32_t from, int32_t to) {
    const int32_t B = kv_pool_layout(p)->block_tokens;
    int32_t first = from / B, last = (to - 1) / B;
    kv_block_snap *s = malloc(sizeof *s + (size_t)(last - first + 1) * sizeof(kv_block *));
    if (!s) return NULL;
    s->from = from;
    s->to = to;
    s->first = first;
    s->n = last - first + 1;
    s->pool = p;
    return s;
}

static void blk_close(void *self, void *snap) {
    (void)self;
    kv_block_snap *s = snap;
    if (!s) return;
    for (int32_t i = 0; i < s->n; i++) kv_block_unref(s->pool, s->blocks[i]);
    free(s);
}

static void *blk_snapshot(void *self, int32_t from) {
    kv_table *t = self;
    if (from < 0) from = 0;
    if (from >= t->len) return NULL;
    kv_block_snap *s = blk_snap_new(t->pool, from, t->len);
    if (!s) return NULL;
    for (int32_t i = 0; i < s->n; i++) s->blocks[i] = kv_block_ref(t->blocks[s->first + i]);
    return s;
}

static bool blk_restore(void *self, void *snap, int32_t target) {
    kv_table *t = self;
    kv_block_snap *s = snap;
    if (!s) {
        if (target < 0 || target > t->len) return false;
        kv_table_truncate(t, target);
        return true;
    }
    if (target > s->to || t->len < s->from || target < s->from) return false;
    kv_table_truncate(t, s->from);
    const int32_t B = kv_pool_layout(t->pool)->block_tokens;
    int32_t end_block = target > s->from ? (target - 1) / B : s->first - 1;
    for (int32_t k = s->first; k <= end_block; k++) {
        if (kv_table_set(t, k, s->blocks[k - s->first], NULL) != HL_OK) {
            kv_table_truncate(t, s->from); /* e.g. a spill file vanished */
            return false;
        }
    }
    return kv_table_set_len(t, target, NULL) == HL_OK;
}

static void blk_free_state(void *self) { kv_table_truncate((kv_table *)self, 0); }

static void blk_split(void *self, void *snap, int32_t at, void **head, void **tail) {
    (void)self;
    kv_block_snap *s = snap;
    *head = *tail = NULL;
    if (!s) return;
    if (at <= s->from) {
        *tail = s;
        return;
    }
    if (at >= s->to) {
        *head = s;
        return;
    }
    kv_block_snap *h = blk_snap_new(s->pool, s->from, at), *t = blk_snap_new(s->pool, at, s->to);
    if (!h || !t) { /* keep the tail (the restore point that matters most) */
        free(h);
        free(t);
        *tail = s;
        return;
    }
    for (int32_t i = 0; i < h->n; i++) h->blocks[i] = kv_block_ref(s->blocks[h->first - s->first + i]);
    for (int32_t i = 0; i < t->n; i++) t->blocks[i] = kv_block_ref(s->blocks[t->first - s->first + i]);
    blk_close(NULL, s);
    *head = h;
    *tail = t;
}

static void *blk_merge(void *self, void *parent, void *child) {
    kv_block_snap *a = parent, *b = child;
    if (!a || !b || a->to != b->from) {
        blk_close(self, a);
        blk_close(self, b);
        return NULL;
    }
    kv_block_snap *m = blk_snap_new(a->pool, a->from, b->to);
    if (!m) {
        blk_close(self, a);
        return b; /* the child's range is still a valid (shorter) restore point */
    }
    /* The child's first block also holds the parent's rows below b->from. */
    for (int32_t i = 0; i < m->n; i++) {
        int32_t k = m->first + i;
        m->blocks[i] = kv_block_ref(k >= b->first ? b->blocks[k - b->first] : a->blocks[k - a->first]);
    }
    blk_close(self, a);
    blk_close(self, b);
    return m;
}

static size_t blk_bytes(void *self, const void *snap) {
    (void)self;
    const kv_block_snap *s = snap;
    return s ? (size_t)s->n * kv_pool_get_stats(s->pool).block_bytes : 0;
}

const kv_cache_ops kv_block_cache_ops = {
    .offset = blk_offset,
    .snapshot = blk_snapshot,
    .restore = blk_restore,
    .free_state = blk_free_state,
    .split = blk_split,
    .merge = blk_merge,
    .snap_bytes = blk_bytes,
    .snap_close = blk_close,
};

/* ---- sliding-window KV ----
 * The same block snapshots; what changes is what is restorable: position t needs the
 * keys of [t - W, t) (a query at t reads t-W+1..t, and its own row is written then). */

static int32_t win_offset(void *self) { return ((kv_window_cache *)self)->table->len; }

static void *win_snapshot(void *self, int32_t from) {
    return blk_snapshot(((kv_window_cache *)self)->table, from); /* holes stay NULL */
}

static bool win_covered(const kv_window_cache *w, int32_t target) {
    return kv_table_covers(w->table, target - w->window, target);
}

static bool win_restore(void *self, void *snap, int32_t target) {
    kv_window_cache *w = self;
    kv_table *t = w->table;
    kv_block_snap *s = snap;
    if (!s) {
        if (target < 0 || target > t->len || !win_covered(w, target)) return false;
        kv_table_truncate(t, target);
        return true;
    }
    if (target > s->to || t->len < s->from || target < s->from) return false;
    kv_table_truncate(t, s->from);
    const int32_t B = kv_pool_layout(t->pool)->block_tokens;
    int32_t end_block = target > s->from ? (target - 1) / B : s->first - 1;
    for (int32_t k = s->first; k <= end_block; k++) {
        kv_block *b = s->blocks[k - s->first];
        hl_status st = b ? kv_table_set(t, k, b, NULL) : kv_table_set_hole(t, k, NULL);
        if (st != HL_OK) {
            kv_table_truncate(t, s->from);
            return false;
        }
    }
    if (kv_table_set_len(t, target, NULL) != HL_OK || !win_covered(w, target)) {
        kv_table_truncate(t, s->from);
        return false;
    }
    return true;
}

static void win_free_state(void *self) { kv_table_truncate(((kv_window_cache *)self)->table, 0); }

const kv_cache_ops kv_window_cache_ops = {
    .offset = win_offset,
    .snapshot = win_snapshot,
    .restore = win_restore,
    .free_state = win_free_state,
    .split = blk_split,
    .merge = blk_merge,
    .snap_bytes = blk_bytes,
    .snap_close = blk_close,
};

void kv_window_trim(kv_window_cache *w) {
    const int32_t B = kv_pool_layout(w->table->pool)->block_tokens;
    /* a block of slack past the window: a request that rewinds a few tokens (the held
     * back last prompt token, a retried reply) still finds its window */
    kv_table_drop_below(w->table, w->table->len - w->window - B);
}

bool kv_pool_set_over_budget(void *ctx, const kv_prefix *pc) {
    const kv_pool_set *set = ctx;
    bool over = false;
    for (int i = 0; i < set->n; i++) over |= kv_pool_over_budget(set->pools[i], pc);
    if (set->state_pager) return !kv_state_pager_page(set->state_pager) || over;
    return over || (set->snapshot_budget && kv_prefix_snapshot_bytes(pc) > set->snapshot_budget);
}

bool kv_pool_over_budget(void *ctx, const kv_prefix *pc) {
    (void)pc;
    kv_pool *p = ctx;
    if (kv_pool_page(p)) return false;
    kv_pool_stats st = kv_pool_get_stats(p);
    if (st.disk_bytes > kv_pool_spill_max(p)) return true;
    return st.ram_bytes > kv_pool_budget(p) && kv_pool_cold_ram_bytes(p) > 0;
}

/* ---- whole state ---- */

typedef struct state_snap {
    int32_t offset;
    size_t n_floats;
    kv_state_pager *pager; /* NULL: always resident */
    struct state_snap *prev, *next; /* the pager's LRU list (head: least recent) */
    uint64_t id;
    kv_tier tier;
    float *data;  /* resident copy */
    uint8_t *z;   /* compressed bytes (tier COMPRESSED) */
    size_t zlen;  /* compressed size (also the spill file's) */
} state_snap;

struct kv_state_pager {
    size_t budget;
    char *spill_dir;
    size_t spill_max;
    unsigned pager_id;
    uint64_t next_id;
    state_snap *head, *tail;
    kv_state_stats st;
};

hl_status kv_state_pager_create(const kv_state_pager_config *cfg, kv_state_pager **out,
                                hl_err *err) {
    static unsigned next_pager_id;
    *out = NULL;
    kv_state_pager *p = calloc(1, sizeof *p);
    if (!p) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    p->budget = cfg->budget_bytes ? cfg->budget_bytes : SIZE_MAX;
    p->spill_max = cfg->spill_max_bytes ? cfg->spill_max_bytes : SIZE_MAX;
    p->pager_id = __atomic_fetch_add(&next_pager_id, 1, __ATOMIC_RELAXED);
    if (cfg->spill_dir && !(p->spill_dir = strdup(cfg->spill_dir))) {
        free(p);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    *out = p;
    return HL_OK;
}

void kv_state_pager_destroy(kv_state_pager *p) {
    if (!p) return;
    free(p->spill_dir);
    free(p);
}

kv_state_stats kv_state_pager_get_stats(const kv_state_pager *p) { return p->st; }

static void lru_unlink(kv_state_pager *p, state_snap *s) {
    if (s->prev) s->prev->next = s->next;
    else p->head = s->next;
    if (s->next) s->next->prev = s->prev;
    else p->tail = s->prev;
    s->prev = s->next = NULL;
}

static void lru_push(kv_state_pager *p, state_snap *s) { /* most recent at the tail */
    s->prev = p->tail;
    s->next = NULL;
    if (p->tail) p->tail->next = s;
    else p->head = s;
    p->tail = s;
}

static void state_spill_path(const kv_state_pager *p, const state_snap *s, char *buf, size_t n) {
    snprintf(buf, n, "%s/hearth-state-%ld-%u-%llu.z", p->spill_dir, (long)getpid(), p->pager_id,
             (unsigned long long)s->id);
}

/* Floats compress poorly as bytes; byte i of every float together does better. */
static void shuffle4(const uint8_t *src, uint8_t *dst, size_t n_bytes) {
    size_t n = n_bytes / 4;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < 4; j++) dst[j * n + i] = src[i * 4 + j];
}

static void unshuffle4(const uint8_t *src, uint8_t *dst, size_t n_bytes) {
    size_t n = n_bytes / 4;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < 4; j++) dst[i * 4 + j] = src[j * n + i];
}

static size_t snap_data_bytes(const state_snap *s) { return s->n_floats * sizeof(float); }

static bool state_compress(kv_state_pager *p, state_snap *s) {
    if (s->tier != KV_TIER_RESIDENT) return false;
    const size_t nb = snap_data_bytes(s), bound = ZSTD_compressBound(nb);
    uint8_t *tmp = malloc(nb ? nb : 1), *z = malloc(bound);
    if (!tmp || !z) {
        free(tmp);
        free(z);
        return false;
    }
    shuffle4((const uint8_t *)s->data, tmp, nb);
    const size_t zlen = ZSTD_compress(z, bound, tmp, nb, 1); /* level 1, as block.c */
    free(tmp);
    if (ZSTD_isError(zlen)) {
        free(z);
        return false;
    }
    uint8_t *shrunk = realloc(z, zlen ? zlen : 1);
    if (shrunk) z = shrunk;
    free(s->data);
    s->data = NULL;
    s->z = z;
    s->zlen = zlen;
    s->tier = KV_TIER_COMPRESSED;
    p->st.ram_bytes -= nb;
    p->st.ram_bytes += zlen;
    p->st.n_resident--;
    p->st.n_compressed++;
    p->st.n_paged_out++;
    return true;
}

static bool state_spill(kv_state_pager *p, state_snap *s) {
    if (s->tier != KV_TIER_COMPRESSED || !p->spill_dir) return false;
    if (p->st.disk_bytes + s->zlen > p->spill_max) return false;
    char path[4096];
    state_spill_path(p, s, path, sizeof path);
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(s->z, 1, s->zlen, f) == s->zlen;
    if (fclose(f) != 0) ok = false;
    if (!ok) {
        unlink(path);
        return false;
    }
    free(s->z);
    s->z = NULL;
    s->tier = KV_TIER_SPILLED;
    p->st.ram_bytes -= s->zlen;
    p->st.disk_bytes += s->zlen;
    p->st.n_compressed--;
    p->st.n_spilled++;
    return true;
}

/* Brings a snapshot back to RAM (uncompressed); false when its copy cannot be read or is
 * damaged (the snapshot stays where it was: a restore from it is refused). */
static bool state_make_resident(kv_state_pager *p, state_snap *s) {
    if (s->tier == KV_TIER_RESIDENT) return true;
    const size_t nb = snap_data_bytes(s);
    uint8_t *z = s->z;
    char path[4096] = "";
    if (s->tier == KV_TIER_SPILLED) {
        state_spill_path(p, s, path, sizeof path);
        z = malloc(s->zlen ? s->zlen : 1);
        FILE *f = z ? fopen(path, "rb") : NULL;
        bool ok = f && fread(z, 1, s->zlen, f) == s->zlen && fgetc(f) == EOF;
        if (f) fclose(f);
        if (!ok) {
            free(z);
            return false;
        }
    }
    uint8_t *tmp = malloc(nb ? nb : 1);
    float *d = malloc(nb ? nb : 1);
    size_t n = tmp && d ? ZSTD_decompress(tmp, nb, z, s->zlen) : 0;
    if (!tmp || !d || ZSTD_isError(n) || n != nb) {
        free(tmp);
        free(d);
        if (z != s->z) free(z);
        return false;
    }
    unshuffle4(tmp, (uint8_t *)d, nb);
    free(tmp);
    if (s->tier == KV_TIER_SPILLED) {
        free(z);
        unlink(path);
        p->st.disk_bytes -= s->zlen;
        p->st.n_spilled--;
    } else {
        free(s->z);
        p->st.ram_bytes -= s->zlen;
        p->st.n_compressed--;
    }
    s->z = NULL;
    s->zlen = 0;
    s->data = d;
    s->tier = KV_TIER_RESIDENT;
    p->st.ram_bytes += nb;
    p->st.n_resident++;
    p->st.n_paged_in++;
    return true;
}

bool kv_state_pager_page(kv_state_pager *p) {
    /* least recently used first: compress them all before anything goes to disk, so a
     * recent snapshot costs a decompression, not a file read */
    for (state_snap *s = p->head; s && p->st.ram_bytes > p->budget; s = s->next)
        state_compress(p, s);
    for (state_snap *s = p->head; s && p->st.ram_bytes > p->budget; s = s->next)
        state_spill(p, s);
    return p->st.ram_bytes <= p->budget && p->st.disk_bytes <= p->spill_max;
}

void kv_state_pager_page_out_all(kv_state_pager *p) {
    for (state_snap *s = p->head; s; s = s->next) {
        state_compress(p, s);
        state_spill(p, s);
    }
}

hl_status kv_state_cache_init(kv_state_cache *c, size_t n_floats, hl_err *err) {
    *c = (kv_state_cache){0};
    c->state = calloc(n_floats ? n_floats : 1, sizeof(float));
    if (!c->state) return hl_fail(err, HL_ERR_NOMEM, "out of memory for a cache state");
    c->n_floats = n_floats;
    return HL_OK;
}

void kv_state_cache_free(kv_state_cache *c) {
    free(c->state);
    *c = (kv_state_cache){0};
}

static int32_t st_offset(void *self) { return ((kv_state_cache *)self)->offset; }

static void *st_snapshot(void *self, int32_t from) {
    kv_state_cache *c = self;
    (void)from;
    if (c->offset == 0) return NULL;
    state_snap *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->data = malloc(c->n_floats ? c->n_floats * sizeof(float) : 1);
    if (!s->data) {
        free(s);
        return NULL;
    }
    s->offset = c->offset;
    s->n_floats = c->n_floats;
    s->tier = KV_TIER_RESIDENT;
    memcpy(s->data, c->state, c->n_floats * sizeof(float)); /* a compact, owned copy */
    kv_state_pager *p = c->pager;
    if (p) {
        s->pager = p;
        s->id = p->next_id++;
        lru_push(p, s);
        p->st.n_snaps++;
        p->st.n_resident++;
        p->st.ram_bytes += snap_data_bytes(s);
    }
    return s;
}

static bool st_restore(void *self, void *snap, int32_t target) {
    kv_state_cache *c = self;
    state_snap *s = snap;
    if (!s) return target == c->offset;
    if (target != s->offset || s->n_floats != c->n_floats) return false;
    kv_state_pager *p = s->pager;
    if (p) {
        if (!state_make_resident(p, s)) {
            p->st.n_lost++;
            return false;
        }
        lru_unlink(p, s);
        lru_push(p, s);
    }
    memcpy(c->state, s->data, c->n_floats * sizeof(float));
    c->offset = target;
    return true;
}

static void st_free_state(void *self) {
    kv_state_cache *c = self;
    memset(c->state, 0, c->n_floats * sizeof(float));
    c->offset = 0;
}

static void st_split(void *self, void *snap, int32_t at, void **head, void **tail) {
    (void)self;
    (void)at;
    *head = NULL;
    *tail = snap;
}

static void st_close(void *self, void *snap) {
    (void)self;
    state_snap *s = snap;
    if (!s) return;
    kv_state_pager *p = s->pager;
    if (p) {
        lru_unlink(p, s);
        p->st.n_snaps--;
        switch (s->tier) {
        case KV_TIER_RESIDENT:
            p->st.n_resident--;
            p->st.ram_bytes -= snap_data_bytes(s);
            break;
        case KV_TIER_COMPRESSED:
            p->st.n_compressed--;
            p->st.ram_bytes -= s->zlen;
            break;
        case KV_TIER_SPILLED: {
            char path[4096];
            state_spill_path(p, s, path, sizeof path);
            unlink(path);
            p->st.n_spilled--;
            p->st.disk_bytes -= s->zlen;
            break;
        }
        }
    }
    free(s->data);
    free(s->z);
    free(s);
}

static void *st_merge(void *self, void *parent, void *child) {
    st_close(self, parent);
    return child;
}

/* The snapshot's full size whatever its tier (the trie's counter needs a size that does
 * not change while it holds the snapshot; the pager counts the tiers). */
static size_t st_bytes(void *self, const void *snap) {
    (void)self;
    const state_snap *s = snap;
    return s ? sizeof *s + snap_data_bytes(s) : 0;
}

const kv_cache_ops kv_state_cache_ops = {
    .offset = st_offset,
    .snapshot = st_snapshot,
    .restore = st_restore,
    .free_state = st_free_state,
    .split = st_split,
    .merge = st_merge,
    .snap_bytes = st_bytes,
    .snap_close = st_close,
};
