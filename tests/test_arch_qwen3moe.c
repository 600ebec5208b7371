/*
 * test_arch_qwen3moe.c - qwen3moe (qwen3 attention, mixture-of-experts feed-forward)
 * against llama.cpp's goldens (tests/arch_golden.h), F32 and Q8_0; and a batch evaluated
 * at once (tokens grouped by expert) equals the same tokens evaluated one at a time.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch_golden.h"
#include "model/model.h"
#include "test.h"

TEST(arch_qwen3moe) { arch_golden_check("qwen3moe"); }
TEST(arch_qwen3moe_q8_0) { arch_golden_check("qwen3moe-q8_0"); }

#define N_TOK 64

/* Grouping a batch's tokens by expert must not change any token's result beyond float
 * rounding: 64 tokens (8 experts, 2 per token: every expert gets several tokens) in one
 * eval against 64 evals of one token, every position's logits within 1e-4. */
TEST(arch_qwen3moe_batch_equals_token_by_token) {
    const char *gp = test_shared_path("testdata/arch/qwen3moe.gguf");
    if (!gp) SKIP("testdata/arch/qwen3moe.gguf not found (HEARTH_SHARED)");
    model *m = NULL;
    CHECK_OK(model_load(gp, NULL, &m, NULL), NULL);
    const int32_t V = model_get_hparams(m)->n_vocab;
    int32_t toks[N_TOK];
    for (int i = 0; i < N_TOK; i++) toks[i] = (i * 97 + 13) % V;
    float *batch = malloc(sizeof(float) * (size_t)V * N_TOK);
    float *step = malloc(sizeof(float) * (size_t)V * N_TOK);
    model_ctx *c = NULL;
    model_kv *a = NULL, *b = NULL;
    CHECK_OK(model_ctx_create(m, 2, N_TOK, &c, NULL), NULL);
    CHECK_OK(model_kv_create(m, 128, &a, NULL), NULL);
    CHECK_OK(model_kv_create(m, 128, &b, NULL), NULL);
    CHECK_OK(model_eval(c, a, toks, N_TOK, batch, NULL), NULL);
    for (int i = 0; i < N_TOK; i++)
        CHECK_OK(model_eval(c, b, &toks[i], 1, step + (size_t)i * V, NULL), NULL);
    double d = 0, mx = 0;
    for (size_t i = 0; i < (size_t)V * N_TOK; i++) {
        d = fmax(d, fabs(batch[i] - step[i]));
        mx = fmax(mx, fabs(batch[i]));
    }
    fprintf(stderr, "    %d tokens: max |logit diff| %.3g (|logit| <= %.3g)\n", N_TOK, d, mx);
    CHECK_MSG(mx > 0.1, "degenerate logits");
    CHECK_NEAR(d, 0, 1e-4);
    free(batch);
    free(step);
    model_kv_free(a);
    model_kv_free(b);
    model_ctx_free(c);
    model_free(m);
}
