/*
 * test_arch_mamba2.c - mamba2 (Mamba-2 layers only: no attention, no KV) and nemotron_h
 * (a per-layer mix of Mamba-2, attention and relu^2 MLP layers) against llama.cpp's
 * goldens (tests/arch_golden.h: logits, greedy and the golden's state_check), F32 and
 * Q8_0; the state is the same whatever the batching; both through the runner continue a
 * conversation from the prefix cache with the tokens of a cold run; bad hyperparameters
 * are named in the load error.
 */
#include <stdio.h>
#include <string.h>

#include "arch_golden.h"
#include "arch_recurrent.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model_synth.h"
#include "test.h"

TEST(arch_mamba2) { arch_golden_check("mamba2"); }
TEST(arch_mamba2_q8_0) { arch_golden_check("mamba2-q8_0"); }
TEST(arch_nemotron_h) { arch_golden_check("nemotron_h"); }
TEST(arch_nemotron_h_q8_0) { arch_golden_check("nemotron_h-q8_0"); }

/* Per Mamba-2 layer: conv (4 - 1) x (128 + 2 * 2 * 16) and S 8 heads x 16 x 16; mamba2
 * has 4 such layers and nothing else (no KV at all), nemotron_h 3 and one attention
 * layer. */
TEST(arch_mamba2_state_and_kv_layout) {
    const char *p1 = test_shared_path("testdata/arch/mamba2.gguf");
    const char *p2 = test_shared_path("testdata/arch/nemotron_h.gguf");
    if (!p1 || !p2) SKIP("testdata/arch/{mamba2,nemotron_h}.gguf not found (HEARTH_SHARED)");
    model *m = NULL;
    const int per_layer = 3 * 192 + 8 * 16 * 16;
    CHECK_OK(model_load(p1, NULL, &m, NULL), NULL);
    CHECK_EQ_INT((int)model_state_floats(m), 4 * per_layer);
    CHECK(!model_has_kv(m));
    model_free(m);
    CHECK_OK(model_load(p2, NULL, &m, NULL), NULL);
    CHECK_EQ_INT((int)model_state_floats(m), 3 * per_layer);
    CHECK(model_has_kv(m));
    model_free(m);
}

TEST(arch_mamba2_batch_equals_token_by_token) { arch_recurrent_batch_check("mamba2", 1e-4); }
TEST(arch_nemotron_h_batch_equals_token_by_token) {
    arch_recurrent_batch_check("nemotron_h", 1e-4);
}
TEST(arch_mamba2_runner_continues_from_the_cache) { arch_recurrent_runner_check("mamba2"); }
TEST(arch_nemotron_h_runner_continues_from_the_cache) {
    arch_recurrent_runner_check("nemotron_h");
}

/* The mamba2 golden's hyperparameters, ssm.inner_size `inner` and ssm.group_count
 * `groups`; no tensors (the hyperparameters are checked first). */
static hl_status write_hp(const char *path, uint32_t inner, uint32_t groups, hl_err *err) {
    gguf_writer *w = gguf_writer_create();
    if (!w) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    gguf_writer_set_str(w, "general.architecture", "mamba2");
    gguf_writer_set_u32(w, "mamba2.context_length", 256);
    gguf_writer_set_u32(w, "mamba2.embedding_length", 64);
    gguf_writer_set_u32(w, "mamba2.block_count", 4);
    gguf_writer_set_u32(w, "mamba2.feed_forward_length", 0);
    gguf_writer_set_u32(w, "mamba2.attention.head_count", 8);
    gguf_writer_set_f32(w, "mamba2.attention.layer_norm_rms_epsilon", 1e-6f);
    gguf_writer_set_u32(w, "mamba2.ssm.conv_kernel", 4);
    gguf_writer_set_u32(w, "mamba2.ssm.inner_size", inner);
    gguf_writer_set_u32(w, "mamba2.ssm.state_size", 16);
    gguf_writer_set_u32(w, "mamba2.ssm.time_step_rank", 8);
    gguf_writer_set_u32(w, "mamba2.ssm.group_count", groups);
    synth_write_vocab(w, 64);
    hl_status st = gguf_writer_write_file(w, path, err);
    gguf_writer_destroy(w);
    return st;
}

TEST(arch_mamba2_bad_hparams_are_named) {
    char path[512];
    snprintf(path, sizeof path, "%s/mamba2-bad.gguf", test_tmpdir());
    hl_err err = {0};
    model *m = NULL;
    /* 124 is not a multiple of the 8 heads */
    CHECK_OK(write_hp(path, 124, 2, &err), &err);
    CHECK_EQ_INT(model_load(path, NULL, &m, &err), HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "inner_size 124"), "%s", err.msg);
    /* 3 groups do not divide the 8 heads */
    CHECK_OK(write_hp(path, 128, 3, &err), &err);
    CHECK_EQ_INT(model_load(path, NULL, &m, &err), HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "group_count 3"), "%s", err.msg);
    /* well-formed hyperparameters (feed_forward_length 0 included) get as far as the
     * tensors */
    CHECK_OK(write_hp(path, 128, 2, &err), &err);
    CHECK(model_load(path, NULL, &m, &err) != HL_OK);
    CHECK_MSG(strstr(err.msg, "token_embd.weight"), "%s", err.msg);
    CHECK(m == NULL);
}
