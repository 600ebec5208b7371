/*
 * test_window.c - sliding-window models (gemma3: 5 local layers with a window of 8 : 1
 * global) through the runner and its prefix cache: a conversation that continues after
 * the window has slid is served from the cache and gives exactly the tokens of a cold run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/runner.h"
#include "runner_greedy.h"
#include "test.h"

static model *window_model(void) {
    static model *m;
    const char *p = test_shared_path("testdata/arch/gemma3.gguf");
    if (!m && p && model_load(p, NULL, &m, NULL) != HL_OK) m = NULL;
    return m;
}

static runner *new_runner(void) {
    runner_config cfg = {.n_threads = 1, .block_tokens = 8, .prefill_chunk = 16,
                         .kv_budget_bytes = (size_t)64 << 20, .n_parallel = 2,
                         .batch_tokens = 32};
    runner *r = NULL;
    return runner_create(window_model(), &cfg, &r, NULL) == HL_OK ? r : NULL;
}

TEST(window_conversation_continues_from_the_cache_after_the_window_slid) {
    if (!window_model()) SKIP("testdata/arch/gemma3.gguf not found");
    const model_hparams *hp = model_get_hparams(window_model());
    CHECK(hp->n_layer == 6);
    /* turn 1: 30 prompt tokens and 100 generated ones, far past the window of 8 */
    int32_t conv[256];
    int n = 0;
    for (int i = 0; i < 30; i++) conv[n++] = 3 + (i * 37) % (hp->n_vocab - 3);
    runner *warm = new_runner();
    CHECK(warm);
    collect c1, c2, cold;
    runner_stats s1, s2, s3;
    CHECK_OK(runner_greedy(warm, conv, n, 100, &c1, &s1), NULL);
    CHECK_EQ_INT(c1.n, 100);
    /* the windowed layers keep about W + 2B positions live, and as much per snapshot (the
     * prompt's, at 26); the global ones all 130 */
    CHECK(runner_kv_window_pool(warm));
    kv_pool_stats full = kv_pool_get_stats(runner_kv_pool(warm));
    kv_pool_stats win = kv_pool_get_stats(runner_kv_window_pool(warm));
    fprintf(stderr, "    blocks after 130 positions: full %zu, window %zu\n", full.n_blocks,
            win.n_blocks);
    CHECK(full.n_blocks >= 17);
    CHECK(win.n_blocks <= 7);
    for (int i = 0; i < c1.n; i++) conv[n++] = c1.toks[i];
    /* turn 2: the whole conversation plus a new question */
    for (int i = 0; i < 10; i++) conv[n++] = 100 + i;
    CHECK_OK(runner_greedy(warm, conv, n, 20, &c2, &s2), NULL);
    CHECK_MSG(s2.cached_tokens >= 129, "cached %d of %d", (int)s2.cached_tokens, n);
    /* the same conversation on a fresh runner computes everything */
    runner *fresh = new_runner();
    CHECK(fresh);
    CHECK_OK(runner_greedy(fresh, conv, n, 20, &cold, &s3), NULL);
    CHECK_EQ_INT(s3.cached_tokens, 0);
    CHECK_EQ_INT(cold.n, c2.n);
    for (int i = 0; i < cold.n; i++) CHECK_EQ_INT(c2.toks[i], cold.toks[i]);
    /* and both equal a plain evaluation of the model over one contiguous cache */
    model_ctx *ctx;
    model_kv *kv;
    CHECK_OK(model_ctx_create(window_model(), 1, 64, &ctx, NULL), NULL);
    CHECK_OK(model_kv_create(window_model(), 256, &kv, NULL), NULL);
    CHECK_OK(model_eval(ctx, kv, conv, n, NULL, NULL), NULL);
    for (int i = 0; i < cold.n; i++) {
        const float *l = model_ctx_logits(ctx);
        int32_t best = 0;
        for (int32_t v = 1; v < hp->n_vocab; v++)
            if (l[v] > l[best]) best = v;
        CHECK_EQ_INT(best, cold.toks[i]);
        CHECK_OK(model_eval(ctx, kv, &best, 1, NULL, NULL), NULL);
    }
    model_kv_free(kv);
    model_ctx_free(ctx);

    /* a prompt that leaves the conversation inside its first turn, where the windowed
     * layers kept nothing: it restarts from the nearest restorable point, never from a
     * wrong state (the fresh runner saw only the long conversation) */
    int32_t branch[64];
    memcpy(branch, conv, 24 * sizeof *branch);
    for (int i = 0; i < 6; i++) branch[24 + i] = 200 + i;
    collect b_warm, b_cold;
    runner_stats sb;
    CHECK_OK(runner_greedy(warm, branch, 30, 12, &b_warm, &sb), NULL);
    runner *fresh2 = new_runner();
    CHECK(fresh2);
    CHECK_OK(runner_greedy(fresh2, branch, 30, 12, &b_cold, &s3), NULL);
    CHECK_EQ_INT(b_warm.n, b_cold.n);
    for (int i = 0; i < b_cold.n; i++) CHECK_EQ_INT(b_warm.toks[i], b_cold.toks[i]);
    runner_destroy(warm);
    runner_destroy(fresh);
    runner_destroy(fresh2);
}
