/*
 * arch_recurrent.h - checks shared by the architecture tests (recurrent and hybrid ones:
 * lfm2, mamba2, nemotron_h, qwen35; and batching and runner checks of the others), on a
 * golden case of ../shared/testdata/arch (SKIP when its files are absent). Each check is
 * (part of) a TEST body; failures are reported at the helper's lines with the case named.
 *
 *   TEST(arch_lfm2_batch_equals_token_by_token) { arch_recurrent_batch_check("lfm2", 1e-4); }
 *   TEST(arch_lfm2_runner_continues_from_the_cache) { arch_recurrent_runner_check("lfm2"); }
 */
#ifndef HL_TEST_ARCH_RECURRENT_H
#define HL_TEST_ARCH_RECURRENT_H

#include <stdint.h>

#include "model/model.h"

/* The case's model (the caller frees it) and its golden prompt and greedy ids (up to 128
 * and 64); NULL when its files are absent or do not load. */
model *arch_case_model(const char *case_name, int32_t *prompt, int32_t *n_prompt,
                       int32_t *greedy, int32_t *n_greedy);

/* testdata/arch/<file> loaded (the caller frees it); NULL when absent or not loadable. */
model *arch_load_file(const char *file);

/* toks[0..n) evaluated into fresh caches of n_ctx positions in one batch, and again in
 * pieces of steps[k] tokens for each k: every position's logits within tol of the one
 * batch's, and those not all near 0. The caller keeps m. */
void arch_steps_check(model *m, const int32_t *toks, int n, int n_ctx, const int *steps,
                      int n_steps, double tol);

/* Through the runner (small prefix-cache blocks, two parallel slots, the server's path):
 * prompt[0..n) (n <= 48) gives 12 greedy tokens; the conversation continued by them and 6
 * more tokens is served mostly from the prefix cache (>= 30 tokens) and its 12 greedy
 * tokens are those of model_eval on a contiguous cache. The caller keeps m. */
void arch_runner_eval_check(model *m, const int32_t *prompt, int n);

/* ARCH_RECURRENT_N tokens (the golden prompt, then a fixed pattern) evaluated in one
 * batch, in chunks of 7 and one token per eval: the three final recurrent states must be
 * bitwise equal (the recurrence walks tokens in order whatever the batching) and every
 * position's logits within logit_tol of the one-batch run's. */
#define ARCH_RECURRENT_N 100
void arch_recurrent_batch_check(const char *case_name, double logit_tol);

/* Through the runner (small prefix-cache blocks, two parallel slots): the golden prompt
 * gives the golden's first 16 greedy tokens; the conversation continued by 10 tokens is
 * served from the prefix cache (cached_tokens > 0: the recurrent state restored from a
 * snapshot) and gives exactly the tokens of a cold run on a fresh runner. */
void arch_recurrent_runner_check(const char *case_name);

#endif
