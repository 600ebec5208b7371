/*
 * kern_ref.c - scalar reference kernels: a dot product for every weight type
 * against its vec_dot_type, the activation quantizers, and the small f32 ops.
 * Integer dots accumulate exactly per block and scale once, as ggml does; float
 * dots accumulate in double. These define correct results for the SIMD variants.
 */
#include <math.h>
#include <string.h>

#include "kernels/kern_internal.h"

#define FP16(h) hl_fp16_to_fp32(h)

/* ---- float weights ---------------------------------------------------------------- */

static float dot_f32(int64_t n, const void *row, const void *vec) {
    const float *a = row, *b = vec;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)a[i] * b[i];
    return (float)sum;
}

static float dot_f16(int64_t n, const void *row, const void *vec) {
    const hl_fp16 *a = row;
    const float *b = vec;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)hl_fp16_to_fp32(a[i]) * b[i];
    return (float)sum;
}

static float dot_bf16(int64_t n, const void *row, const void *vec) {
    const hl_bf16 *a = row;
    const float *b = vec;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)hl_bf16_to_fp32(a[i]) * b[i];
    return (float)sum;
}

/* ---- 32-element blocks -------------------------------------------------------------- */

static uint32_t load_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static float dot_q4_0(int64_t n, const void *row, const void *vec) {
    const block_q4_0 *x = row;
    const block_q8_0 *y = vec;
    float sum = 0;
    for (int64_t i = 0; i < n / QK4_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            sumi += ((x[i].qs[j] & 0x0f) - 8) * y[i].qs[j];
            sumi += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + QK4_0 / 2];
        }
        sum += (float)sumi * (FP16(x[i].d) * FP16(y[i].d));
    }
    return sum;
}

/* Q4_0_X8: row r of a group is lane r; ad / as are not used, the reference takes the
 * scale and the quants from the activation blocks themselves. */
static void gemm8_q4_0_x8(int64_t n, const void *w, const void *vec, size_t stride,
                          const float *ad, const int32_t *as, int nt, float *out,
                          size_t out_stride) {
    (void)ad;
    (void)as;
    const block_q4_0_x8 *x = w;
    for (int t = 0; t < nt; t++) {
        const block_q8_0 *y = (const block_q8_0 *)((const uint8_t *)vec + (size_t)t * stride);
        for (int r = 0; r < KERN_GEMM8_ROWS; r++) {
            float acc = 0;
            for (int64_t i = 0; i < n / QK4_0; i++) {
                int32_t sumi = 0;
                for (int c = 0; c < 4; c++)
                    for (int k = 0; k < 4; k++) {
                        const uint8_t b = x[i].qs[c][4 * r + k];
                        sumi += ((b & 0x0f) - 8) * y[i].qs[4 * c + k];
                        sumi += ((b >> 4) - 8) * y[i].qs[16 + 4 * c + k];
                    }
                acc = fmaf(FP16(x[i].d[r]) * FP16(y[i].d), (float)sumi, acc);
            }
            out[(size_t)t * out_stride + r] = acc;
        }
    }
}

/* Q8_0_X8: per block the exact integer dot, then acc = fmaf(dx * dy, dot, acc). */
static void gemm8_q8_0_x8(int64_t n, const void *w, const void *vec, size_t stride,
                          const float *ad, const int32_t *as, int nt, float *out,
                          size_t out_stride) {
    (void)ad;
    (void)as;
    const block_q8_0_x8 *x = w;
    for (int t = 0; t < nt; t++) {
        const block_q8_0 *y = (const block_q8_0 *)((const uint8_t *)vec + (size_t)t * stride);
        for (int r = 0; r < KERN_GEMM8_ROWS; r++) {
            float acc = 0;
            for (int64_t i = 0; i < n / QK8_0; i++) {
                int32_t sumi = 0;
                for (int e = 0; e < QK8_0; e++) sumi += x[i].qs[e / 4][4 * r + e % 4] * y[i].qs[e];
                acc = fmaf(FP16(x[i].d[r]) * FP16(y[i].d), (float)sumi, acc);
            }
            out[(size_t)t * out_stride + r] = acc;
        }
    }
}

void kern_q4_K_x8_scales(const block_q4_K_x8 *x, int r, uint8_t sc[8], uint8_t mn[8]) {
    for (int k = 0; k < 4; k++) {
        sc[k] = x->scales[k][r] & 63;
        mn[k] = x->scales[4 + k][r] & 63;
        sc[4 + k] = (uint8_t)((x->scales[8 + k][r] & 0x0f) | (x->scales[k][r] >> 6) << 4);
        mn[4 + k] = (uint8_t)((x->scales[8 + k][r] >> 4) | (x->scales[4 + k][r] >> 6) << 4);
    }
}

/* Q4_K_X8: per super-block the exact integer sums of scale * q * y and of min * y per
 * sub-block, then acc = fmaf(d * y.d, sum, acc) and accm = fmaf(dmin * y.d, mins, accm);
 * the result is acc - accm. */
static void gemm8_q4_K_x8(int64_t n, const void *w, const void *vec, size_t stride,
                          const float *ad, const int32_t *as, int nt, float *out,
                          size_t out_stride) {
    (void)ad;
    (void)as;
    const block_q4_K_x8 *x = w;
    for (int t = 0; t < nt; t++) {
        const block_q8_K *y = (const block_q8_K *)((const uint8_t *)vec + (size_t)t * stride);
        for (int r = 0; r < KERN_GEMM8_ROWS; r++) {
            float acc = 0, accm = 0;
            for (int64_t i = 0; i < n / QK_K; i++) {
                uint8_t sc[8], mn[8];
                kern_q4_K_x8_scales(&x[i], r, sc, mn);
                int32_t sumi = 0, summ = 0;
                for (int sb = 0; sb < 8; sb++) {
                    int32_t dot = 0, ysum = 0;
                    for (int e = 0; e < 32; e++) {
                        const uint8_t b = x[i].qs[sb / 2][e / 4][4 * r + e % 4];
                        const int q = sb % 2 ? b >> 4 : b & 0x0f;
                        dot += q * y[i].qs[32 * sb + e];
                        ysum += y[i].qs[32 * sb + e];
                    }
                    sumi += sc[sb] * dot;
                    summ += mn[sb] * ysum;
                }
                acc = fmaf(FP16(x[i].d[r]) * y[i].d, (float)sumi, acc);
                accm = fmaf(FP16(x[i].dmin[r]) * y[i].d, (float)summ, accm);
            }
            out[(size_t)t * out_stride + r] = acc - accm;
        }
    }
}

/* Q6_K_X8: per super-block the exact integer sum of scale * (q - 32) * y over the 16
 * groups, then sum += (y.d * d) * isum, as dot_q6_K. */
static void gemm8_q6_K_x8(int64_t n, const void *w, const void *vec, size_t stride,
                          const float *ad, const int32_t *as, int nt, float *out,
                          size_t out_stride) {
    (void)ad;
    (void)as;
    const block_q6_K_x8 *x = w;
    for (int t = 0; t < nt; t++) {
        const block_q8_K *y = (const block_q8_K *)((const uint8_t *)vec + (size_t)t * stride);
        for (int r = 0; r < KERN_GEMM8_ROWS; r++) {
            float sum = 0;
            for (int64_t i = 0; i < n / QK_K; i++) {
                int32_t sums[QK_K / 16] = {0};
                for (int e = 0; e < QK_K; e++) {
                    const int h = e / 128, g = e % 128 / 32, l = e % 32;
                    const uint8_t lo = q6_K_x8_ql(&x[i], 2 * h + g % 2, l / 4)[4 * r + l % 4];
                    const int hi = q6_K_x8_qh(&x[i], h, l / 4)[4 * r + l % 4] >> (2 * g) & 3;
                    const int q = (g < 2 ? lo & 0x0f : lo >> 4) | hi << 4;
                    sums[e / 16] += (q - 32) * y[i].qs[e];
                }
                int32_t isum = 0;
                for (int g = 0; g < QK_K / 16; g++) isum += x[i].scales[g][r] * sums[g];
                sum += y[i].d * FP16(x[i].d[r]) * (float)isum;
            }
            out[(size_t)t * out_stride + r] = sum;
        }
    }
}

/* as ggml: integer sums of doubled E2M1 values times the Q8_0 quants, scaled by the
 * halved E8M0 scale */
static float dot_mxfp4(int64_t n, const void *row, const void *vec) {
    const block_mxfp4 *x = row;
    const block_q8_0 *y = vec;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_MXFP4; i++) {
        int sumi = 0;
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            sumi += hl_kvalues_mxfp4[x[i].qs[j] & 0x0f] * y[i].qs[j];
            sumi += hl_kvalues_mxfp4[x[i].qs[j] >> 4] * y[i].qs[j + QK_MXFP4 / 2];
        }
        sum += (float)sumi * (hl_e8m0_to_fp32_half(x[i].e) * FP16(y[i].d));
    }
    return sum;
}

/* y.s = d_y * sum(q_y) carries the min term: sum((q*d + m) * q_y*d_y) */
static float dot_q4_1(int64_t n, const void *row, const void *vec) {
    const block_q4_1 *x = row;
    const block_q8_1 *y = vec;
    float sum = 0;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        int sumi = 0;
        for (int j = 0; j < QK4_1 / 2; j++) {
            sumi += (x[i].qs[j] & 0x0f) * y[i].qs[j];
            sumi += (x[i].qs[j] >> 4) * y[i].qs[j + QK4_1 / 2];
        }
        sum += (float)sumi * (FP16(x[i].d) * FP16(y[i].d)) + FP16(x[i].m) * FP16(y[i].s);
    }
    return sum;
}

static float dot_q5_0(int64_t n, const void *row, const void *vec) {
    const block_q5_0 *x = row;
    const block_q8_0 *y = vec;
    float sum = 0;
    for (int64_t i = 0; i < n / QK5_0; i++) {
        const uint32_t qh = load_u32le(x[i].qh);
        int sumi = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
            sumi += (((x[i].qs[j] & 0x0f) | h0) - 16) * y[i].qs[j];
            sumi += (((x[i].qs[j] >> 4) | h1) - 16) * y[i].qs[j + QK5_0 / 2];
        }
        sum += (float)sumi * (FP16(x[i].d) * FP16(y[i].d));
    }
    return sum;
}

static float dot_q5_1(int64_t n, const void *row, const void *vec) {
    const block_q5_1 *x = row;
    const block_q8_1 *y = vec;
    float sum = 0;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        const uint32_t qh = load_u32le(x[i].qh);
        int sumi = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
            sumi += ((x[i].qs[j] & 0x0f) | h0) * y[i].qs[j];
            sumi += ((x[i].qs[j] >> 4) | h1) * y[i].qs[j + QK5_1 / 2];
        }
        sum += (float)sumi * (FP16(x[i].d) * FP16(y[i].d)) + FP16(x[i].m) * FP16(y[i].s);
    }
    return sum;
}

static float dot_q8_0(int64_t n, const void *row, const void *vec) {
    const block_q8_0 *x = row;
    const block_q8_0 *y = vec;
    float sum = 0;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += x[i].qs[j] * y[i].qs[j];
        sum += (float)sumi * (FP16(x[i].d) * FP16(y[i].d));
    }
    return sum;
}

/* ---- K-quants: unpack the integer values of a block, then one exact dot per
 * sub-block with the Q8_K activations. Element order is the dequantizers'. ---- */

/* Sum over each group of 16 of q[e] * y[e]. */
static void dot16_groups(const int8_t q[QK_K], const int8_t y[QK_K], int sums[QK_K / 16]) {
    for (int g = 0; g < QK_K / 16; g++) {
        int s = 0;
        for (int l = 0; l < 16; l++) s += q[g * 16 + l] * y[g * 16 + l];
        sums[g] = s;
    }
}

/* Q2_K/Q3_K: 2 low bits of element e at byte (e/128)*32 + e%32, bits 2*((e%128)/32) */
static int q2_bits(const uint8_t *qs, int e) {
    return (qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

static float dot_q2_K(int64_t n, const void *row, const void *vec) {
    const block_q2_K *x = row;
    const block_q8_K *y = vec;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        int sums[16];
        for (int e = 0; e < QK_K; e++) q[e] = (int8_t)q2_bits(x[i].qs, e);
        dot16_groups(q, y[i].qs, sums);
        int isum = 0, summs = 0;
        for (int g = 0; g < 16; g++) {
            isum += (x[i].scales[g] & 0x0f) * sums[g];
            summs += (x[i].scales[g] >> 4) * y[i].bsums[g];
        }
        sum += y[i].d * FP16(x[i].d) * (float)isum - y[i].d * FP16(x[i].dmin) * (float)summs;
    }
    return sum;
}

static float dot_q3_K(int64_t n, const void *row, const void *vec) {
    const block_q3_K *x = row;
    const block_q8_K *y = vec;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        int sums[16];
        for (int e = 0; e < QK_K; e++) {
            const int high = (x[i].hmask[e % 32] >> (e / 32)) & 1;
            q[e] = (int8_t)(q2_bits(x[i].qs, e) - (high ? 0 : 4));
        }
        dot16_groups(q, y[i].qs, sums);
        int isum = 0;
        for (int g = 0; g < 16; g++) isum += hl_q3_K_scale(x[i].scales, g) * sums[g];
        sum += y[i].d * FP16(x[i].d) * (float)isum;
    }
    return sum;
}

/* Q4_K/Q5_K: 8 sub-blocks of 32 with scale sc and min mn:
 * sum = d*dy * sum_j sc_j*dot_j - dmin*dy * sum_j mn_j*sum(q8 in j) */
static float k4_finish(const block_q8_K *y, float d, float dmin, const uint8_t *scales,
                       const int8_t q[QK_K]) {
    int sums[16];
    dot16_groups(q, y->qs, sums);
    int isum = 0, summs = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, mn;
        hl_q4_K_scale_min(j, scales, &sc, &mn);
        isum += sc * (sums[2 * j] + sums[2 * j + 1]);
        summs += mn * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
    return y->d * d * (float)isum - y->d * dmin * (float)summs;
}

static float dot_q4_K(int64_t n, const void *row, const void *vec) {
    const block_q4_K *x = row;
    const block_q8_K *y = vec;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        for (int e = 0; e < QK_K; e++) {
            const uint8_t byte = x[i].qs[(e / 64) * 32 + e % 32];
            q[e] = (int8_t)((e / 32) % 2 == 0 ? byte & 0x0f : byte >> 4);
        }
        sum += k4_finish(&y[i], FP16(x[i].d), FP16(x[i].dmin), x[i].scales, q);
    }
    return sum;
}

static float dot_q5_K(int64_t n, const void *row, const void *vec) {
    const block_q5_K *x = row;
    const block_q8_K *y = vec;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        for (int e = 0; e < QK_K; e++) {
            const uint8_t byte = x[i].qs[(e / 64) * 32 + e % 32];
            const int lo = (e / 32) % 2 == 0 ? byte & 0x0f : byte >> 4;
            q[e] = (int8_t)(lo | ((x[i].qh[e % 32] >> (e / 32)) & 1) << 4);
        }
        sum += k4_finish(&y[i], FP16(x[i].d), FP16(x[i].dmin), x[i].scales, q);
    }
    return sum;
}

static float dot_q6_K(int64_t n, const void *row, const void *vec) {
    const block_q6_K *x = row;
    const block_q8_K *y = vec;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        int sums[16];
        for (int e = 0; e < QK_K; e++) {
            const int half = e / 128, g = (e % 128) / 32, l = e % 32;
            const uint8_t lo = x[i].ql[half * 64 + (g % 2) * 32 + l];
            const int hi = (x[i].qh[half * 32 + l] >> (2 * g)) & 3;
            q[e] = (int8_t)(((g < 2 ? lo & 0x0f : lo >> 4) | hi << 4) - 32);
        }
        dot16_groups(q, y[i].qs, sums);
        int isum = 0;
        for (int g = 0; g < 16; g++) isum += x[i].scales[g] * sums[g];
        sum += y[i].d * FP16(x[i].d) * (float)isum;
    }
    return sum;
}

/* ---- activation quantizers (the reference quantizers of types.h) ------------------ */

static void quantize_q8_0(const float *x, void *dst, int64_t n) {
    hl_quantize_row(HL_TYPE_Q8_0, x, dst, n);
}
static void quantize_q8_1(const float *x, void *dst, int64_t n) {
    hl_quantize_row(HL_TYPE_Q8_1, x, dst, n);
}
static void quantize_q8_K(const float *x, void *dst, int64_t n) {
    hl_quantize_row(HL_TYPE_Q8_K, x, dst, n);
}

/* ---- small f32 ops (kernels.c wraps them as kern_rmsnorm/softmax/swiglu) ---------- */

static float sum_squares(const float *x, int64_t n) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    return (float)ss;
}

static float exp_shift_sum(float *x, int64_t n, float shift) {
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - shift);
        sum += x[i];
    }
    return (float)sum;
}

static float max_f32(const float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > m) m = x[i];
    return m;
}

static void scale(float *x, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

static void swiglu(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

static void axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void dot_rows(float *out, const float *q, const float *k, int64_t ldk, int64_t nk,
                     int64_t d, float scale) {
    for (int64_t j = 0; j < nk; j++) out[j] = scale * dot_f32(d, k + j * ldk, q);
}

/* fused like the SIMD lanes, so both variants give the same bits */
static void axpy_rows(float *y, const float *p, const float *v, int64_t ldv, int64_t nk,
                      int64_t d) {
    for (int64_t i = 0; i < d; i++) {
        float acc = y[i];
        for (int64_t j = 0; j < nk; j++) acc = fmaf(p[j], v[j * ldv + i], acc);
        y[i] = acc;
    }
}

/* ---- KV cache rows of f16 / q8_0 (attention over a converted cache) ------------- */

static void to_f16(const float *x, hl_fp16 *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = hl_fp32_to_fp16(x[i]);
}

static void dot_rows_f16(float *out, const float *q, const hl_fp16 *k, int64_t ldk, int64_t nk,
                         int64_t d, float scale) {
    for (int64_t j = 0; j < nk; j++) out[j] = scale * dot_f16(d, k + j * ldk, q);
}

static void dot_cols_f16(float *out, const float *q, const hl_fp16 *k, int64_t ld, int64_t nk,
                         int64_t d, float scale) {
    for (int64_t j = 0; j < nk; j++) {
        float acc = 0.0f;
        for (int64_t i = 0; i < d; i++) acc = fmaf(q[i], hl_fp16_to_fp32(k[i * ld + j]), acc);
        out[j] = scale * acc;
    }
}

static void axpy_rows_f16(float *y, const float *p, const hl_fp16 *v, int64_t ldv, int64_t nk,
                          int64_t d) {
    for (int64_t i = 0; i < d; i++) {
        float acc = y[i];
        for (int64_t j = 0; j < nk; j++) acc = fmaf(p[j], hl_fp16_to_fp32(v[j * ldv + i]), acc);
        y[i] = acc;
    }
}

/* per key and block one weight p[j] * d, then one fmaf per element, keys in order */
static void axpy_rows_q8_0(float *y, const float *p, const void *v, size_t ldv, int64_t nk,
                           int64_t d) {
    for (int64_t j = 0; j < nk; j++) {
        const block_q8_0 *b = (const block_q8_0 *)((const uint8_t *)v + (size_t)j * ldv);
        for (int64_t ib = 0; ib < d / QK8_0; ib++) {
            const float s = p[j] * hl_fp16_to_fp32(b[ib].d);
            float *yb = y + ib * QK8_0;
            for (int i = 0; i < QK8_0; i++) yb[i] = fmaf(s, (float)b[ib].qs[i], yb[i]);
        }
    }
}

static const kern_table g_ref = {
    .name = "ref",
    .vec_dot =
        {
            [HL_TYPE_F32] = dot_f32,
            [HL_TYPE_F16] = dot_f16,
            [HL_TYPE_BF16] = dot_bf16,
            [HL_TYPE_Q4_0] = dot_q4_0,
            [HL_TYPE_MXFP4] = dot_mxfp4,
            [HL_TYPE_Q4_1] = dot_q4_1,
            [HL_TYPE_Q5_0] = dot_q5_0,
            [HL_TYPE_Q5_1] = dot_q5_1,
            [HL_TYPE_Q8_0] = dot_q8_0,
            [HL_TYPE_Q2_K] = dot_q2_K,
            [HL_TYPE_Q3_K] = dot_q3_K,
            [HL_TYPE_Q4_K] = dot_q4_K,
            [HL_TYPE_Q5_K] = dot_q5_K,
            [HL_TYPE_Q6_K] = dot_q6_K,
        },
    .gemm8 = {[HL_TYPE_Q4_0_X8] = gemm8_q4_0_x8,
              [HL_TYPE_Q8_0_X8] = gemm8_q8_0_x8,
              [HL_TYPE_Q4_K_X8] = gemm8_q4_K_x8,
              [HL_TYPE_Q6_K_X8] = gemm8_q6_K_x8},
    .sum_squares = sum_squares,
    .exp_shift_sum = exp_shift_sum,
    .max = max_f32,
    .scale = scale,
    .swiglu = swiglu,
    .axpy = axpy,
    .dot_rows = dot_rows,
    .axpy_rows = axpy_rows,
    .to_f16 = to_f16,
    .dot_rows_f16 = dot_rows_f16,
    .dot_cols_f16 = dot_cols_f16,
    .axpy_rows_f16 = axpy_rows_f16,
    .axpy_rows_q8_0 = axpy_rows_q8_0,
    .quantize =
        {
            [HL_TYPE_Q8_0] = quantize_q8_0,
            [HL_TYPE_Q8_1] = quantize_q8_1,
            [HL_TYPE_Q8_K] = quantize_q8_K,
        },
};

const kern_table *kern_table_ref(void) { return &g_ref; }
