/*
 * kern_amx.c - prefill matmuls on Intel AMX (AMX-INT8 tile multiplies, Sapphire Rapids and
 * later): a kernel for two Q8_0_X8 groups (16 rows) times any number of tokens, which
 * matmul_groups (kernels.c) calls for prefill chunks in place of gemm16 when the table has
 * it (kern_amx_fill, on top of the AVX-512 table).
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
 * store) is what bounds the kernel, not the tile multiplies: a Q4_0 kernel of the same
 * shape (nibbles unpacked to q - 8) ran no faster than the AVX-512 table's 32-row Q4_0
 * kernel, so Q4_0 stays there (bench/README.md).
 *
 * The OS must grant the tile state (arch_prctl ARCH_REQ_XCOMP_PERM) before a thread uses
 * it; kern_cpu_has_amx() asks once for the whole process.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kern_internal.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define HL_HAVE_AMX 1
#define AMX_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8"
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

/* tmm0, tmm1: dots (mt x 16 int32); tmm2, tmm3: activations (mt x 32 int8); tmm4, tmm5:
 * weights (8 x 64). Two of each, so a block's multiply runs while the previous block's
 * dots go through the float step. */
AMX_FN void amx_config(int mt) {
    volatile amx_tilecfg c; /* volatile: ldtilecfg's asm names only its first bytes */
    memset((void *)&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 6; i++) {
        c.rows[i] = (uint8_t)(i < 4 ? mt : 8);
        c.colsb[i] = i == 2 || i == 3 ? 32 : 64;
    }
    _tile_loadconfig((const void *)&c);
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
    const __m128i a = _mm_loadu_si128((const __m128i *)d0), b = _mm_loadu_si128((const __m128i *)d1);
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
        for (int m = 0; m < AMX_TOKS; m++) s->da[i][m] = m < mt ? ad[(size_t)m * nb + k0 + i] : 0.0f;
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

/* 16 rows (two Q8_0_X8 groups) x nt tokens. */
AMX_FN void amx_q8_0_x8(int64_t n, const void *w, const void *vec, size_t stride, const float *ad,
                        const int32_t *as, int nt, float *out, size_t out_stride) {
    (void)as;
    amx_scratch s;
    const int64_t nb = n / QK8_0;
    int cfg = 0;
    for (int64_t k0 = 0; k0 < nb; k0 += AMX_KC) {
        const int kc = (int)(nb - k0 < AMX_KC ? nb - k0 : AMX_KC);
        amx_unpack_q8_0(&s, (const block_q8_0_x8 *)w + k0, (const block_q8_0_x8 *)w + nb + k0, kc);
        for (int t = 0; t < nt; t += AMX_TOKS) {
            const int mt = nt - t < AMX_TOKS ? nt - t : AMX_TOKS;
            if (mt != cfg) amx_config(cfg = mt);
            amx_tokens(&s, nb, k0, kc, (const uint8_t *)vec + (size_t)t * stride, stride,
                          ad + (size_t)t * nb, mt, out + (size_t)t * out_stride, out_stride);
        }
    }
    _tile_release();
}

static bool amx_probe(void) {
    unsigned a, b, c, d;
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
    t->gemm_many[HL_TYPE_Q8_0_X8] = amx_q8_0_x8;
#else
    (void)t;
#endif
}
