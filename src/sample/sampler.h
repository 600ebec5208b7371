/*
 * sampler.h - the runner's batched, slot-based token sampler.
 *
 * Owns, per slot (one slot per in-flight sequence): the normalised sampling options,
 * a ring buffer of the last repeat_last_n tokens (for repeat/presence/frequency
 * penalties) and a deterministic per-slot RNG. Owns one set of scratch buffers sized
 * for the vocabulary, so sampling never allocates.
 *
 * Use:
 *     sampler *s; sampler_create(n_vocab, num_ctx, &s, &err);
 *     sampler_opts o = sampler_opts_defaults();   // Ollama's defaults; edit fields
 *     sampler_add(s, seq_id, &o, prompt, n_prompt, &err);  // priors seed the ring
 *     loop: sampler_sample(s, ids, n, logits, n_vocab, out, &err);
 *           // row i of logits belongs to ids[i]; out[i].token is its next token and
 *           // has already been written to that slot's history
 *     sampler_remove(s, seq_id);  sampler_destroy(s);
 *
 * Behaviour follows Ollama's MLX runner sampler (x/mlxrunner/sample, described in
 * research/mlxrunner-internals.md section 5). The default transform order is that
 * reference's (SAMPLER_ORDER_REFERENCE): penalties -> top-p/top-k on the raw
 * (un-tempered) logits -> min-p on the raw logits -> temperature + draw; temperature
 * 0 is greedy (argmax, lowest index on ties). SAMPLER_ORDER_PROBS selects the later
 * upstream order: penalties -> top-k -> softmax(logits/T) -> top-p -> min-p -> draw.
 * Logprobs are the log-softmax of the ORIGINAL logits row (before penalties, filters
 * and temperature), as in the reference.
 *
 * Ties and determinism: candidates are ordered by logit descending, then token id
 * ascending. Every sample of a slot (greedy or not) advances its draw counter n; a
 * slot with seed >= 0 draws from upstream's mixSeed (SplitMix64 of seed and n), so its
 * tokens depend only on its own seed, options, history and logits - not on which
 * other slots share the call, nor on whether the call took the fused path (all named
 * slots share options: one resolved plan for every row) or the per-slot path. The
 * full-row passes use AVX2+FMA when the CPU has them, SSE2 otherwise; the two round
 * exp() slightly differently, so a seeded run is reproducible on one kind of CPU,
 * and across kinds except where a draw lands within rounding of a boundary.
 *
 * Cost per row: one max scan; top-k by a bounded heap (k <= 256) or quickselect;
 * top-p on the sorted top candidates, or an O(V) bucketed nucleus when it is large;
 * one exp pass over the row for the reference order's top-p normaliser, for logprobs
 * and for draws without top-k. Scratch is sized at create; sampling never allocates.
 *
 * Bad logits: NaN counts as -inf and +inf as FLT_MAX; a row with no finite entry is an
 * error (HL_ERR_INVALID) and then no slot's state changes.
 *
 * Threading: a sampler is not thread-safe; one thread uses it at a time. Separate
 * samplers are independent.
 *
 * Ownership: sampler_create allocates, sampler_destroy frees everything. sampler_add
 * copies the options and the prior tokens. Logits and outputs belong to the caller.
 */
#ifndef HL_SAMPLE_SAMPLER_H
#define HL_SAMPLE_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* The Ollama API caps top_logprobs at 20; sampler_out holds that many inline. */
#define SAMPLER_MAX_TOP_LOGPROBS 20
/* Largest ring a slot may ask for (repeat_last_n after -1 is resolved). */
#define SAMPLER_MAX_WINDOW (1 << 24)

typedef enum sampler_order {
    SAMPLER_ORDER_REFERENCE = 0, /* MLX runner at the batched-sampler commit (default) */
    SAMPLER_ORDER_PROBS = 1,     /* upstream's later distribution pipeline */
} sampler_order;

typedef struct sampler_opts {
    float temperature;       /* 0: greedy. Must be finite and >= 0. */
    int32_t top_k;           /* active when 0 < top_k < n_vocab */
    float top_p;             /* active when 0 < top_p < 1 */
    float min_p;             /* active when 0 < min_p <= 1 */
    float repeat_penalty;    /* <= 0 means 1 (off) */
    int32_t repeat_last_n;   /* penalty window; 0: penalties off; < 0: num_ctx */
    float presence_penalty;  /* subtracted once per distinct token in the window */
    float frequency_penalty; /* subtracted once per occurrence in the window */
    int64_t seed;            /* >= 0: deterministic; < 0: seeded from the clock */
    bool logprobs;           /* fill sampler_out.logprob */
    int32_t top_logprobs;    /* 0..SAMPLER_MAX_TOP_LOGPROBS alternatives (if logprobs) */
    sampler_order order;
} sampler_opts;

/* One sampled token. logprob / top_* are filled only when the slot asked for them
 * (logprob is 0 and n_top 0 otherwise). The top list is sorted by logprob descending
 * (ties: lower id first) and has min(top_logprobs, n_vocab) entries. */
typedef struct sampler_out {
    int32_t token;
    float logprob;
    int32_t n_top;
    int32_t top_tokens[SAMPLER_MAX_TOP_LOGPROBS];
    float top_logprobs[SAMPLER_MAX_TOP_LOGPROBS];
} sampler_out;

typedef struct sampler sampler;

/* Ollama's server defaults: temperature 0.8, top_k 40, top_p 0.9, min_p 0,
 * repeat_penalty 1, repeat_last_n 64, no presence/frequency penalty, seed -1,
 * no logprobs. (A zeroed struct is valid too: greedy, no penalties, seed 0.) */
sampler_opts sampler_opts_defaults(void);

/* Checks options the way sampler_add does (for early, user-facing validation):
 * NaN/inf in any float field, temperature < 0, top_logprobs outside 0..20, an unknown
 * order, or repeat_last_n larger than SAMPLER_MAX_WINDOW -> HL_ERR_INVALID. Other
 * out-of-range values are normalised as the reference does (see the field comments). */
hl_status sampler_validate_opts(const sampler_opts *opts, hl_err *err);

/* n_vocab >= 1; num_ctx is what repeat_last_n < 0 resolves to (>= 1). */
hl_status sampler_create(int32_t n_vocab, int32_t num_ctx, sampler **out, hl_err *err);
void sampler_destroy(sampler *s); /* accepts NULL */

/* Registers a slot. prior (n_prior tokens, may be NULL when 0) is the sequence so
 * far, normally the whole prompt: its last repeat_last_n tokens seed the ring. A
 * duplicate id, invalid options or a prior token outside [0, n_vocab) fail with
 * HL_ERR_INVALID and change nothing. Allocates (the ring); call off the hot path. */
hl_status sampler_add(sampler *s, int32_t slot, const sampler_opts *opts, const int32_t *prior,
                      size_t n_prior, hl_err *err);

/* Unregisters a slot and frees its ring; an unknown id is a no-op. The id may be
 * added again later and starts fresh. */
void sampler_remove(sampler *s, int32_t slot);

/* Removes every slot. */
void sampler_clear(sampler *s);

/* Samples one token for each of slots[0..n) (any subset of the registered slots, in
 * any order, each at most once) from logits: n rows of n_vocab floats, row i starting
 * at logits + i*row_stride (row_stride >= n_vocab). Writes out[i] and appends
 * out[i].token to slot i's history. n == 0 is a no-op. An unknown or repeated id, or a
 * row with no finite logit, fails with HL_ERR_INVALID and changes no slot. Never
 * allocates. */
hl_status sampler_sample(sampler *s, const int32_t *slots, int n, const float *logits,
                         size_t row_stride, sampler_out *out, hl_err *err);

/* Appends tokens a slot produced outside sampler_sample (e.g. accepted draft tokens)
 * to its history: only the last repeat_last_n are written. Unknown slot or a token
 * outside the vocabulary -> HL_ERR_INVALID (nothing changes). */
hl_status sampler_commit(sampler *s, int32_t slot, const int32_t *tokens, size_t n, hl_err *err);

int sampler_n_slots(const sampler *s);
bool sampler_has_slot(const sampler *s, int32_t slot);
int32_t sampler_n_vocab(const sampler *s);

/* A slot's ring (for tests and debugging): *ring points at *window entries (the
 * normalised repeat_last_n; 0 when the slot uses no penalties) of which
 * min(*history_len, *window) are filled; *history_len counts every token ever
 * written. Returns false for an unknown slot. */
bool sampler_slot_history(const sampler *s, int32_t slot, const int32_t **ring, int32_t *window,
                          int64_t *history_len);

/* The fused path (one option plan for the whole call) is taken when every slot named
 * in a call has the same options; disabling it forces the per-slot path (tests use
 * this to show both give identical results). sampler_last_call_fused() says which
 * path the last successful sampler_sample took. */
void sampler_set_fused(sampler *s, bool enabled);
bool sampler_last_call_fused(const sampler *s);

#endif
