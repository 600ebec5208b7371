/*
 * sampler_internal.h - state shared by sampler.c (slots, driver) and sampler_row.c
 * (per-row numeric kernel). Not for use outside src/sample/sampler*.c. The sampler owns
 * all of it (slots and scratch, allocated by sampler_create, freed by sampler_destroy).
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

/* exp() of a non-positive argument (a logit minus the row max, times 1/T), accurate to
 * about 1 ulp; exactly 0 below SAMPLER_EXP_MIN and for -inf. Cody-Waite reduction and
 * a degree-7 Taylor polynomial; sampler_vec.c runs the same operations 4-wide. */
#define SAMPLER_EXP_MIN (-87.3f)
#define SAMPLER_LOG2E 1.44269504f
#define SAMPLER_LN2_HI 0.693359375f
#define SAMPLER_LN2_LO (-2.12194440e-4f)
#define SAMPLER_EXP_C2 (1.0f / 2)
#define SAMPLER_EXP_C3 (1.0f / 6)
#define SAMPLER_EXP_C4 (1.0f / 24)
#define SAMPLER_EXP_C5 (1.0f / 120)
#define SAMPLER_EXP_C6 (1.0f / 720)
#define SAMPLER_EXP_C7 (1.0f / 5040)

static inline float sampler_exp_nonpos(float x) {
    float xc = x < SAMPLER_EXP_MIN ? SAMPLER_EXP_MIN : x;
    int32_t n = (int32_t)(xc * SAMPLER_LOG2E - 0.5f);
    float nf = (float)n;
    float r = (xc - nf * SAMPLER_LN2_HI) - nf * SAMPLER_LN2_LO;
    float p = SAMPLER_EXP_C7;
    p = p * r + SAMPLER_EXP_C6;
    p = p * r + SAMPLER_EXP_C5;
    p = p * r + SAMPLER_EXP_C4;
    p = p * r + SAMPLER_EXP_C3;
    p = p * r + SAMPLER_EXP_C2;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        uint32_t u;
        float f;
    } pow2 = {.u = (uint32_t)(n + 127) << 23};
    return x < SAMPLER_EXP_MIN ? 0.0f : p * pow2.f;
}

/* Dense weights are summed in blocks so a draw can skip whole blocks. */
#define SAMPLER_PICK_BLOCK 64

/* Large top-p nuclei are found by bucketing (m - x) / T over [0, RANGE): exp() of
 * anything past RANGE is 0 in float. */
#define SAMPLER_NUCLEUS_BUCKETS 2048
#define SAMPLER_NUCLEUS_RANGE 88.0f

/* Full-row passes (sampler_vec.c). */
/* Max and first maximal index; returns true (outputs unset) if any entry is NaN/+inf. */
bool sampler_vec_scan(const float *x, int32_t n, float *max_out, int32_t *argmax_out);
/* sum of exp((x[i] - m) * scale) */
double sampler_vec_exp_sum(const float *x, int32_t n, float m, float scale);
/* w[i] = exp((x[i] - m) * scale); block_sums[b] = sum of block b; returns the total
 * (the sum of block_sums, in order). */
double sampler_vec_exp_fill(const float *x, int32_t n, float m, float scale, float *w,
                            double *block_sums);
/* First i in [from, n) with x[i] > floor_value (resp. >= threshold), or n. */
int32_t sampler_vec_first_above(const float *x, int32_t from, int32_t n, float floor_value);
int32_t sampler_vec_first_at_least(const float *x, int32_t from, int32_t n, float threshold);

/* Tests only: false forces the SSE2/scalar paths (process-wide, not thread-safe). */
void sampler_vec_allow_avx2(bool allowed);

/* AVX2+FMA variants (sampler_vec_avx2.c, x86-64 only); the functions above dispatch. */
bool sampler_vec_scan_avx2(const float *x, int32_t n, float *max_out, int32_t *argmax_out);
double sampler_vec_exp_sum_avx2(const float *x, int32_t n, float m, float scale);
double sampler_vec_exp_fill_avx2(const float *x, int32_t n, float m, float scale, float *w,
                                 double *block_sums);
int32_t sampler_vec_first_above_avx2(const float *x, int32_t from, int32_t n, float floor_value);
int32_t sampler_vec_first_at_least_avx2(const float *x, int32_t from, int32_t n,
                                        float threshold);

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
    float *weights;          /* dense unnormalised probabilities, by token id */
    float *cand_w;           /* draw weights of the candidates in cand */
    double *block_sums;      /* per SAMPLER_PICK_BLOCK block of weights */
    double *bucket_mass;     /* SAMPLER_NUCLEUS_BUCKETS entries */
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
