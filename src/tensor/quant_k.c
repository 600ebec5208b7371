/*
 * quant_k.c - K-quant reference quantizers (see quant_k.h).
 *
 * Each follows ggml's reference algorithm step for step, in float, in the same
 * order, so the blocks come out as ggml's would: a per-sub-block scale (and min)
 * search, then the sub-block scales themselves quantized against one fp16 super
 * scale, then the values re-quantized against the scales as they will be decoded.
 * Non-finite input cannot cause undefined behaviour (nearest() clamps); the output
 * for it is unspecified.
 */
#include "tensor/quant_k.h"

#include <math.h>
#include <string.h>

#define GROUP_MAX_EPS 1e-15f

/* Round half to even, as ggml's nearest_int does for the values it sees; out of
 * range and NaN values are clamped so the int conversion is always defined. */
static int nearest(float v) {
    if (!(v == v)) return 0;
    if (v > 4194303.0f) return 4194303;
    if (v < -4194303.0f) return -4194303;
    return (int)rintf(v);
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Symmetric quantization of n values to [-nmax, nmax-1] (stored + nmax) with a
 * weighted least-squares scale refined over 18 trial scales. rmse_type 1 weights by
 * x^2. Returns the scale. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -nmax / max;
    if (rmse_type == 0) {
        for (int i = 0; i < n; i++)
            L[i] = (int8_t)(nmax + clampi(nearest(iscale * x[i]), -nmax, nmax - 1));
        return 1 / iscale;
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = rmse_type == 1 ? x[i] * x[i] : rmse_type == 2 ? 1.0f : fabsf(x[i]);
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
            const float w = rmse_type == 1 ? x[i] * x[i] : rmse_type == 2 ? 1.0f : fabsf(x[i]);
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + clampi(nearest(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's symmetric search: start from the max-based scale, then move single values
 * to their best level while the x^2-weighted fit improves (at most 5 sweeps). */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                const int new_l = clampi(nearest(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0 ? sumlx / suml2 : 0.0f;
}

/* Asymmetric quantization x ~ scale * L - the_min, L in [0, nmax], min <= 0:
 * weighted least squares over nstep+1 trial scales around nmax / (max - min);
 * use_mad scores by absolute rather than squared error. Returns the scale. */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights,
                              uint8_t *L, float *the_min, uint8_t *Laux, float rmin,
                              float rdelta, int nstep, int use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(nearest(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* 2-bit values of 128 elements packed 4 per byte: byte l holds elements l, l+32,
 * l+64, l+96 (Q2_K and Q3_K low bits). */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | L[j + l + 32] << 2 | L[j + l + 64] << 4 |
                                      L[j + l + 96] << 6);
}

void hl_quant_q2_K(const float *x, block_q2_K *y, int64_t nb) {
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.0f;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                         -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; j++)
                y[i].scales[j] = (uint8_t)clampi(nearest(iscale * scales[j]), 0, 15);
            y[i].d = hl_fp32_to_fp16(max_scale / q4scale);
        } else {
            memset(y[i].scales, 0, sizeof y[i].scales);
            y[i].d = 0;
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; j++)
                y[i].scales[j] |= (uint8_t)(clampi(nearest(iscale * mins[j]), 0, 15) << 4);
            y[i].dmin = hl_fp32_to_fp16(max_min / q4scale);
        } else {
            y[i].dmin = 0;
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = hl_fp16_to_fp32(y[i].d) * (float)(y[i].scales[j] & 0xf);
            if (d == 0.0f) continue;
            const float dm = hl_fp16_to_fp32(y[i].dmin) * (float)(y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (uint8_t)clampi(nearest((x[16 * j + ii] + dm) / d), 0, 3);
        }
        pack_2bit(L, y[i].qs);
    }
}

void hl_quant_q3_K(const float *x, block_q3_K *y, int64_t nb) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
            const float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        memset(y[i].scales, 0, sizeof y[i].scales);
        if (max_scale != 0.0f) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                int l = clampi(nearest(iscale * scales[j]), -32, 31) + 32;
                if (j < 8)
                    y[i].scales[j] = (uint8_t)(l & 0xf);
                else
                    y[i].scales[j - 8] |= (uint8_t)((l & 0xf) << 4);
                l >>= 4;
                y[i].scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
            }
            y[i].d = hl_fp32_to_fp16(1 / iscale);
        } else {
            y[i].d = 0;
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = hl_fp16_to_fp32(y[i].d) * (float)hl_q3_K_scale(y[i].scales, j);
            if (d == 0.0f) continue;
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (int8_t)(clampi(nearest(x[16 * j + ii] / d), -4, 3) + 4);
        }
        memset(y[i].hmask, 0, sizeof y[i].hmask);
        uint8_t low[QK_K];
        for (int j = 0; j < QK_K; j++) {
            int l = L[j];
            if (l > 3) {
                y[i].hmask[j % (QK_K / 8)] |= (uint8_t)(1u << (j / (QK_K / 8)));
                l -= 4;
            }
            low[j] = (uint8_t)l;
        }
        pack_2bit(low, y[i].qs);
    }
}

/* Q4_K/Q5_K: 8 sub-block scales and mins quantized to 6 bits against max/63 and
 * packed as hl_q4_K_scale_min() unpacks them. */
static void pack_scales_k4(const float *scales, const float *mins, float max_scale,
                           float max_min, uint8_t out[K_SCALE_SIZE], hl_fp16 *d,
                           hl_fp16 *dmin) {
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    memset(out, 0, K_SCALE_SIZE);
    for (int j = 0; j < QK_K / 32; j++) {
        const int ls = clampi(nearest(inv_scale * scales[j]), 0, 63);
        const int lm = clampi(nearest(inv_min * mins[j]), 0, 63);
        if (j < 4) {
            out[j] = (uint8_t)ls;
            out[j + 4] = (uint8_t)lm;
        } else {
            out[j + 4] = (uint8_t)((ls & 0xf) | (lm & 0xf) << 4);
            out[j - 4] |= (uint8_t)((ls >> 4) << 6);
            out[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d = hl_fp32_to_fp16(max_scale / 63.0f);
    *dmin = hl_fp32_to_fp16(max_min / 63.0f);
}

/* The shared first half of Q4_K/Q5_K: scale search per sub-block of 32 with
 * weights sqrt(mean x^2) + |x|, then the final levels against the decoded scales. */
static void quant_k4_levels(const float *x, int nmax, float rmin, int nstep, uint8_t *L,
                            uint8_t scales_out[K_SCALE_SIZE], hl_fp16 *d, hl_fp16 *dmin) {
    uint8_t Laux[32];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                     rmin, 0.1f, nstep, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    pack_scales_k4(scales, mins, max_scale, max_min, scales_out, d, dmin);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        hl_q4_K_scale_min(j, scales_out, &sc, &m);
        const float dd = hl_fp16_to_fp32(*d) * (float)sc;
        if (dd == 0.0f) continue;
        const float dm = hl_fp16_to_fp32(*dmin) * (float)m;
        for (int ii = 0; ii < 32; ii++)
            L[32 * j + ii] = (uint8_t)clampi(nearest((x[32 * j + ii] + dm) / dd), 0, nmax);
    }
}

void hl_quant_q4_K(const float *x, block_q4_K *y, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        quant_k4_levels(x, 15, -1.0f, 20, L, y[i].scales, &y[i].d, &y[i].dmin);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
    }
}

void hl_quant_q5_K(const float *x, block_q5_K *y, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        quant_k4_levels(x, 31, -0.5f, 15, L, y[i].scales, &y[i].d, &y[i].dmin);
        uint8_t *qh = y[i].qh, *ql = y[i].qs;
        memset(qh, 0, QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < QK_K; n += 64, ql += 32) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | l2 << 4);
            }
            m1 = (uint8_t)(m1 << 2);
            m2 = (uint8_t)(m2 << 2);
        }
    }
}

void hl_quant_q6_K(const float *x, block_q6_K *y, int64_t nb) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1);
            const float abs_scale = fabsf(scales[ib]);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scales[ib];
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -128.0f / max_scale;
        y[i].d = hl_fp32_to_fp16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++)
            y[i].scales[ib] = (int8_t)clampi(nearest(iscale * scales[ib]), -128, 127);
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = hl_fp16_to_fp32(y[i].d) * (float)y[i].scales[j];
            if (d == 0.0f) continue;
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (int8_t)(clampi(nearest(x[16 * j + ii] / d), -32, 31) + 32);
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64],
                          q4 = L[j + l + 96];
                ql[l] = (uint8_t)((q1 & 0xf) | (q3 & 0xf) << 4);
                ql[l + 32] = (uint8_t)((q2 & 0xf) | (q4 & 0xf) << 4);
                qh[l] = (uint8_t)(q1 >> 4 | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
            }
        }
    }
}
