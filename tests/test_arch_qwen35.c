/*
 * test_arch_qwen35.c - qwen35 (Gated DeltaNet + gated full attention) against llama.cpp's
 * goldens (tests/arch_golden.h), F32 and Q8_0; the golden's state_check (a saved state
 * restored gives bitwise the same continuation); the chunked prefill equals the
 * token-by-token recurrence (logits and state); and the model through the runner: a
 * continued conversation is served from the prefix cache with the tokens of a cold run;
 * bad hyperparameters are named in the load error.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch_golden.h"
#include "arch_recurrent.h"
#include "runner/runner.h"
#include "runner_greedy.h"
#include "test.h"

TEST(arch_qwen35) { arch_golden_check("qwen35"); }
TEST(arch_qwen35_q8_0) { arch_golden_check("qwen35-q8_0"); }

#define N_AFTER 8

/* The golden's state_check: after the prompt the state is saved (a model_kv's KV rows
 * below its length never change, so the state buffer is all there is to save), 8 greedy
 * tokens are fed; a second model_kv that evaluated the same prompt, its state then
 * overwritten (so that only the restore can make it right), gets the saved state and the
 * same 8 tokens: the logits are bitwise those of the first pass. */
TEST(arch_qwen35_state_save_restore_is_exact) {
    int32_t prompt[128], greedy[64], n_prompt, n_greedy;
    model *m = arch_case_model("qwen35", prompt, &n_prompt, greedy, &n_greedy);
    if (!m) SKIP("testdata/arch/qwen35.{gguf,json} not found (HEARTH_SHARED)");
    CHECK(n_greedy >= N_AFTER);
    const int32_t V = model_get_hparams(m)->n_vocab;
    const size_t S = model_state_floats(m);
    /* 6 GDN layers: conv 3 x 128 and S 4 x 16 x 16 each */
    CHECK_EQ_INT((int)S, 6 * (3 * 128 + 4 * 16 * 16));
    model_ctx *c = NULL;
    model_kv *a = NULL, *b = NULL;
    CHECK_OK(model_ctx_create(m, 1, 256, &c, NULL), NULL);
    CHECK_OK(model_kv_create(m, 256, &a, NULL), NULL);
    CHECK_OK(model_kv_create(m, 256, &b, NULL), NULL);
    float *saved = malloc(S * sizeof(float));
    float *first = malloc(sizeof(float) * (size_t)V * N_AFTER);
    CHECK_OK(model_eval(c, a, prompt, n_prompt, NULL, NULL), NULL);
    memcpy(saved, model_kv_state(a), S * sizeof(float));
    for (int i = 0; i < N_AFTER; i++) {
        CHECK_OK(model_eval(c, a, &greedy[i], 1, NULL, NULL), NULL);
        memcpy(first + (size_t)i * V, model_ctx_logits(c), sizeof(float) * (size_t)V);
    }
    CHECK_MSG(memcmp(saved, model_kv_state(a), S * sizeof(float)) != 0,
              "8 more tokens left the state unchanged");
    CHECK_OK(model_eval(c, b, prompt, n_prompt, NULL, NULL), NULL);
    memcpy(model_kv_state(b), model_kv_state(a), S * sizeof(float)); /* a later state */
    memcpy(model_kv_state(b), saved, S * sizeof(float));
    for (int i = 0; i < N_AFTER; i++) {
        CHECK_OK(model_eval(c, b, &greedy[i], 1, NULL, NULL), NULL);
        CHECK_MSG(memcmp(first + (size_t)i * V, model_ctx_logits(c), sizeof(float) * (size_t)V) == 0,
                  "token %d after the restore differs", i);
    }
    /* the greedy tokens follow from the logits too */
    for (int i = 0; i + 1 < N_AFTER; i++) {
        int32_t best = 0;
        for (int32_t v = 1; v < V; v++)
            if (first[(size_t)i * V + v] > first[(size_t)i * V + best]) best = v;
        CHECK_EQ_INT(best, greedy[i + 1]);
    }
    free(saved);
    free(first);
    model_kv_free(a);
    model_kv_free(b);
    model_ctx_free(c);
    model_free(m);
}

#define N_LONG 200 /* several chunks of 64, and a partial one */

/* A prefill in one batch runs the chunked delta rule; one token per eval runs the plain
 * recurrence: same final state within 1e-5 and same logits at every position within 2e-4
 * (float rounding, which this random-weight model amplifies: llama.cpp's own one-token vs
 * one-batch runs of it differ by 7e-5 in 70 positions). */
TEST(arch_qwen35_chunked_prefill_equals_token_by_token) {
    int32_t prompt[128], greedy[64], n_prompt, n_greedy;
    model *m = arch_case_model("qwen35", prompt, &n_prompt, greedy, &n_greedy);
    if (!m) SKIP("testdata/arch/qwen35.{gguf,json} not found (HEARTH_SHARED)");
    const int32_t V = model_get_hparams(m)->n_vocab;
    const size_t S = model_state_floats(m);
    int32_t toks[N_LONG];
    for (int i = 0; i < N_LONG; i++) toks[i] = i < n_prompt ? prompt[i] : (i * 97 + 13) % V;
    float *batch = malloc(sizeof(float) * (size_t)V * N_LONG);
    float *step = malloc(sizeof(float) * (size_t)V * N_LONG);
    model_ctx *c = NULL;
    model_kv *a = NULL, *b = NULL;
    CHECK_OK(model_ctx_create(m, 2, 256, &c, NULL), NULL);
    CHECK_OK(model_kv_create(m, 256, &a, NULL), NULL);
    CHECK_OK(model_kv_create(m, 256, &b, NULL), NULL);
    CHECK_OK(model_eval(c, a, toks, N_LONG, batch, NULL), NULL);
    for (int i = 0; i < N_LONG; i++)
        CHECK_OK(model_eval(c, b, &toks[i], 1, step + (size_t)i * V, NULL), NULL);
    double dl = 0, ds = 0, smax = 0;
    for (size_t i = 0; i < (size_t)V * N_LONG; i++) dl = fmax(dl, fabs(batch[i] - step[i]));
    const float *sa = model_kv_state(a), *sb = model_kv_state(b);
    for (size_t i = 0; i < S; i++) {
        ds = fmax(ds, fabs(sa[i] - sb[i]));
        smax = fmax(smax, fabs(sa[i]));
    }
    fprintf(stderr, "    %d tokens: max |logit diff| %.3g, max |state diff| %.3g (|state| <= %.3g)\n",
            N_LONG, dl, ds, smax);
    CHECK_MSG(smax > 0.1, "degenerate state");
    CHECK_NEAR(dl, 0, 2e-4);
    CHECK_NEAR(ds, 0, 1e-5);
    free(batch);
    free(step);
    model_kv_free(a);
    model_kv_free(b);
    model_ctx_free(c);
    model_free(m);
}

/* The golden's greedy tokens through the runner; then the conversation continued is served
 * from the prefix cache (the recurrent state restored from its snapshot) and gives the
 * tokens of a cold run on a fresh runner. */
TEST(arch_qwen35_runner_continues_from_the_cache) { arch_recurrent_runner_check("qwen35"); }

/* ---- bad files get clear errors ---- */

#include "gguf/gguf.h"
#include "model_synth.h"

/* The golden's hyperparameters without `skip` and with ssm.inner_size `inner`; no tensors
 * (the hyperparameters are checked first). */
static hl_status write_hp(const char *path, const char *skip, uint32_t inner, hl_err *err) {
    gguf_writer *w = gguf_writer_create();
    if (!w) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    static const struct {
        const char *key;
        uint32_t v;
    } u[] = {{"qwen35.context_length", 256},    {"qwen35.embedding_length", 64},
             {"qwen35.block_count", 8},         {"qwen35.feed_forward_length", 128},
             {"qwen35.attention.head_count", 4}, {"qwen35.attention.head_count_kv", 2},
             {"qwen35.attention.key_length", 32}, {"qwen35.attention.value_length", 32},
             {"qwen35.rope.dimension_count", 8}, {"qwen35.ssm.conv_kernel", 4},
             {"qwen35.ssm.inner_size", 0},      {"qwen35.ssm.state_size", 16},
             {"qwen35.ssm.time_step_rank", 4},  {"qwen35.ssm.group_count", 2},
             {"qwen35.full_attention_interval", 4}};
    gguf_writer_set_str(w, "general.architecture", "qwen35");
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) {
        if (skip && strcmp(u[i].key, skip) == 0) continue;
        gguf_writer_set_u32(w, u[i].key, strcmp(u[i].key, "qwen35.ssm.inner_size") ? u[i].v : inner);
    }
    gguf_writer_set_f32(w, "qwen35.attention.layer_norm_rms_epsilon", 1e-6f);
    synth_write_vocab(w, 64);
    hl_status st = gguf_writer_write_file(w, path, err);
    gguf_writer_destroy(w);
    return st;
}

TEST(arch_qwen35_bad_hparams_are_named) {
    char path[512];
    snprintf(path, sizeof path, "%s/qwen35-bad.gguf", test_tmpdir());
    hl_err err = {0};
    model *m = NULL;
    CHECK_OK(write_hp(path, "qwen35.ssm.state_size", 64, &err), &err);
    CHECK_EQ_INT(model_load(path, NULL, &m, &err), HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "qwen35.ssm.state_size"), "%s", err.msg);
    /* 62 is not a multiple of the 4 value heads */
    CHECK_OK(write_hp(path, NULL, 62, &err), &err);
    CHECK_EQ_INT(model_load(path, NULL, &m, &err), HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "inner_size 62"), "%s", err.msg);
    /* well-formed hyperparameters get as far as the tensors */
    CHECK_OK(write_hp(path, NULL, 64, &err), &err);
    CHECK(model_load(path, NULL, &m, &err) != HL_OK);
    CHECK_MSG(strstr(err.msg, "token_embd.weight"), "%s", err.msg);
    CHECK(m == NULL);
}
