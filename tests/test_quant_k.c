/*
 * test_quant_k.c - the K-quant reference quantizers (Q2_K..Q6_K): round-trip error
 * per type on gaussian-like data, quantize->dequantize->quantize stability, exact
 * and degenerate blocks, and that non-finite input is handled without UB.
 */
#include "test.h"

#include <stdlib.h>

#include "tensor/types.h"

static uint32_t g_rng = 0x9e3779b9u;
static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 17;
    g_rng ^= g_rng << 5;
    return (float)(g_rng >> 8) / 16777216.0f * 2.0f - 1.0f;
}
/* sum of 4 uniforms: bell-shaped like trained weights, with a varying scale per 256.
 * The same data every call, so no test depends on which ran before it in-process (-n). */
static void fill_weights(float *x, int n) {
    g_rng = 0x9e3779b9u;
    for (int i = 0; i < n; i++) {
        const float s = 0.02f * (float)(1 + (i / QK_K) % 5);
        x[i] = s * (frand() + frand() + frand() + frand());
    }
}

static const hl_type g_k_types[] = {HL_TYPE_Q2_K, HL_TYPE_Q3_K, HL_TYPE_Q4_K, HL_TYPE_Q5_K,
                                    HL_TYPE_Q6_K};
/* Relative RMS error bounds (error RMS / signal RMS) for the data above. ggml's
 * quantizers measure about 0.29, 0.145, 0.070, 0.035, 0.017 on it; the bounds leave
 * ~10% room, and a lower bound catches a quantizer that is suspiciously exact (e.g.
 * one that wrote f32 through). */
static const double g_rel_rmse_max[] = {0.32, 0.16, 0.077, 0.039, 0.019};
static const double g_rel_rmse_min[] = {0.20, 0.10, 0.050, 0.025, 0.012};

static double rel_rmse(const float *a, const float *b, int n) {
    double e = 0, s = 0;
    for (int i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)a[i] * a[i];
    }
    return s > 0 ? sqrt(e / s) : sqrt(e);
}

enum { N = QK_K * 24 };

TEST(quant_k_roundtrip_error_bounds) {
    static float x[N], y[N];
    static uint8_t q[N];
    fill_weights(x, N);
    for (size_t ti = 0; ti < sizeof g_k_types / sizeof g_k_types[0]; ti++) {
        const hl_type t = g_k_types[ti];
        hl_quantize_row(t, x, q, N);
        hl_dequantize_row(t, q, y, N);
        const double r = rel_rmse(x, y, N);
        CHECK_MSG(r <= g_rel_rmse_max[ti] && r >= g_rel_rmse_min[ti],
                  "%s: relative rms error %.4f outside [%.3f, %.3f]", hl_type_name(t), r,
                  g_rel_rmse_min[ti], g_rel_rmse_max[ti]);
        /* per block, no value is off by more than a few quantization steps of the block's
         * range: (max-min) / levels, levels = 3, 7, 15, 31, 63 */
        const int levels = (int[]){3, 7, 15, 31, 63}[ti];
        for (int b = 0; b < N; b += QK_K) {
            float mn = x[b], mx = x[b];
            for (int i = b; i < b + QK_K; i++) {
                mn = fminf(mn, x[i]);
                mx = fmaxf(mx, x[i]);
            }
            const float step = (mx - mn) / (float)levels;
            for (int i = b; i < b + QK_K; i++)
                CHECK_MSG(fabsf(x[i] - y[i]) <= 2.0f * step, "%s x[%d]=%g y=%g step %g",
                          hl_type_name(t), i, x[i], y[i], step);
        }
    }
}

/* Values already on a quantization grid are (nearly) a fixed point: re-quantizing the
 * dequantized row changes them far less than the first quantization did. */
TEST(quant_k_requantize_is_stable) {
    static float x[N], y[N], z[N];
    static uint8_t q[N], q2[N];
    fill_weights(x, N);
    /* how much smaller the second round's error must be than the first's */
    const double ratio[] = {0.1, 0.25, 0.02, 0.05, 0.02};
    for (size_t ti = 0; ti < sizeof g_k_types / sizeof g_k_types[0]; ti++) {
        const hl_type t = g_k_types[ti];
        hl_quantize_row(t, x, q, N);
        hl_dequantize_row(t, q, y, N);
        hl_quantize_row(t, y, q2, N);
        hl_dequantize_row(t, q2, z, N);
        const double first = rel_rmse(x, y, N), second = rel_rmse(y, z, N);
        CHECK_MSG(second <= ratio[ti] * first, "%s: requantization error %.5f vs first %.5f",
                  hl_type_name(t), second, first);
    }
    /* Q4_K in particular lands back on the same bytes */
    hl_quantize_row(HL_TYPE_Q4_K, x, q, N);
    hl_dequantize_row(HL_TYPE_Q4_K, q, y, N);
    hl_quantize_row(HL_TYPE_Q4_K, y, q2, N);
    CHECK(memcmp(q, q2, hl_row_size(HL_TYPE_Q4_K, N)) == 0);
}

TEST(quant_k_zero_and_constant_blocks) {
    static float x[QK_K], y[QK_K];
    static uint8_t q[QK_K];
    for (size_t ti = 0; ti < sizeof g_k_types / sizeof g_k_types[0]; ti++) {
        const hl_type t = g_k_types[ti];
        memset(x, 0, sizeof x);
        hl_quantize_row(t, x, q, QK_K);
        for (int i = 0; i < QK_K; i++) y[i] = 1.0f;
        hl_dequantize_row(t, q, y, QK_K);
        for (int i = 0; i < QK_K; i++) CHECK_MSG(y[i] == 0.0f, "%s zero block", hl_type_name(t));
        /* a constant block decodes to the constant within fp16-scale precision */
        for (int i = 0; i < QK_K; i++) x[i] = 0.75f;
        hl_quantize_row(t, x, q, QK_K);
        hl_dequantize_row(t, q, y, QK_K);
        for (int i = 0; i < QK_K; i++)
            CHECK_MSG(fabsf(y[i] - 0.75f) < 0.75f * 0.02f, "%s constant: %g", hl_type_name(t),
                      y[i]);
    }
}

/* Integers 0..15 in every sub-block are exactly a Q4_K grid (scale 1, min 0); only
 * the 6-bit/fp16 representation of the scale 1 limits the match. */
TEST(quant_k_q4_K_exact_grid) {
    static float x[QK_K], y[QK_K];
    block_q4_K b;
    for (int i = 0; i < QK_K; i++) x[i] = (float)((i * 7) % 16);
    hl_quantize_row(HL_TYPE_Q4_K, x, &b, QK_K);
    hl_dequantize_row(HL_TYPE_Q4_K, &b, y, QK_K);
    for (int i = 0; i < QK_K; i++) CHECK_NEAR(y[i], x[i], 0.01);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, mn;
        hl_q4_K_scale_min(j, b.scales, &sc, &mn);
        CHECK_EQ_INT(sc, 63); /* every sub-block has the max scale */
        CHECK_EQ_INT(mn, 0);
    }
    for (int l = 0; l < 32; l++) CHECK_EQ_INT(b.qs[l] & 0x0f, (l * 7) % 16);
}

/* Negative-only data needs the symmetric types to use the sign of the max: Q3_K and
 * Q6_K must still reach the most negative value closely. */
TEST(quant_k_symmetric_sign) {
    static float x[QK_K], y[QK_K];
    static uint8_t q[QK_K];
    for (int i = 0; i < QK_K; i++) x[i] = -1.0f - (float)(i % 16) / 16.0f;
    const hl_type sym[] = {HL_TYPE_Q3_K, HL_TYPE_Q6_K};
    const double tol[] = {0.25, 0.02}; /* half a step of the 3- and 6-bit grids */
    for (int k = 0; k < 2; k++) {
        hl_quantize_row(sym[k], x, q, QK_K);
        hl_dequantize_row(sym[k], q, y, QK_K);
        for (int i = 0; i < QK_K; i++)
            CHECK_MSG(fabsf(x[i] - y[i]) <= tol[k], "%s x=%g y=%g", hl_type_name(sym[k]), x[i],
                      y[i]);
    }
}

/* Files may hold NaN/inf: quantizing them must not be undefined behaviour (UBSan
 * checks the float->int conversions) and finite blocks stay unaffected. */
TEST(quant_k_nonfinite_input_is_defined) {
    static float x[QK_K * 2], y[QK_K * 2];
    static uint8_t q[QK_K * 2];
    fill_weights(x, QK_K * 2);
    x[3] = NAN;
    x[100] = INFINITY;
    x[200] = -INFINITY;
    for (size_t ti = 0; ti < sizeof g_k_types / sizeof g_k_types[0]; ti++) {
        const hl_type t = g_k_types[ti];
        hl_quantize_row(t, x, q, QK_K * 2);
        hl_dequantize_row(t, q, y, QK_K * 2);
        CHECK_MSG(rel_rmse(x + QK_K, y + QK_K, QK_K) < 0.35, "%s finite block damaged",
                  hl_type_name(t));
    }
}
