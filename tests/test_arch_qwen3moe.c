/*
 * test_arch_qwen3moe.c - qwen3moe (qwen3 attention, mixture-of-experts feed-forward)
 * against llama.cpp's goldens (tests/arch_golden.h), F32 and Q8_0; and a batch evaluated
 * at once (tokens grouped by expert) equals the same tokens evaluated one at a time; bad
 * expert hyperparameters are named in the load error.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch_golden.h"
#include "arch_recurrent.h"
#include "model/model.h"
#include "model_synth.h"
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
    arch_steps_check(m, toks, N_TOK, 128, (const int[]){1}, 1, 1e-4);
    model_free(m);
}

/* A qwen3moe GGUF with the given expert keys (-1: absent) and no tensors: the
 * hyperparameters are read before any tensor. */
static hl_status write_moe_hp(const char *path, int n_expert, int n_used, int n_ff_exp,
                              hl_err *err) {
    gguf_writer *w = gguf_writer_create();
    if (!w) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    gguf_writer_set_u32(w, "qwen3moe.context_length", 64);
    gguf_writer_set_u32(w, "qwen3moe.embedding_length", 32);
    gguf_writer_set_u32(w, "qwen3moe.block_count", 1);
    gguf_writer_set_u32(w, "qwen3moe.feed_forward_length", 48);
    gguf_writer_set_u32(w, "qwen3moe.attention.head_count", 4);
    gguf_writer_set_u32(w, "qwen3moe.attention.head_count_kv", 2);
    gguf_writer_set_f32(w, "qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f);
    if (n_expert >= 0) gguf_writer_set_u32(w, "qwen3moe.expert_count", (uint32_t)n_expert);
    if (n_used >= 0) gguf_writer_set_u32(w, "qwen3moe.expert_used_count", (uint32_t)n_used);
    if (n_ff_exp >= 0)
        gguf_writer_set_u32(w, "qwen3moe.expert_feed_forward_length", (uint32_t)n_ff_exp);
    synth_write_vocab(w, 40);
    hl_status st = gguf_writer_write_file(w, path, err);
    gguf_writer_destroy(w);
    return st;
}

TEST(arch_qwen3moe_bad_expert_hparams_are_named) {
    char path[512];
    snprintf(path, sizeof path, "%s/moe-hp.gguf", test_tmpdir());
    const struct {
        int n_expert, n_used, n_ff_exp;
        const char *want;
    } cases[] = {
        {8, 9, 16, "expert_used_count 9"},
        {0, 1, 16, "expert_count' = 0"},
        {8, 2, 0, "expert_feed_forward_length' = 0"},
        {8, 2, -1, "expert_feed_forward_length"},
        {-1, 2, 16, "expert_count"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hl_err err = {0};
        CHECK_OK(write_moe_hp(path, cases[i].n_expert, cases[i].n_used, cases[i].n_ff_exp, &err),
                 &err);
        model *m = NULL;
        CHECK_MSG(model_load(path, NULL, &m, &err) != HL_OK, "case %zu loaded", i);
        CHECK(m == NULL);
        CHECK_MSG(strstr(err.msg, cases[i].want), "case %zu: want \"%s\" in \"%s\"", i,
                  cases[i].want, err.msg);
    }
}
