/*
 * sampler_vec_avx2.c - AVX2+FMA versions of the sampler's full-row passes (built with
 * -mavx2 -mfma; sampler_vec.c calls them only when the CPU has both). Same block
 * structure and results up to FMA rounding as the SSE2 path in sampler_vec.c.
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>

#include "sample/sampler_internal.h"

static inline __m256 exp_nonpos8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(SAMPLER_EXP_MIN);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 xc = _mm256_max_ps(x, lo);
    __m256i n = _mm256_cvttps_epi32(
        _mm256_fmsub_ps(xc, _mm256_set1_ps(SAMPLER_LOG2E), _mm256_set1_ps(0.5f)));
    __m256 nf = _mm256_cvtepi32_ps(n);
    __m256 r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(SAMPLER_LN2_HI), xc);
    r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(SAMPLER_LN2_LO), r);
    __m256 p = _mm256_set1_ps(SAMPLER_EXP_C7);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SAMPLER_EXP_C6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SAMPLER_EXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SAMPLER_EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SAMPLER_EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SAMPLER_EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256 scale =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, scale));
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, _MM_SHUFFLE(1, 1, 1, 1)));
    return _mm_cvtss_f32(s);
}

bool sampler_vec_scan_avx2(const float *x, int32_t n, float *max_out, int32_t *argmax_out) {
    enum { BLOCK = 64 };
    float m = -INFINITY;
    int32_t best_block = -1;
    int32_t b0 = 0;
    const __m256 big = _mm256_set1_ps(FLT_MAX);
    __m256 badv = _mm256_setzero_ps();
    for (; b0 + BLOCK <= n; b0 += BLOCK) {
        __m256 mv = _mm256_set1_ps(-INFINITY);
        for (int32_t i = b0; i < b0 + BLOCK; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            badv = _mm256_or_ps(badv, _mm256_cmp_ps(v, big, _CMP_NLE_UQ));
            mv = _mm256_max_ps(mv, v);
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, _MM_SHUFFLE(1, 1, 1, 1)));
        float bm = _mm_cvtss_f32(h);
        if (bm > m) {
            m = bm;
            best_block = b0;
        }
    }
    bool bad = _mm256_movemask_ps(badv) != 0;
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
    if (bad) return true;
    if (!tail_best && best_block >= 0) {
        am = best_block;
        while (x[am] != m) am++;
    }
    *max_out = m;
    *argmax_out = am;
    return false;
}

double sampler_vec_exp_sum_avx2(const float *x, int32_t n, float m, float scale) {
    double total = 0;
    const __m256 mv = _mm256_set1_ps(m), sv = _mm256_set1_ps(scale);
    for (int32_t b0 = 0; b0 < n; b0 += SAMPLER_PICK_BLOCK) {
        int32_t end = b0 + SAMPLER_PICK_BLOCK < n ? b0 + SAMPLER_PICK_BLOCK : n;
        int32_t i = b0;
        __m256 acc = _mm256_setzero_ps();
        for (; i + 8 <= end; i += 8)
            acc = _mm256_add_ps(
                acc, exp_nonpos8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv), sv)));
        float bs = hsum8(acc);
        for (; i < end; i++) bs += sampler_exp_nonpos((x[i] - m) * scale);
        total += bs;
    }
    return total;
}

double sampler_vec_exp_fill_avx2(const float *x, int32_t n, float m, float scale, float *w,
                                 double *block_sums) {
    double total = 0;
    const __m256 mv = _mm256_set1_ps(m), sv = _mm256_set1_ps(scale);
    for (int32_t b0 = 0; b0 < n; b0 += SAMPLER_PICK_BLOCK) {
        int32_t end = b0 + SAMPLER_PICK_BLOCK < n ? b0 + SAMPLER_PICK_BLOCK : n;
        int32_t i = b0;
        __m256 acc = _mm256_setzero_ps();
        for (; i + 8 <= end; i += 8) {
            __m256 e = exp_nonpos8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv), sv));
            _mm256_storeu_ps(w + i, e);
            acc = _mm256_add_ps(acc, e);
        }
        float bs = hsum8(acc);
        for (; i < end; i++) {
            w[i] = sampler_exp_nonpos((x[i] - m) * scale);
            bs += w[i];
        }
        block_sums[b0 / SAMPLER_PICK_BLOCK] = bs;
        total += bs;
    }
    return total;
}

int32_t sampler_vec_first_above_avx2(const float *x, int32_t from, int32_t n, float floor_value) {
    int32_t i = from;
    const __m256 f = _mm256_set1_ps(floor_value);
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_cmp_ps(_mm256_loadu_ps(x + i), f, _CMP_GT_OQ);
        __m256 b = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 8), f, _CMP_GT_OQ);
        if (_mm256_movemask_ps(_mm256_or_ps(a, b))) break;
    }
    for (; i < n; i++)
        if (x[i] > floor_value) return i;
    return n;
}

int32_t sampler_vec_first_at_least_avx2(const float *x, int32_t from, int32_t n,
                                        float threshold) {
    int32_t i = from;
    const __m256 t = _mm256_set1_ps(threshold);
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_cmp_ps(_mm256_loadu_ps(x + i), t, _CMP_GE_OQ);
        __m256 b = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 8), t, _CMP_GE_OQ);
        if (_mm256_movemask_ps(_mm256_or_ps(a, b))) break;
    }
    for (; i < n; i++)
        if (x[i] >= threshold) return i;
    return n;
}
