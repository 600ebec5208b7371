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

/* The 70-token prompt (far past the window of 8) in one batch, one token per eval and
 * chunks of 7: every position's logits within 1e-4 (llama.cpp's own one-token vs batch
 * difference on this file is 1.5e-5). The windowed layers live in their own cache slot. */
TEST(arch_gptoss_batch_equals_token_by_token_and_chunks) {
    int32_t prompt[128], greedy[64], n_prompt, n_greedy;
    model *m = arch_case_model("gpt-oss", prompt, &n_prompt, greedy, &n_greedy);
    if (!m) SKIP("testdata/arch/gpt-oss.{gguf,json} not found (HEARTH_SHARED)");
    CHECK_EQ_INT(model_kv_slots(m), 2);
    CHECK_EQ_INT(model_kv_window(m), 8);
    CHECK(n_prompt > 16);
    arch_steps_check(m, prompt, n_prompt, 128, (const int[]){1, 7}, 2, 1e-4);
    model_free(m);
}

/* Through the runner the conversation continued is served from the prefix cache (its
 * full-attention and sliding-window slots, 70 prompt tokens past the window of 8) and gives
 * exactly the tokens of a cold run. */
TEST(arch_gptoss_runner_continues_from_the_cache) { arch_recurrent_runner_check("gpt-oss"); }
