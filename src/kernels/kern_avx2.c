/*
 * kern_avx2.c - AVX2/FMA/F16C variants of the hottest kernels. Compiled with
 * -mavx2 -mfma -mf16c (the Makefile rule for *_avx2.c files);
 * nothing here may run before kernels.c has checked the CPU (kern_cpu_has_avx2()).
 *
 * Integer dots use the maddubs sign trick: |x| (unsigned) times y with x's sign.
 * maddubs saturates at 2*128*128, so it relies on quants in [-127, 127]: what ggml
 * and hl_quantize_row produce (Q8 never stores -128; Q4 values are small).
 */
#include <immintrin.h>

#include "kernels/kern_internal.h"

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float fp16_to_f32(hl_fp16 h) { return _cvtsh_ss(h); }

/* ---- float weights --------------------------------------------------------------- */

static inline __m256 load_f16x8(const hl_fp16 *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256 load_bf16x8(const hl_bf16 *p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* Four accumulators hide the FMA latency. */
#define FLOAT_DOT(NAME, WTYPE, LOAD, SCALAR)                                             \
    static float NAME(int64_t n, const void *row, const void *vec) {                    \
        const WTYPE *a = row;                                                           \
        const float *b = vec;                                                           \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                  \
        __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();                  \
        int64_t i = 0;                                                                  \
        for (; i + 32 <= n; i += 32) {                                                  \
            acc0 = _mm256_fmadd_ps(LOAD(a + i), _mm256_loadu_ps(b + i), acc0);          \
            acc1 = _mm256_fmadd_ps(LOAD(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);  \
            acc2 = _mm256_fmadd_ps(LOAD(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2); \
            acc3 = _mm256_fmadd_ps(LOAD(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3); \
        }                                                                               \
        for (; i + 8 <= n; i += 8)                                                      \
            acc0 = _mm256_fmadd_ps(LOAD(a + i), _mm256_loadu_ps(b + i), acc0);          \
        float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3))); \
        for (; i < n; i++) sum += SCALAR(a[i]) * b[i];                                  \
        return sum;                                                                     \
    }

#define F32_SCALAR(v) (v)
FLOAT_DOT(dot_f32, float, _mm256_loadu_ps, F32_SCALAR)
FLOAT_DOT(dot_f16, hl_fp16, load_f16x8, fp16_to_f32)
FLOAT_DOT(dot_bf16, hl_bf16, load_bf16x8, hl_bf16_to_fp32)

/* ---- 32-element blocks ------------------------------------------------------------ */

/* sum of x*y over 32 int8 pairs, as 8 float partial sums */
static inline __m256 dot_i8x32(__m256i x, __m256i y) {
    const __m256i ax = _mm256_sign_epi8(x, x);
    const __m256i sy = _mm256_sign_epi8(y, x);
    const __m256i d16 = _mm256_maddubs_epi16(ax, sy);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(d16, _mm256_set1_epi16(1)));
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15), then high (16..31) */
static inline __m256i unpack_nibbles(const uint8_t *qs) {
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(b),
                                                 _mm_srli_epi16(b, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

static float dot_q4_0(int64_t n, const void *row, const void *vec) {
    const block_q4_0 *x = row;
    const block_q8_0 *y = vec;
    const int64_t nb = n / QK4_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m256i q0 = _mm256_sub_epi8(unpack_nibbles(x[i].qs), _mm256_set1_epi8(8));
        const __m256i q1 = _mm256_sub_epi8(unpack_nibbles(x[i + 1].qs), _mm256_set1_epi8(8));
        const __m256 d0 = _mm256_set1_ps(fp16_to_f32(x[i].d) * fp16_to_f32(y[i].d));
        const __m256 d1 = _mm256_set1_ps(fp16_to_f32(x[i + 1].d) * fp16_to_f32(y[i + 1].d));
        acc0 = _mm256_fmadd_ps(d0, dot_i8x32(q0, _mm256_loadu_si256((const __m256i *)y[i].qs)), acc0);
        acc1 = _mm256_fmadd_ps(d1, dot_i8x32(q1, _mm256_loadu_si256((const __m256i *)y[i + 1].qs)), acc1);
    }
    for (; i < nb; i++) {
        const __m256i q0 = _mm256_sub_epi8(unpack_nibbles(x[i].qs), _mm256_set1_epi8(8));
        const __m256 d0 = _mm256_set1_ps(fp16_to_f32(x[i].d) * fp16_to_f32(y[i].d));
        acc0 = _mm256_fmadd_ps(d0, dot_i8x32(q0, _mm256_loadu_si256((const __m256i *)y[i].qs)), acc0);
    }
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

static float dot_q8_0(int64_t n, const void *row, const void *vec) {
    const block_q8_0 *x = row;
    const block_q8_0 *y = vec;
    const int64_t nb = n / QK8_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m256 d0 = _mm256_set1_ps(fp16_to_f32(x[i].d) * fp16_to_f32(y[i].d));
        const __m256 d1 = _mm256_set1_ps(fp16_to_f32(x[i + 1].d) * fp16_to_f32(y[i + 1].d));
        acc0 = _mm256_fmadd_ps(d0, dot_i8x32(_mm256_loadu_si256((const __m256i *)x[i].qs),
                                             _mm256_loadu_si256((const __m256i *)y[i].qs)), acc0);
        acc1 = _mm256_fmadd_ps(d1, dot_i8x32(_mm256_loadu_si256((const __m256i *)x[i + 1].qs),
                                             _mm256_loadu_si256((const __m256i *)y[i + 1].qs)), acc1);
    }
    for (; i < nb; i++) {
        const __m256 d0 = _mm256_set1_ps(fp16_to_f32(x[i].d) * fp16_to_f32(y[i].d));
        acc0 = _mm256_fmadd_ps(d0, dot_i8x32(_mm256_loadu_si256((const __m256i *)x[i].qs),
                                             _mm256_loadu_si256((const __m256i *)y[i].qs)), acc0);
    }
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

/* ---- activation quantizer --------------------------------------------------------- */

/* roundf(): half away from zero, as the reference quantizer rounds. v - trunc(v)
 * is exact, so the comparison with 0.5 is too. */
static inline __m256 round_half_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    const __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(up, one));
}

/* Bit-identical to hl_quantize_row(HL_TYPE_Q8_0) for finite input. */
static void quantize_q8_0(const float *x, void *dst, int64_t n) {
    block_q8_0 *y = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        __m256 v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 8 * k);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = hl_fp32_to_fp16(d);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvtps_epi32(round_half_away(_mm256_mul_ps(v[k], vid)));
        /* packs interleave 128-bit lanes; the permute restores element order */
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                             _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)y[i].qs, _mm256_permutevar8x32_epi32(p, perm));
    }
}

void kern_avx2_fill(kern_table *t) {
    t->name = "avx2";
    t->vec_dot[HL_TYPE_F32] = dot_f32;
    t->vec_dot[HL_TYPE_F16] = dot_f16;
    t->vec_dot[HL_TYPE_BF16] = dot_bf16;
    t->vec_dot[HL_TYPE_Q4_0] = dot_q4_0;
    t->vec_dot[HL_TYPE_Q8_0] = dot_q8_0;
    t->quantize[HL_TYPE_Q8_0] = quantize_q8_0;
}
