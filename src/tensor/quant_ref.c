/*
 * quant_ref.c - scalar reference dequantizers and quantizers for the ggml block
 * formats declared in types.h.
 *
 * Dequantization follows ggml's float operation order exactly (e.g. Q4_K computes
 * d1 = d * sc once, then d1 * q - m1), so weights decode bit-exactly as ggml does.
 * Quantization is round-to-nearest as ggml's *_ref quantizers are; the K-quants'
 * scale searches are in quant_k.c. These are the
 * slow, obviously-correct paths every SIMD kernel is tested against.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "tensor/quant_k.h"
#include "tensor/types.h"

#define FP16(h) hl_fp16_to_fp32(h)

/* ---- dequantization ---------------------------------------------------------- */

static void dequant_q4_0(const block_q4_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        const float d = FP16(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int x0 = (b[i].qs[j] & 0x0f) - 8;
            const int x1 = (b[i].qs[j] >> 4) - 8;
            y[j] = (float)x0 * d;
            y[j + QK4_0 / 2] = (float)x1 * d;
        }
    }
}

static void dequant_mxfp4(const block_mxfp4 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_MXFP4) {
        const float d = hl_e8m0_to_fp32_half(b[i].e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            y[j] = (float)hl_kvalues_mxfp4[b[i].qs[j] & 0x0f] * d;
            y[j + QK_MXFP4 / 2] = (float)hl_kvalues_mxfp4[b[i].qs[j] >> 4] * d;
        }
    }
}

static void dequant_q4_1(const block_q4_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_1) {
        const float d = FP16(b[i].d), m = FP16(b[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j] = (float)(b[i].qs[j] & 0x0f) * d + m;
            y[j + QK4_1 / 2] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

/* The 5th bit of element j is bit j of the little-endian 32-bit qh. */
static uint32_t load_qh(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

static void dequant_q5_0(const block_q5_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK5_0) {
        const float d = FP16(b[i].d);
        const uint32_t qh = load_qh(b[i].qh);
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4;
            const int h1 = (int)((qh >> (j + QK5_0 / 2)) & 1) << 4;
            y[j] = (float)(((b[i].qs[j] & 0x0f) | h0) - 16) * d;
            y[j + QK5_0 / 2] = (float)(((b[i].qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

static void dequant_q5_1(const block_q5_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK5_1) {
        const float d = FP16(b[i].d), m = FP16(b[i].m);
        const uint32_t qh = load_qh(b[i].qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4;
            const int h1 = (int)((qh >> (j + QK5_1 / 2)) & 1) << 4;
            y[j] = (float)((b[i].qs[j] & 0x0f) | h0) * d + m;
            y[j + QK5_1 / 2] = (float)((b[i].qs[j] >> 4) | h1) * d + m;
        }
    }
}

static void dequant_q8_0(const block_q8_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        const float d = FP16(b[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

static void dequant_q8_1(const block_q8_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK8_1) {
        const float d = FP16(b[i].d);
        for (int j = 0; j < QK8_1; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

/* Q2_K: 16 sub-blocks of 16; scales[k] = scale (low nibble) | min (high nibble).
 * Element order: for each half of 128, for shift 0,2,4,6: 16 from qs[0..15], 16
 * from qs[16..31]. */
static void dequant_q2_K(const block_q2_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = FP16(b[i].d), dmin = FP16(b[i].dmin);
        const uint8_t *q = b[i].qs;
        int is = 0;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int part = 0; part < 2; part++) {
                    const uint8_t sc = b[i].scales[is++];
                    const float dl = d * (float)(sc & 0x0f), ml = dmin * (float)(sc >> 4);
                    for (int l = 0; l < 16; l++)
                        *y++ = dl * (float)((q[l + 16 * part] >> shift) & 3) - ml;
                }
            }
        }
    }
}

/* Q3_K's 16 6-bit scales: low 4 bits in scales[0..7] (nibbles: sub-block k<8 low
 * nibble of byte k, k>=8 high nibble of byte k-8), high 2 bits in scales[8..11]
 * (sub-block k: byte 8 + k%4, bits 2*(k/4)). Stored with a +32 bias. */
int hl_q3_K_scale(const uint8_t s[12], int k) {
    const int lo = k < 8 ? (s[k] & 0x0f) : (s[k - 8] >> 4);
    const int hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
    return (lo | hi << 4) - 32;
}

static void dequant_q3_K(const block_q3_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d_all = FP16(b[i].d);
        const uint8_t *q = b[i].qs, *hm = b[i].hmask;
        uint8_t m = 1;
        int is = 0;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1)) {
                for (int part = 0; part < 2; part++) {
                    const float dl = d_all * (float)hl_q3_K_scale(b[i].scales, is++);
                    for (int l = 0; l < 16; l++) {
                        const int k = l + 16 * part;
                        const int v = ((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4);
                        *y++ = dl * (float)v;
                    }
                }
            }
        }
    }
}

/* Q4_K/Q5_K: 8 sub-blocks of 32, each with a 6-bit scale and 6-bit min packed in
 * 12 bytes. */
void hl_q4_K_scale_min(int j, const uint8_t q[12], uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void dequant_q4_K(const block_q4_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = FP16(b[i].d), dmin = FP16(b[i].dmin);
        const uint8_t *q = b[i].qs;
        for (int is = 0; is < 8; is += 2, q += 32) {
            uint8_t sc, mn;
            hl_q4_K_scale_min(is, b[i].scales, &sc, &mn);
            const float d1 = d * (float)sc, m1 = dmin * (float)mn;
            hl_q4_K_scale_min(is + 1, b[i].scales, &sc, &mn);
            const float d2 = d * (float)sc, m2 = dmin * (float)mn;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0x0f) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static void dequant_q5_K(const block_q5_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = FP16(b[i].d), dmin = FP16(b[i].dmin);
        const uint8_t *ql = b[i].qs, *qh = b[i].qh;
        uint8_t u1 = 1, u2 = 2;
        for (int is = 0; is < 8; is += 2, ql += 32) {
            uint8_t sc, mn;
            hl_q4_K_scale_min(is, b[i].scales, &sc, &mn);
            const float d1 = d * (float)sc, m1 = dmin * (float)mn;
            hl_q4_K_scale_min(is + 1, b[i].scales, &sc, &mn);
            const float d2 = d * (float)sc, m2 = dmin * (float)mn;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((ql[l] & 0x0f) + ((qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
            u1 = (uint8_t)(u1 << 2);
            u2 = (uint8_t)(u2 << 2);
        }
    }
}

/* Q6_K: per 128 elements, ql[0..63] holds low nibbles, qh[0..31] the 2 high bits
 * of four groups of 32; 16 int8 scales, one per 16 elements. */
static void dequant_q6_K(const block_q6_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = FP16(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4) - 32;
                const int q2 = ((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) - 32;
                const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

static void dequant_q8_K(const block_q8_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K)
        for (int j = 0; j < QK_K; j++) y[j] = b[i].d * (float)b[i].qs[j];
}

void hl_dequantize_row(hl_type type, const void *src, float *dst, int64_t n) {
    const hl_type_traits *t = hl_type_traits_get(type);
    if (!t || n <= 0) return;
    const int64_t nb = n / t->block_size;
    switch (type) {
    case HL_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case HL_TYPE_F16: {
        const hl_fp16 *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = hl_fp16_to_fp32(s[i]);
        break;
    }
    case HL_TYPE_BF16: {
        const hl_bf16 *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = hl_bf16_to_fp32(s[i]);
        break;
    }
    case HL_TYPE_Q4_0: dequant_q4_0(src, dst, nb); break;
    case HL_TYPE_MXFP4: dequant_mxfp4(src, dst, nb); break;
    case HL_TYPE_Q4_1: dequant_q4_1(src, dst, nb); break;
    case HL_TYPE_Q5_0: dequant_q5_0(src, dst, nb); break;
    case HL_TYPE_Q5_1: dequant_q5_1(src, dst, nb); break;
    case HL_TYPE_Q8_0: dequant_q8_0(src, dst, nb); break;
    case HL_TYPE_Q8_1: dequant_q8_1(src, dst, nb); break;
    case HL_TYPE_Q2_K: dequant_q2_K(src, dst, nb); break;
    case HL_TYPE_Q3_K: dequant_q3_K(src, dst, nb); break;
    case HL_TYPE_Q4_K: dequant_q4_K(src, dst, nb); break;
    case HL_TYPE_Q5_K: dequant_q5_K(src, dst, nb); break;
    case HL_TYPE_Q6_K: dequant_q6_K(src, dst, nb); break;
    case HL_TYPE_Q8_K: dequant_q8_K(src, dst, nb); break;
    default: break; /* can_dequantize is false: callers check the traits */
    }
}

/* ---- quantization ------------------------------------------------------------ */

/* The value with the largest magnitude, sign kept (first one on ties). */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static float absmax(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = fmaxf(amax, fabsf(x[j]));
    return amax;
}

static void min_max(const float *x, int n, float *mn, float *mx) {
    *mn = FLT_MAX;
    *mx = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < *mn) *mn = x[j];
        if (x[j] > *mx) *mx = x[j];
    }
}

/* ggml truncates v + 0.5 (v >= -0.5 here) and clamps to hi. Clamping before the
 * cast keeps non-finite input from being undefined behaviour. */
static int trunc_clamp(float v, int hi) {
    if (!(v > 0.0f)) return 0;
    if (v >= (float)hi) return hi;
    return (int)v;
}

static void quant_q4_0(const float *x, block_q4_0 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK4_0) {
        const float max = signed_absmax(x, QK4_0);
        const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = hl_fp32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int q0 = trunc_clamp(x[j] * id + 8.5f, 15);
            const int q1 = trunc_clamp(x[j + QK4_0 / 2] * id + 8.5f, 15);
            b[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void quant_q4_1(const float *x, block_q4_1 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK4_1) {
        float mn, mx;
        min_max(x, QK4_1, &mn, &mx);
        const float d = (mx - mn) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = hl_fp32_to_fp16(d);
        b[i].m = hl_fp32_to_fp16(mn);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int q0 = trunc_clamp((x[j] - mn) * id + 0.5f, 15);
            const int q1 = trunc_clamp((x[j + QK4_1 / 2] - mn) * id + 0.5f, 15);
            b[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void store_qh(uint8_t qh[4], uint32_t v) {
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(v >> (8 * k));
}

static void quant_q5_0(const float *x, block_q5_0 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK5_0) {
        const float max = signed_absmax(x, QK5_0);
        const float d = max / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = hl_fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int q0 = trunc_clamp(x[j] * id + 16.5f, 31);
            const int q1 = trunc_clamp(x[j + QK5_0 / 2] * id + 16.5f, 31);
            b[i].qs[j] = (uint8_t)((q0 & 0x0f) | (q1 & 0x0f) << 4);
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + QK5_0 / 2);
        }
        store_qh(b[i].qh, qh);
    }
}

static void quant_q5_1(const float *x, block_q5_1 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK5_1) {
        float mn, mx;
        min_max(x, QK5_1, &mn, &mx);
        const float d = (mx - mn) / 31.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = hl_fp32_to_fp16(d);
        b[i].m = hl_fp32_to_fp16(mn);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int q0 = trunc_clamp((x[j] - mn) * id + 0.5f, 31);
            const int q1 = trunc_clamp((x[j + QK5_1 / 2] - mn) * id + 0.5f, 31);
            b[i].qs[j] = (uint8_t)((q0 & 0x0f) | (q1 & 0x0f) << 4);
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + QK5_1 / 2);
        }
        store_qh(b[i].qh, qh);
    }
}

/* round() (half away from zero) of a value already within [-127, 127]. */
static int8_t round_i8(float v) {
    if (!(v == v)) return 0;
    v = roundf(v);
    return (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : (int)v);
}

static void quant_q8_0(const float *x, block_q8_0 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        const float d = absmax(x, QK8_0) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = hl_fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++) b[i].qs[j] = round_i8(x[j] * id);
    }
}

static void quant_q8_1(const float *x, block_q8_1 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK8_1) {
        const float d = absmax(x, QK8_1) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = hl_fp32_to_fp16(d);
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            b[i].qs[j] = round_i8(x[j] * id);
            sum += b[i].qs[j];
        }
        b[i].s = hl_fp32_to_fp16((float)sum * d);
    }
}

/* Q8_K: scale from the signed max so that value maps to exactly -127... or 127;
 * rounding is to nearest even (ggml's nearest_int). bsums feed the K-quant dots. */
static void quant_q8_K(const float *x, block_q8_K *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        const float max = signed_absmax(x, QK_K);
        if (max == 0.0f || !isfinite(max)) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            float v = rintf(iscale * x[j]);
            if (!(v == v)) v = 0.0f;
            b[i].qs[j] = (int8_t)(v > 127.0f ? 127 : v < -128.0f ? -128 : (int)v);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += b[i].qs[16 * j + l];
            b[i].bsums[j] = (int16_t)s;
        }
        b[i].d = 1.0f / iscale;
    }
}

void hl_quantize_row(hl_type type, const float *src, void *dst, int64_t n) {
    const hl_type_traits *t = hl_type_traits_get(type);
    if (!t || n <= 0) return;
    const int64_t nb = n / t->block_size;
    switch (type) {
    case HL_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case HL_TYPE_F16: {
        hl_fp16 *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = hl_fp32_to_fp16(src[i]);
        break;
    }
    case HL_TYPE_BF16: {
        hl_bf16 *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = hl_fp32_to_bf16(src[i]);
        break;
    }
    case HL_TYPE_Q4_0: quant_q4_0(src, dst, nb); break;
    case HL_TYPE_Q4_1: quant_q4_1(src, dst, nb); break;
    case HL_TYPE_Q5_0: quant_q5_0(src, dst, nb); break;
    case HL_TYPE_Q5_1: quant_q5_1(src, dst, nb); break;
    case HL_TYPE_Q8_0: quant_q8_0(src, dst, nb); break;
    case HL_TYPE_Q8_1: quant_q8_1(src, dst, nb); break;
    case HL_TYPE_Q8_K: quant_q8_K(src, dst, nb); break;
    case HL_TYPE_Q2_K: hl_quant_q2_K(src, dst, nb); break;
    case HL_TYPE_Q3_K: hl_quant_q3_K(src, dst, nb); break;
    case HL_TYPE_Q4_K: hl_quant_q4_K(src, dst, nb); break;
    case HL_TYPE_Q5_K: hl_quant_q5_K(src, dst, nb); break;
    case HL_TYPE_Q6_K: hl_quant_q6_K(src, dst, nb); break;
    default: break; /* can_quantize is false: callers check the traits */
    }
}
