/*
 * types.c - the type-traits table and scalar fp16/bf16 conversion. The reference
 * (de)quantizers live in quant_ref.c. The can_* flags are static: they list what
 * quant_ref.c and src/kernels implement, and tests check each one.
 */
#include "tensor/types.h"

#include <ctype.h>
#include <string.h>

/* D: hl_dequantize_row, Q: hl_quantize_row, M: kern_matmul weight type. */
#define D 1
#define Q 2
#define M 4
#define T(id, nm, bs, ts, quant, caps, vdt)                                               \
    [id] = {nm, bs, ts, quant, ((caps) & D) != 0, ((caps) & Q) != 0, ((caps) & M) != 0, vdt, false}

/* F16/BF16 weights dot against f32 activations: converting the weight on the fly is
 * exact and cheaper than rounding the activations to 16 bits. */
static hl_type_traits g_traits[HL_TYPE_COUNT] = {
    T(HL_TYPE_F32, "f32", 1, 4, false, D | Q | M, HL_TYPE_F32),
    T(HL_TYPE_F16, "f16", 1, 2, false, D | Q | M, HL_TYPE_F32),
    T(HL_TYPE_Q4_0, "q4_0", QK4_0, sizeof(block_q4_0), true, D | Q | M, HL_TYPE_Q8_0),
    T(HL_TYPE_Q4_1, "q4_1", QK4_1, sizeof(block_q4_1), true, D | Q | M, HL_TYPE_Q8_1),
    T(HL_TYPE_Q5_0, "q5_0", QK5_0, sizeof(block_q5_0), true, D | Q | M, HL_TYPE_Q8_0),
    T(HL_TYPE_Q5_1, "q5_1", QK5_1, sizeof(block_q5_1), true, D | Q | M, HL_TYPE_Q8_1),
    T(HL_TYPE_Q8_0, "q8_0", QK8_0, sizeof(block_q8_0), true, D | Q | M, HL_TYPE_Q8_0),
    T(HL_TYPE_Q8_1, "q8_1", QK8_1, sizeof(block_q8_1), true, D | Q, HL_TYPE_Q8_1),
    T(HL_TYPE_Q2_K, "q2_K", QK_K, sizeof(block_q2_K), true, D | Q | M, HL_TYPE_Q8_K),
    T(HL_TYPE_Q3_K, "q3_K", QK_K, sizeof(block_q3_K), true, D | Q | M, HL_TYPE_Q8_K),
    T(HL_TYPE_Q4_K, "q4_K", QK_K, sizeof(block_q4_K), true, D | Q | M, HL_TYPE_Q8_K),
    T(HL_TYPE_Q5_K, "q5_K", QK_K, sizeof(block_q5_K), true, D | Q | M, HL_TYPE_Q8_K),
    T(HL_TYPE_Q6_K, "q6_K", QK_K, sizeof(block_q6_K), true, D | Q | M, HL_TYPE_Q8_K),
    T(HL_TYPE_Q8_K, "q8_K", QK_K, sizeof(block_q8_K), true, D | Q, HL_TYPE_Q8_K),
    T(HL_TYPE_I8, "i8", 1, 1, false, 0, HL_TYPE_I8),
    T(HL_TYPE_I16, "i16", 1, 2, false, 0, HL_TYPE_I16),
    T(HL_TYPE_I32, "i32", 1, 4, false, 0, HL_TYPE_I32),
    T(HL_TYPE_I64, "i64", 1, 8, false, 0, HL_TYPE_I64),
    T(HL_TYPE_F64, "f64", 1, 8, false, 0, HL_TYPE_F64),
    T(HL_TYPE_BF16, "bf16", 1, 2, false, D | Q | M, HL_TYPE_F32),
    T(HL_TYPE_MXFP4, "mxfp4", QK_MXFP4, sizeof(block_mxfp4), true, D | M, HL_TYPE_Q8_0),
    /* 8 rows at a time: a row cannot be read alone, so only the matmul takes it */
    [HL_TYPE_Q4_0_X8] = {"q4_0_x8", QK4_0, sizeof(block_q4_0), true, false, false, true,
                         HL_TYPE_Q8_0, true},
    [HL_TYPE_Q8_0_X8] = {"q8_0_x8", QK8_0, sizeof(block_q8_0), true, false, false, true,
                         HL_TYPE_Q8_0, true},
    [HL_TYPE_Q4_K_X8] = {"q4_K_x8", QK_K, sizeof(block_q4_K), true, false, false, true,
                         HL_TYPE_Q8_K, true},
    [HL_TYPE_Q6_K_X8] = {"q6_K_x8", QK_K, sizeof(block_q6_K), true, false, false, true,
                         HL_TYPE_Q8_K, true},
};
#undef D
#undef Q
#undef M
#undef T

const int8_t hl_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

const hl_type_traits *hl_type_traits_get(uint32_t type) {
    if (type >= HL_TYPE_COUNT || !g_traits[type].name) return NULL;
    return &g_traits[type];
}

const char *hl_type_name(uint32_t type) {
    const hl_type_traits *t = hl_type_traits_get(type);
    return t ? t->name : "unknown";
}

bool hl_type_from_name(const char *name, hl_type *out) {
    for (int i = 0; i < HL_TYPE_COUNT; i++) {
        const char *n = g_traits[i].name;
        if (!n || g_traits[i].internal) continue;
        size_t k = 0;
        while (n[k] && name[k] && tolower((unsigned char)n[k]) == tolower((unsigned char)name[k])) k++;
        if (!n[k] && !name[k]) {
            *out = (hl_type)i;
            return true;
        }
    }
    return false;
}

size_t hl_row_size(uint32_t type, int64_t n) {
    const hl_type_traits *t = hl_type_traits_get(type);
    if (!t || n < 0 || n % t->block_size != 0) return 0;
    return (size_t)(n / t->block_size) * t->type_size;
}

float hl_fp16_to_fp32(hl_fp16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                mant <<= 1;
            } while (!(mant & 0x400));
            mant &= 0x3ff;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

hl_fp16 hl_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (hl_fp16)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (hl_fp16)(sign | 0x7c00);
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (absx < 0x33000000u) return (hl_fp16)sign; /* < 2^-25 rounds to 0 */
        uint32_t e = absx >> 23;
        uint32_t mant = (absx & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (hl_fp16)(sign | half);
    }
    uint32_t half = ((absx >> 13) - ((127 - 15) << 10));
    uint32_t rem = absx & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
    return (hl_fp16)(sign | half);
}

float hl_bf16_to_fp32(hl_bf16 h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

hl_bf16 hl_fp32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (hl_bf16)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (hl_bf16)(x >> 16);
}
