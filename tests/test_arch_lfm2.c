/*
 * test_arch_lfm2.c - lfm2 (short-convolution blocks + GQA attention with q/k norms)
 * against llama.cpp's goldens (tests/arch_golden.h: logits, greedy and the golden's
 * state_check), F32 and Q8_0; the conv state is the same whatever the batching; the model
 * through the runner continues a conversation from the prefix cache with the tokens of a
 * cold run; bad hyperparameters are named in the load error.
 */
#include <stdio.h>
#include <string.h>

#include "arch_golden.h"
#include "arch_recurrent.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model_synth.h"
#include "test.h"

TEST(arch_lfm2) { arch_golden_check("lfm2"); }
TEST(arch_lfm2_q8_0) { arch_golden_check("lfm2-q8_0"); }

/* 4 conv layers of (l_cache - 1) x n_embd = 2 x 64 floats */
TEST(arch_lfm2_state_is_the_conv_rows) {
    const char *gp = test_shared_path("testdata/arch/lfm2.gguf");
    if (!gp) SKIP("testdata/arch/lfm2.gguf not found (HEARTH_SHARED)");
    model *m = NULL;
    CHECK_OK(model_load(gp, NULL, &m, NULL), NULL);
    CHECK_EQ_INT((int)model_state_floats(m), 4 * 2 * 64);
    CHECK(model_has_kv(m));
    model_free(m);
}

TEST(arch_lfm2_batch_equals_token_by_token) { arch_recurrent_batch_check("lfm2", 1e-4); }
TEST(arch_lfm2_runner_continues_from_the_cache) { arch_recurrent_runner_check("lfm2"); }

/* The golden's hyperparameters with shortconv.l_cache = l_cache (0: absent); no tensors
 * (the hyperparameters are checked first). */
static hl_status write_hp(const char *path, uint32_t l_cache, hl_err *err) {
    gguf_writer *w = gguf_writer_create();
    if (!w) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    static const uint32_t kv[] = {0, 0, 2, 0, 0, 2};
    gguf_writer_set_str(w, "general.architecture", "lfm2");
    gguf_writer_set_u32(w, "lfm2.context_length", 256);
    gguf_writer_set_u32(w, "lfm2.embedding_length", 64);
    gguf_writer_set_u32(w, "lfm2.block_count", 6);
    gguf_writer_set_u32(w, "lfm2.feed_forward_length", 128);
    gguf_writer_set_u32(w, "lfm2.attention.head_count", 4);
    gguf_writer_set_arr(w, "lfm2.attention.head_count_kv", GGUF_TYPE_UINT32, kv, 6);
    gguf_writer_set_f32(w, "lfm2.attention.layer_norm_rms_epsilon", 1e-6f);
    if (l_cache) gguf_writer_set_u32(w, "lfm2.shortconv.l_cache", l_cache);
    synth_write_vocab(w, 64);
    hl_status st = gguf_writer_write_file(w, path, err);
    gguf_writer_destroy(w);
    return st;
}

TEST(arch_lfm2_bad_hparams_are_named) {
    char path[512];
    snprintf(path, sizeof path, "%s/lfm2-bad.gguf", test_tmpdir());
    hl_err err = {0};
    model *m = NULL;
    CHECK_OK(write_hp(path, 0, &err), &err);
    CHECK_EQ_INT(model_load(path, NULL, &m, &err), HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "lfm2.shortconv.l_cache"), "%s", err.msg);
    CHECK_OK(write_hp(path, 1, &err), &err);
    CHECK_EQ_INT(model_load(path, NULL, &m, &err), HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "l_cache 1"), "%s", err.msg);
    /* well-formed hyperparameters get as far as the tensors */
    CHECK_OK(write_hp(path, 3, &err), &err);
    CHECK(model_load(path, NULL, &m, &err) != HL_OK);
    CHECK_MSG(strstr(err.msg, "token_embd.weight"), "%s", err.msg);
    CHECK(m == NULL);
}
