/*
 * test_quant.c - fp16/bf16 conversion, the reference (de)quantizers, and the
 * block layouts (hand-built blocks with expected values worked out from the format).
 */
#include "test.h"

#include <stdlib.h>

#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "tensor/types.h"

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* xorshift: deterministic data without touching the global rand() state */
static uint32_t g_rng = 0x12345678u;
static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 17;
    g_rng ^= g_rng << 5;
    return (float)(g_rng >> 8) / 16777216.0f * 2.0f - 1.0f; /* [-1, 1) */
}

/* ---- fp16 / bf16 ---------------------------------------------------------------- */

TEST(quant_fp16_to_fp32_special_values) {
    CHECK(hl_fp16_to_fp32(0x0000) == 0.0f && !signbit(hl_fp16_to_fp32(0x0000)));
    CHECK(hl_fp16_to_fp32(0x8000) == 0.0f && signbit(hl_fp16_to_fp32(0x8000)));
    CHECK(hl_fp16_to_fp32(0x3c00) == 1.0f);
    CHECK(hl_fp16_to_fp32(0xc000) == -2.0f);
    CHECK(hl_fp16_to_fp32(0x7bff) == 65504.0f);
    CHECK(hl_fp16_to_fp32(0x0400) == ldexpf(1.0f, -14));           /* smallest normal */
    CHECK(hl_fp16_to_fp32(0x0001) == ldexpf(1.0f, -24));           /* smallest subnormal */
    CHECK(hl_fp16_to_fp32(0x03ff) == 1023.0f * ldexpf(1.0f, -24)); /* largest subnormal */
    CHECK(hl_fp16_to_fp32(0x8001) == -ldexpf(1.0f, -24));
    CHECK(isinf(hl_fp16_to_fp32(0x7c00)) && hl_fp16_to_fp32(0x7c00) > 0);
    CHECK(isinf(hl_fp16_to_fp32(0xfc00)) && hl_fp16_to_fp32(0xfc00) < 0);
    CHECK(isnan(hl_fp16_to_fp32(0x7e00)));
    CHECK(isnan(hl_fp16_to_fp32(0x7c01)));
}

TEST(quant_fp32_to_fp16_rounding) {
    CHECK_EQ_INT(hl_fp32_to_fp16(1.0f), 0x3c00);
    CHECK_EQ_INT(hl_fp32_to_fp16(-0.0f), 0x8000);
    CHECK_EQ_INT(hl_fp32_to_fp16(65504.0f), 0x7bff);
    CHECK_EQ_INT(hl_fp32_to_fp16(65519.0f), 0x7bff); /* below the halfway point */
    CHECK_EQ_INT(hl_fp32_to_fp16(65520.0f), 0x7c00); /* tie rounds to even = inf */
    CHECK_EQ_INT(hl_fp32_to_fp16(1e6f), 0x7c00);
    CHECK_EQ_INT(hl_fp32_to_fp16(-1e6f), 0xfc00);
    CHECK_EQ_INT(hl_fp32_to_fp16(u2f(0x7f800000u)), 0x7c00);
    CHECK_EQ_INT(hl_fp32_to_fp16(u2f(0xff800000u)), 0xfc00);
    hl_fp16 nan = hl_fp32_to_fp16(u2f(0x7fc00000u));
    CHECK((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff) != 0);
    nan = hl_fp32_to_fp16(u2f(0x7f800001u)); /* signalling NaN with low bits only */
    CHECK((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff) != 0);
    /* ties to even in the normal range: 1 + 2^-11 is halfway between 0x3c00 and 0x3c01 */
    CHECK_EQ_INT(hl_fp32_to_fp16(1.0f + ldexpf(1.0f, -11)), 0x3c00);
    CHECK_EQ_INT(hl_fp32_to_fp16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3c02);
    CHECK_EQ_INT(hl_fp32_to_fp16(u2f(f2u(1.0f + ldexpf(1.0f, -11)) + 1)), 0x3c01);
    /* subnormals */
    CHECK_EQ_INT(hl_fp32_to_fp16(ldexpf(1.0f, -24)), 0x0001);
    CHECK_EQ_INT(hl_fp32_to_fp16(ldexpf(1.0f, -25)), 0x0000); /* tie to even: 0 */
    CHECK_EQ_INT(hl_fp32_to_fp16(ldexpf(1.0001f, -25)), 0x0001);
    CHECK_EQ_INT(hl_fp32_to_fp16(3 * ldexpf(1.0f, -25)), 0x0002);       /* tie 1|2 -> 2 */
    CHECK_EQ_INT(hl_fp32_to_fp16(5 * ldexpf(1.0f, -25)), 0x0002);       /* tie 2|3 -> 2 */
    CHECK_EQ_INT(hl_fp32_to_fp16(1023.5f * ldexpf(1.0f, -24)), 0x0400); /* into normal */
    CHECK_EQ_INT(hl_fp32_to_fp16(-ldexpf(1.0f, -24)), 0x8001);
    CHECK_EQ_INT(hl_fp32_to_fp16(1e-10f), 0x0000);
}

TEST(quant_fp16_roundtrip_all_values) {
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN payloads */
        CHECK_MSG(hl_fp32_to_fp16(hl_fp16_to_fp32((hl_fp16)h)) == h, "half 0x%04x", h);
    }
}

TEST(quant_bf16_conversion) {
    CHECK(hl_bf16_to_fp32(0x3f80) == 1.0f);
    CHECK(hl_bf16_to_fp32(0xc000) == -2.0f);
    CHECK(hl_bf16_to_fp32(0x0001) == u2f(0x00010000u)); /* subnormal */
    CHECK_EQ_INT(hl_fp32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ_INT(hl_fp32_to_bf16(u2f(0x3f808000u)), 0x3f80); /* tie -> even */
    CHECK_EQ_INT(hl_fp32_to_bf16(u2f(0x3f818000u)), 0x3f82); /* tie -> even */
    CHECK_EQ_INT(hl_fp32_to_bf16(u2f(0x3f808001u)), 0x3f81);
    CHECK_EQ_INT(hl_fp32_to_bf16(u2f(0x00018000u)), 0x0002); /* subnormal tie */
    CHECK_EQ_INT(hl_fp32_to_bf16(u2f(0x7f800000u)), 0x7f80);
    CHECK_EQ_INT(hl_fp32_to_bf16(u2f(0xff800000u)), 0xff80);
    CHECK_EQ_INT(hl_fp32_to_bf16(u2f(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds to inf */
    hl_bf16 nan = hl_fp32_to_bf16(u2f(0x7f800001u));         /* low-bit NaN must stay NaN */
    CHECK((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0);
    CHECK(isnan(hl_bf16_to_fp32(0x7fc0)));
}

/* ---- traits --------------------------------------------------------------------- */

TEST(quant_traits_caps) {
    const hl_type deq[] = {HL_TYPE_F32,  HL_TYPE_F16,  HL_TYPE_BF16, HL_TYPE_Q4_0, HL_TYPE_Q4_1,
                           HL_TYPE_Q5_0, HL_TYPE_Q5_1, HL_TYPE_Q8_0, HL_TYPE_Q2_K, HL_TYPE_Q3_K,
                           HL_TYPE_Q4_K, HL_TYPE_Q5_K, HL_TYPE_Q6_K, HL_TYPE_Q8_K,
                           HL_TYPE_MXFP4};
    for (size_t i = 0; i < sizeof deq / sizeof deq[0]; i++)
        CHECK_MSG(hl_type_traits_get(deq[i])->can_dequantize, "%s", hl_type_name(deq[i]));
    const hl_type q[] = {HL_TYPE_F16,  HL_TYPE_BF16, HL_TYPE_Q4_0, HL_TYPE_Q4_1, HL_TYPE_Q5_0,
                         HL_TYPE_Q5_1, HL_TYPE_Q8_0, HL_TYPE_Q8_1, HL_TYPE_Q8_K, HL_TYPE_Q2_K,
                         HL_TYPE_Q3_K, HL_TYPE_Q4_K, HL_TYPE_Q5_K, HL_TYPE_Q6_K};
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        CHECK_MSG(hl_type_traits_get(q[i])->can_quantize, "%s", hl_type_name(q[i]));
    CHECK(!hl_type_traits_get(HL_TYPE_I32)->can_dequantize);
    CHECK(!hl_type_traits_get(HL_TYPE_I32)->can_quantize);
    /* every weight type's activation type must be quantizable */
    for (uint32_t t = 0; t < HL_TYPE_COUNT; t++) {
        const hl_type_traits *tr = hl_type_traits_get(t);
        if (tr && tr->can_matmul)
            CHECK_MSG(hl_type_traits_get(tr->vec_dot_type)->can_quantize, "%s", tr->name);
    }
    CHECK_EQ_INT(hl_row_size(HL_TYPE_Q4_K, 512), 288);
    CHECK_EQ_INT(hl_row_size(HL_TYPE_Q4_0, 33), 0);
}

/* ---- hand-built blocks ------------------------------------------------------------ */

TEST(quant_dequant_q4_0_block) {
    block_q4_0 b;
    b.d = 0x4000; /* 2.0 */
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    hl_dequantize_row(HL_TYPE_Q4_0, &b, y, 32);
    /* low nibbles are elements 0..15, high nibbles 16..31; value (q - 8) * d */
    CHECK(y[0] == -16.0f && y[1] == -14.0f && y[8] == 0.0f && y[15] == 14.0f);
    CHECK(y[16] == 14.0f && y[17] == 12.0f && y[31] == -16.0f);
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == (float)((j - 8) * 2));
        CHECK(y[16 + j] == (float)((7 - j) * 2));
    }
}

/* MXFP4: E2M1 codes 0..7 are 0, .5, 1, 1.5, 2, 3, 4, 6 and 8..15 their negatives, all
 * times 2^(e-127); e 0 gives 2^-127 (a subnormal half scale), e 255 2^128. */
TEST(quant_dequant_mxfp4_block) {
    static const float e2m1[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
    block_mxfp4 b[4];
    const uint8_t es[4] = {127, 130, 0, 254};
    const float scale[4] = {1.0f, 8.0f, 0x1p-127f, 0x1p127f};
    for (int k = 0; k < 4; k++) {
        b[k].e = es[k];
        for (int j = 0; j < 16; j++) b[k].qs[j] = (uint8_t)(j | (15 - j) << 4);
    }
    CHECK_EQ_INT(hl_row_size(HL_TYPE_MXFP4, 64), 34);
    CHECK_STR(hl_type_name(39), "mxfp4");
    float y[128];
    hl_dequantize_row(HL_TYPE_MXFP4, b, y, 128);
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 16; j++) {
            CHECK_MSG(y[32 * k + j] == e2m1[j] * scale[k], "block %d el %d: %g", k, j, y[32 * k + j]);
            CHECK(y[32 * k + 16 + j] == e2m1[15 - j] * scale[k]);
        }
    CHECK(y[7] == 6.0f && y[16 + 0] == -6.0f && y[32 + 13] == -24.0f);
    CHECK(hl_e8m0_to_fp32_half(1) == 0x1p-127f && hl_e8m0_to_fp32_half(255) == 0x1p127f);
    CHECK(hl_e8m0_to_fp32_half(2) == 0x1p-126f);
}

/* The golden gpt-oss file's MXFP4 expert tensors: the reader accepts type 39 and every
 * row dequantizes to finite values whose reference dot matches the float dot. */
TEST(quant_mxfp4_gguf_tensors) {
    const char *path = test_shared_path("testdata/arch/gpt-oss-mxfp4.gguf");
    if (!path) SKIP("testdata/arch/gpt-oss-mxfp4.gguf not found");
    gguf_file *f;
    hl_err err;
    CHECK_OK(gguf_open(path, &f, &err), &err);
    int n_mx = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->type != HL_TYPE_MXFP4) continue;
        n_mx++;
        const int64_t n = t->ne[0];
        const size_t rb = hl_row_size(HL_TYPE_MXFP4, n);
        CHECK(rb > 0 && t->n_bytes % rb == 0);
        float *w = malloc((size_t)n * sizeof *w), *x = malloc((size_t)n * sizeof *x);
        void *xq = malloc(hl_row_size(HL_TYPE_Q8_0, n));
        for (int64_t j = 0; j < n; j++) x[j] = (float)((j * 37) % 19) / 9.0f - 1.0f;
        hl_quantize_row(HL_TYPE_Q8_0, x, xq, n);
        hl_dequantize_row(HL_TYPE_Q8_0, xq, x, n);
        double nonzero = 0;
        for (uint64_t r = 0; r < t->n_bytes / rb; r++) {
            const uint8_t *row = (const uint8_t *)t->data + r * rb;
            hl_dequantize_row(HL_TYPE_MXFP4, row, w, n);
            double want = 0, mag = 0;
            for (int64_t j = 0; j < n; j++) {
                CHECK(isfinite(w[j]));
                nonzero += w[j] != 0;
                want += (double)w[j] * x[j];
                mag += fabs((double)w[j] * x[j]);
            }
            const float got = kern_vec_dot(HL_TYPE_MXFP4, n, row, xq);
            CHECK_MSG(fabs(got - want) <= 1e-5 * mag + 1e-30, "%.*s row %llu: %g vs %g",
                      (int)t->name.len, t->name.ptr, (unsigned long long)r, got, want);
        }
        CHECK(nonzero > 0);
        free(w);
        free(x);
        free(xq);
    }
    CHECK(n_mx > 0);
    gguf_close(f);
}

TEST(quant_dequant_q4_1_block) {
    block_q4_1 b;
    b.d = 0x3800; /* 0.5 */
    b.m = 0xbc00; /* -1.0 */
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((j + 3) & 15) << 4);
    float y[32];
    hl_dequantize_row(HL_TYPE_Q4_1, &b, y, 32);
    CHECK(y[0] == -1.0f && y[15] == 6.5f && y[16] == 0.5f && y[28] == 6.5f && y[29] == -1.0f);
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == 0.5f * (float)j - 1.0f);
        CHECK(y[16 + j] == 0.5f * (float)((j + 3) & 15) - 1.0f);
    }
}

TEST(quant_dequant_q5_block) {
    /* qh is a little-endian u32: bit k is the 5th bit of element k */
    block_q5_0 b;
    b.d = 0x3c00;
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | (15 - j) << 4);
    const uint8_t qh[4] = {0x55, 0x55, 0xaa, 0xaa}; /* u32 0xaaaa5555 */
    memcpy(b.qh, qh, 4);
    float y[32];
    hl_dequantize_row(HL_TYPE_Q5_0, &b, y, 32);
    CHECK(y[0] == 0.0f && y[1] == -15.0f && y[2] == 2.0f && y[16] == -1.0f && y[17] == 14.0f);
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == (float)(j + (j % 2 == 0 ? 16 : 0) - 16));
        CHECK(y[16 + j] == (float)((15 - j) + (j % 2 == 1 ? 16 : 0) - 16));
    }
    block_q5_1 c;
    c.d = 0x3800; /* 0.5 */
    c.m = 0x4000; /* 2.0 */
    memcpy(c.qs, b.qs, 16);
    memcpy(c.qh, qh, 4);
    hl_dequantize_row(HL_TYPE_Q5_1, &c, y, 32);
    CHECK(y[0] == 10.0f && y[1] == 2.5f && y[17] == 17.0f);
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == 0.5f * (float)(j + (j % 2 == 0 ? 16 : 0)) + 2.0f);
        CHECK(y[16 + j] == 0.5f * (float)((15 - j) + (j % 2 == 1 ? 16 : 0)) + 2.0f);
    }
}

TEST(quant_dequant_q8_block) {
    block_q8_0 b;
    b.d = 0x3400; /* 0.25 */
    for (int j = 0; j < 32; j++) b.qs[j] = (int8_t)(j * 8 - 128);
    float y[32];
    hl_dequantize_row(HL_TYPE_Q8_0, &b, y, 32);
    CHECK(y[0] == -32.0f && y[31] == 30.0f);
    for (int j = 0; j < 32; j++) CHECK(y[j] == (float)(j * 8 - 128) * 0.25f);

    static block_q8_K k;
    k.d = 0.125f;
    for (int j = 0; j < QK_K; j++) k.qs[j] = (int8_t)(j - 128);
    float z[QK_K];
    hl_dequantize_row(HL_TYPE_Q8_K, &k, z, QK_K);
    CHECK(z[0] == -16.0f && z[255] == 15.875f);
}

/* Q2_K: element e lives in byte (e/128)*32 + e%32 at bits 2*((e%128)/32); sub-block
 * e/16 has scale = low nibble, min = high nibble of scales[e/16]. */
TEST(quant_dequant_q2_K_block) {
    block_q2_K b;
    b.d = 0x4000;    /* 2.0 */
    b.dmin = 0x3800; /* 0.5 */
    for (int k = 0; k < 16; k++) b.scales[k] = (uint8_t)(k | (15 - k) << 4);
    for (int i = 0; i < 64; i++) b.qs[i] = (uint8_t)(i * 37 + 11);
    float y[QK_K];
    hl_dequantize_row(HL_TYPE_Q2_K, &b, y, QK_K);
    /* byte 0 = 11 = 0b00001011: elements 0, 32, 64, 96 are 3, 2, 0, 0; scale 0 = 0,
     * min 0 = 15: y = 2*0*q - 0.5*15 */
    CHECK(y[0] == -7.5f);
    /* element 32: sub-block 2 (scale 2, min 13): 2*2*2 - 6.5 */
    CHECK(y[32] == 1.5f);
    for (int e = 0; e < QK_K; e++) {
        const int sb = e / 16;
        const int q = (b.qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        CHECK_MSG(y[e] == 2.0f * (float)sb * (float)q - 0.5f * (float)(15 - sb), "e=%d", e);
    }
}

/* Q3_K: 2 low bits as Q2_K; hmask byte e%32 bit e/32 set means +0, clear means -4;
 * 6-bit scales (bias 32) packed: low nibbles in bytes 0..7, top 2 bits in 8..11. */
TEST(quant_dequant_q3_K_block) {
    static const int raw[16] = {1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 63};
    /* written out by hand from the packing rule above */
    static const uint8_t scales[12] = {0x11, 0x55, 0x99, 0xdd, 0x11, 0x55,
                                       0x99, 0xfd, 0xe4, 0xe4, 0xe4, 0xe4};
    block_q3_K b;
    memcpy(b.scales, scales, 12);
    for (int k = 0; k < 16; k++) CHECK_EQ_INT(hl_q3_K_scale(b.scales, k), raw[k] - 32);
    b.d = 0x3800; /* 0.5 */
    for (int i = 0; i < 64; i++) b.qs[i] = (uint8_t)(i * 53 + 7);
    for (int i = 0; i < 32; i++) b.hmask[i] = (uint8_t)(i * 29 + 3);
    float y[QK_K];
    hl_dequantize_row(HL_TYPE_Q3_K, &b, y, QK_K);
    /* element 0: qs[0] = 7 -> 3, hmask[0] = 3 bit 0 set -> 3; scale 1 - 32 = -31 */
    CHECK(y[0] == 0.5f * -31.0f * 3.0f);
    for (int e = 0; e < QK_K; e++) {
        const int q = (b.qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        const int h = (b.hmask[e % 32] >> (e / 32)) & 1;
        const float want = 0.5f * (float)(raw[e / 16] - 32) * (float)(q - (h ? 0 : 4));
        CHECK_MSG(y[e] == want, "e=%d: %g vs %g", e, y[e], want);
    }
}

/* Q4_K scales/mins for sub-blocks 0..7 and their 12 packed bytes, packed by hand:
 * j<4: scale in byte j bits 0-5, min in byte j+4 bits 0-5; j>=4: low nibbles in
 * byte j+4 (scale low, min high), top 2 bits in bytes j-4 (scale) and j (min). */
static const uint8_t k4_sc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
static const uint8_t k4_mn[8] = {5, 6, 7, 8, 20, 36, 49, 62};
static const uint8_t k4_packed[12] = {0x41, 0x82, 0xc3, 0xc4, 0x45, 0x86,
                                      0xc7, 0xc8, 0x41, 0x41, 0x12, 0xef};

TEST(quant_dequant_q4_K_block) {
    for (int j = 0; j < 8; j++) {
        uint8_t sc, mn;
        hl_q4_K_scale_min(j, k4_packed, &sc, &mn);
        CHECK_EQ_INT(sc, k4_sc[j]);
        CHECK_EQ_INT(mn, k4_mn[j]);
    }
    block_q4_K b;
    b.d = 0x3800;    /* 0.5 */
    b.dmin = 0x3400; /* 0.25 */
    memcpy(b.scales, k4_packed, 12);
    for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)(i * 73 + 5);
    float y[QK_K];
    hl_dequantize_row(HL_TYPE_Q4_K, &b, y, QK_K);
    /* element 0: qs[0] = 5, low nibble 5: 0.5*1*5 - 0.25*5; element 32: high nibble 0 */
    CHECK(y[0] == 1.25f);
    CHECK(y[32] == -1.5f);
    for (int e = 0; e < QK_K; e++) {
        const int j = e / 32;
        const uint8_t byte = b.qs[(e / 64) * 32 + e % 32];
        const int q = (j % 2 == 0) ? (byte & 15) : (byte >> 4);
        const float want = 0.5f * k4_sc[j] * (float)q - 0.25f * k4_mn[j];
        CHECK_MSG(y[e] == want, "e=%d: %g vs %g", e, y[e], want);
    }
}

TEST(quant_dequant_q5_K_block) {
    block_q5_K b;
    b.d = 0x3800;
    b.dmin = 0x3400;
    memcpy(b.scales, k4_packed, 12);
    for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)(i * 73 + 5);
    for (int i = 0; i < 32; i++) b.qh[i] = (uint8_t)(i * 41 + 9);
    float y[QK_K];
    hl_dequantize_row(HL_TYPE_Q5_K, &b, y, QK_K);
    /* element 0: low nibble 5, qh[0] = 9 bit 0 set: q = 21 */
    CHECK(y[0] == 0.5f * 21.0f - 1.25f);
    for (int e = 0; e < QK_K; e++) {
        const int j = e / 32;
        const uint8_t byte = b.qs[(e / 64) * 32 + e % 32];
        const int q = ((j % 2 == 0) ? (byte & 15) : (byte >> 4)) + 16 * ((b.qh[e % 32] >> j) & 1);
        const float want = 0.5f * k4_sc[j] * (float)q - 0.25f * k4_mn[j];
        CHECK_MSG(y[e] == want, "e=%d: %g vs %g", e, y[e], want);
    }
}

/* Q6_K: per half of 128, group g = (e%128)/32 takes the low (g<2) or high nibble of
 * ql[half*64 + (g%2)*32 + e%32] and bits 2g..2g+1 of qh[half*32 + e%32]; bias 32;
 * scale int8 scales[e/16]. */
TEST(quant_dequant_q6_K_block) {
    block_q6_K b;
    b.d = 0x3400; /* 0.25 */
    for (int i = 0; i < 128; i++) b.ql[i] = (uint8_t)(i * 97 + 13);
    for (int i = 0; i < 64; i++) b.qh[i] = (uint8_t)(i * 59 + 1);
    for (int k = 0; k < 16; k++) b.scales[k] = (int8_t)(k * 17 - 120);
    float y[QK_K];
    hl_dequantize_row(HL_TYPE_Q6_K, &b, y, QK_K);
    /* element 0: ql[0] = 13, qh[0] = 1 -> q = 13 | 1<<4 = 29 - 32 = -3; scale -120 */
    CHECK(y[0] == 0.25f * -120.0f * -3.0f);
    for (int e = 0; e < QK_K; e++) {
        const int half = e / 128, g = (e % 128) / 32, l = e % 32;
        const uint8_t lo = b.ql[half * 64 + (g % 2) * 32 + l];
        const int q =
            ((g < 2 ? lo & 15 : lo >> 4) | ((b.qh[half * 32 + l] >> (2 * g)) & 3) << 4) - 32;
        const float want = 0.25f * (float)b.scales[e / 16] * (float)q;
        CHECK_MSG(y[e] == want, "e=%d: %g vs %g", e, y[e], want);
    }
}

/* ---- quantizers ------------------------------------------------------------------- */

TEST(quant_q4_0_known_block) {
    /* x = (j - 16) / 2: signed max -8 -> d = -8 / -8 = 1; q = trunc(x + 8.5), max 15 */
    float x[32], y[32];
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16) * 0.5f;
    block_q4_0 b;
    hl_quantize_row(HL_TYPE_Q4_0, x, &b, 32);
    CHECK_EQ_INT(b.d, 0x3c00);
    CHECK_EQ_INT(b.qs[0] & 15, 0);   /* -8 -> 0 */
    CHECK_EQ_INT(b.qs[1] & 15, 1);   /* -7.5 + 8.5 = 1 */
    CHECK_EQ_INT(b.qs[15] >> 4, 15); /* 7.5 + 8.5 = 16 -> clamped 15 */
    CHECK_EQ_INT(b.qs[0] >> 4, 8);   /* x[16] = 0 -> 8 */
    hl_dequantize_row(HL_TYPE_Q4_0, &b, y, 32);
    CHECK(y[0] == -8.0f && y[16] == 0.0f && y[31] == 7.0f);
}

TEST(quant_q8_known_blocks) {
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
    block_q8_0 b;
    hl_quantize_row(HL_TYPE_Q8_0, x, &b, 32);
    CHECK_EQ_INT(b.d, hl_fp32_to_fp16(16.0f / 127.0f));
    CHECK_EQ_INT(b.qs[0], -127);
    CHECK_EQ_INT(b.qs[16], 0);
    CHECK_EQ_INT(b.qs[24], 64); /* 8 * 127/16 = 63.5 -> 64 (half away from zero) */
    CHECK_EQ_INT(b.qs[8], -64);
    block_q8_1 c;
    hl_quantize_row(HL_TYPE_Q8_1, x, &c, 32);
    int sum = 0;
    for (int j = 0; j < 32; j++) sum += c.qs[j];
    CHECK(memcmp(c.qs, b.qs, 32) == 0);
    CHECK_EQ_INT(c.s, hl_fp32_to_fp16((float)sum * (16.0f / 127.0f)));

    static float xk[QK_K];
    for (int j = 0; j < QK_K; j++) xk[j] = (float)(j % 64) - 31.0f; /* max +32 */
    static block_q8_K k;
    hl_quantize_row(HL_TYPE_Q8_K, xk, &k, QK_K);
    CHECK(k.d == 1.0f / (-127.0f / 32.0f));
    /* the signed max maps to -127 (d is negative), as ggml does */
    CHECK_EQ_INT(k.qs[63], -127);
    CHECK_EQ_INT(k.qs[0], 123); /* -31 * -127/32 = 123.03 */
    for (int g = 0; g < 16; g++) {
        int s = 0;
        for (int l = 0; l < 16; l++) s += k.qs[g * 16 + l];
        CHECK_EQ_INT(k.bsums[g], s);
    }
    memset(xk, 0, sizeof xk);
    hl_quantize_row(HL_TYPE_Q8_K, xk, &k, QK_K);
    CHECK(k.d == 0.0f && k.qs[5] == 0 && k.bsums[3] == 0);
}

/* Largest error allowed for one element of a block, from the block's values. */
static double roundtrip_bound(hl_type t, const float *x, int n) {
    float mn = x[0], mx = x[0], amax = 0;
    for (int j = 0; j < n; j++) {
        mn = fminf(mn, x[j]);
        mx = fmaxf(mx, x[j]);
        amax = fmaxf(amax, fabsf(x[j]));
    }
    const double range = (double)mx - mn, fp16_rel = 1.0 / 1024; /* d stored as fp16 */
    switch (t) {
    case HL_TYPE_F16: return amax / 2048.0;
    case HL_TYPE_BF16: return amax / 256.0;
    case HL_TYPE_Q4_0: return amax / 8.0 * (1 + fp16_rel) + amax * fp16_rel; /* clamp at +7 */
    case HL_TYPE_Q5_0: return amax / 16.0 * (1 + fp16_rel) + amax * fp16_rel;
    case HL_TYPE_Q4_1: return range / 30.0 + (range + fabsf(mn)) * fp16_rel;
    case HL_TYPE_Q5_1: return range / 62.0 + (range + fabsf(mn)) * fp16_rel;
    case HL_TYPE_Q8_0:
    case HL_TYPE_Q8_1: return amax / 254.0 + amax * fp16_rel;
    case HL_TYPE_Q8_K: return amax / 254.0 * 1.0001;
    default: return 0;
    }
}

TEST(quant_roundtrip_error_bounds) {
    const hl_type types[] = {HL_TYPE_F16,  HL_TYPE_BF16, HL_TYPE_Q4_0, HL_TYPE_Q4_1, HL_TYPE_Q5_0,
                             HL_TYPE_Q5_1, HL_TYPE_Q8_0, HL_TYPE_Q8_1, HL_TYPE_Q8_K};
    enum { N = 4096 };
    static float x[N], y[N];
    static uint8_t q[N * 4];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const hl_type t = types[ti];
        const int bs = (int)hl_type_traits_get(t)->block_size;
        const int blk = bs == 1 ? 32 : bs; /* bound computed per 32 for plain types */
        for (int i = 0; i < N; i++) {
            /* vary the scale per block, include an offset and some exact zeros */
            const float scale = (float)(1 + (i / blk) % 7) * 0.37f;
            x[i] = (i % 97 == 0) ? 0.0f : frand() * scale + ((i / blk) % 3 == 0 ? 0.5f : 0.0f);
        }
        hl_quantize_row(t, x, q, N);
        hl_dequantize_row(t, q, y, N);
        double worst = 0;
        for (int b0 = 0; b0 < N; b0 += blk) {
            const double bound = roundtrip_bound(t, x + b0, blk);
            for (int j = b0; j < b0 + blk; j++) {
                const double err = fabs((double)x[j] - y[j]);
                CHECK_MSG(err <= bound, "%s: x[%d]=%g y=%g err %g > bound %g", hl_type_name(t), j,
                          x[j], y[j], err, bound);
                if (err / bound > worst) worst = err / bound;
            }
        }
        /* the bound is not loose by orders of magnitude */
        CHECK_MSG(worst > 0.2, "%s: worst error only %g of bound", hl_type_name(t), worst);
    }
}

TEST(quant_zero_block_is_exact) {
    const hl_type types[] = {HL_TYPE_Q4_0, HL_TYPE_Q4_1, HL_TYPE_Q5_0, HL_TYPE_Q5_1,
                             HL_TYPE_Q8_0, HL_TYPE_Q8_1, HL_TYPE_Q8_K};
    static float x[QK_K], y[QK_K];
    static uint8_t q[QK_K * 2];
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        memset(x, 0, sizeof x);
        hl_quantize_row(types[i], x, q, QK_K);
        for (int j = 0; j < QK_K; j++) y[j] = 1.0f;
        hl_dequantize_row(types[i], q, y, QK_K);
        for (int j = 0; j < QK_K; j++) CHECK_MSG(y[j] == 0.0f, "%s", hl_type_name(types[i]));
    }
}
