/*
 * arch_state.h - checks of a golden case's cache state (tests/arch_golden.h checks its
 * logits): the JSON's state_check and the prefix cache through the runner.
 *
 *   TEST(arch_qwen35moe_state) { arch_state_check("qwen35moe"); }
 *   TEST(arch_qwen35moe_runner) { arch_runner_continue_check("qwen35moe"); }
 *
 * Both SKIP when testdata/arch/<case>.{gguf,json} is absent (HEARTH_SHARED) and fail the
 * current test at the caller's line.
 *
 * arch_state_check: the golden's state_check for a recurrent or hybrid model. After the
 * prompt the recurrent state is saved (a model_kv's KV rows below its length never change,
 * so the state buffer is all there is to save) and greedy_ids[0..8) are fed; a second
 * model_kv that evaluated the same prompt, its state then overwritten with the later one
 * (so that only the restore can make it right), gets the saved state and the same 8
 * tokens: the logits must be bitwise those of the first pass, and follow the golden's
 * greedy ids.
 *
 * arch_runner_continue_check: through the runner (the server's path), the prompt's first
 * 16 greedy tokens are the golden's; the conversation continued (those tokens and 10
 * more) is served from the prefix cache (cached_tokens >= the prompt: every cache slot,
 * recurrent state or sliding window, restored) and gives exactly the tokens of a cold run
 * on a fresh runner.
 *
 * arch_case_load: the case's model, prompt_ids (up to 128) and greedy_ids (up to 64);
 * NULL when the files are absent or do not load.
 */
#ifndef HL_TEST_ARCH_STATE_H
#define HL_TEST_ARCH_STATE_H

#include <stdint.h>

#include "model/model.h"

model *arch_case_load(const char *case_name, int32_t prompt[128], int32_t *n_prompt,
                      int32_t greedy[64], int32_t *n_greedy);

#define arch_state_check(case_name) arch_state_check_at((case_name), __FILE__, __LINE__)
void arch_state_check_at(const char *case_name, const char *file, int line);

#define arch_runner_continue_check(case_name) \
    arch_runner_continue_check_at((case_name), __FILE__, __LINE__)
void arch_runner_continue_check_at(const char *case_name, const char *file, int line);

#endif
