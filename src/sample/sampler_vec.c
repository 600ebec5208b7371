/*
 * sampler_vec.c - the full-vocabulary passes of the sampler (max scan, exp sums and
 * weights, threshold searches), in SSE2 (baseline x86-64) with a scalar fallback.
 *
 * The SIMD and scalar paths run the same IEEE operations in the same order per
 * element, so a result never depends on which path handled which element; sums are
 * split over lanes in a fixed way, so they are deterministic too.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "sample/sampler_internal.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#define SAMPLER_SSE2 1
#else
#define SAMPLER_SSE2 0
#endif

static bool avx2_allowed = true;

void sampler_vec_allow_avx2(bool allowed) { avx2_allowed = allowed; }

#if defined(__x86_64__) && defined(__GNUC__)
/* __builtin_cpu_supports reads flags libgcc sets up before main: cheap per call. */
static inline bool have_avx2(void) {
    return avx2_allowed && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#define DISPATCH(call) \
    do {               \
        if (have_avx2()) return call; \
    } while (0)
#else
#define DISPATCH(call) \
    do {               \
    } while (0)
#endif

#if SAMPLER_SSE2
static inline __m128 exp_nonpos4(__m128 x) {
    const __m128 lo = _mm_set1_ps(SAMPLER_EXP_MIN);
    __m128 under = _mm_cmplt_ps(x, lo);
    __m128 xc = _mm_max_ps(x, lo);
    __m128i n = _mm_cvttps_epi32(_mm_sub_ps(_mm_mul_ps(xc, _mm_set1_ps(SAMPLER_LOG2E)),
                                            _mm_set1_ps(0.5f)));
    __m128 nf = _mm_cvtepi32_ps(n);
    __m128 r = _mm_sub_ps(_mm_sub_ps(xc, _mm_mul_ps(nf, _mm_set1_ps(SAMPLER_LN2_HI))),
                          _mm_mul_ps(nf, _mm_set1_ps(SAMPLER_LN2_LO)));
    __m128 p = _mm_set1_ps(SAMPLER_EXP_C7);
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(SAMPLER_EXP_C6));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(SAMPLER_EXP_C5));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(SAMPLER_EXP_C4));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(SAMPLER_EXP_C3));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(SAMPLER_EXP_C2));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
    __m128 scale = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(n, _mm_set1_epi32(127)), 23));
    return _mm_andnot_ps(under, _mm_mul_ps(p, scale));
}

static inline float hsum_ps(__m128 v) {
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_shuffle_ps(v, v, _MM_SHUFFLE(1, 1, 1, 1)));
    return _mm_cvtss_f32(v);
}
#endif

bool sampler_vec_scan(const float *x, int32_t n, float *max_out, int32_t *argmax_out) {
    DISPATCH(sampler_vec_scan_avx2(x, n, max_out, argmax_out));
    enum { BLOCK = 64 };
    float m = -INFINITY;
    int32_t best_block = -1;
    bool bad = false;
    int32_t b0 = 0;
#if SAMPLER_SSE2
    const __m128 big = _mm_set1_ps(FLT_MAX);
    __m128 badv = _mm_setzero_ps();
    for (; b0 + BLOCK <= n; b0 += BLOCK) {
        __m128 mv = _mm_set1_ps(-INFINITY);
        for (int32_t i = b0; i < b0 + BLOCK; i += 4) {
            __m128 v = _mm_loadu_ps(x + i);
            badv = _mm_or_ps(badv, _mm_cmpnle_ps(v, big)); /* NaN or +inf */
            mv = _mm_max_ps(mv, v);
        }
        mv = _mm_max_ps(mv, _mm_shuffle_ps(mv, mv, _MM_SHUFFLE(1, 0, 3, 2)));
        mv = _mm_max_ps(mv, _mm_shuffle_ps(mv, mv, _MM_SHUFFLE(2, 3, 0, 1)));
        float bm = _mm_cvtss_f32(mv);
        if (bm > m) {
            m = bm;
            best_block = b0;
        }
    }
    bad = _mm_movemask_ps(badv) != 0;
#endif
    int32_t am = 0;
    bool tail_best = false;
    for (int32_t i = b0; i < n; i++) {
        float xi = x[i];
        if (!(xi <= FLT_MAX)) bad = true;
        else if (xi > m) {
            m = xi;
            am = i;
            tail_best = true;
        }
    }
    if (bad) return true; /* the caller sanitises and rescans */
    if (!tail_best && best_block >= 0) {
        am = best_block;
        while (x[am] != m) am++;
    }
    *max_out = m;
    *argmax_out = am;
    return false;
}

/* Both functions sum in blocks of SAMPLER_PICK_BLOCK: float lanes inside a block (few
 * terms, each <= 1), doubles across blocks. */
double sampler_vec_exp_sum(const float *x, int32_t n, float m, float scale) {
    DISPATCH(sampler_vec_exp_sum_avx2(x, n, m, scale));
    double total = 0;
    for (int32_t b0 = 0; b0 < n; b0 += SAMPLER_PICK_BLOCK) {
        int32_t end = b0 + SAMPLER_PICK_BLOCK < n ? b0 + SAMPLER_PICK_BLOCK : n;
        int32_t i = b0;
        float bs = 0;
#if SAMPLER_SSE2
        const __m128 mv = _mm_set1_ps(m), sv = _mm_set1_ps(scale);
        __m128 acc = _mm_setzero_ps();
        for (; i + 4 <= end; i += 4)
            acc = _mm_add_ps(acc, exp_nonpos4(_mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(x + i), mv), sv)));
        bs = hsum_ps(acc);
#endif
        for (; i < end; i++) bs += sampler_exp_nonpos((x[i] - m) * scale);
        total += bs;
    }
    return total;
}

double sampler_vec_exp_fill(const float *x, int32_t n, float m, float scale, float *w,
                            double *block_sums) {
    DISPATCH(sampler_vec_exp_fill_avx2(x, n, m, scale, w, block_sums));
    double total = 0;
    for (int32_t b0 = 0; b0 < n; b0 += SAMPLER_PICK_BLOCK) {
        int32_t end = b0 + SAMPLER_PICK_BLOCK < n ? b0 + SAMPLER_PICK_BLOCK : n;
        int32_t i = b0;
        float bs = 0;
#if SAMPLER_SSE2
        const __m128 mv = _mm_set1_ps(m), sv = _mm_set1_ps(scale);
        __m128 acc = _mm_setzero_ps();
        for (; i + 4 <= end; i += 4) {
            __m128 e = exp_nonpos4(_mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(x + i), mv), sv));
            _mm_storeu_ps(w + i, e);
            acc = _mm_add_ps(acc, e);
        }
        bs = hsum_ps(acc);
#endif
        for (; i < end; i++) {
            w[i] = sampler_exp_nonpos((x[i] - m) * scale);
            bs += w[i];
        }
        block_sums[b0 / SAMPLER_PICK_BLOCK] = bs;
        total += bs;
    }
    return total;
}

int32_t sampler_vec_first_above(const float *x, int32_t from, int32_t n, float floor_value) {
    DISPATCH(sampler_vec_first_above_avx2(x, from, n, floor_value));
    int32_t i = from;
#if SAMPLER_SSE2
    const __m128 f = _mm_set1_ps(floor_value);
    for (; i + 8 <= n; i += 8) {
        __m128 a = _mm_cmpgt_ps(_mm_loadu_ps(x + i), f);
        __m128 b = _mm_cmpgt_ps(_mm_loadu_ps(x + i + 4), f);
        if (_mm_movemask_ps(_mm_or_ps(a, b))) break;
    }
#endif
    for (; i < n; i++)
        if (x[i] > floor_value) return i;
    return n;
}

int32_t sampler_vec_first_at_least(const float *x, int32_t from, int32_t n, float threshold) {
    DISPATCH(sampler_vec_first_at_least_avx2(x, from, n, threshold));
    int32_t i = from;
#if SAMPLER_SSE2
    const __m128 t = _mm_set1_ps(threshold);
    for (; i + 8 <= n; i += 8) {
        __m128 a = _mm_cmpge_ps(_mm_loadu_ps(x + i), t);
        __m128 b = _mm_cmpge_ps(_mm_loadu_ps(x + i + 4), t);
        if (_mm_movemask_ps(_mm_or_ps(a, b))) break;
    }
#endif
    for (; i < n; i++)
        if (x[i] >= threshold) return i;
    return n;
}
