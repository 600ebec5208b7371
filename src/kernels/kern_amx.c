/*
 * kern_amx.c - prefill matmuls on Intel AMX (AMX-INT8 tile multiplies, Sapphire Rapids and
 * later): kernels for two X8 groups (16 rows) of Q8_0, Q4_0 or Q4_K times any number of
 * tokens, which matmul_groups (kernels.c) calls for prefill chunks in place of gemm16 when
 * the table has them (kern_amx_fill, on top of the AVX-512 table).
 *
 * A tile multiply (TDPBSSD) takes 16 tokens x 32 activation quants (tile A, straight from
 * the token rows: a block's 32 quants, `stride` bytes apart) against 32 quants of 16
 * weight rows (tile B: 8 rows of 64 bytes, 4 quants of each of the 16 rows per row) and
 * gives the 16 x 16 exact integer dots of the block. The X8 layout already holds steps of
 * 4 quants of 8 rows, so B is the two groups' steps side by side: a chunk of a row group's
 * blocks is laid out once as B tiles (AMX_KC blocks, 32 KiB, in L1) and serves every token
 * of the call. Each block's dots then take the reference's float step (kern_ref.c): acc =
 * fmaf(dw * da, dot, acc), in block order, so results equal every other table's bit for
 * bit. That step (a convert, a multiply and an FMA per token and block, after a tile
 * store) is what bounds the Q8_0 and Q4_0 kernels, not the tile multiplies: Q4_0 (nibbles
 * laid out as q - 8) gains little over the AVX-512 table's 32-row kernel. Q4_K folds its
 * integer scales into the weight tiles and takes one float step per super-block (below).
 *
 * The OS must grant the tile state (arch_prctl ARCH_REQ_XCOMP_PERM) before a thread uses
 * it; kern_cpu_has_amx() asks once for the whole process.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kern_internal.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define HL_HAVE_AMX 1
#define AMX_TARGET                                                                           \
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8"
#define AMX_FN static __attribute__((target(AMX_TARGET)))
#define AMX_INLINE static inline __attribute__((always_inline, target(AMX_TARGET)))

enum {
    AMX_TOKS = 16, /* tokens per tile multiply (tile rows) */
    AMX_KC = 64,   /* 32-quant blocks unpacked per chunk: 64 x 512 B = 32 KiB of B tiles */
    ARCH_REQ_XCOMP_PERM = 0x1023,
    XFEATURE_XTILEDATA = 18,
};

/* ldtilecfg's 64-byte operand (palette 1). */
typedef struct amx_tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tilecfg;

/* Q8_0 (k_quant false): tmm0, tmm1: dots (mt x 16 int32); tmm2, tmm3: activations (mt x
 * 32 int8); tmm4, tmm5: weights (8 x 64). Two of each, so a block's multiply runs while the
 * previous block's dots go through the float step. Q4_K: tmm0, 1 sums (mt x 16 int32),
 * tmm2, 3 activations (mt x 64), tmm4-7 weights (16 x 64). */
AMX_FN void amx_config(int mt, bool k_quant) {
    amx_tilecfg c = {.palette = 1};
    for (int i = 0; i < 8; i++) {
        if (k_quant) {
            c.rows[i] = (uint8_t)(i < 4 ? mt : 16);
            c.colsb[i] = 64;
        } else if (i < 6) {
            c.rows[i] = (uint8_t)(i < 4 ? mt : 8);
            c.colsb[i] = i == 2 || i == 3 ? 32 : 64;
        }
    }
    /* ldtilecfg's asm names only the first bytes of its operand, and gcc 12 drops stores
     * to the rest (llama.cpp's AMX path dies of it, bench/README.md): volatile writes stay */
    volatile uint8_t cfg[64] __attribute__((aligned(64)));
    for (size_t i = 0; i < sizeof cfg; i++) cfg[i] = ((const uint8_t *)&c)[i];
    _tile_loadconfig((const void *)cfg);
}

/* The tile asm names no memory: these order it against the C code's loads and stores. */
#define AMX_FENCE() __asm__ volatile("" ::: "memory")

/* Per call: the 16 rows' block scales as floats and B tiles for AMX_KC blocks; per token
 * tile: the tokens' block scales (rows beyond mt zero). */
typedef struct amx_scratch {
    _Alignas(64) int8_t b[AMX_KC][8][64];
    _Alignas(64) float dw[AMX_KC][16];
    _Alignas(64) float da[AMX_KC][AMX_TOKS];
    _Alignas(64) int32_t c[2][AMX_TOKS][16];
} amx_scratch;

/* Two groups' 8 fp16 scales as 16 floats. */
AMX_FN __m512 amx_scales16(const hl_fp16 *d0, const hl_fp16 *d1) {
    const __m128i a = _mm_loadu_si128((const __m128i *)d0);
    const __m128i b = _mm_loadu_si128((const __m128i *)d1);
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1));
}

/* Blocks [k0, k0 + kc) of the two Q8_0_X8 groups into B tiles: step s of both side by side. */
AMX_FN void amx_unpack_q8_0(amx_scratch *s, const block_q8_0_x8 *g0, const block_q8_0_x8 *g1,
                            int kc) {
    for (int i = 0; i < kc; i++) {
        for (int st = 0; st < 8; st++) {
            const __m256i a = _mm256_loadu_si256((const __m256i *)g0[i].qs[st]);
            const __m256i b = _mm256_loadu_si256((const __m256i *)g1[i].qs[st]);
            _mm512_store_si512(s->b[i][st], _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
        }
        _mm512_store_ps(s->dw[i], amx_scales16(g0[i].d, g1[i].d));
    }
}

/* The same for Q4_0_X8: chunk c's low nibbles are step c, its high nibbles step 4 + c,
 * stored as q - 8 so the tile multiply gives the reference's signed dot directly. */
AMX_FN void amx_unpack_q4_0(amx_scratch *s, const block_q4_0_x8 *g0, const block_q4_0_x8 *g1,
                            int kc) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
    for (int i = 0; i < kc; i++) {
        for (int c = 0; c < 4; c++) {
            const __m256i a = _mm256_loadu_si256((const __m256i *)g0[i].qs[c]);
            const __m256i b = _mm256_loadu_si256((const __m256i *)g1[i].qs[c]);
            const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
            const __m512i lo = _mm512_and_si512(z, m4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
            _mm512_store_si512(s->b[i][c], _mm512_sub_epi8(lo, eight));
            _mm512_store_si512(s->b[i][4 + c], _mm512_sub_epi8(hi, eight));
        }
        _mm512_store_ps(s->dw[i], amx_scales16(g0[i].d, g1[i].d));
    }
}

/* One block's dots (s->c[buf], the tile's rows) into the accumulators, as the reference:
 * acc = fmaf(dw * da, dot, acc). */
#define AMX_BLOCK_STEP(buf, i)                                                               \
    do {                                                                                     \
        const __m512 dw_ = _mm512_load_ps(s->dw[i]);                                         \
        _Pragma("GCC unroll 16") for (int m = 0; m < AMX_TOKS; m++)                          \
            acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(dw_, _mm512_set1_ps(s->da[i][m])),        \
                                     _mm512_cvtepi32_ps(_mm512_load_si512(s->c[buf][m])),    \
                                     acc[m]);                                                \
    } while (0)

/* Block i's activations (tile A) times its weights (tile B) into dots tile C. */
#define AMX_MUL(C, A, B, i)                                                                  \
    do {                                                                                     \
        _tile_loadd(A, a + (size_t)(i) * sizeof(block_q8_0), stride);                        \
        _tile_loadd(B, s->b[i], 64);                                                         \
        _tile_zero(C);                                                                       \
        _tile_dpbssd(C, A, B);                                                               \
    } while (0)

/* Tokens [t, t + mt) against the unpacked blocks [k0, k0 + kc): the float sums continue
 * from out (k0 > 0) so the chunks keep the block order. */
AMX_INLINE void amx_tokens(amx_scratch *s, int64_t nb, int64_t k0, int kc, const uint8_t *vec,
                           size_t stride, const float *ad, int mt, float *out,
                           size_t out_stride) {
    __m512 acc[AMX_TOKS]; /* in registers: every loop over them is unrolled */
#pragma GCC unroll 16
    for (int m = 0; m < AMX_TOKS; m++)
        acc[m] = k0 > 0 && m < mt ? _mm512_loadu_ps(out + (size_t)m * out_stride)
                                  : _mm512_setzero_ps();
    for (int i = 0; i < kc; i++)
        for (int m = 0; m < AMX_TOKS; m++)
            s->da[i][m] = m < mt ? ad[(size_t)m * nb + k0 + i] : 0.0f;
    /* a block's quants start 2 bytes in (after its fp16 scale) */
    const uint8_t *a = vec + (size_t)k0 * sizeof(block_q8_0) + 2;
    AMX_FENCE();
    AMX_MUL(0, 2, 4, 0);
    for (int i = 0; i < kc; i += 2) {
        if (i + 1 < kc) AMX_MUL(1, 3, 5, i + 1);
        _tile_stored(0, s->c[0], 64);
        AMX_FENCE();
        AMX_BLOCK_STEP(0, i);
        if (i + 1 >= kc) break;
        if (i + 2 < kc) AMX_MUL(0, 2, 4, i + 2);
        _tile_stored(1, s->c[1], 64);
        AMX_FENCE();
        AMX_BLOCK_STEP(1, i + 1);
    }
#pragma GCC unroll 16
    for (int m = 0; m < AMX_TOKS; m++)
        if (m < mt) _mm512_storeu_ps(out + (size_t)m * out_stride, acc[m]);
}

/* 16 rows (two X8 groups of Q8_0, or of Q4_0) x nt tokens. */
AMX_INLINE void amx_gemm_32(int64_t n, const void *w, const void *vec, size_t stride,
                            const float *ad, int nt, float *out, size_t out_stride, bool q4) {
    amx_scratch s;
    const int64_t nb = n / QK8_0;
    int cfg = 0;
    for (int64_t k0 = 0; k0 < nb; k0 += AMX_KC) {
        const int kc = (int)(nb - k0 < AMX_KC ? nb - k0 : AMX_KC);
        if (q4)
            amx_unpack_q4_0(&s, (const block_q4_0_x8 *)w + k0,
                            (const block_q4_0_x8 *)w + nb + k0, kc);
        else
            amx_unpack_q8_0(&s, (const block_q8_0_x8 *)w + k0,
                            (const block_q8_0_x8 *)w + nb + k0, kc);
        for (int t = 0; t < nt; t += AMX_TOKS) {
            const int mt = nt - t < AMX_TOKS ? nt - t : AMX_TOKS;
            if (mt != cfg) amx_config(cfg = mt, false);
            amx_tokens(&s, nb, k0, kc, (const uint8_t *)vec + (size_t)t * stride, stride,
                       ad + (size_t)t * nb, mt, out + (size_t)t * out_stride, out_stride);
        }
    }
    _tile_release();
}

AMX_FN void amx_q8_0_x8(int64_t n, const void *w, const void *vec, size_t stride, const float *ad,
                        const int32_t *as, int nt, float *out, size_t out_stride) {
    (void)as;
    amx_gemm_32(n, w, vec, stride, ad, nt, out, out_stride, false);
}

AMX_FN void amx_q4_0_x8(int64_t n, const void *w, const void *vec, size_t stride, const float *ad,
                        const int32_t *as, int nt, float *out, size_t out_stride) {
    (void)as;
    amx_gemm_32(n, w, vec, stride, ad, nt, out, out_stride, true);
}

/* ---- Q4_K ------------------------------------------------------------------------------
 * A Q4_K super-block's dot is sum_sb sc[sb] * dot_sb - sum_sb mn[sb] * ysum[sb], per
 * sub-block of 32 (kern_ref.c). The 6-bit scale splits as sc = 8 * hi + lo (3 bits each),
 * and q * lo, q * hi (at most 105) fit a signed byte: with the scales folded into two
 * copies of the weights, tile multiplies accumulate a whole super-block, and C_lo + 8 * C_hi
 * is the reference's sum_sb sc[sb] * dot_sb exactly; the mins' sum comes from the
 * activations' bsums with vpdpwssd. One float step per super-block instead of per block.
 * K steps of 64 (two sub-blocks: the low and the high nibbles of one qs[j]), weight tiles
 * of 16 rows of 64 bytes. */

enum {
    AMX_KC_K = 2,      /* super-blocks unpacked per chunk: 2 x 4 x 2 x 1 KiB = 16 KiB */
    AMX_MAX_TOK = 256, /* tokens per pass over the chunks (their mins sums in the scratch) */
};

typedef struct amx_scratch_k {
    _Alignas(64) int8_t b[AMX_KC_K][4][2][16][64]; /* [super-block][K step][lo, hi] */
    _Alignas(64) int16_t mn[AMX_KC_K][4][16][2];   /* [.][pair p][row]: mn[2p], mn[2p + 1] */
    _Alignas(64) float d[AMX_KC_K][16], dmin[AMX_KC_K][16];
    _Alignas(64) int32_t c[2][AMX_TOKS][16];
    _Alignas(64) int32_t ysum[AMX_TOKS][8]; /* pairs of a token's sub-block sums, packed */
    _Alignas(64) float accm[AMX_MAX_TOK][16];
} amx_scratch_k;

/* Bytes times per-row factors of at most 7 (each row's factor in all 4 bytes of its lane);
 * the products fit a byte. */
AMX_INLINE __m512i amx_mul_small(__m512i q, __m512i f) {
    const __m512i even = _mm512_set1_epi16(0x00ff);
    const __m512i lo = _mm512_maddubs_epi16(q, _mm512_and_si512(f, even));
    const __m512i hi = _mm512_maddubs_epi16(q, _mm512_andnot_si512(even, f));
    return _mm512_or_si512(lo, _mm512_slli_epi16(hi, 8));
}

AMX_FN void amx_unpack_q4_K(amx_scratch_k *s, const block_q4_K_x8 *g0, const block_q4_K_x8 *g1,
                            int kc) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int i = 0; i < kc; i++) {
        uint32_t lo[8][16], hi[8][16]; /* [sub-block][row]: the factor in all 4 bytes */
        for (int r = 0; r < 16; r++) {
            uint8_t sc8[8], mn8[8];
            kern_q4_K_x8_scales(r < 8 ? &g0[i] : &g1[i], r % 8, sc8, mn8);
            for (int sb = 0; sb < 8; sb++) {
                lo[sb][r] = (sc8[sb] & 7u) * 0x01010101u;
                hi[sb][r] = (uint32_t)(sc8[sb] >> 3) * 0x01010101u;
                s->mn[i][sb / 2][r][sb % 2] = mn8[sb];
            }
        }
        for (int j = 0; j < 4; j++) {
            const __m512i lo0 = _mm512_loadu_si512(lo[2 * j]);
            const __m512i lo1 = _mm512_loadu_si512(lo[2 * j + 1]);
            const __m512i hi0 = _mm512_loadu_si512(hi[2 * j]);
            const __m512i hi1 = _mm512_loadu_si512(hi[2 * j + 1]);
            for (int st = 0; st < 8; st++) {
                const __m256i a = _mm256_loadu_si256((const __m256i *)g0[i].qs[j][st]);
                const __m256i b = _mm256_loadu_si256((const __m256i *)g1[i].qs[j][st]);
                const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
                const __m512i q0 = _mm512_and_si512(z, m4);                       /* 2j */
                const __m512i q1 = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4); /* 2j + 1 */
                _mm512_store_si512(s->b[i][j][0][st], amx_mul_small(q0, lo0));
                _mm512_store_si512(s->b[i][j][0][8 + st], amx_mul_small(q1, lo1));
                _mm512_store_si512(s->b[i][j][1][st], amx_mul_small(q0, hi0));
                _mm512_store_si512(s->b[i][j][1][8 + st], amx_mul_small(q1, hi1));
            }
        }
        _mm512_store_ps(s->d[i], amx_scales16(g0[i].d, g1[i].d));
        _mm512_store_ps(s->dmin[i], amx_scales16(g0[i].dmin, g1[i].dmin));
    }
}

/* K steps j (tiles A, B lo, B hi) accumulated into tmm0 (lo) and tmm1 (hi). */
#define AMX_K_STEP(A, BLO, BHI, j)                                                           \
    do {                                                                                     \
        _tile_loadd(A, y + offsetof(block_q8_K, qs) + 64 * (j), stride);                     \
        _tile_loadd(BLO, s->b[i][j][0], 64);                                                 \
        _tile_loadd(BHI, s->b[i][j][1], 64);                                                 \
        _tile_dpbssd(0, A, BLO);                                                             \
        _tile_dpbssd(1, A, BHI);                                                             \
    } while (0)

/* Tokens [t, t + mt) against the unpacked super-blocks [k0, k0 + kc): acc continues from
 * out and accm from the scratch (k0 > 0); the last chunk writes out = acc - accm. tmm0, 1:
 * the super-block's sums (lo, hi); tmm2, 3: activations; tmm4-7: weights, two K steps'
 * worth, so a step's loads need not wait for the previous step's multiplies. */
AMX_INLINE void amx_tokens_q4_K(amx_scratch_k *s, int64_t k0, int kc, bool last,
                                const uint8_t *vec, size_t stride, int mt, float *out,
                                size_t out_stride, float (*accm)[16]) {
    __m512 acc[AMX_TOKS];
#pragma GCC unroll 16
    for (int m = 0; m < AMX_TOKS; m++) {
        acc[m] = k0 > 0 && m < mt ? _mm512_loadu_ps(out + (size_t)m * out_stride)
                                  : _mm512_setzero_ps();
        if (k0 == 0) _mm512_store_ps(accm[m], _mm512_setzero_ps());
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < kc; i++) {
        const uint8_t *y = vec + (size_t)(k0 + i) * sizeof(block_q8_K);
        float yd[AMX_TOKS];
        for (int m = 0; m < AMX_TOKS; m++) {
            /* ysum of sub-block sb = bsums[2sb] + bsums[2sb + 1]; packed as int16 pairs
             * (sb 2p, 2p + 1) in int32 elements 0, 1, 4, 5 */
            __m256i ys = _mm256_setzero_si256();
            yd[m] = 0.0f;
            if (m < mt) {
                const block_q8_K *ym = (const block_q8_K *)(y + (size_t)m * stride);
                ys = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)ym->bsums), ones);
                yd[m] = ym->d;
            }
            _mm256_store_si256((__m256i *)s->ysum[m], _mm256_packs_epi32(ys, ys));
        }
        AMX_FENCE();
        _tile_zero(0);
        _tile_zero(1);
        AMX_K_STEP(2, 4, 5, 0);
        AMX_K_STEP(3, 6, 7, 1);
        AMX_K_STEP(2, 4, 5, 2);
        AMX_K_STEP(3, 6, 7, 3);
        _tile_stored(0, s->c[0], 64);
        _tile_stored(1, s->c[1], 64);
        AMX_FENCE();
        const __m512 d = _mm512_load_ps(s->d[i]), dmin = _mm512_load_ps(s->dmin[i]);
        const __m512i mn0 = _mm512_load_si512(s->mn[i][0]), mn1 = _mm512_load_si512(s->mn[i][1]);
        const __m512i mn2 = _mm512_load_si512(s->mn[i][2]), mn3 = _mm512_load_si512(s->mn[i][3]);
#pragma GCC unroll 16
        for (int m = 0; m < AMX_TOKS; m++) {
            const __m512i hi8 = _mm512_slli_epi32(_mm512_load_si512(s->c[1][m]), 3);
            const __m512i sumi = _mm512_add_epi32(_mm512_load_si512(s->c[0][m]), hi8);
            __m512i summ = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mn0,
                                               _mm512_set1_epi32(s->ysum[m][0]));
            summ = _mm512_dpwssd_epi32(summ, mn1, _mm512_set1_epi32(s->ysum[m][1]));
            summ = _mm512_dpwssd_epi32(summ, mn2, _mm512_set1_epi32(s->ysum[m][4]));
            summ = _mm512_dpwssd_epi32(summ, mn3, _mm512_set1_epi32(s->ysum[m][5]));
            const __m512 ydm = _mm512_set1_ps(yd[m]);
            acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(d, ydm), _mm512_cvtepi32_ps(sumi), acc[m]);
            _mm512_store_ps(accm[m], _mm512_fmadd_ps(_mm512_mul_ps(dmin, ydm),
                                                     _mm512_cvtepi32_ps(summ),
                                                     _mm512_load_ps(accm[m])));
        }
    }
#pragma GCC unroll 16
    for (int m = 0; m < AMX_TOKS; m++)
        if (m < mt)
            _mm512_storeu_ps(out + (size_t)m * out_stride,
                             last ? _mm512_sub_ps(acc[m], _mm512_load_ps(accm[m])) : acc[m]);
}

/* 16 rows (two Q4_K_X8 groups) x nt tokens of Q8_K activations: up to AMX_MAX_TOK tokens
 * per pass, each chunk unpacked once per pass for all its token tiles. */
AMX_FN void amx_q4_K_x8(int64_t n, const void *w, const void *vec, size_t stride, const float *ad,
                        const int32_t *as, int nt, float *out, size_t out_stride) {
    (void)ad;
    (void)as;
    amx_scratch_k s;
    const int64_t nb = n / QK_K;
    const block_q4_K_x8 *g0 = w, *g1 = g0 + nb;
    int cfg = 0;
    for (int p = 0; p < nt; p += AMX_MAX_TOK) {
        const int np = nt - p < AMX_MAX_TOK ? nt - p : AMX_MAX_TOK;
        for (int64_t k0 = 0; k0 < nb; k0 += AMX_KC_K) {
            const int kc = (int)(nb - k0 < AMX_KC_K ? nb - k0 : AMX_KC_K);
            amx_unpack_q4_K(&s, g0 + k0, g1 + k0, kc);
            for (int t = p; t < p + np; t += AMX_TOKS) {
                const int mt = p + np - t < AMX_TOKS ? p + np - t : AMX_TOKS;
                if (mt != cfg) amx_config(cfg = mt, true);
                amx_tokens_q4_K(&s, k0, kc, k0 + kc == nb,
                                (const uint8_t *)vec + (size_t)t * stride, stride, mt,
                                out + (size_t)t * out_stride, out_stride, s.accm + (t - p));
            }
        }
    }
    _tile_release();
}

static bool amx_probe(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!kern_cpu_has_avx512() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 24)) || !(d & (1u << 25))) return false; /* AMX-TILE, AMX-INT8 */
    /* Linux 5.16+: the tile data state is off until the process asks for it */
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}
#endif

#ifdef HL_HAVE_AMX
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;
static bool g_amx;
static void amx_probe_once(void) { g_amx = amx_probe(); }
#endif

bool kern_cpu_has_amx(void) {
#ifdef HL_HAVE_AMX
    pthread_once(&g_amx_once, amx_probe_once);
    return g_amx;
#else
    return false;
#endif
}

void kern_amx_fill(kern_table *t) {
#ifdef HL_HAVE_AMX
    t->name = "amx";
    /* below these token counts the AVX-512 kernels were as fast or faster (a batched decode
     * step: laying out Q4_K's weight tiles costs more than 16 tokens' multiplies save) */
    t->gemm_many[HL_TYPE_Q8_0_X8] = amx_q8_0_x8;
    t->gemm_many_min[HL_TYPE_Q8_0_X8] = 9;
    t->gemm_many[HL_TYPE_Q4_0_X8] = amx_q4_0_x8;
    t->gemm_many_min[HL_TYPE_Q4_0_X8] = 9;
    t->gemm_many[HL_TYPE_Q4_K_X8] = amx_q4_K_x8;
    t->gemm_many_min[HL_TYPE_Q4_K_X8] = 32;
#else
    (void)t;
#endif
}
