/*
 * test_kv_block.c - KV blocks: copy-on-write sharing, paging tiers (zstd in RAM, disk
 * spill), the block cache kind under the prefix trie (every row checked against the
 * token prefix it must encode), and the whole-state kind's compact snapshots.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kv/block.h"
#include "kv/kvcache.h"
#include "kv/trie.h"
#include "test.h"

static const kv_layout LAYOUT = {.n_layer = 2, .n_head_kv = 2, .head_dim_k = 4,
                                 .head_dim_v = 3, .block_tokens = 8};

static kv_pool *pool_new(size_t budget, const char *spill) {
    kv_pool_config cfg = {.layout = LAYOUT, .budget_bytes = budget, .spill_dir = spill};
    kv_pool *p = NULL;
    if (kv_pool_create(&cfg, &p, NULL) != HL_OK) return NULL;
    return p;
}

/* The value every K/V element of position p must hold: a function of the whole prefix
 * seq[0..p], so a row shared or restored from the wrong branch is caught. */
static float row_val(uint32_t prefix_hash, int layer, int head, int d, bool is_v) {
    return (float)((prefix_hash + (uint32_t)layer * 131u + (uint32_t)head * 17u + (uint32_t)d * 3u +
                    (is_v ? 7u : 0u)) % 100003u);
}

static uint32_t prefix_hash(const int32_t *seq, int32_t p) {
    uint32_t h = 2166136261u;
    for (int32_t i = 0; i <= p; i++) h = (h ^ (uint32_t)seq[i]) * 16777619u;
    return h;
}

/* A stand-in forward pass: writes rows for seq[len..n). */
static hl_status fake_forward(kv_table *t, const int32_t *seq, int32_t n) {
    int32_t n_new = n - t->len;
    if (n_new <= 0) return HL_OK;
    hl_status st = kv_table_reserve(t, n_new, NULL);
    if (st) return st;
    const int32_t B = LAYOUT.block_tokens;
    for (int32_t p = t->len; p < n; p++) {
        uint32_t h = prefix_hash(seq, p);
        float *data = t->data[p / B];
        for (int l = 0; l < LAYOUT.n_layer; l++)
            for (int hd = 0; hd < LAYOUT.n_head_kv; hd++) {
                float *k = kv_block_k_row(t->pool, data, l, hd, p % B);
                float *v = kv_block_v_row(t->pool, data, l, hd, p % B);
                for (int d = 0; d < LAYOUT.head_dim_k; d++) k[d] = row_val(h, l, hd, d, false);
                for (int d = 0; d < LAYOUT.head_dim_v; d++) v[d] = row_val(h, l, hd, d, true);
            }
    }
    kv_table_commit(t, n_new);
    return HL_OK;
}

/* -1 when every row of the table encodes seq, else the first bad position. */
static int32_t table_check(const kv_table *t, const int32_t *seq) {
    const int32_t B = LAYOUT.block_tokens;
    for (int32_t p = 0; p < t->len; p++) {
        uint32_t h = prefix_hash(seq, p);
        float *data = t->data[p / B];
        if (!data || data != kv_block_data(t->blocks[p / B])) return p;
        if (kv_block_valid(t->blocks[p / B]) <= p % B) return p;
        for (int l = 0; l < LAYOUT.n_layer; l++)
            for (int hd = 0; hd < LAYOUT.n_head_kv; hd++) {
                float *k = kv_block_k_row(t->pool, data, l, hd, p % B);
                float *v = kv_block_v_row(t->pool, data, l, hd, p % B);
                for (int d = 0; d < LAYOUT.head_dim_k; d++)
                    if (k[d] != row_val(h, l, hd, d, false)) return p;
                for (int d = 0; d < LAYOUT.head_dim_v; d++)
                    if (v[d] != row_val(h, l, hd, d, true)) return p;
            }
    }
    return -1;
}

TEST(kv_block_layout_and_bad_config) {
    CHECK_EQ_INT(kv_layout_block_bytes(&LAYOUT), 2 * 2 * 8 * (4 + 3) * 4);
    kv_layout bad = LAYOUT;
    bad.block_tokens = 0;
    CHECK_EQ_INT(kv_layout_block_bytes(&bad), 0);
    kv_pool_config cfg = {.layout = bad};
    kv_pool *p = NULL;
    hl_err err;
    CHECK(kv_pool_create(&cfg, &p, &err) == HL_ERR_INVALID);
    CHECK(strstr(err.msg, "invalid KV layout") != NULL);
    CHECK(p == NULL);
    CHECK(kv_default_budget() >= ((size_t)64 << 20));
}

TEST(kv_block_shared_prefix_copy_on_write) {
    kv_pool *p = pool_new((size_t)64 << 20, NULL);
    CHECK(p);
    int32_t a[40], b[40];
    for (int i = 0; i < 40; i++) a[i] = b[i] = i + 1;
    for (int i = 20; i < 40; i++) b[i] = 900 + i; /* diverges at 20, inside block 2 */
    kv_table ta, tb;
    kv_table_init(&ta, p);
    kv_table_init(&tb, p);
    CHECK_OK(fake_forward(&ta, a, 20), NULL);
    /* tb takes ta's blocks (what a trie snapshot restore does) */
    for (int32_t k = 0; k < ta.n_blocks; k++) CHECK_OK(kv_table_set(&tb, k, ta.blocks[k], NULL), NULL);
    CHECK_OK(kv_table_set_len(&tb, 20, NULL), NULL);
    CHECK_EQ_INT(kv_pool_get_stats(p).n_blocks, 3);
    /* ta appends at n_valid: in place, still shared */
    CHECK_OK(fake_forward(&ta, a, 40), NULL);
    CHECK(ta.blocks[2] == tb.blocks[2]);
    CHECK_EQ_INT(kv_pool_get_stats(p).n_cow, 0);
    /* tb writes row 20 of block 2 that ta already wrote: copy on write */
    CHECK_OK(fake_forward(&tb, b, 40), NULL);
    CHECK(ta.blocks[2] != tb.blocks[2]);
    CHECK(ta.blocks[1] == tb.blocks[1] && ta.blocks[0] == tb.blocks[0]);
    CHECK_EQ_INT(kv_pool_get_stats(p).n_cow, 1);
    CHECK_EQ_INT(table_check(&ta, a), -1);
    CHECK_EQ_INT(table_check(&tb, b), -1);
    /* 2 shared + 2*3 private blocks */
    CHECK_EQ_INT(kv_pool_get_stats(p).n_blocks, 8);
    /* a sole owner rewinds and overwrites in place */
    kv_table_truncate(&ta, 35);
    a[35] = 4242;
    CHECK_OK(fake_forward(&ta, a, 40), NULL);
    CHECK_EQ_INT(kv_pool_get_stats(p).n_cow, 1);
    CHECK_EQ_INT(table_check(&ta, a), -1);
    kv_table_free(&ta);
    kv_table_free(&tb);
    CHECK_EQ_INT(kv_pool_get_stats(p).n_blocks, 0);
    kv_pool_destroy(p);
}

static int count_spill_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, "hearth-kv-", 10) == 0) n++;
    closedir(d);
    return n;
}

TEST(kv_block_paging_compress_spill_restore) {
    const char *dir = test_tmpdir();
    kv_pool *p = pool_new((size_t)64 << 20, dir);
    CHECK(p);
    const size_t bb = kv_layout_block_bytes(&LAYOUT);
    int32_t seq[64];
    for (int i = 0; i < 64; i++) seq[i] = i * 7 + 3;
    kv_table t;
    kv_table_init(&t, p);
    CHECK_OK(fake_forward(&t, seq, 64), NULL);
    kv_block_snap *snap = kv_block_cache_ops.snapshot(&t, 0);
    CHECK(snap && snap->n == 8);
    /* live tables pin their blocks: nothing can be paged */
    kv_pool_set_budget(p, 1);
    CHECK(!kv_pool_page(p));
    CHECK_EQ_INT(kv_pool_get_stats(p).n_resident, 8);
    kv_table_free(&t);
    /* now only the snapshot holds them: budget of 3 resident blocks -> compress the rest */
    kv_pool_set_budget(p, 3 * bb);
    CHECK(kv_pool_page(p));
    kv_pool_stats st = kv_pool_get_stats(p);
    CHECK(st.n_compressed >= 5);
    CHECK(st.ram_bytes <= 3 * bb);
    /* a budget no compressed block fits in spills to disk */
    kv_pool_set_budget(p, 1);
    CHECK(kv_pool_page(p));
    st = kv_pool_get_stats(p);
    CHECK_EQ_INT(st.n_spilled, 8);
    CHECK_EQ_INT(st.ram_bytes, 0);
    CHECK(st.disk_bytes > 0);
    CHECK_EQ_INT(count_spill_files(dir), 8);
    /* restoring pages everything back in, bit-exact */
    kv_pool_set_budget(p, (size_t)64 << 20);
    kv_table_init(&t, p);
    CHECK(kv_block_cache_ops.restore(&t, snap, 64));
    CHECK_EQ_INT(t.len, 64);
    CHECK_EQ_INT(table_check(&t, seq), -1);
    st = kv_pool_get_stats(p);
    CHECK_EQ_INT(st.n_resident, 8);
    CHECK_EQ_INT(st.disk_bytes, 0);
    CHECK_EQ_INT(count_spill_files(dir), 0);
    CHECK(st.n_paged_in >= 8);
    kv_table_free(&t);
    /* spill again, then the pool goes away: files are removed */
    kv_pool_page_out_cold(p);
    CHECK_EQ_INT(count_spill_files(dir), 8);
    kv_block_cache_ops.snap_close(NULL, snap);
    CHECK_EQ_INT(count_spill_files(dir), 0);
    kv_pool_destroy(p);
}

TEST(kv_block_lost_spill_file_fails_restore_cleanly) {
    const char *dir = test_tmpdir();
    kv_pool *p = pool_new((size_t)64 << 20, dir);
    int32_t seq[16];
    for (int i = 0; i < 16; i++) seq[i] = i;
    kv_table t;
    kv_table_init(&t, p);
    CHECK_OK(fake_forward(&t, seq, 16), NULL);
    kv_block_snap *snap = kv_block_cache_ops.snapshot(&t, 0);
    kv_table_free(&t);
    kv_pool_page_out_cold(p);
    CHECK_EQ_INT(kv_block_tier(snap->blocks[1]), KV_TIER_SPILLED);
    DIR *d = opendir(dir);
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, "hearth-kv-", 10) == 0) {
            char path[1024];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            FILE *f = fopen(path, "wb"); /* truncate: a corrupt/short spill file */
            fclose(f);
        }
    closedir(d);
    hl_err err;
    CHECK(kv_block_make_resident(p, snap->blocks[0], &err) != HL_OK);
    CHECK(strstr(err.msg, "KV block") != NULL);
    kv_table_init(&t, p);
    CHECK(!kv_block_cache_ops.restore(&t, snap, 16));
    CHECK_EQ_INT(t.len, 0);
    kv_table_free(&t);
    kv_block_cache_ops.snap_close(NULL, snap);
    kv_pool_destroy(p);
}

TEST(kv_block_snapshot_split_merge_keep_only_their_blocks) {
    kv_pool *p = pool_new((size_t)64 << 20, NULL);
    int32_t seq[40];
    for (int i = 0; i < 40; i++) seq[i] = i + 5;
    kv_table t;
    kv_table_init(&t, p);
    CHECK_OK(fake_forward(&t, seq, 40), NULL);
    kv_block_snap *s = kv_block_cache_ops.snapshot(&t, 12); /* [12,40): blocks 1..4 */
    CHECK_EQ_INT(s->first, 1);
    CHECK_EQ_INT(s->n, 4);
    CHECK_EQ_INT(kv_block_cache_ops.snap_bytes(NULL, s), 4 * kv_layout_block_bytes(&LAYOUT));
    void *h, *tl;
    kv_block_cache_ops.split(NULL, s, 20, &h, &tl);
    kv_block_snap *hs = h, *ts = tl;
    CHECK(hs && ts);
    CHECK_EQ_INT(hs->first, 1);
    CHECK_EQ_INT(hs->n, 2); /* [12,20): blocks 1,2 */
    CHECK_EQ_INT(ts->first, 2);
    CHECK_EQ_INT(ts->n, 3); /* [20,40): blocks 2,3,4 */
    kv_table_free(&t);
    CHECK_EQ_INT(kv_pool_get_stats(p).n_blocks, 4); /* block 0 is gone: nobody holds it */
    kv_block_snap *m = kv_block_cache_ops.merge(NULL, hs, ts);
    CHECK(m && m->from == 12 && m->to == 40 && m->n == 4);
    /* restore needs the live cache to reach the snapshot's start */
    kv_table_init(&t, p);
    CHECK(!kv_block_cache_ops.restore(&t, m, 30));
    CHECK_OK(fake_forward(&t, seq, 12), NULL);
    CHECK(kv_block_cache_ops.restore(&t, m, 30));
    CHECK_EQ_INT(t.len, 30);
    CHECK_EQ_INT(table_check(&t, seq), -1);
    CHECK(!kv_block_cache_ops.restore(&t, m, 41));
    kv_block_cache_ops.snap_close(NULL, m);
    kv_table_free(&t);
    CHECK_EQ_INT(kv_pool_get_stats(p).n_blocks, 0);
    kv_pool_destroy(p);
}

TEST(kv_state_snapshot_is_a_compact_copy) {
    kv_state_cache c;
    CHECK_OK(kv_state_cache_init(&c, 10, NULL), NULL);
    for (int i = 0; i < 10; i++) c.state[i] = (float)i;
    c.offset = 7;
    void *s = kv_state_cache_ops.snapshot(&c, 3);
    CHECK(s);
    CHECK(kv_state_cache_ops.snap_bytes(&c, s) <= 10 * sizeof(float) + 128); /* + a header */
    c.state[0] = 99; /* the snapshot must not see later updates */
    c.offset = 9;
    CHECK(!kv_state_cache_ops.restore(&c, NULL, 7)); /* cannot rewind */
    CHECK(!kv_state_cache_ops.restore(&c, s, 6));    /* only exactly at its offset */
    CHECK(kv_state_cache_ops.restore(&c, s, 7));
    CHECK_EQ_INT(c.offset, 7);
    CHECK_NEAR(c.state[0], 0, 0);
    void *h, *t;
    kv_state_cache_ops.split(&c, s, 5, &h, &t);
    CHECK(h == NULL && t == s);
    kv_state_cache_ops.snap_close(&c, s);
    kv_state_cache_free(&c);
}

/* ---- the block kind under the prefix trie ---- */

typedef struct blk_env {
    kv_pool *pool;
    kv_table table;
    kv_cache cache;
    kv_prefix *pc;
} blk_env;

static bool blk_env_init(blk_env *e, size_t budget, const char *spill) {
    e->pool = pool_new(budget, spill);
    if (!e->pool) return false;
    kv_table_init(&e->table, e->pool);
    e->cache = (kv_cache){&kv_block_cache_ops, &e->table};
    kv_prefix_config cfg = {.caches = &e->cache, .n_caches = 1,
                            .over_budget = kv_pool_over_budget, .budget_ctx = e->pool,
                            .page_out_on_close = true};
    return kv_prefix_create(&cfg, &e->pc, NULL) == HL_OK;
}

static void blk_env_free(blk_env *e) {
    kv_prefix_destroy(e->pc);
    kv_table_free(&e->table);
    kv_pool_destroy(e->pool);
}

/* begin, check restored rows, compute the rest + gen, close. Returns remaining or -1. */
static int32_t blk_req(blk_env *e, const int32_t *in, int32_t n, const int32_t *gen, int32_t ng) {
    kv_session s;
    if (kv_prefix_begin(e->pc, in, n, &s, NULL)) return -1;
    int32_t remaining = n - s.prefix;
    bool ok = e->table.len == s.prefix && table_check(&e->table, in) < 0;
    kv_session_schedule_prefill(&s);
    if (ok && fake_forward(&e->table, in, n)) ok = false;
    if (ok) kv_session_snapshot(&s, NULL);
    if (ok && ng > 0) {
        kv_session_add_outputs(&s, gen, ng, NULL);
        int32_t all[512];
        memcpy(all, in, (size_t)n * sizeof *in);
        memcpy(all + n, gen, (size_t)ng * sizeof *gen);
        if (fake_forward(&e->table, all, n + ng)) ok = false;
    }
    if (kv_session_close(&s, NULL)) ok = false;
    return ok ? remaining : -1;
}

TEST(kv_block_trie_shares_system_prompt) {
    blk_env e;
    CHECK(blk_env_init(&e, (size_t)64 << 20, NULL));
    int32_t sys = 100;
    int32_t a[130], b[130];
    for (int i = 0; i < 130; i++) a[i] = b[i] = 1000 + i;
    for (int i = sys; i < 130; i++) b[i] = 5000 + i;
    CHECK_EQ_INT(blk_req(&e, a, 120, NULL, 0), 120);
    size_t after_a = kv_pool_get_stats(e.pool).n_blocks; /* 15 blocks */
    CHECK_EQ_INT(blk_req(&e, b, 120, NULL, 0), 20);
    size_t after_b = kv_pool_get_stats(e.pool).n_blocks;
    /* b shares the 12 full system blocks and copies the one it diverges in */
    CHECK_EQ_INT(after_a, 15);
    CHECK_EQ_INT(after_b, 15 + 3);
    /* alternate: each hit restores the whole other conversation */
    CHECK_EQ_INT(blk_req(&e, a, 125, NULL, 0), 5);
    CHECK_EQ_INT(blk_req(&e, b, 125, NULL, 0), 5);
    CHECK_EQ_INT(blk_req(&e, a, 125, NULL, 0), 1); /* fully cached: last token re-evaluated */
    CHECK_OK(kv_trie_check(e.pc, NULL), NULL);
    blk_env_free(&e);
}

/* Random branching conversations under a budget small enough to page (and, without a
 * spill directory, to evict); every restored row is checked against its prefix. */
static void random_conversations(const char *dir) {
    blk_env e;
    CHECK(blk_env_init(&e, 12 * kv_layout_block_bytes(&LAYOUT), dir));
    uint64_t rng = 12345;
    int32_t convs[6][400];
    int32_t lens[6] = {0};
    for (int c = 0; c < 6; c++)
        for (int i = 0; i < 20; i++) convs[c][i] = i + 1; /* shared system prompt */
    for (int c = 0; c < 6; c++) lens[c] = 20;
    for (int step = 0; step < 80; step++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int c = (int)((rng >> 33) % 6);
        int32_t add = 1 + (int32_t)((rng >> 40) % 12);
        if (lens[c] + add + 4 > 400) lens[c] = 20 + (int32_t)((rng >> 20) % 10); /* edit */
        for (int32_t i = 0; i < add; i++) convs[c][lens[c] + i] = (int32_t)((rng >> (i % 16)) % 50) + c * 100;
        lens[c] += add;
        int32_t gen[3] = {7 + c, 8, 9};
        memcpy(&convs[c][lens[c]], gen, sizeof gen);
        int32_t r = blk_req(&e, convs[c], lens[c], gen, 3);
        CHECK_MSG(r >= 0, "step %d conversation %d failed", step, c);
        lens[c] += 3;
        CHECK_OK(kv_trie_check(e.pc, NULL), NULL);
    }
    kv_pool_stats st = kv_pool_get_stats(e.pool);
    CHECK(st.n_paged_out > 0);
    CHECK(st.n_paged_in > 0);
    /* only the live conversation's blocks may exceed the budget: they cannot be paged */
    CHECK(st.ram_bytes <= (12 + (size_t)e.table.n_blocks) * kv_layout_block_bytes(&LAYOUT));
    if (dir) {
        CHECK(st.n_spilled > 0);
    } else {
        CHECK(kv_prefix_evictions(e.pc) > 0);
    }
    blk_env_free(&e);
    if (dir) CHECK_EQ_INT(count_spill_files(dir), 0);
}

TEST(kv_block_trie_random_conversations_stay_consistent) {
    random_conversations(test_tmpdir());
    if (test_failed()) return;
    random_conversations(NULL);
}

TEST(kv_block_eviction_only_when_paging_cannot_help) {
    const char *dir = test_tmpdir();
    const size_t bb = kv_layout_block_bytes(&LAYOUT);
    int32_t conv[4][64];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 64; i++) conv[k][i] = i < 10 ? i + 1 : 100 * k + i;
    /* unlimited disk: the live conversation alone is over the 2-block budget, yet nothing
     * cached is evicted - it all goes to disk */
    blk_env e;
    CHECK(blk_env_init(&e, 2 * bb, dir));
    for (int k = 0; k < 4; k++) CHECK(blk_req(&e, conv[k], 60, NULL, 0) >= 0);
    CHECK_EQ_INT(kv_prefix_evictions(e.pc), 0);
    CHECK(kv_pool_get_stats(e.pool).n_spilled > 0);
    CHECK_EQ_INT(blk_req(&e, conv[0], 64, NULL, 0), 4);
    blk_env_free(&e);
    /* a disk cap of 3 blocks: the oldest conversations are evicted to respect it */
    CHECK(blk_env_init(&e, 2 * bb, dir));
    kv_pool_destroy(e.pool);
    kv_pool_config cfg = {.layout = LAYOUT, .budget_bytes = 2 * bb, .spill_dir = dir,
                          .spill_max_bytes = 3 * bb};
    kv_prefix_destroy(e.pc);
    CHECK_OK(kv_pool_create(&cfg, &e.pool, NULL), NULL);
    kv_table_init(&e.table, e.pool);
    kv_prefix_config tc = {.caches = &e.cache, .n_caches = 1, .over_budget = kv_pool_over_budget,
                           .budget_ctx = e.pool, .page_out_on_close = true};
    CHECK_OK(kv_prefix_create(&tc, &e.pc, NULL), NULL);
    for (int k = 0; k < 4; k++) CHECK(blk_req(&e, conv[k], 60, NULL, 0) >= 0);
    CHECK(kv_prefix_evictions(e.pc) > 0);
    CHECK(kv_pool_get_stats(e.pool).disk_bytes <= 3 * bb);
    CHECK_OK(kv_trie_check(e.pc, NULL), NULL);
    blk_env_free(&e);
}
