/*
 * test_kernels.c - dot products (reference and SIMD), matmul, and the small f32 ops,
 * each against a naive float/double computation.
 */
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/pool.h"
#include "kernels/kern_internal.h"
#include "kernels/kernels.h"

static uint32_t g_rng = 0x9e3779b9u;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 17;
    g_rng ^= g_rng << 5;
    return g_rng;
}
static float frand(void) { return (float)(rnd() >> 8) / 16777216.0f * 2.0f - 1.0f; }

static const hl_type g_weight_types[] = {
    HL_TYPE_F32,  HL_TYPE_F16,  HL_TYPE_BF16, HL_TYPE_Q4_0, HL_TYPE_Q4_1,
    HL_TYPE_Q5_0, HL_TYPE_Q5_1, HL_TYPE_Q8_0, HL_TYPE_Q2_K, HL_TYPE_Q3_K,
    HL_TYPE_Q4_K, HL_TYPE_Q5_K, HL_TYPE_Q6_K, HL_TYPE_MXFP4,
};
#define N_WEIGHT_TYPES (sizeof g_weight_types / sizeof g_weight_types[0])

/* A random weight row: quantized random floats for the 32-element types, random bytes
 * with sane fp16 scales for the K-quants (every bit pattern of their quants and scales
 * is valid, and random bytes reach patterns a quantizer rarely writes). */
static void random_weights(hl_type t, void *dst, int64_t n) {
    const hl_type_traits *tr = hl_type_traits_get(t);
    if (tr->can_quantize && tr->block_size != QK_K) {
        float *x = malloc((size_t)n * sizeof *x);
        for (int64_t i = 0; i < n; i++) x[i] = frand();
        hl_quantize_row(t, x, dst, n);
        free(x);
        return;
    }
    uint8_t *p = dst;
    const int64_t nb = n / tr->block_size;
    for (size_t i = 0; i < (size_t)nb * tr->type_size; i++) p[i] = (uint8_t)rnd();
    for (int64_t b = 0; b < nb; b++) {
        const hl_fp16 d = hl_fp32_to_fp16(0.01f + 0.02f * fabsf(frand()));
        const hl_fp16 dmin = hl_fp32_to_fp16(0.01f * fabsf(frand()));
        switch (t) {
        case HL_TYPE_Q2_K:
            ((block_q2_K *)dst)[b].d = d;
            ((block_q2_K *)dst)[b].dmin = dmin;
            break;
        case HL_TYPE_Q3_K: ((block_q3_K *)dst)[b].d = d; break;
        case HL_TYPE_Q4_K:
            ((block_q4_K *)dst)[b].d = d;
            ((block_q4_K *)dst)[b].dmin = dmin;
            break;
        case HL_TYPE_Q5_K:
            ((block_q5_K *)dst)[b].d = d;
            ((block_q5_K *)dst)[b].dmin = dmin;
            break;
        case HL_TYPE_Q6_K: ((block_q6_K *)dst)[b].d = d; break;
        /* scales 2^-7 .. 2^-4 (times the doubled values: up to 0.75) */
        case HL_TYPE_MXFP4: ((block_mxfp4 *)dst)[b].e = (uint8_t)(121 + rnd() % 4); break;
        default: break;
        }
    }
}

/* dot of the dequantized weight and dequantized activations, in double; *mag gets
 * sum |w*x| to scale tolerances */
static double dequant_dot(hl_type t, const void *row, const void *xq, int64_t n, double *mag) {
    const hl_type vdt = hl_type_traits_get(t)->vec_dot_type;
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    hl_dequantize_row(t, row, a, n);
    hl_dequantize_row(vdt, xq, b, n);
    double s = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)a[i] * b[i];
        m += fabs((double)a[i] * b[i]);
    }
    free(a);
    free(b);
    *mag = m;
    return s;
}

static void *row_alloc(hl_type t, int64_t n) { return malloc(hl_row_size(t, n) + 1); }

/* The reference dot must be the dot of what the dequantizers decode: this ties the
 * dot kernels' element order to the (hand-checked) dequantizer layouts. */
TEST(kernels_ref_vec_dot_matches_dequantized_dot) {
    const kern_table *ref = kern_table_ref();
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const hl_type t = g_weight_types[ti];
        const hl_type vdt = hl_type_traits_get(t)->vec_dot_type;
        const int64_t n = 2 * QK_K;
        void *w = row_alloc(t, n), *xq = row_alloc(vdt, n);
        float x[2 * QK_K];
        for (int i = 0; i < n; i++) x[i] = frand();
        random_weights(t, w, n);
        hl_quantize_row(vdt, x, xq, n);
        double mag;
        const double want = dequant_dot(t, w, xq, n, &mag);
        const float got = ref->vec_dot[t](n, w, xq);
        CHECK_MSG(fabs(got - want) <= 1e-5 * mag + 1e-6, "%s: %.9g vs %.9g (mag %g)",
                  hl_type_name(t), got, want, mag);
        CHECK_MSG(mag > 0.1, "%s: degenerate test data", hl_type_name(t));
        free(w);
        free(xq);
    }
}

/* With quantized activations the dot approximates the exact float dot; a bound per
 * weight type, relative to sum |w*x|, catches a wrong activation type or scale. */
TEST(kernels_vec_dot_close_to_float_dot) {
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const hl_type t = g_weight_types[ti];
        const hl_type vdt = hl_type_traits_get(t)->vec_dot_type;
        const int64_t n = 4 * QK_K;
        void *w = row_alloc(t, n), *xq = row_alloc(vdt, n);
        static float x[4 * QK_K], wf[4 * QK_K];
        for (int i = 0; i < n; i++) x[i] = frand();
        random_weights(t, w, n);
        hl_dequantize_row(t, w, wf, n);
        hl_quantize_row(vdt, x, xq, n);
        double want = 0, mag = 0;
        for (int i = 0; i < n; i++) {
            want += (double)wf[i] * x[i];
            mag += fabs((double)wf[i] * x[i]);
        }
        const float got = kern_vec_dot(t, n, w, xq);
        CHECK_MSG(fabs(got - want) <= 0.02 * mag, "%s: %.9g vs %.9g (mag %g)", hl_type_name(t), got,
                  want, mag);
        free(w);
        free(xq);
    }
}

TEST(kernels_variant_selection) {
    CHECK_STR(kern_choose_variant("ref"), "ref");
    const char *best = kern_cpu_has_amx()        ? "amx"
                       : kern_cpu_has_avx512()   ? "avx512"
                       : kern_cpu_has_avx_vnni() ? "avx2-vnni"
                       : kern_cpu_has_avx2()     ? "avx2"
                                                 : "ref";
    CHECK_STR(kern_choose_variant(NULL), best);
    CHECK_STR(kern_choose_variant("bogus"), best);
    CHECK_STR(kern_choose_variant("avx2"), kern_cpu_has_avx2() ? "avx2" : "ref");
    CHECK(!kern_cpu_has_avx_vnni() || kern_cpu_has_avx2());
    CHECK(!kern_cpu_has_avx512() || kern_cpu_has_avx2());
    CHECK(!kern_cpu_has_amx() || kern_cpu_has_avx512());
    CHECK_STR(kern_choose_variant("avx512"), kern_cpu_has_avx512()  ? "avx512"
                                             : kern_cpu_has_avx_vnni() ? "avx2-vnni"
                                             : kern_cpu_has_avx2()     ? "avx2"
                                                                       : "ref");
    const char *env = getenv("HEARTH_CPU");
    CHECK_STR(kern_variant(), kern_choose_variant(env));
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++)
        CHECK(kern_table_active()->vec_dot[g_weight_types[ti]] != NULL);
}

/* Every SIMD entry against the reference, on odd lengths so tails are exercised. */
TEST(kernels_simd_vec_dot_matches_ref) {
    if (!kern_cpu_has_avx2()) SKIP("CPU has no avx2+fma+f16c");
    kern_table simd = *kern_table_ref();
    kern_avx2_fill(&simd);
    const kern_table *ref = kern_table_ref();
    int n_simd = 0;
    static const int blocks[] = {1, 3, 7, 33};
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const hl_type t = g_weight_types[ti];
        if (simd.vec_dot[t] == ref->vec_dot[t]) continue;
        n_simd++;
        const hl_type vdt = hl_type_traits_get(t)->vec_dot_type;
        const int64_t bs = hl_type_traits_get(t)->block_size;
        for (int k = 0; k < 4; k++) {
            /* plain types: odd element counts (1, 3, 7, 33 and 32x those + 5) */
            for (int pass = 0; pass < (bs == 1 ? 2 : 1); pass++) {
                const int64_t n =
                    bs == 1 ? (pass ? blocks[k] * 32 + 5 : blocks[k]) : blocks[k] * bs;
                void *w = row_alloc(t, n), *xq = row_alloc(vdt, n);
                float *x = malloc((size_t)n * sizeof *x);
                for (int64_t i = 0; i < n; i++) x[i] = frand();
                random_weights(t, w, n);
                hl_quantize_row(vdt, x, xq, n);
                double mag;
                dequant_dot(t, w, xq, n, &mag);
                const float want = ref->vec_dot[t](n, w, xq), got = simd.vec_dot[t](n, w, xq);
                /* float sums in another order: a few ulps of sum |w*x| */
                CHECK_MSG(fabs(got - want) <= 1e-5 * mag + 1e-30, "%s n=%lld: %.9g vs %.9g",
                          hl_type_name(t), (long long)n, got, want);
                free(w);
                free(xq);
                free(x);
            }
        }
    }
    CHECK_EQ_INT(n_simd, N_WEIGHT_TYPES); /* every weight type has an AVX2 dot */
}

/* The multi-token dots must equal the single-token dot exactly, so that prefill and
 * decode give identical logits. */
TEST(kernels_simd_vec_dot4_equals_vec_dot) {
    if (!kern_cpu_has_avx2()) SKIP("CPU has no avx2+fma+f16c");
    kern_table simd = *kern_table_ref();
    kern_avx2_fill(&simd);
    int n_dot4 = 0;
    static const int blocks[] = {1, 3, 7, 33};
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const hl_type t = g_weight_types[ti];
        if (!simd.vec_dot4[t]) continue;
        n_dot4++;
        const hl_type vdt = hl_type_traits_get(t)->vec_dot_type;
        for (int k = 0; k < 4; k++) {
            const int64_t n = blocks[k] * hl_type_traits_get(t)->block_size;
            const size_t xr = hl_row_size(vdt, n) + 4; /* a stride other than the row size */
            void *w = row_alloc(t, n);
            uint8_t *xq = malloc(4 * xr);
            float *x = malloc((size_t)n * sizeof *x);
            random_weights(t, w, n);
            for (int tok = 0; tok < 4; tok++) {
                for (int64_t i = 0; i < n; i++) x[i] = frand();
                hl_quantize_row(vdt, x, xq + tok * xr, n);
            }
            float out[4];
            simd.vec_dot4[t](n, w, xq, xr, out);
            for (int tok = 0; tok < 4; tok++)
                CHECK_MSG(out[tok] == simd.vec_dot[t](n, w, xq + tok * xr), "%s n=%lld tok %d",
                          hl_type_name(t), (long long)n, tok);
            free(w);
            free(xq);
            free(x);
        }
    }
    CHECK_EQ_INT(n_dot4, N_WEIGHT_TYPES); /* every weight type */
}

/* The register-blocked tiles (2 weight rows x 4 tokens) must equal the single-token dot
 * exactly for every (row, token) pair, with strides other than the row sizes and an
 * output stride other than the tile width. */
static void check_tiles(const kern_table *simd, int *n_tile) {
    *n_tile = 0;
    static const int blocks[] = {1, 3, 7, 33};
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const hl_type t = g_weight_types[ti];
        if (!simd->vec_dot_tile[t]) continue;
        (*n_tile)++;
        const hl_type vdt = hl_type_traits_get(t)->vec_dot_type;
        for (int k = 0; k < 4; k++) {
            const int64_t n = blocks[k] * hl_type_traits_get(t)->block_size;
            const size_t wr = hl_row_size(t, n) + 6, xr = hl_row_size(vdt, n) + 4;
            uint8_t *w = malloc(KERN_TILE_ROWS * wr);
            uint8_t *xq = malloc(KERN_TILE_TOKS * xr);
            float *x = malloc((size_t)n * sizeof *x);
            for (int r = 0; r < KERN_TILE_ROWS; r++) random_weights(t, w + r * wr, n);
            for (int tok = 0; tok < KERN_TILE_TOKS; tok++) {
                for (int64_t i = 0; i < n; i++) x[i] = frand() * (float)(tok + 1);
                hl_quantize_row(vdt, x, xq + tok * xr, n);
            }
            /* Q8_0 activations: with and without their scales in float (vscale) */
            float *vscale = NULL;
            if (vdt == HL_TYPE_Q8_0) {
                vscale = malloc(sizeof *vscale * KERN_TILE_TOKS * (size_t)(n / QK8_0));
                for (int tok = 0; tok < KERN_TILE_TOKS; tok++)
                    for (int64_t i = 0; i < n / QK8_0; i++)
                        vscale[KERN_TILE_TOKS * i + tok] =
                            hl_fp16_to_fp32(((const block_q8_0 *)(xq + tok * xr))[i].d);
            }
            for (int with_vs = 0; with_vs <= (vscale != NULL); with_vs++) {
                const size_t os = KERN_TILE_ROWS + 3;
                float out[KERN_TILE_TOKS * (KERN_TILE_ROWS + 3)];
                for (size_t i = 0; i < sizeof out / sizeof out[0]; i++) out[i] = -1234.5f;
                simd->vec_dot_tile[t](n, w, wr, xq, xr, with_vs ? vscale : NULL, out, os);
                for (int tok = 0; tok < KERN_TILE_TOKS; tok++) {
                    for (int r = 0; r < KERN_TILE_ROWS; r++) {
                        const float want = simd->vec_dot[t](n, w + r * wr, xq + tok * xr);
                        CHECK_MSG(out[tok * os + r] == want,
                                  "%s %s n=%lld row %d tok %d vscale %d: %g vs %g", simd->name,
                                  hl_type_name(t), (long long)n, r, tok, with_vs,
                                  out[tok * os + r], want);
                    }
                    for (size_t r = KERN_TILE_ROWS; r < os; r++)
                        CHECK(out[tok * os + r] == -1234.5f);
                }
            }
            free(vscale);
            free(w);
            free(xq);
            free(x);
        }
    }
}

/* The register-blocked tiles (2 weight rows x 4 tokens) must equal the single-token dot
 * exactly for every (row, token) pair, with strides other than the row sizes and an
 * output stride other than the tile width; the AVX-VNNI and AVX-512 tiles too, where
 * the CPU has them. */
TEST(kernels_simd_vec_dot_tile_equals_vec_dot) {
    if (!kern_cpu_has_avx2()) SKIP("CPU has no avx2+fma+f16c");
    kern_table simd = *kern_table_ref();
    kern_avx2_fill(&simd);
    int n_tile;
    check_tiles(&simd, &n_tile);
    CHECK_EQ_INT(n_tile, 4); /* q4_0, q8_0, q4_K, q6_K */
    if (kern_cpu_has_avx_vnni()) {
        kern_avx_vnni_fill(&simd);
        CHECK_STR(simd.name, "avx2-vnni");
        check_tiles(&simd, &n_tile);
        CHECK_EQ_INT(n_tile, 4);
    }
    if (!kern_cpu_has_avx512()) SKIP("CPU has no AVX-512: its tiles were not tested");
    kern_avx512_fill(&simd);
    CHECK_STR(simd.name, "avx512");
    check_tiles(&simd, &n_tile);
    CHECK_EQ_INT(n_tile, 4);
    /* its single-token dots return the AVX2 dots' bits, so any variant's prefill and
     * decode agree */
    kern_table avx2 = *kern_table_ref();
    kern_avx2_fill(&avx2);
    int n_dot = 0;
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const hl_type t = g_weight_types[ti];
        if (simd.vec_dot[t] == avx2.vec_dot[t]) continue;
        n_dot++;
        const hl_type vdt = hl_type_traits_get(t)->vec_dot_type;
        for (int blocks = 1; blocks <= 33; blocks += 7) { /* odd and even block counts */
            const int64_t n = blocks * hl_type_traits_get(t)->block_size;
            void *w = row_alloc(t, n), *xq = row_alloc(vdt, n);
            float *x = malloc((size_t)n * sizeof *x);
            random_weights(t, w, n);
            for (int64_t i = 0; i < n; i++) x[i] = frand();
            hl_quantize_row(vdt, x, xq, n);
            CHECK_MSG(simd.vec_dot[t](n, w, xq) == avx2.vec_dot[t](n, w, xq), "%s n=%lld",
                      hl_type_name(t), (long long)n);
            free(w);
            free(xq);
            free(x);
        }
    }
    CHECK_EQ_INT(n_dot, 3); /* q4_0, q4_K, q6_K */
}

/* The online softmax's exp for arguments <= 0 (kern_table.exp_nonpos_shift_sum) gives
 * exp_shift_sum's bits: every 61st float from -0 down to -inf, every float around the
 * underflow cut (-87.33) and the subnormal results just above it, +0, NaN, -inf, and the
 * returned sums over lengths with tails (the tail runs the general exp). */
TEST(kernels_exp_nonpos_equals_exp) {
    if (!kern_cpu_has_avx2()) SKIP("CPU has no avx2+fma+f16c");
    kern_table simd = *kern_table_ref();
    kern_avx2_fill(&simd);
    CHECK(simd.exp_nonpos_shift_sum != NULL);
    enum { N = 4096 };
    static float a[N], b[N];
    int64_t n_checked = 0, n_diff = 0;
    /* -87.4 .. -86.9 as bit patterns, then the rest of the sign-set range with a stride */
    uint32_t cut_lo, cut_hi;
    const float flo = -86.9f, fhi = -87.4f;
    memcpy(&cut_lo, &flo, 4);
    memcpy(&cut_hi, &fhi, 4);
    for (int pass = 0; pass < 2; pass++) {
        const uint64_t first = pass == 0 ? cut_lo : 0x80000000u;
        const uint64_t last = pass == 0 ? cut_hi : 0xffffffffu, step = pass == 0 ? 1 : 61;
        int k = 0;
        for (uint64_t u = first; u <= last; u += step) {
            const uint32_t bits = (uint32_t)u;
            memcpy(&a[k], &bits, 4);
            if (++k < N && u + step <= last) continue;
            memcpy(b, a, (size_t)k * sizeof *a);
            simd.exp_nonpos_shift_sum(a, k, 0.0f);
            simd.exp_shift_sum(b, k, 0.0f);
            for (int i = 0; i < k; i++)
                n_diff += memcmp(&a[i], &b[i], 4) != 0 && !(isnan(a[i]) && isnan(b[i]));
            n_checked += k;
            k = 0;
        }
    }
    CHECK_MSG(n_diff == 0, "%lld of %lld arguments differ", (long long)n_diff,
              (long long)n_checked);
    CHECK(n_checked > 35000000);
    float sp[4] = {0.0f, NAN, -INFINITY, -0.0f}, sq[4];
    memcpy(sq, sp, sizeof sp);
    simd.exp_nonpos_shift_sum(sp, 4, 0.0f);
    simd.exp_shift_sum(sq, 4, 0.0f);
    CHECK(sp[0] == 1.0f && isnan(sp[1]) && sp[2] == 0.0f && sp[3] == 1.0f);
    CHECK(sq[0] == sp[0] && isnan(sq[1]) && sq[2] == sp[2] && sq[3] == sp[3]);
    /* softmax steps: scores against their max, the sums bit for bit */
    for (int n = 1; n < 70; n += 3) {
        float mx = -INFINITY;
        for (int i = 0; i < n; i++) {
            a[i] = b[i] = frand() * 20.0f;
            if (a[i] > mx) mx = a[i];
        }
        const float sa = simd.exp_nonpos_shift_sum(a, n, mx), sb = simd.exp_shift_sum(b, n, mx);
        CHECK_MSG(memcmp(&sa, &sb, 4) == 0 && memcmp(a, b, (size_t)n * sizeof *a) == 0,
                  "n=%d: sums %.9g vs %.9g", n, sa, sb);
    }
}

/* The SIMD exp (softmax, swiglu) against expf over the whole float range, and the
 * other small ops against the reference, on lengths with tails. */
TEST(kernels_simd_small_ops_match_ref) {
    if (!kern_cpu_has_avx2()) SKIP("CPU has no avx2+fma+f16c");
    kern_table simd = *kern_table_ref();
    kern_avx2_fill(&simd);
    const kern_table *ref = kern_table_ref();
    CHECK(simd.exp_shift_sum != ref->exp_shift_sum);
    enum { N = 4003 };
    static float x[N], y[N], a[N], b[N];
    for (int i = 0; i < N; i++) x[i] = -100.0f + 190.0f * (float)i / (N - 1); /* -100..90 */
    memcpy(y, x, sizeof x);
    simd.exp_shift_sum(y, N, 0.0f);
    for (int i = 0; i < N; i++) {
        const float want = expf(x[i]);
        if (isinf(want))
            CHECK_MSG(isinf(y[i]) && y[i] > 0, "exp(%g) = %g", x[i], y[i]);
        else if (want < 1.2e-38f)
            CHECK_MSG(y[i] <= 1.2e-38f && y[i] >= 0, "exp(%g) = %g", x[i], y[i]);
        else
            CHECK_MSG(fabsf(y[i] - want) <= 4e-7f * want, "exp(%g) = %.9g vs %.9g", x[i], y[i],
                      want);
    }
    float nan_in[3] = {NAN, 0.0f, -INFINITY};
    simd.exp_shift_sum(nan_in, 3, 0.0f);
    CHECK(isnan(nan_in[0]) && nan_in[1] == 1.0f && nan_in[2] == 0.0f);
    /* the sum it returns, on a short odd length */
    for (int i = 0; i < 13; i++) a[i] = b[i] = frand() * 10.0f;
    const float sa = simd.exp_shift_sum(a, 13, 3.0f), sb = ref->exp_shift_sum(b, 13, 3.0f);
    CHECK_NEAR(sa, sb, 1e-6 * sb);
    for (int n = 1; n < 40; n += 3) {
        for (int i = 0; i < n; i++) {
            x[i] = frand() * 12.0f;
            y[i] = frand();
        }
        simd.swiglu(a, x, y, n);
        ref->swiglu(b, x, y, n);
        for (int i = 0; i < n; i++) CHECK_NEAR(a[i], b[i], 1e-6 * (fabsf(b[i]) + 1e-3f));
        memcpy(a, y, (size_t)n * sizeof *a);
        memcpy(b, y, (size_t)n * sizeof *b);
        float y0[64];
        memcpy(y0, a, (size_t)n * sizeof *a);
        simd.axpy(a, 0.37f, x, n);
        ref->axpy(b, 0.37f, x, n);
        /* fused vs separate multiply-add: the error scales with the terms, not with the
         * (possibly near-cancelled) result */
        for (int i = 0; i < n; i++)
            CHECK_NEAR(a[i], b[i], 1e-6 * (fabsf(y0[i]) + 0.37f * fabsf(x[i]) + 1e-3f));
        const float ss = simd.sum_squares(x, n), sr = ref->sum_squares(x, n);
        CHECK_NEAR(ss, sr, 1e-6 * sr);
    }
}

/* Attention helpers: scores close to the reference and, for a key, the same bits for
 * any run length and slot; the value sum equal to one fmaf per key and element in key
 * order, bit for bit, in both variants. Head sizes with and without a multiple of 8 or 32. */
TEST(kernels_attention_rows_match_ref) {
    kern_table simd = *kern_table_ref();
    if (kern_cpu_has_avx2()) kern_avx2_fill(&simd);
    const kern_table *tabs[2] = {kern_table_ref(), &simd};
    static const int dims[] = {64, 40, 12, 7};
    enum { NK = 13, LD = 70 };
    static float q[LD], k[NK * LD], v[NK * LD], p[NK], y[2][LD], want[LD];
    for (int di = 0; di < 4; di++) {
        const int d = dims[di];
        for (int i = 0; i < NK * LD; i++) {
            k[i] = frand();
            v[i] = frand();
        }
        for (int i = 0; i < LD; i++) q[i] = frand();
        for (int j = 0; j < NK; j++) p[j] = fabsf(frand());
        float s[2][NK];
        for (int ti = 0; ti < 2; ti++) {
            tabs[ti]->dot_rows(s[ti], q, k, LD, NK, d, 0.125f);
            for (int j = 0; j < NK; j++) {
                double exact = 0;
                for (int i = 0; i < d; i++) exact += (double)q[i] * k[j * LD + i];
                CHECK_NEAR(s[ti][j], 0.125 * exact, 1e-5);
                float one[NK];
                tabs[ti]->dot_rows(one, q, k + j * LD, LD, NK - j, d, 0.125f); /* key j first */
                CHECK_MSG(one[0] == s[ti][j], "%s d=%d key %d: %g vs %g", tabs[ti]->name, d, j,
                          one[0], s[ti][j]);
            }
            for (int i = 0; i < d; i++) y[ti][i] = want[i] = frand();
            tabs[ti]->axpy_rows(y[ti], p, v, LD, NK, d);
            for (int j = 0; j < NK; j++)
                for (int i = 0; i < d; i++) want[i] = fmaf(p[j], v[j * LD + i], want[i]);
            for (int i = 0; i < d; i++)
                CHECK_MSG(y[ti][i] == want[i], "%s d=%d elem %d: %g vs %g", tabs[ti]->name, d, i,
                          y[ti][i], want[i]);
        }
    }
}

/* kern_max skips NaNs as the reference does and gives -inf for nothing to compare;
 * kern_scale is a plain multiply. Lengths around the vector widths. */
TEST(kernels_max_and_scale_match_ref) {
    kern_table simd = *kern_table_ref();
    if (kern_cpu_has_avx2()) kern_avx2_fill(&simd);
    const kern_table *ref = kern_table_ref();
    float x[41], a[41], b[41];
    for (int n = 1; n <= 41; n++) {
        for (int i = 0; i < n; i++) x[i] = frand() * 50.0f - 60.0f;
        if (n > 3) x[n / 2] = NAN;
        if (n > 5) x[n - 1] = NAN; /* in the scalar tail, or the last lane */
        const float want = ref->max(x, n);
        CHECK(!isnan(want));
        CHECK_MSG(simd.max(x, n) == want, "n=%d: %g vs %g", n, simd.max(x, n), want);
        x[n - 1] = 1e30f; /* the largest in the last place */
        CHECK(simd.max(x, n) == 1e30f);
        memcpy(a, x, sizeof x);
        memcpy(b, x, sizeof x);
        simd.scale(a, 0.3f, n);
        ref->scale(b, 0.3f, n);
        for (int i = 0; i < n; i++) CHECK(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])));
    }
    const float nans[3] = {NAN, NAN, NAN};
    CHECK(kern_max(nans, 3) == -INFINITY);
    CHECK(kern_max(nans, 0) == -INFINITY);
    CHECK(simd.max(nans, 3) == -INFINITY);
}

/* Decode attention's step for a GQA group (kern_attn_block): the SIMD kernel (f16 heads
 * in pairs, each key and value row converted once per pair) equals its own table's
 * per-head pieces bit for bit, for any head count (odd ones run the last head alone), key
 * count (vector tails) and head size (unrolled 64 and 128, chunks of 32 and 8, a scalar
 * tail); the step's keys split into two runs elsewhere in memory (two cache blocks) give
 * the same bits as one run, wherever the split falls; all within rounding of the
 * reference table; and two steps in a row (the first naming the second for prefetch)
 * give the softmax attention of all their keys. */
static void check_attn_block(const kern_table simd) {
    CHECK(simd.attn_block_f16 != NULL);
    enum { MAXH = 16, MAXK = 67, LD = 131, WAYS = 5 };
    /* 64 and 128: the kernel's unrolled head sizes; the others its generic loop */
    static const int heads[] = {1, 2, 3, 6, 7, 8, 9, 12, 16}, keys[] = {1, 5, 64, 67},
                     dims[] = {64, 128, 80, 24, 12};
    static float q[MAXH * LD];
    /* each step's keys and values, and a copy of the rows from its split on (its second
     * run, elsewhere in memory) */
    static hl_fp16 k[2 * MAXK * LD], v[2 * MAXK * LD], k2[2 * MAXK * LD], v2[2 * MAXK * LD];
    float o[WAYS][MAXH * LD], m[WAYS][MAXH], sum[WAYS][MAXH], score[8 * MAXK];
    int n_cases = 0;
    /* keys by rows (LD apart) and by columns (kv/layout.h; key j's element i at
     * i * MAXK + j, the cache's tiles with a width of MAXK) */
    for (int cols = 0; cols < 2; cols++)
    for (int di = 0; di < 5; di++)
        for (int hi = 0; hi < 9; hi++)
            for (int ki = 0; ki < 4; ki++) {
                const int d = dims[di], nh = heads[hi], nk = keys[ki];
                const int split = nk * (di + hi + ki + 1) % (nk + 1); /* 0 .. nk */
                for (int i = 0; i < MAXH * LD; i++) q[i] = 2.0f * frand();
                for (int i = 0; i < 2 * MAXK * LD; i++) {
                    k[i] = hl_fp32_to_fp16(frand());
                    v[i] = hl_fp32_to_fp16(frand());
                }
                for (int blk = 0; blk < 2; blk++)
                    for (int j = split; j < nk; j++)
                        for (int i = 0; i < LD; i++) {
                            const size_t at = (size_t)blk * MAXK * LD;
                            if (cols && i < d)
                                k2[at + (size_t)i * MAXK + (size_t)(j - split)] =
                                    k[at + (size_t)i * MAXK + (size_t)j];
                            else if (!cols)
                                k2[(blk * MAXK + j - split) * LD + i] = k[(blk * MAXK + j) * LD + i];
                            v2[(blk * MAXK + j - split) * LD + i] = v[(blk * MAXK + j) * LD + i];
                        }
                /* 0: SIMD kernel, 1: SIMD pieces, 2: reference pieces, one run per step;
                 * 3: SIMD kernel, 4: SIMD pieces, two runs. A fresh state, or one with a
                 * sink's start (m = 0.5, s = 1) for odd head counts */
                for (int w = 0; w < WAYS; w++)
                    for (int h = 0; h < nh; h++) {
                        m[w][h] = nh % 2 ? 0.5f : -INFINITY;
                        sum[w][h] = nh % 2 ? 1.0f : 0.0f;
                        for (int i = 0; i < d; i++) o[w][h * d + i] = 0.0f;
                    }
                for (int blk = 0; blk < 2; blk++)
                    for (int w = 0; w < WAYS; w++) {
                        kern_attn_run one[2][2], two[2][2]; /* [step][run] */
                        for (int s = 0; s < 2; s++) {
                            const size_t at = (size_t)s * MAXK * LD;
                            one[s][0] = (kern_attn_run){k + at, v + at, nk, MAXK};
                            one[s][1] = (kern_attn_run){NULL, NULL, 0, 0};
                            two[s][0] = (kern_attn_run){k + at, v + at, split, MAXK};
                            two[s][1] = (kern_attn_run){k2 + at, v2 + at, nk - split, MAXK};
                        }
                        kern_attn_run(*runs)[2] = w < 3 ? one : two;
                        kern_attn_block b = {.nh = nh, .q = q, .ldq = LD, .ldk = LD, .ldv = LD,
                                             .k_cols = cols,
                                             .dk = d, .dv = d, .scale = 0.125f, .o = o[w],
                                             .m = m[w], .s = sum[w], .score = score};
                        b.run[0] = runs[blk][0];
                        b.run[1] = runs[blk][1];
                        if (blk == 0) { /* the first step names the second to prefetch */
                            b.next[0] = runs[1][0];
                            b.next[1] = runs[1][1];
                        }
                        if (w == 0 || w == 3) simd.attn_block_f16(&b);
                        else kern_attn_block_pieces(w == 2 ? kern_table_ref() : &simd,
                                                    HL_TYPE_F16, &b);
                    }
                for (int w = 1; w < WAYS; w++) {
                    if (w == 2) continue;
                    CHECK_MSG(memcmp(o[0], o[w], sizeof(float) * (size_t)(nh * d)) == 0 &&
                                  memcmp(m[0], m[w], sizeof(float) * (size_t)nh) == 0 &&
                                  memcmp(sum[0], sum[w], sizeof(float) * (size_t)nh) == 0,
                              "cols=%d d=%d heads=%d keys=%d split=%d: way %d != the kernel",
                              cols, d, nh, nk, split, w);
                }
                for (int h = 0; h < nh; h++) {
                    CHECK_NEAR(sum[0][h], sum[2][h], 1e-5 * sum[2][h]);
                    CHECK_NEAR(m[0][h], m[2][h], 1e-5);
                    /* the normalised output against a double softmax over both steps */
                    double mx = nh % 2 ? 0.5 : -INFINITY, sc[2 * MAXK];
                    for (int j = 0; j < 2 * nk; j++) {
                        const hl_fp16 *kr = k + (j / nk) * MAXK * LD + (cols ? j % nk : (j % nk) * LD);
                        double e = 0;
                        for (int i = 0; i < d; i++)
                            e += (double)q[h * LD + i] * hl_fp16_to_fp32(kr[cols ? i * MAXK : i]);
                        sc[j] = 0.125 * e;
                        if (sc[j] > mx) mx = sc[j];
                    }
                    double den = nh % 2 ? exp(0.5 - mx) : 0.0;
                    for (int j = 0; j < 2 * nk; j++) den += exp(sc[j] - mx);
                    for (int i = 0; i < d; i++) {
                        double num = 0;
                        for (int j = 0; j < 2 * nk; j++)
                            num += exp(sc[j] - mx) *
                                   hl_fp16_to_fp32(v[(j / nk) * MAXK * LD + (j % nk) * LD + i]);
                        CHECK_NEAR(o[0][h * d + i] / sum[0][h], num / den, 1e-5);
                        CHECK_NEAR(o[0][h * d + i], o[2][h * d + i], 1e-5 * sum[2][h]);
                    }
                }
                n_cases++;
            }
    CHECK_EQ_INT(n_cases, 360);
}

TEST(kernels_attn_block_equals_per_head_pieces) {
    if (!kern_cpu_has_avx2()) SKIP("CPU has no avx2+fma+f16c");
    kern_table simd = *kern_table_ref();
    kern_avx2_fill(&simd);
    check_attn_block(simd);
    if (!kern_cpu_has_avx512()) SKIP("CPU has no AVX-512: its attention kernel was not tested");
    kern_avx512_fill(&simd); /* the zmm kernel against the AVX2 pieces */
    CHECK_STR(simd.name, "avx512");
    check_attn_block(simd);
}

/* SIMD activation quantizers must produce the reference bytes exactly. */
TEST(kernels_simd_quantize_matches_ref) {
    if (!kern_cpu_has_avx2()) SKIP("CPU has no avx2+fma+f16c");
    kern_table simd = *kern_table_ref();
    kern_avx2_fill(&simd);
    const kern_table *ref = kern_table_ref();
    int n_simd = 0;
    const hl_type types[] = {HL_TYPE_Q8_0, HL_TYPE_Q8_1, HL_TYPE_Q8_K};
    for (size_t ti = 0; ti < 3; ti++) {
        const hl_type t = types[ti];
        if (simd.quantize[t] == ref->quantize[t]) continue;
        n_simd++;
        const int64_t bs = hl_type_traits_get(t)->block_size;
        static const int blocks[] = {1, 3, 7, 33};
        for (int k = 0; k < 4; k++) {
            const int64_t n = blocks[k] * bs;
            float *x = malloc((size_t)n * sizeof *x);
            for (int64_t i = 0; i < n; i++) x[i] = frand() * (float)(1 + i % 5);
            /* exact .5 ties after scaling and an all-zero block */
            for (int64_t i = 0; i < bs && i < n; i++) x[i] = (float)(i % 64) - 32.0f;
            if (n >= 3 * bs)
                for (int64_t i = bs; i < 2 * bs; i++) x[i] = 0.0f;
            const size_t sz = hl_row_size(t, n);
            uint8_t *a = malloc(sz), *b = malloc(sz);
            ref->quantize[t](x, a, n);
            simd.quantize[t](x, b, n);
            CHECK_MSG(memcmp(a, b, sz) == 0, "%s n=%lld", hl_type_name(t), (long long)n);
            free(a);
            free(b);
            free(x);
        }
    }
    CHECK_EQ_INT(n_simd, 2); /* q8_0 and q8_K */
}

/* matmul == the vec_dot of every (row, token) pair, bit for bit, for any thread
 * count and token tiling; and close to the float product. */
TEST(kernels_matmul_matches_naive) {
    static const int toks[] = {1, 3, 6, 8, 17, 23, 70}; /* 70: two token blocks */
    static const int threads[] = {1, 3};
    const int64_t n_rows = 37, n_cols = 512;
    for (int th = 0; th < 2; th++) {
        hl_pool *pool = NULL;
        hl_err err;
        CHECK_OK(hl_pool_create(threads[th], &pool, &err), &err);
        for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
            const hl_type t = g_weight_types[ti];
            const hl_type vdt = hl_type_traits_get(t)->vec_dot_type;
            const size_t rb = hl_row_size(t, n_cols);
            uint8_t *w = malloc(rb * (size_t)n_rows);
            for (int64_t r = 0; r < n_rows; r++) random_weights(t, w + r * rb, n_cols);
            for (int k = 0; k < 7; k++) {
                const int64_t nt = toks[k];
                float *x = malloc((size_t)(nt * n_cols) * sizeof *x);
                float *out = malloc((size_t)(nt * n_rows) * sizeof *out);
                for (int64_t i = 0; i < nt * n_cols; i++) x[i] = frand();
                const size_t ss = kern_matmul_scratch_size(t, n_cols, nt);
                void *scratch = ss ? malloc(ss) : NULL;
                kern_matmul(pool, t, w, n_rows, n_cols, x, nt, out, scratch);
                void *xq = row_alloc(vdt, n_cols);
                float *wf = malloc((size_t)n_cols * sizeof *wf);
                for (int64_t tk = 0; tk < nt; tk++) {
                    hl_quantize_row(vdt, x + tk * n_cols, xq, n_cols);
                    for (int64_t r = 0; r < n_rows; r++) {
                        const float want = kern_vec_dot(t, n_cols, w + r * rb, xq);
                        CHECK_MSG(out[tk * n_rows + r] == want,
                                  "%s nt=%lld th=%d tok %lld row %lld: %g vs %g", hl_type_name(t),
                                  (long long)nt, threads[th], (long long)tk, (long long)r,
                                  out[tk * n_rows + r], want);
                        hl_dequantize_row(t, w + r * rb, wf, n_cols);
                        double exact = 0, mag = 0;
                        for (int64_t i = 0; i < n_cols; i++) {
                            exact += (double)wf[i] * x[tk * n_cols + i];
                            mag += fabs((double)wf[i] * x[tk * n_cols + i]);
                        }
                        CHECK(fabs(out[tk * n_rows + r] - exact) <= 0.02 * mag);
                    }
                }
                free(wf);
                free(xq);
                free(scratch);
                free(out);
                free(x);
            }
            free(w);
        }
        hl_pool_destroy(pool);
    }
}

/* The batched-decode shapes: every token count 1..16 (one token per sequence of a decode
 * step: tiles, their leftovers and the caller-quantized activations), rows split between
 * two threads by guided claims, bit for bit the vec_dot of each (row, token), and
 * kern_matmul_many equal to separate matmuls. */
TEST(kernels_matmul_small_batches) {
    const int64_t n_rows = 70, n_cols = 512;
    hl_pool *pool = NULL;
    hl_err err;
    CHECK_OK(hl_pool_create(2, &pool, &err), &err);
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const hl_type t = g_weight_types[ti];
        const hl_type vdt = hl_type_traits_get(t)->vec_dot_type;
        const size_t rb = hl_row_size(t, n_cols);
        uint8_t *w = malloc(rb * (size_t)n_rows);
        for (int64_t r = 0; r < n_rows; r++) random_weights(t, w + r * rb, n_cols);
        float *x = malloc((size_t)(16 * n_cols) * sizeof *x);
        float *out = malloc((size_t)(16 * n_rows) * sizeof *out);
        float *out2 = malloc((size_t)(16 * n_rows) * sizeof *out2);
        void *xq = row_alloc(vdt, n_cols);
        for (int64_t i = 0; i < 16 * n_cols; i++) x[i] = frand();
        for (int64_t nt = 1; nt <= 16; nt++) {
            const size_t ss = kern_matmul_scratch_size(t, n_cols, nt);
            void *scratch = ss ? malloc(ss) : NULL;
            kern_matmul(pool, t, w, n_rows, n_cols, x, nt, out, scratch);
            for (int64_t tk = 0; tk < nt; tk++) {
                hl_quantize_row(vdt, x + tk * n_cols, xq, n_cols);
                for (int64_t r = 0; r < n_rows; r++) {
                    const float want = kern_vec_dot(t, n_cols, w + r * rb, xq);
                    CHECK_MSG(out[tk * n_rows + r] == want, "%s nt=%lld tok %lld row %lld: %g vs %g",
                              hl_type_name(t), (long long)nt, (long long)tk, (long long)r,
                              out[tk * n_rows + r], want);
                }
            }
            /* the same rows as two items of one run (e.g. Wgate and Wup) */
            const kern_matmul_item items[2] = {{t, w, 30, out2},
                                               {t, w + 30 * rb, n_rows - 30, out2 + 30 * nt}};
            kern_matmul_many(pool, items, 2, n_cols, x, nt, scratch);
            for (int64_t tk = 0; tk < nt; tk++)
                for (int64_t r = 0; r < n_rows; r++) {
                    const float got = r < 30 ? out2[tk * 30 + r]
                                             : out2[30 * nt + tk * (n_rows - 30) + r - 30];
                    CHECK(got == out[tk * n_rows + r]);
                }
            free(scratch);
        }
        free(xq);
        free(out2);
        free(out);
        free(x);
        free(w);
    }
    hl_pool_destroy(pool);
}

TEST(kernels_matmul_scratch_size) {
    CHECK_EQ_INT(kern_matmul_scratch_size(HL_TYPE_F32, 4096, 8), 0);
    CHECK_EQ_INT(kern_matmul_scratch_size(HL_TYPE_F16, 4096, 8), 0);
    CHECK_EQ_INT(kern_matmul_scratch_size(HL_TYPE_Q4_0, 4096, 3), 3 * 128 * 34);
    CHECK_EQ_INT(kern_matmul_scratch_size(HL_TYPE_Q4_1, 64, 1), 2 * 36);
    CHECK_EQ_INT(kern_matmul_scratch_size(HL_TYPE_Q6_K, 512, 2), 2 * 2 * 292);
}

TEST(kernels_rmsnorm_vs_naive) {
    float x[67], w[67], out[67];
    for (int i = 0; i < 67; i++) {
        x[i] = frand() * 3.0f;
        w[i] = 1.0f + frand();
    }
    kern_rmsnorm(out, x, w, 67, 1e-5f);
    double ss = 0;
    for (int i = 0; i < 67; i++) ss += (double)x[i] * x[i];
    const double scale = 1.0 / sqrt(ss / 67 + 1e-5);
    for (int i = 0; i < 67; i++) CHECK_NEAR(out[i], x[i] * scale * w[i], 1e-5);
    /* in place; eps dominates an all-zero row */
    memset(x, 0, sizeof x);
    kern_rmsnorm(x, x, w, 67, 1e-5f);
    for (int i = 0; i < 67; i++) CHECK(x[i] == 0.0f);
}

TEST(kernels_softmax_vs_naive) {
    float x[33];
    double e[33], sum = 0;
    for (int i = 0; i < 33; i++) {
        x[i] = frand() * 5.0f;
        e[i] = exp((double)x[i]);
        sum += e[i];
    }
    kern_softmax(x, 33);
    for (int i = 0; i < 33; i++) CHECK_NEAR(x[i], e[i] / sum, 1e-6);
    /* large logits must not overflow; -inf entries (masked) get 0 */
    float y[4] = {1000.0f, 1001.0f, -INFINITY, 999.0f};
    kern_softmax(y, 4);
    const double s = exp(-1.0) + 1 + exp(-2.0);
    CHECK_NEAR(y[0], exp(-1.0) / s, 1e-6);
    CHECK_NEAR(y[1], 1 / s, 1e-6);
    CHECK(y[2] == 0.0f);
    CHECK_NEAR(y[3], exp(-2.0) / s, 1e-6);
    float z[3] = {-INFINITY, -INFINITY, -INFINITY};
    kern_softmax(z, 3);
    CHECK_NEAR(z[0], 1.0 / 3, 1e-7);
    float one = 42.0f;
    kern_softmax(&one, 1);
    CHECK(one == 1.0f);
}

TEST(kernels_swiglu_vs_naive) {
    float g[19], u[19], out[19];
    for (int i = 0; i < 19; i++) {
        g[i] = frand() * 8.0f;
        u[i] = frand();
    }
    g[0] = -100.0f; /* exp overflow side: silu -> -0 */
    g[1] = 100.0f;
    kern_swiglu(out, g, u, 19);
    for (int i = 0; i < 19; i++)
        CHECK_NEAR(out[i], (double)g[i] / (1 + exp(-(double)g[i])) * u[i], 1e-5);
    CHECK(isfinite(out[0]));
}

/* Decode splits the rows into one part per thread with stealing at the end (kernels.c,
 * many_worker_owned): every output row is written, with the bits of a one-thread matmul,
 * for parts of one unit to hundreds, more threads than CPUs (late workers skip their run
 * and the others take their parts), and items whose row counts end inside a unit. */
TEST(kernels_decode_split_every_row_once) {
    enum { COLS = 256, MAX_ROWS = 4104, REPEATS = 8 };
    static const int threads[] = {2, 3, 8};
    static const int64_t rows[][3] = {{8, 0, 0}, {40, 0, 0}, {1000, 0, 0}, {MAX_ROWS, 0, 0},
                                      {24, 1000, 8}, {8, 16, 2048}};
    const size_t rb = hl_row_size(HL_TYPE_Q8_0, COLS);
    uint8_t *w = malloc(rb * MAX_ROWS), *tmp = malloc(8 * rb);
    for (int64_t r = 0; r < MAX_ROWS; r++) random_weights(HL_TYPE_Q8_0, w + r * rb, COLS);
    const hl_type packed = kern_packed_type(HL_TYPE_Q8_0, MAX_ROWS);
    CHECK(kern_repack(packed, w, MAX_ROWS, COLS, tmp));
    static float x[5 * COLS], want[5 * 3 * MAX_ROWS], got[5 * 3 * MAX_ROWS];
    for (int i = 0; i < 5 * COLS; i++) x[i] = frand();
    void *scratch = malloc(kern_matmul_scratch_size(packed, COLS, 5));
    for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
        for (int64_t nt = 1; nt <= 5; nt += 4) {
            kern_matmul_item items[3]; /* each item's output at the same offset in got */
            int n_items = 0;
            int64_t off = 0;
            for (int k = 0; k < 3 && rows[ri][k]; k++, n_items++) {
                items[k] = (kern_matmul_item){packed, w, rows[ri][k], got + off};
                kern_matmul(NULL, packed, w, rows[ri][k], COLS, x, nt, want + off, scratch);
                off += rows[ri][k] * nt;
            }
            for (int th = 0; th < 3; th++) {
                hl_pool *pool = NULL;
                hl_err err;
                CHECK_OK(hl_pool_create(threads[th], &pool, &err), &err);
                for (int rep = 0; rep < REPEATS; rep++) {
                    for (int64_t i = 0; i < off; i++) got[i] = NAN;
                    kern_matmul_many(pool, items, n_items, COLS, x, nt, scratch);
                    int64_t bad = -1;
                    for (int64_t i = 0; i < off && bad < 0; i++)
                        if (!(got[i] == want[i])) bad = i;
                    CHECK_MSG(bad < 0, "rows %lld+%lld+%lld nt=%lld threads=%d: output %lld is %g, "
                              "not %g", (long long)rows[ri][0], (long long)rows[ri][1],
                              (long long)rows[ri][2], (long long)nt, threads[th], (long long)bad,
                              bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : want[bad]);
                }
                hl_pool_destroy(pool);
            }
        }
    }
    free(scratch);
    free(tmp);
    free(w);
}

/* kern_matmul_many: every item's output equals a separate kern_matmul exactly, for mixed
 * weight types sharing an activation type, row counts that split unevenly across
 * threads, decode and prefill; mixed activation types fall back to separate calls. */
TEST(kernels_matmul_many_equals_separate) {
    hl_pool *pool = NULL;
    hl_err err;
    CHECK_OK(hl_pool_create(3, &pool, &err), &err);
    const int64_t cols = 512;
    const struct { hl_type t; int64_t rows; } spec[3][3] = {
        {{HL_TYPE_Q4_K, 37}, {HL_TYPE_Q6_K, 16}, {HL_TYPE_Q4_K, 5}},
        {{HL_TYPE_Q8_0, 40}, {HL_TYPE_Q4_0, 9}, {HL_TYPE_Q8_0, 1}},
        {{HL_TYPE_Q8_0, 20}, {HL_TYPE_Q4_K, 19}, {HL_TYPE_F16, 3}}, /* fallback */
    };
    static float x[7 * 512], got[7 * 64], want[7 * 64];
    for (int i = 0; i < 7 * 512; i++) x[i] = frand();
    for (int g = 0; g < 3; g++) {
        for (int64_t n_tok = 1; n_tok <= 7; n_tok += 6) {
            kern_matmul_item items[3];
            void *w[3];
            size_t scratch_size = 0;
            for (int k = 0; k < 3; k++) {
                const hl_type t = spec[g][k].t;
                w[k] = malloc(hl_row_size(t, cols) * (size_t)spec[g][k].rows);
                for (int64_t r = 0; r < spec[g][k].rows; r++)
                    random_weights(t, (uint8_t *)w[k] + (size_t)r * hl_row_size(t, cols), cols);
                const size_t s = kern_matmul_scratch_size(t, cols, n_tok);
                if (s > scratch_size) scratch_size = s;
            }
            void *scratch = malloc(scratch_size + 1);
            int64_t off = 0;
            for (int k = 0; k < 3; k++) {
                items[k] = (kern_matmul_item){spec[g][k].t, w[k], spec[g][k].rows, got + off};
                off += spec[g][k].rows * n_tok;
            }
            memset(got, 0, sizeof got);
            kern_matmul_many(pool, items, 3, cols, x, n_tok, scratch);
            off = 0;
            for (int k = 0; k < 3; k++) {
                kern_matmul(pool, spec[g][k].t, w[k], spec[g][k].rows, cols, x, n_tok,
                            want + off, scratch);
                for (int64_t i = 0; i < spec[g][k].rows * n_tok; i++)
                    CHECK_MSG(got[off + i] == want[off + i], "group %d item %d tok %lld: %g vs %g",
                              g, k, (long long)n_tok, got[off + i], want[off + i]);
                off += spec[g][k].rows * n_tok;
            }
            for (int k = 0; k < 3; k++) free(w[k]);
            free(scratch);
        }
    }
    hl_pool_destroy(pool);
}

/* The tables' gemm_many kernels (AMX: 16 rows x any number of tokens) against the
 * reference, every token count up to max_tok (tile tails included), for every pair of
 * groups. */
/* nt rows of activations in the vec_dot type, with the per-block scales (ad) and 8 x sums
 * (as) kern_matmul hands the X8 kernels for Q8_0 activations. */
typedef struct x8_acts {
    size_t xb; /* bytes per row */
    uint8_t *xq;
    float *ad;
    int32_t *as;
} x8_acts;

static x8_acts x8_acts_make(hl_type vdt, const float *x, int64_t n_cols, int64_t nt) {
    const int64_t nb = n_cols / QK8_0;
    x8_acts a = {.xb = hl_row_size(vdt, n_cols)};
    a.xq = malloc(a.xb * (size_t)nt);
    a.ad = malloc(sizeof(float) * (size_t)(nt * nb));
    a.as = malloc(sizeof(int32_t) * (size_t)(nt * nb));
    for (int64_t t = 0; t < nt; t++) {
        hl_quantize_row(vdt, x + t * n_cols, a.xq + t * a.xb, n_cols);
        for (int64_t i = 0; vdt == HL_TYPE_Q8_0 && i < nb; i++) {
            const block_q8_0 *b = (const block_q8_0 *)(a.xq + t * a.xb) + i;
            int32_t sum = 0;
            for (int k = 0; k < QK8_0; k++) sum += b->qs[k];
            a.ad[t * nb + i] = hl_fp16_to_fp32(b->d);
            a.as[t * nb + i] = 8 * sum;
        }
    }
    return a;
}

static void x8_acts_free(x8_acts *a) {
    free(a->as);
    free(a->ad);
    free(a->xq);
}

static void check_x8_many(const kern_table *tabs, int n_tabs, hl_type packed,
                          const x8_acts *acts, const uint8_t *p, size_t rb, int64_t n_rows,
                          int64_t n_cols, int64_t max_tok) {
    const uint8_t *xq = acts->xq;
    const size_t xb = acts->xb;
    float *got = malloc(sizeof(float) * 16 * (size_t)max_tok);
    const kern_gemm8_fn ref = kern_table_ref()->gemm8[packed];
    for (int v = 0; v < n_tabs; v++) {
        const kern_gemm8_fn fn = tabs[v].gemm_many[packed];
        for (int64_t g = 0; fn && g + 2 <= n_rows / 8; g += 2) {
            const uint8_t *w = p + (size_t)g * 8 * rb;
            for (int nt = 1; nt <= max_tok; nt++) {
                fn(n_cols, w, xq, xb, acts->ad, acts->as, nt, got, 16);
                for (int t = 0; t < nt; t++) {
                    float want[16];
                    for (int k = 0; k < 2; k++)
                        ref(n_cols, w + (size_t)k * 8 * rb, xq + t * xb, 0, NULL, NULL, 1,
                            want + 8 * k, 0);
                    for (int r = 0; r < 16; r++)
                        CHECK_MSG(got[t * 16 + r] == want[r], "%s %s many, nt=%d tok %d row %lld",
                                  tabs[v].name, hl_type_name(packed), nt, t,
                                  (long long)(8 * g + r));
                }
            }
        }
    }
    free(got);
}

/* The X8 kernels of every SIMD table this CPU runs (AVX2; AVX-VNNI and AVX-512 VNNI have
 * their own, AVX-512 also for 16 rows per call) against the reference, 1 to
 * KERN_GEMM8_TOKS tokens per call, with the block scales and sums kern_matmul hands them:
 * whichever table is active, each encoding is checked. */
static void check_x8_tables(hl_type packed, hl_type vdt, const uint8_t *p, size_t rb,
                            int64_t n_rows, int64_t n_cols, const float *x, int64_t max_tok) {
    kern_table tabs[4];
    int n_tabs = 0;
    if (!kern_cpu_has_avx2()) return;
    tabs[n_tabs] = *kern_table_ref();
    kern_avx2_fill(&tabs[n_tabs++]);
    if (kern_cpu_has_avx_vnni()) {
        tabs[n_tabs] = tabs[0];
        kern_avx_vnni_fill(&tabs[n_tabs++]);
    }
    if (kern_cpu_has_avx512()) {
        tabs[n_tabs] = tabs[n_tabs - 1];
        kern_avx512_fill(&tabs[n_tabs++]);
    }
    if (kern_cpu_has_amx()) {
        tabs[n_tabs] = tabs[n_tabs - 1];
        kern_amx_fill(&tabs[n_tabs++]);
    }
    x8_acts acts = x8_acts_make(vdt, x, n_cols, max_tok);
    check_x8_many(tabs, n_tabs, packed, &acts, p, rb, n_rows, n_cols, max_tok);
    const int64_t nt_max = max_tok < KERN_GEMM8_TOKS ? max_tok : KERN_GEMM8_TOKS;
    const size_t xb = acts.xb;
    const uint8_t *xq = acts.xq;
    const float *ad = acts.ad;
    const int32_t *as = acts.as;
    const kern_gemm8_fn ref = kern_table_ref()->gemm8[packed];
    for (int v = 0; v < n_tabs; v++) {
        /* gemm8, then gemm16, gemm32 and gemm64 where a table has them */
        for (int rows = 8; rows <= 64; rows *= 2) {
            const kern_gemm8_fn fn = rows == 8    ? tabs[v].gemm8[packed]
                                     : rows == 16 ? tabs[v].gemm16[packed]
                                     : rows == 32 ? tabs[v].gemm32[packed]
                                                  : tabs[v].gemm64[packed];
            for (int64_t g = 0; fn && g + rows / 8 <= n_rows / 8; g++) {
                const uint8_t *w = p + (size_t)g * 8 * rb;
                for (int nt = 1; nt <= nt_max; nt++) {
                    float got[KERN_GEMM8_TOKS * 64], want[64];
                    fn(n_cols, w, xq, xb, ad, as, nt, got, (size_t)rows);
                    for (int t = 0; t < nt; t++) {
                        for (int k = 0; k < rows / 8; k++)
                            ref(n_cols, w + (size_t)k * 8 * rb, xq + t * xb, 0, NULL, NULL, 1,
                                want + 8 * k, 0);
                        for (int r = 0; r < rows; r++)
                            CHECK_MSG(got[t * rows + r] == want[r],
                                      "%s %s, %d rows, nt=%d tok %d row %lld", tabs[v].name,
                                      hl_type_name(packed), rows, nt, t, (long long)(8 * g + r));
                    }
                }
            }
        }
    }
    x8_acts_free(&acts);
}

/* Q4_0, Q8_0, Q4_K and Q6_K weights repacked to their X8 layouts (8 rows interleaved,
 * computed 8 rows to a register): every token count gives the reference's bits, the
 * results track the file layout's dot within rounding, and the extremes (all quants 0 or
 * at their largest against activations of one sign at full scale) do not overflow the
 * int16 step sums. */
static void check_x8(hl_pool *pool, hl_type file, const uint8_t *w, int64_t n_rows,
                     int64_t n_cols, const float *x, int64_t max_tok) {
    const hl_type packed = file == HL_TYPE_Q4_0   ? HL_TYPE_Q4_0_X8
                           : file == HL_TYPE_Q8_0 ? HL_TYPE_Q8_0_X8
                           : file == HL_TYPE_Q4_K ? HL_TYPE_Q4_K_X8
                                                  : HL_TYPE_Q6_K_X8;
    const hl_type vdt = hl_type_traits_get(file)->vec_dot_type;
    const size_t rb = hl_row_size(file, n_cols);
    uint8_t *p = malloc(rb * (size_t)n_rows), *tmp = malloc(8 * rb);
    memcpy(p, w, rb * (size_t)n_rows);
    CHECK(kern_repack(packed, p, n_rows, n_cols, tmp));
    const kern_gemm8_fn ref = kern_table_ref()->gemm8[packed];
    float *out = malloc((size_t)(max_tok * n_rows) * sizeof *out);
    void *xq = row_alloc(vdt, n_cols);
    float want[8];
    /* the active table runs the matmul, where it takes this layout (HEARTH_CPU=avx2 keeps
     * Q6_K's file layout) */
    const int64_t nt_active = kern_table_active()->gemm8[packed] ? max_tok : 0;
    for (int64_t nt = 1; nt <= nt_active; nt++) {
        void *scratch = malloc(kern_matmul_scratch_size(packed, n_cols, nt));
        kern_matmul(pool, packed, p, n_rows, n_cols, x, nt, out, scratch);
        for (int64_t tk = 0; tk < nt; tk++) {
            hl_quantize_row(vdt, x + tk * n_cols, xq, n_cols);
            for (int64_t g = 0; g < n_rows / 8; g++) {
                ref(n_cols, p + (size_t)g * 8 * rb, xq, 0, NULL, NULL, 1, want, 0);
                for (int r = 0; r < 8; r++) {
                    const int64_t row = 8 * g + r;
                    const float got = out[tk * n_rows + row];
                    CHECK_MSG(got == want[r], "%s nt=%lld tok %lld row %lld: %.9g vs ref %.9g",
                              hl_type_name(packed), (long long)nt, (long long)tk,
                              (long long)row, got, want[r]);
                    double mag;
                    const double exact = dequant_dot(file, w + row * rb, xq, n_cols, &mag);
                    CHECK_MSG(fabs(got - exact) <= 1e-5 * mag + 1e-6,
                              "%s row %lld: %.9g vs %.9g (mag %g)", hl_type_name(packed),
                              (long long)row, got, exact, mag);
                }
            }
        }
        free(scratch);
    }
    check_x8_tables(packed, vdt, p, rb, n_rows, n_cols, x, max_tok);
    free(xq);
    free(out);
    free(tmp);
    free(p);
}

TEST(kernels_x8_layouts_equal_ref_for_every_token_count) {
    /* 520 rows: the matmul's prefill chunks are then 48 and 40 rows, so it calls 32-, 16-
     * and 8-row kernels */
    enum { ROWS = 520, COLS = 512, TOK = 19 };
    hl_pool *pool = NULL;
    hl_err err;
    CHECK_OK(hl_pool_create(2, &pool, &err), &err);
    const hl_type files[4] = {HL_TYPE_Q4_0, HL_TYPE_Q8_0, HL_TYPE_Q4_K, HL_TYPE_Q6_K};
    float *x = malloc(sizeof(float) * TOK * COLS);
    for (int f = 0; f < 4; f++) {
        const size_t rb = hl_row_size(files[f], COLS);
        uint8_t *w = malloc(rb * ROWS);
        for (int r = 0; r < ROWS; r++) random_weights(files[f], w + r * rb, COLS);
        for (int i = 0; i < TOK * COLS; i++) x[i] = frand();
        check_x8(pool, files[f], w, ROWS, COLS, x, TOK);
        /* extremes: quants all 15 (Q6_K: 63) or all 0 (K scales and mins as random), activations
         * all +1 or all -1 (Q8_K: -128 for the largest negative) */
        for (int r = 0; r < ROWS; r++) {
            const int64_t nb = COLS / hl_type_traits_get(files[f])->block_size;
            for (int64_t b = 0; b < nb; b++) {
                if (files[f] == HL_TYPE_Q4_0) {
                    block_q4_0 *blk = (block_q4_0 *)(w + r * rb) + b;
                    blk->d = hl_fp32_to_fp16(0.5f);
                    memset(blk->qs, r % 2 ? 0xff : 0x00, sizeof blk->qs);
                } else if (files[f] == HL_TYPE_Q8_0) {
                    block_q8_0 *blk = (block_q8_0 *)(w + r * rb) + b;
                    blk->d = hl_fp32_to_fp16(0.01f);
                    memset(blk->qs, r % 2 ? 0x7f : 0x81, sizeof blk->qs); /* +-127 */
                } else if (files[f] == HL_TYPE_Q4_K) {
                    block_q4_K *blk = (block_q4_K *)(w + r * rb) + b;
                    memset(blk->qs, r % 2 ? 0xff : 0x00, sizeof blk->qs);
                } else {
                    block_q6_K *blk = (block_q6_K *)(w + r * rb) + b;
                    memset(blk->ql, r % 2 ? 0xff : 0x00, sizeof blk->ql);
                    memset(blk->qh, r % 2 ? 0xff : 0x00, sizeof blk->qh);
                }
            }
        }
        for (int i = 0; i < TOK * COLS; i++) x[i] = (i / COLS) % 2 ? 1.0f : -1.0f;
        check_x8(pool, files[f], w, ROWS, COLS, x, 4);
        free(w);
    }
    free(x);
    hl_pool_destroy(pool);
}

/* Long rows and more tokens than a tile: the AMX kernels unpack a row group's blocks in
 * chunks of 64 (then of 3 or 8: an odd count ends the pairs of tile multiplies early) and
 * take 16 tokens per tile multiply (35: two full tiles and a tail of 3). */
TEST(kernels_x8_long_rows_many_tokens) {
    enum { ROWS = 32, TOK = 35 };
    hl_pool *pool = NULL;
    hl_err err;
    CHECK_OK(hl_pool_create(2, &pool, &err), &err);
    const hl_type files[4] = {HL_TYPE_Q4_0, HL_TYPE_Q8_0, HL_TYPE_Q4_K, HL_TYPE_Q6_K};
    for (int f = 0; f < 4; f++) {
        const int64_t cols = hl_type_traits_get(files[f])->block_size == 32 ? 67 * 32 : 9 * 256;
        const size_t rb = hl_row_size(files[f], cols);
        uint8_t *w = malloc(rb * ROWS);
        float *x = malloc(sizeof(float) * TOK * (size_t)cols);
        for (int r = 0; r < ROWS; r++) random_weights(files[f], w + r * rb, cols);
        for (int64_t i = 0; i < TOK * cols; i++) x[i] = frand();
        check_x8(pool, files[f], w, ROWS, cols, x, TOK);
        free(x);
        free(w);
    }
    hl_pool_destroy(pool);
}

/* Rows of KERN_WIDE_LONG_COLS columns and more: decode of the Q8_0-activation layouts
 * takes 64 rows a call everywhere (kernels.c, wide_long), with the reference's bits. */
TEST(kernels_x8_wide_long_rows_decode) {
    enum { ROWS = 136, COLS = 4096, TOK = 4 };
    hl_pool *pool = NULL;
    hl_err err;
    CHECK_OK(hl_pool_create(2, &pool, &err), &err);
    const hl_type files[2] = {HL_TYPE_Q4_0, HL_TYPE_Q8_0};
    float *x = malloc(sizeof(float) * TOK * COLS);
    for (int i = 0; i < TOK * COLS; i++) x[i] = frand();
    for (int f = 0; f < 2; f++) {
        const size_t rb = hl_row_size(files[f], COLS);
        uint8_t *w = malloc(rb * ROWS);
        for (int r = 0; r < ROWS; r++) random_weights(files[f], w + r * rb, COLS);
        check_x8(pool, files[f], w, ROWS, COLS, x, TOK);
        free(w);
    }
    free(x);
    hl_pool_destroy(pool);
}

/* The X8 kernels measured faster than the AVX-512 and AVX-VNNI file-layout tiles on Zen 5
 * (kern_avx2.c), so every SIMD table repacks; the fills only set pointers, so this holds
 * on any CPU. */
TEST(kernels_every_simd_table_repacks) {
    kern_table t = *kern_table_ref();
    kern_avx2_fill(&t);
    const hl_type packed[] = {HL_TYPE_Q4_0_X8, HL_TYPE_Q4_K_X8, HL_TYPE_Q8_0_X8,
                              HL_TYPE_Q6_K_X8};
    for (int v = 0; v < 3; v++) {
        if (v == 1) kern_avx_vnni_fill(&t);
        if (v == 2) kern_avx512_fill(&t);
        /* Q6_K_X8 only with vpdpbusd: the AVX2 table keeps Q6_K's file layout (with the
         * reference's X8 kernel it would repack Q6_K and run it in plain C) */
        for (size_t i = 0; i < sizeof packed / sizeof *packed; i++)
            CHECK_MSG((t.gemm8[packed[i]] != NULL) == (v > 0 || packed[i] != HL_TYPE_Q6_K_X8),
                      "%s: %s kernel %s", t.name, hl_type_name(packed[i]),
                      t.gemm8[packed[i]] ? "present" : "missing");
    }
}

TEST(kernels_q4_0_x8_many_and_packing_rules) {
    enum { COLS = 128, TOK = 6 };
    hl_pool *pool = NULL;
    hl_err err;
    CHECK_OK(hl_pool_create(2, &pool, &err), &err);
    CHECK(getenv("HEARTH_REPACK") || !kern_table_active()->gemm8[HL_TYPE_Q4_0_X8] ||
          kern_packed_type(HL_TYPE_Q4_0, 64) == HL_TYPE_Q4_0_X8);
    CHECK(getenv("HEARTH_REPACK") || !kern_table_active()->gemm8[HL_TYPE_Q4_K_X8] ||
          kern_packed_type(HL_TYPE_Q4_K, 64) == HL_TYPE_Q4_K_X8);
    CHECK(kern_packed_type(HL_TYPE_Q4_0, 12) == HL_TYPE_Q4_0);   /* slices not of 8 rows */
    CHECK(getenv("HEARTH_REPACK") || !kern_table_active()->gemm8[HL_TYPE_Q8_0_X8] ||
          kern_packed_type(HL_TYPE_Q8_0, 64) == HL_TYPE_Q8_0_X8);
    CHECK(getenv("HEARTH_REPACK") || !kern_table_active()->gemm8[HL_TYPE_Q6_K_X8] ||
          kern_packed_type(HL_TYPE_Q6_K, 64) == HL_TYPE_Q6_K_X8);
    CHECK(kern_packed_type(HL_TYPE_Q5_K, 64) == HL_TYPE_Q5_K);   /* no packed layout (yet) */
    CHECK(hl_type_traits_get(HL_TYPE_Q4_0_X8)->internal);
    CHECK(hl_type_traits_get(HL_TYPE_Q4_K_X8)->internal);
    CHECK(hl_type_traits_get(HL_TYPE_Q8_0_X8)->internal);
    CHECK(hl_type_traits_get(HL_TYPE_Q6_K_X8)->internal);
    hl_type parsed;
    CHECK(!hl_type_from_name("q4_0_x8", &parsed)); /* not a type a user can ask for */
    const size_t rb = hl_row_size(HL_TYPE_Q4_0, COLS);
    uint8_t *w = malloc(rb * 40), *tmp = malloc(8 * rb);
    for (int r = 0; r < 40; r++) random_weights(HL_TYPE_Q4_0, w + r * rb, COLS);
    uint8_t before[18];
    memcpy(before, w, sizeof before);
    CHECK(!kern_repack(HL_TYPE_Q4_0_X8, w, 12, COLS, tmp)); /* not a multiple of 8: untouched */
    CHECK(memcmp(before, w, sizeof before) == 0);
    CHECK(kern_repack(HL_TYPE_Q4_0_X8, w, 40, COLS, tmp));
    float x[TOK * COLS], sep[TOK * 40], many[TOK * 40];
    for (int i = 0; i < TOK * COLS; i++) x[i] = frand();
    void *scratch = malloc(kern_matmul_scratch_size(HL_TYPE_Q4_0_X8, COLS, TOK));
    kern_matmul(pool, HL_TYPE_Q4_0_X8, w, 40, COLS, x, TOK, sep, scratch);
    const kern_matmul_item items[2] = {{HL_TYPE_Q4_0_X8, w, 16, many},
                                       {HL_TYPE_Q4_0_X8, w + 16 * rb, 24, many + 16 * TOK}};
    kern_matmul_many(pool, items, 2, COLS, x, TOK, scratch);
    for (int t = 0; t < TOK; t++)
        for (int r = 0; r < 40; r++)
            CHECK(sep[t * 40 + r] == (r < 16 ? many[t * 16 + r] : many[16 * TOK + t * 24 + r - 16]));
    free(scratch);
    /* a packed Q4_K item and a plain Q6_K one share the Q8_K activations of one run */
    const size_t kb = hl_row_size(HL_TYPE_Q4_K, 256), sb6 = hl_row_size(HL_TYPE_Q6_K, 256);
    uint8_t *wk = malloc(kb * 32), *w6 = malloc(sb6 * 16), *tk = malloc(8 * kb);
    for (int r = 0; r < 32; r++) random_weights(HL_TYPE_Q4_K, wk + r * kb, 256);
    for (int r = 0; r < 16; r++) random_weights(HL_TYPE_Q6_K, w6 + r * sb6, 256);
    CHECK(kern_repack(HL_TYPE_Q4_K_X8, wk, 32, 256, tk));
    float xk[TOK * 256], a[TOK * 32], b[TOK * 16], a2[TOK * 32], b2[TOK * 16];
    for (int i = 0; i < TOK * 256; i++) xk[i] = frand();
    size_t ss = kern_matmul_scratch_size(HL_TYPE_Q4_K_X8, 256, TOK);
    if (kern_matmul_scratch_size(HL_TYPE_Q6_K, 256, TOK) > ss)
        ss = kern_matmul_scratch_size(HL_TYPE_Q6_K, 256, TOK);
    scratch = malloc(ss);
    kern_matmul(pool, HL_TYPE_Q4_K_X8, wk, 32, 256, xk, TOK, a, scratch);
    kern_matmul(pool, HL_TYPE_Q6_K, w6, 16, 256, xk, TOK, b, scratch);
    const kern_matmul_item mixed[2] = {{HL_TYPE_Q4_K_X8, wk, 32, a2}, {HL_TYPE_Q6_K, w6, 16, b2}};
    kern_matmul_many(pool, mixed, 2, 256, xk, TOK, scratch);
    CHECK(memcmp(a, a2, sizeof a) == 0 && memcmp(b, b2, sizeof b) == 0);
    free(scratch);
    free(tk);
    free(w6);
    free(wk);
    free(tmp);
    free(w);
    hl_pool_destroy(pool);
}
