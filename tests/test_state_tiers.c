/*
 * test_state_tiers.c - recurrent-state snapshots paged like KV blocks (kv/kvcache.h's
 * kv_state_pager; issue 13): under a small budget the least recently used go compressed,
 * then to a spill file, and come back exactly on restore; a damaged spill file is refused,
 * never used. Through the runner on a hybrid golden model (qwen35): a conversation whose
 * snapshots were paged out continues from the cache (cached tokens > 0, so the snapshot
 * was paged, not dropped) with exactly the tokens of a cold run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>

#include "kv/kvcache.h"
#include "model/model.h"
#include "runner/runner.h"
#include "runner_greedy.h"
#include "test.h"

enum { NF = 4096 };

static void fill(kv_state_cache *c, int seed) {
    for (int i = 0; i < NF; i++) c->state[i] = (float)((i * 7 + seed) % 101) * 0.01f - 0.5f;
}

/* The one spill file in dir (path into buf); false when there is not exactly one. */
static bool one_file(const char *dir, char *buf, size_t n) {
    DIR *d = opendir(dir);
    if (!d) return false;
    int k = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.' && k++ == 0) snprintf(buf, n, "%s/%s", dir, de->d_name);
    closedir(d);
    return k == 1;
}

TEST(kv_state_pager_compresses_spills_and_restores) {
    const char *dir = test_tmpdir();
    kv_state_pager *p = NULL;
    kv_state_pager_config cfg = {.budget_bytes = 1, .spill_dir = dir};
    CHECK_OK(kv_state_pager_create(&cfg, &p, NULL), NULL);
    kv_state_cache c;
    CHECK_OK(kv_state_cache_init(&c, NF, NULL), NULL);
    c.pager = p;
    fill(&c, 1);
    c.offset = 40;
    float want[NF];
    memcpy(want, c.state, sizeof want);
    void *s = kv_state_cache_ops.snapshot(&c, 0);
    CHECK(s);
    kv_state_stats st = kv_state_pager_get_stats(p);
    CHECK_EQ_INT(st.n_resident, 1);
    CHECK_EQ_INT(st.ram_bytes, NF * sizeof(float));
    CHECK(kv_state_pager_page(p)); /* compressed, then spilled: RAM 0 */
    st = kv_state_pager_get_stats(p);
    CHECK_EQ_INT(st.n_spilled, 1);
    CHECK_EQ_INT(st.n_compressed + st.n_resident, 0);
    CHECK_EQ_INT(st.ram_bytes, 0);
    CHECK(st.disk_bytes > 0 && st.disk_bytes < NF * sizeof(float));
    fill(&c, 2);
    c.offset = 48;
    CHECK(kv_state_cache_ops.restore(&c, s, 40)); /* back from the disk, exact */
    CHECK_EQ_INT(c.offset, 40);
    CHECK(memcmp(c.state, want, sizeof want) == 0);
    st = kv_state_pager_get_stats(p);
    CHECK_EQ_INT(st.n_resident, 1);
    CHECK_EQ_INT(st.disk_bytes, 0);
    CHECK_EQ_INT(st.n_paged_in, 1);
    /* the trie's counter sees a size that does not change with the tier */
    CHECK_EQ_INT(kv_state_cache_ops.snap_bytes(&c, s) >= NF * sizeof(float), 1);

    /* a damaged spill file: the restore is refused and the state left alone */
    CHECK(kv_state_pager_page(p));
    char path[4096];
    CHECK(one_file(dir, path, sizeof path));
    FILE *f = fopen(path, "r+b");
    CHECK(f);
    fseek(f, 3, SEEK_SET);
    fputc(0x5a, f);
    fputc(0xa5, f);
    fclose(f);
    fill(&c, 3);
    c.offset = 52;
    CHECK(!kv_state_cache_ops.restore(&c, s, 40));
    CHECK_EQ_INT(c.offset, 52);
    CHECK_EQ_INT(kv_state_pager_get_stats(p).n_lost, 1);
    kv_state_cache_ops.snap_close(&c, s);
    st = kv_state_pager_get_stats(p);
    CHECK_EQ_INT(st.n_snaps + st.n_spilled + st.disk_bytes + st.ram_bytes, 0);
    CHECK(!one_file(dir, path, sizeof path)); /* closing deletes the spill file */
    kv_state_cache_free(&c);
    kv_state_pager_destroy(p);
}

TEST(kv_state_pager_without_spill_dir_compresses_lru_first) {
    kv_state_pager *p = NULL;
    kv_state_pager_config cfg = {.budget_bytes = NF * sizeof(float) + NF};
    CHECK_OK(kv_state_pager_create(&cfg, &p, NULL), NULL);
    kv_state_cache c;
    CHECK_OK(kv_state_cache_init(&c, NF, NULL), NULL);
    c.pager = p;
    void *s[3];
    for (int i = 0; i < 3; i++) {
        fill(&c, i);
        c.offset = 10 + i;
        s[i] = kv_state_cache_ops.snapshot(&c, 0);
        CHECK(s[i]);
    }
    CHECK(kv_state_cache_ops.restore(&c, s[0], 10)); /* s[0] is now the most recent */
    CHECK(kv_state_pager_page(p));
    kv_state_stats st = kv_state_pager_get_stats(p);
    CHECK_EQ_INT(st.n_compressed, 2);
    CHECK_EQ_INT(st.n_resident, 1);
    CHECK_EQ_INT(st.n_spilled, 0);
    CHECK(st.ram_bytes <= cfg.budget_bytes);
    for (int i = 2; i >= 0; i--) {
        float want[NF];
        fill(&c, i);
        memcpy(want, c.state, sizeof want);
        fill(&c, 9);
        c.offset = 99;
        CHECK(kv_state_cache_ops.restore(&c, s[i], 10 + i));
        CHECK(memcmp(c.state, want, sizeof want) == 0);
    }
    /* a pager that cannot get under its budget says so: the trie then evicts */
    cfg.budget_bytes = 1;
    kv_state_pager *q = NULL;
    CHECK_OK(kv_state_pager_create(&cfg, &q, NULL), NULL);
    c.pager = q;
    void *t = kv_state_cache_ops.snapshot(&c, 0);
    CHECK(!kv_state_pager_page(q));
    CHECK_EQ_INT(kv_state_pager_get_stats(q).n_compressed, 1);
    kv_state_cache_ops.snap_close(&c, t);
    for (int i = 0; i < 3; i++) kv_state_cache_ops.snap_close(&c, s[i]);
    CHECK_EQ_INT(kv_state_pager_get_stats(p).ram_bytes, 0);
    kv_state_cache_free(&c);
    kv_state_pager_destroy(p);
    kv_state_pager_destroy(q);
}

/* The qwen35 golden model and its prompt; NULL (a skip) when HEARTH_SHARED lacks it. */
static model *qwen35(int32_t *prompt, int *n_prompt) {
    const char *gp = test_shared_path("testdata/arch/qwen35.gguf");
    model *m = NULL;
    if (!gp || model_load(gp, NULL, &m, NULL) != HL_OK) return NULL;
    const int32_t V = model_get_hparams(m)->n_vocab;
    *n_prompt = 60;
    for (int i = 0; i < *n_prompt; i++) prompt[i] = 1 + (i * 37 + 11) % (V - 1);
    return m;
}

static runner *tiny_runner(model *m, size_t budget, const char *spill) {
    runner_config cfg = {.n_threads = 1, .block_tokens = 8, .prefill_chunk = 16,
                         .kv_budget_bytes = budget, .spill_dir = spill, .n_parallel = 1,
                         .batch_tokens = 32};
    runner *r = NULL;
    return runner_create(m, &cfg, &r, NULL) == HL_OK ? r : NULL;
}

TEST(runner_hybrid_snapshot_paged_out_and_restored) {
    int32_t conv[160];
    int n = 0;
    model *m = qwen35(conv, &n);
    if (!m) SKIP("testdata/arch/qwen35.gguf not found (HEARTH_SHARED)");
    const size_t state_bytes = model_state_floats(m) * sizeof(float);
    /* less than one snapshot: every snapshot must leave RAM (spilled) to be kept */
    runner *warm = tiny_runner(m, state_bytes / 2, test_tmpdir());
    runner *fresh = tiny_runner(m, 0, NULL);
    CHECK(warm && fresh);
    collect a, b, cold;
    runner_stats sa, sb, sc;
    CHECK_OK(runner_greedy(warm, conv, n, 8, &a, &sa), NULL);
    CHECK_EQ_INT(a.n, 8);
    runner_cache_stats cs = runner_get_cache_stats(warm);
    fprintf(stderr, "    after A: %zu snapshots, %zu resident, %zu compressed, %zu spilled "
                    "(%zu B RAM, %zu B disk; one is %zu B)\n",
            cs.state.n_snaps, cs.state.n_resident, cs.state.n_compressed, cs.state.n_spilled,
            cs.state.ram_bytes, cs.state.disk_bytes, state_bytes);
    CHECK(cs.state.n_snaps > 0);
    CHECK(cs.state.n_spilled > 0);
    CHECK(cs.state.ram_bytes <= state_bytes / 2);
    for (int i = 0; i < a.n; i++) conv[n++] = a.toks[i];
    for (int i = 0; i < 10; i++) conv[n++] = 100 + i;
    CHECK_OK(runner_greedy(warm, conv, n, 10, &b, &sb), NULL);
    cs = runner_get_cache_stats(warm);
    fprintf(stderr, "    B: cached %d of %d; %llu paged in\n", (int)sb.cached_tokens, n,
            (unsigned long long)cs.state.n_paged_in);
    /* dropped instead of paged: nothing cached */
    CHECK_MSG(sb.cached_tokens > 0, "the paged-out snapshot was not restored");
    CHECK(cs.state.n_paged_in > 0);
    CHECK_OK(runner_greedy(fresh, conv, n, 10, &cold, &sc), NULL);
    CHECK_EQ_INT(sc.cached_tokens, 0);
    CHECK_EQ_INT(cold.n, b.n);
    for (int i = 0; i < cold.n; i++)
        CHECK_MSG(b.toks[i] == cold.toks[i], "token %d after the restore is %d, cold %d", i,
                  b.toks[i], cold.toks[i]);
    /* idle: the fresh runner's (unbounded) snapshots leave RAM too, and still restore */
    CHECK(runner_get_cache_stats(fresh).state.n_resident > 0);
    runner_page_out_idle(fresh);
    cs = runner_get_cache_stats(fresh);
    CHECK_EQ_INT(cs.state.n_resident, 0);
    CHECK(cs.state.n_compressed > 0);
    collect again;
    CHECK_OK(runner_greedy(fresh, conv, n, 10, &again, &sc), NULL);
    CHECK(sc.cached_tokens > 0);
    for (int i = 0; i < cold.n; i++) CHECK_EQ_INT(again.toks[i], cold.toks[i]);
    runner_destroy(warm);
    runner_destroy(fresh);
    model_free(m);
}
