/*
 * test_arch_gptoss.c - gpt-oss (attention sinks, a sliding window on even layers, YaRN,
 * biases, a top-k-softmax MoE with biased experts and the clamped SwiGLU) against
 * llama.cpp's goldens (tests/arch_golden.h: logits, greedy and the golden's state_check,
 * here a KV rewind), F32, Q8_0 and MXFP4 experts. A prompt in one batch equals the same
 * tokens one at a time and in chunks (window, sinks and expert grouping do not depend on
 * the batch); through the runner, the windowed layers' cache restored from the prefix cache
 * continues a conversation exactly like a cold run (tests/arch_recurrent.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "arch_golden.h"
#include "arch_recurrent.h"
#include "model/model.h"
#include "test.h"

TEST(arch_gptoss) { arch_golden_check("gpt-oss"); }
TEST(arch_gptoss_q8_0) { arch_golden_check("gpt-oss-q8_0"); }
TEST(arch_gptoss_mxfp4) { arch_golden_check("gpt-oss-mxfp4"); }

/* The golden's prompt ids (up to cap). */
static int32_t golden_prompt(int32_t *prompt, int32_t cap) {
    const char *jp = test_shared_path("testdata/arch/gpt-oss.json");
    json_t *root = jp ? json_load_file(jp, 0, NULL) : NULL;
    json_t *p = json_object_get(root, "prompt_ids");
    int32_t n = 0;
    for (size_t i = 0; i < json_array_size(p) && n < cap; i++)
        prompt[n++] = (int32_t)json_integer_value(json_array_get(p, i));
    json_decref(root);
    return n;
}

/* The 70-token prompt (far past the window of 8) in one batch, one token per eval and
 * chunks of 7: every position's logits within 1e-4 (llama.cpp's own one-token vs batch
 * difference on this file is 1.5e-5). The windowed layers live in their own cache slot. */
TEST(arch_gptoss_batch_equals_token_by_token_and_chunks) {
    const char *gp = test_shared_path("testdata/arch/gpt-oss.gguf");
    int32_t prompt[128];
    const int32_t n_prompt = golden_prompt(prompt, 128);
    if (!gp || n_prompt == 0) SKIP("testdata/arch/gpt-oss.{gguf,json} not found (HEARTH_SHARED)");
    model *m = NULL;
    CHECK_OK(model_load(gp, NULL, &m, NULL), NULL);
    CHECK_EQ_INT(model_kv_slots(m), 2);
    CHECK_EQ_INT(model_kv_window(m), 8);
    CHECK(n_prompt > 16);
    const int32_t V = model_get_hparams(m)->n_vocab;
    float *batch = malloc(sizeof(float) * (size_t)V * (size_t)n_prompt);
    float *step = malloc(sizeof(float) * (size_t)V * (size_t)n_prompt);
    float *chunk = malloc(sizeof(float) * (size_t)V * (size_t)n_prompt);
    model_ctx *c = NULL;
    model_kv *a = NULL, *b = NULL, *d = NULL;
    CHECK_OK(model_ctx_create(m, 2, 128, &c, NULL), NULL);
    CHECK_OK(model_kv_create(m, 128, &a, NULL), NULL);
    CHECK_OK(model_kv_create(m, 128, &b, NULL), NULL);
    CHECK_OK(model_kv_create(m, 128, &d, NULL), NULL);
    CHECK_OK(model_eval(c, a, prompt, n_prompt, batch, NULL), NULL);
    for (int i = 0; i < n_prompt; i++)
        CHECK_OK(model_eval(c, b, &prompt[i], 1, step + (size_t)i * V, NULL), NULL);
    for (int i = 0; i < n_prompt; i += 7) {
        const int n = n_prompt - i < 7 ? n_prompt - i : 7;
        CHECK_OK(model_eval(c, d, &prompt[i], n, chunk + (size_t)i * V, NULL), NULL);
    }
    double ds = 0, dc = 0, mx = 0;
    for (size_t i = 0; i < (size_t)V * (size_t)n_prompt; i++) {
        ds = fmax(ds, fabs(batch[i] - step[i]));
        dc = fmax(dc, fabs(batch[i] - chunk[i]));
        mx = fmax(mx, fabs(batch[i]));
    }
    fprintf(stderr, "    %d tokens: max |logit diff| one by one %.3g, chunks of 7 %.3g (|logit| <= %.3g)\n",
            n_prompt, ds, dc, mx);
    CHECK_MSG(mx > 0.1, "degenerate logits");
    CHECK_NEAR(ds, 0, 1e-4);
    CHECK_NEAR(dc, 0, 1e-4);
    free(batch);
    free(step);
    free(chunk);
    model_kv_free(a);
    model_kv_free(b);
    model_kv_free(d);
    model_ctx_free(c);
    model_free(m);
}

/* Through the runner the conversation continued is served from the prefix cache (its
 * full-attention and sliding-window slots, 70 prompt tokens past the window of 8) and gives
 * exactly the tokens of a cold run. */
TEST(arch_gptoss_runner_continues_from_the_cache) { arch_recurrent_runner_check("gpt-oss"); }
