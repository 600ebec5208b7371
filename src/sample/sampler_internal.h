/*
 * sampler_internal.h - state shared by sampler.c (slots, driver) and sampler_row.c
 * (per-row numeric kernel). Not for use outside src/sample/sampler*.c.
 */
#ifndef HL_SAMPLE_SAMPLER_INTERNAL_H
#define HL_SAMPLE_SAMPLER_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "sample/sampler.h"

/* Options resolved into what the row kernel needs. Equal normalised options give
 * equal plans, so the fused path can share one. */
typedef struct sampler_plan {
    sampler_order order;
    bool greedy;
    float inv_temp;
    int32_t top_k; /* 0: off */
    float top_p;   /* 0: off */
    float min_p;   /* 0: off */
    float log_min_p;
    int32_t window; /* 0: no penalties */
    float repeat_penalty, inv_repeat_penalty, presence, frequency;
    bool apply_repeat_presence;
} sampler_plan;

typedef struct sampler_slot {
    int32_t id;
    sampler_opts opts; /* normalised */
    sampler_plan plan;
    int32_t *ring;    /* plan.window entries (NULL when 0) */
    int64_t hist_len; /* tokens ever written; next write at hist_len % window */
    uint64_t rng_seed;
    uint64_t rng_counter;
    uint32_t call_mark;
} sampler_slot;

/* A token and its (possibly penalised) logit. */
typedef struct sampler_cand {
    float score;
    int32_t id;
} sampler_cand;

struct sampler {
    int32_t n_vocab;
    int32_t num_ctx;
    sampler_slot **slots;    /* registration order */
    sampler_slot **resolved; /* per-call: row i's slot */
    int n_slots, cap_slots;
    bool fused_enabled, last_fused;
    uint32_t call_mark;
    uint64_t entropy;
    /* Scratch, n_vocab entries each: */
    float *work;             /* sanitised / penalised copy of a row */
    float *weights;          /* unnormalised probabilities of the candidates */
    sampler_cand *cand;      /* surviving candidates */
    sampler_cand *cand_work; /* partition space for large selections */
    uint32_t *stamp;         /* "seen in this window" marks for penalties */
    uint32_t stamp_epoch;
};

uint64_t sampler_mix_seed(uint64_t seed, uint64_t counter);

/* Samples one row into out (token, logprobs). Reads the slot's ring and RNG position
 * but does not advance them. HL_ERR_INVALID when the row has no finite logit. */
hl_status sampler_row(sampler *s, const sampler_plan *p, const sampler_slot *sl,
                      const float *row, sampler_out *out);

/* The top n of scores[0..v) under (score desc, id asc), sorted, into out[0..n).
 * work must hold v entries when n > SAMPLER_HEAP_MAX. Exposed for tests/bench. */
void sampler_select_top(const float *scores, int32_t v, int32_t n, sampler_cand *out,
                        sampler_cand *work);

#endif
