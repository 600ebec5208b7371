/*
 * arch_recurrent.h - checks shared by the tests of recurrent and hybrid architectures
 * (lfm2, mamba2, nemotron_h), on a golden case of ../shared/testdata/arch (SKIP when its
 * files are absent). Each is a TEST body; failures are reported at the helper's lines
 * with the case named.
 *
 *   TEST(arch_lfm2_batch_equals_token_by_token) { arch_recurrent_batch_check("lfm2", 1e-4); }
 *   TEST(arch_lfm2_runner_continues_from_the_cache) { arch_recurrent_runner_check("lfm2"); }
 */
#ifndef HL_TEST_ARCH_RECURRENT_H
#define HL_TEST_ARCH_RECURRENT_H

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
