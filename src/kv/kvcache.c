/*
 * kvcache.c - block KV and whole-state cache kinds for the prefix trie.
 */
#include "kv/kvcache.h"

#include <stdlib.h>
#include <string.h>

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
    float data[];
} state_snap;

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
    state_snap *s = malloc(sizeof *s + c->n_floats * sizeof(float));
    if (!s) return NULL;
    s->offset = c->offset;
    s->n_floats = c->n_floats;
    memcpy(s->data, c->state, c->n_floats * sizeof(float)); /* a compact, owned copy */
    return s;
}

static bool st_restore(void *self, void *snap, int32_t target) {
    kv_state_cache *c = self;
    state_snap *s = snap;
    if (!s) return target == c->offset;
    if (target != s->offset || s->n_floats != c->n_floats) return false;
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
    free(snap);
}

static void *st_merge(void *self, void *parent, void *child) {
    st_close(self, parent);
    return child;
}

static size_t st_bytes(void *self, const void *snap) {
    (void)self;
    const state_snap *s = snap;
    return s ? sizeof *s + s->n_floats * sizeof(float) : 0;
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
