/*
 * sample.c - greedy / top-k / top-p / min-p / temperature sampling with a seeded RNG.
 */
#include "sample/sample.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

typedef struct cand {
    float logit;
    int32_t id;
} cand;

struct sampler {
    sample_params p;
    int32_t n_vocab;
    uint64_t rng;
    cand *c;
    double *w; /* probabilities / weights of the candidates */
};

sample_params sample_params_default(void) {
    return (sample_params){.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .min_p = 0.0f,
                           .seed = 0};
}

hl_status sampler_create(const sample_params *p, int32_t n_vocab, sampler **out, hl_err *err) {
    *out = NULL;
    if (n_vocab <= 0) return hl_fail(err, HL_ERR_INVALID, "sampler needs a vocabulary size > 0");
    if (!(p->temperature == p->temperature) || !(p->top_p == p->top_p) ||
        !(p->min_p == p->min_p))
        return hl_fail(err, HL_ERR_INVALID, "sampler parameters must not be NaN");
    sampler *s = calloc(1, sizeof *s);
    if (!s) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->c = malloc((size_t)n_vocab * sizeof *s->c);
    s->w = malloc((size_t)n_vocab * sizeof *s->w);
    if (!s->c || !s->w) {
        sampler_free(s);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory for a sampler of %d tokens", n_vocab);
    }
    sampler_reseed(s, p->seed);
    *out = s;
    return HL_OK;
}

void sampler_free(sampler *s) {
    if (!s) return;
    free(s->c);
    free(s->w);
    free(s);
}

void sampler_reseed(sampler *s, uint64_t seed) { s->rng = seed; }

/* splitmix64: a full-period generator that is fine for sampling. */
static uint64_t next_u64(sampler *s) {
    uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double next_unit(sampler *s) { return (double)(next_u64(s) >> 11) * 0x1.0p-53; }

int32_t sample_argmax(const float *logits, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* a ranks before b: larger logit, then smaller id (a total order, so results are stable). */
static int better(const cand *a, const cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_desc(const void *x, const void *y) {
    const cand *a = x, *b = y;
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

/* Min-heap (worst at the root) of the best k candidates. */
static void sift_down(cand *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(&h[w], &h[l])) w = l;
        if (r < n && better(&h[w], &h[r])) w = r;
        if (w == i) return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static int32_t select_top_k(cand *c, const float *logits, int32_t n, int32_t k) {
    for (int32_t i = 0; i < k; i++) c[i] = (cand){logits[i], i};
    for (int32_t i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
    for (int32_t i = k; i < n; i++) {
        cand x = {logits[i], i};
        if (better(&x, &c[0])) {
            c[0] = x;
            sift_down(c, k, 0);
        }
    }
    return k;
}

int32_t sampler_sample(sampler *s, const float *logits) {
    const sample_params *p = &s->p;
    const int32_t n_vocab = s->n_vocab;
    if (p->temperature <= 0.0f) return sample_argmax(logits, n_vocab);

    cand *c = s->c;
    int32_t n;
    bool sorted = false;
    if (p->top_k > 0 && p->top_k < n_vocab) {
        n = select_top_k(c, logits, n_vocab, p->top_k);
    } else {
        n = n_vocab;
        for (int32_t i = 0; i < n; i++) c[i] = (cand){logits[i], i};
    }
    if (p->top_p < 1.0f) {
        qsort(c, (size_t)n, sizeof *c, cmp_desc);
        sorted = true;
    }

    /* probabilities of the untempered logits, for top_p and min_p */
    float max = c[0].logit;
    for (int32_t i = 1; i < n; i++)
        if (c[i].logit > max) max = c[i].logit;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += s->w[i] = exp((double)c[i].logit - max);
    if (sorted) {
        double cum = 0.0, target = (double)p->top_p * sum;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            cum += s->w[i];
            if (cum >= target) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0.0f) {
        /* the most likely candidate has weight exp(0) = 1 */
        int32_t kept = 0;
        for (int32_t i = 0; i < n; i++)
            if (s->w[i] >= (double)p->min_p) c[kept++] = c[i];
        n = kept > 0 ? kept : 1;
        if (kept == 0) c[0] = (cand){max, sample_argmax(logits, n_vocab)};
    }

    /* temperature, then draw */
    sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += s->w[i] = exp(((double)c[i].logit - max) / (double)p->temperature);
    double u = next_unit(s) * sum;
    for (int32_t i = 0; i < n; i++) {
        u -= s->w[i];
        if (u < 0.0) return c[i].id;
    }
    return c[n - 1].id;
}
