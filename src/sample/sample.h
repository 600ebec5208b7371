/*
 * sample.h - a basic token sampler over one logits vector.
 *
 * Greedy (argmax, lowest id on ties) when temperature <= 0. Otherwise, as llama.cpp's
 * default chain does: top_k, then top_p (nucleus), then min_p filter the candidates by the
 * probabilities of the untempered logits; the survivors are scaled by 1/temperature and
 * one is drawn with a seeded RNG (splitmix64), so a given seed always gives the same
 * sequence. top_k <= 0, top_p >= 1 and min_p <= 0 disable those filters.
 *
 * Ownership: sampler_create() allocates candidate buffers for n_vocab once, so sampling
 * never allocates; sampler_free() releases them. One sampler per sequence; not
 * thread-safe. (A slot-based batched sampler comes with the runner.)
 */
#ifndef HL_SAMPLE_H
#define HL_SAMPLE_H

#include <stdint.h>

#include "base/status.h"

typedef struct sample_params {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    uint64_t seed;
} sample_params;

/* temperature 0.8, top_k 40, top_p 0.9, min_p 0 (Ollama's defaults), seed 0. */
sample_params sample_params_default(void);

typedef struct sampler sampler;

hl_status sampler_create(const sample_params *p, int32_t n_vocab, sampler **out, hl_err *err);
void sampler_free(sampler *s); /* accepts NULL */
/* Restarts the RNG from seed. */
void sampler_reseed(sampler *s, uint64_t seed);

/* Picks a token id in [0, n_vocab) from n_vocab logits. */
int32_t sampler_sample(sampler *s, const float *logits);

/* Index of the largest value (the first one on ties). */
int32_t sample_argmax(const float *logits, int32_t n);

#endif
