/*
 * types.h - tensor element types: GGUF/ggml type ids, block layouts, traits,
 * fp16/bf16 conversion, and the scalar reference (de)quantizers.
 *
 * Type ids and block layouts are GGUF's (they are ggml's), so weights are used
 * straight from the mapped file. A quantized row of n elements is n/block_size
 * blocks of type_size bytes; hl_row_size() gives its size. The block structs are
 * declared here with static size asserts so kernels and tests share one layout.
 *
 * hl_dequantize_row()/hl_quantize_row() are the scalar reference (_ref) paths:
 * every SIMD kernel is tested against them. Everything here is a constant table or a
 * function over caller-owned buffers; nothing allocates.
 */
#ifndef HL_TENSOR_TYPES_H
#define HL_TENSOR_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum hl_type {
    HL_TYPE_F32 = 0,
    HL_TYPE_F16 = 1,
    HL_TYPE_Q4_0 = 2,
    HL_TYPE_Q4_1 = 3,
    HL_TYPE_Q5_0 = 6,
    HL_TYPE_Q5_1 = 7,
    HL_TYPE_Q8_0 = 8,
    HL_TYPE_Q8_1 = 9,
    HL_TYPE_Q2_K = 10,
    HL_TYPE_Q3_K = 11,
    HL_TYPE_Q4_K = 12,
    HL_TYPE_Q5_K = 13,
    HL_TYPE_Q6_K = 14,
    HL_TYPE_Q8_K = 15,
    HL_TYPE_I8 = 24,
    HL_TYPE_I16 = 25,
    HL_TYPE_I32 = 26,
    HL_TYPE_I64 = 27,
    HL_TYPE_F64 = 28,
    HL_TYPE_BF16 = 30,
    HL_TYPE_MXFP4 = 39,
    /* hearth's own in-memory layouts, made from a file's tensors at load (kern_repack);
     * never in a file: GGUF readers refuse them (traits->internal) */
    HL_TYPE_Q4_0_X8 = 40,
    HL_TYPE_Q4_K_X8 = 41,
    HL_TYPE_Q8_0_X8 = 42,
    HL_TYPE_Q6_K_X8 = 43,
    HL_TYPE_COUNT = 44 /* upper bound on ids we know of, for tables */
} hl_type;

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_MXFP4 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef uint16_t hl_fp16;
typedef uint16_t hl_bf16;

typedef struct { hl_fp16 d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
typedef struct { hl_fp16 d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
typedef struct { hl_fp16 d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
typedef struct { hl_fp16 d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
typedef struct { hl_fp16 d; int8_t qs[QK8_0]; } block_q8_0;
typedef struct { hl_fp16 d, s; int8_t qs[QK8_1]; } block_q8_1; /* s = d * sum(qs) */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; hl_fp16 d, dmin; } block_q2_K;
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; hl_fp16 d; } block_q3_K;
typedef struct { hl_fp16 d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { hl_fp16 d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; hl_fp16 d; } block_q6_K;
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;
/* MXFP4 (OCP microscaling): e is an E8M0 shared exponent, qs holds 32 E2M1 codes as
 * nibbles (low nibbles elements 0..15, high 16..31, as Q4_0). ggml keeps the E2M1
 * values doubled as int8 (hl_kvalues_mxfp4) and halves the scale to match. */
typedef struct { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; } block_mxfp4;
/* Q4_0_X8: the Q4_0 blocks of 8 consecutive rows interleaved, so that one 32-byte load
 * holds 4 quants of each of the 8 rows and a matmul keeps the 8 rows' sums in the 8
 * lanes of one register (kernels/kernels.h, kern_repack). Block i of a group of rows
 * 8g..8g+7: the 8 scales, then 4 chunks of 32 bytes; byte 4r + k of chunk c is byte
 * 4c + k of row r's qs (low nibble: element 4c + k, high: element 16 + 4c + k). The
 * same 18 bytes per 32 elements as Q4_0, so row offsets that are multiples of 8 rows
 * are where they were. */
typedef struct { hl_fp16 d[8]; uint8_t qs[4][32]; } block_q4_0_x8;
/* Q8_0_X8: the same for Q8_0: qs[s][4r + k] is row r's quant 4s + k. */
typedef struct { hl_fp16 d[8]; int8_t qs[8][32]; } block_q8_0_x8;
/* Q4_K_X8: the same for Q4_K super-blocks. scales[k][r] is byte k of row r's 12 packed
 * scale bytes; qs[j][s] holds bytes 32j + 4s .. +3 of each row's qs (row r at 4r): low
 * nibbles are step s of sub-block 2j, high nibbles of sub-block 2j + 1. */
typedef struct {
    hl_fp16 d[8], dmin[8];
    uint8_t scales[K_SCALE_SIZE][8];
    uint8_t qs[4][8][32];
} block_q4_K_x8;
/* Q6_K_X8: the same for Q6_K super-blocks. scales[g][r] is row r's scale of group g (16
 * elements). Step s (0-7) of ql plane j (0-3) holds bytes 32j + 4s .. +3 of each row's ql
 * (row r at 4r), step s of qh plane h (0-1) bytes 32h + 4s .. +3 of its qh: element
 * 128h + 32g + l (g < 4, l < 32) is the low (g < 2) or high nibble of ql plane 2h + g % 2,
 * step l / 4, byte 4r + l % 4, with bits 2g, 2g + 1 of qh plane h there above it, minus
 * 32, as in Q6_K. The steps lie in the order the kernels read them (q6_K_x8_ql, _qh): per
 * h and pair of steps, 64 bytes of plane 2h, of plane 2h + 1, then of qh plane h, so a
 * super-block streams front to back. */
typedef struct {
    hl_fp16 d[8];
    int8_t scales[QK_K / 16][8];
    uint8_t q[8][3][64]; /* [4h + s / 2][plane 2h, 2h + 1, qh h][32 * (s % 2) + 4r + byte] */
} block_q6_K_x8;
static inline const uint8_t *q6_K_x8_ql(const block_q6_K_x8 *b, int j, int s) {
    return b->q[4 * (j / 2) + s / 2][j % 2] + 32 * (s % 2);
}
static inline const uint8_t *q6_K_x8_qh(const block_q6_K_x8 *b, int h, int s) {
    return b->q[4 * h + s / 2][2] + 32 * (s % 2);
}

_Static_assert(sizeof(block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(block_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(block_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(block_q8_1) == 36, "q8_1 layout");
_Static_assert(sizeof(block_q2_K) == 84, "q2_K layout");
_Static_assert(sizeof(block_q3_K) == 110, "q3_K layout");
_Static_assert(sizeof(block_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(block_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(block_q6_K) == 210, "q6_K layout");
_Static_assert(sizeof(block_q8_K) == 292, "q8_K layout");
_Static_assert(sizeof(block_mxfp4) == 17, "mxfp4 layout");
_Static_assert(sizeof(block_q4_0_x8) == 8 * sizeof(block_q4_0), "q4_0_x8 layout");
_Static_assert(sizeof(block_q4_K_x8) == 8 * sizeof(block_q4_K), "q4_K_x8 layout");
_Static_assert(sizeof(block_q8_0_x8) == 8 * sizeof(block_q8_0), "q8_0_x8 layout");
_Static_assert(sizeof(block_q6_K_x8) == 8 * sizeof(block_q6_K), "q6_K_x8 layout");

/* E2M1 code -> 2 * value: 0, .5, 1, 1.5, 2, 3, 4, 6 and their negatives, doubled */
extern const int8_t hl_kvalues_mxfp4[16];

/* E8M0 byte x -> 2^(x-127) / 2 = 2^(x-128) (the half pairs with the doubled values);
 * x 0 and 1 give the subnormals 2^-128 and 2^-127. Exact for every x. */
static inline float hl_e8m0_to_fp32_half(uint8_t x) {
    union { uint32_t u; float f; } v;
    v.u = x < 2 ? 0x00200000u << x : (uint32_t)(x - 1) << 23;
    return v.f;
}

typedef struct hl_type_traits {
    const char *name;      /* "f32", "q4_0", "q4_K", ... as ggml spells them */
    int64_t block_size;    /* elements per block (1 for plain types) */
    size_t type_size;      /* bytes per block */
    bool is_quantized;
    bool can_dequantize;   /* hl_dequantize_row() supports it */
    bool can_quantize;     /* hl_quantize_row() supports it */
    bool can_matmul;       /* kern_matmul() supports it as a weight type */
    hl_type vec_dot_type;  /* activations are converted to this before the dot */
    bool internal;         /* a layout of hearth's own: never read from or written to a file */
} hl_type_traits;

/* NULL for an id we know nothing about. Callers must check before use: ids come
 * from files. */
const hl_type_traits *hl_type_traits_get(uint32_t type);
const char *hl_type_name(uint32_t type); /* "unknown" if not known */
/* Parses a name such as "q4_K" or "Q8_0" (case-insensitive). Returns false if unknown. */
bool hl_type_from_name(const char *name, hl_type *out);

/* Bytes of a row of n elements; 0 if type unknown or n is not a multiple of the
 * block size. */
size_t hl_row_size(uint32_t type, int64_t n);

float hl_fp16_to_fp32(hl_fp16 h);
hl_fp16 hl_fp32_to_fp16(float f); /* round to nearest even */
float hl_bf16_to_fp32(hl_bf16 h);
hl_bf16 hl_fp32_to_bf16(float f); /* round to nearest even; NaN stays NaN */

/* Reference paths. n must be a multiple of the block size; the type must have
 * can_dequantize / can_quantize set. */
void hl_dequantize_row(hl_type type, const void *src, float *dst, int64_t n);
void hl_quantize_row(hl_type type, const float *src, void *dst, int64_t n);

/* K-quant scale unpacking shared by the dequantizers and the dot kernels.
 * Q3_K: the signed 6-bit scale of sub-block k (0..15) from the 12 scale bytes.
 * Q4_K/Q5_K: the 6-bit scale and min of sub-block j (0..7). */
int hl_q3_K_scale(const uint8_t scales[12], int k);
void hl_q4_K_scale_min(int j, const uint8_t scales[12], uint8_t *sc, uint8_t *mn);

#endif
