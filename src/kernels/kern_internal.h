/*
 * kern_internal.h - the kernel dispatch table shared by kernels.c (dispatch and
 * matmul), kern_ref.c (scalar reference) and kern_avx2.c (AVX2/FMA/F16C variants).
 * Not for use outside src/kernels and its tests.
 *
 * A table maps a weight type to its dot kernel and an activation (vec_dot) type to
 * its row quantizer. kern_table_ref() is complete for every can_matmul type;
 * kern_avx2_fill() overrides the entries it has on top of a copy of it. Tests
 * compare the two tables entry by entry.
 */
#ifndef HL_KERNELS_KERN_INTERNAL_H
#define HL_KERNELS_KERN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/kernels.h"
#include "tensor/types.h"

/* Dot of n elements of a weight row with an activation row of its vec_dot_type. */
typedef float (*kern_vec_dot_fn)(int64_t n, const void *row, const void *vec);
/* The same dot for 4 activation rows `stride` bytes apart (prefill): out[t] must
 * equal vec_dot(n, row, vec + t*stride) exactly. Optional (NULL: matmul loops). */
typedef void (*kern_vec_dot4_fn)(int64_t n, const void *row, const void *vec, size_t stride,
                                 float *out);
/* Register-blocked prefill tile: KERN_TILE_ROWS weight rows (w_stride bytes apart) times
 * KERN_TILE_TOKS activation rows (stride bytes apart); out[t*out_stride + r] must equal
 * vec_dot(n, row r, token t) exactly. Each weight block is unpacked once for all the
 * tile's tokens and each activation block loaded once for all its rows, with the
 * accumulators in registers. Optional (NULL: dot4 / vec_dot).
 * vscale: for Q8_0 activations, the tile's block scales as floats, token-interleaved
 * (block i of token t at vscale[4*i + t]), so that a tile need not convert the fp16
 * scales again for every pair of rows; NULL when not given (a tile then converts them
 * itself; other activation types ignore it). */
enum { KERN_TILE_ROWS = 2, KERN_TILE_TOKS = 4 };
typedef void (*kern_vec_dot_tile_fn)(int64_t n, const void *w, size_t w_stride, const void *vec,
                                     size_t stride, const float *vscale, float *out,
                                     size_t out_stride);
/* Matmul over an interleaved layout of 8 rows (types.h: Q4_0_X8, Q8_0_X8, Q4_K_X8,
 * Q6_K_X8): one group of 8 rows (w) times nt (1..KERN_GEMM8_TOKS) activation rows `stride`
 * bytes apart, into out[t*out_stride + r], r < 8. For Q8_0 activations ad / as hold, per
 * block (token t, block i at [t * n/32 + i]), its scale as a float and 8 times the sum of
 * its quants (NULL for the others). Per (row, token): per block or super-block an exact
 * integer sum, then one multiply-add into the row's float sum, in block order, as
 * kern_ref.c spells out per type; every variant does exactly this, so results equal the
 * reference bit for bit and do not depend on nt. */
enum { KERN_GEMM8_ROWS = 8, KERN_GEMM8_TOKS = 4 };
typedef void (*kern_gemm8_fn)(int64_t n, const void *w, const void *vec, size_t stride,
                              const float *ad, const int32_t *as, int nt, float *out,
                              size_t out_stride);
/* Whether the wide X8 kernels (16-64 rows a call) that this thread calls next prefetch
 * each group's stream a few lines ahead (kern_avx2.c, STREAM_AHEAD_WIDE), and the 8-row
 * vpdpbusd Q8_0_X8 kernel its stream (STREAM_AHEAD_VNNI; the other 8-row kernels always
 * prefetch in decode, and Q8_0_X8 lost by it on Zen 5). matmul_groups
 * sets it for its calls: on where a matmul reads its weights once for all its tokens (at
 * most KERN_TOK_TILE: decode, small batches) and the CPU gains by it (Intel by default,
 * HEARTH_PREFETCH=0/1 overrides); off for prefill, whose calls read each group for many
 * tokens from cache. */
extern _Thread_local bool kern_stream_prefetch;
/* Converts n f32 activations to a row of the table slot's type. */
typedef void (*kern_quantize_fn)(const float *x, void *dst, int64_t n);

typedef struct kern_table {
    const char *name;
    kern_vec_dot_fn vec_dot[HL_TYPE_COUNT];   /* by weight type */
    kern_vec_dot4_fn vec_dot4[HL_TYPE_COUNT]; /* by weight type, optional */
    kern_vec_dot_tile_fn vec_dot_tile[HL_TYPE_COUNT]; /* by weight type, optional */
    kern_gemm8_fn gemm8[HL_TYPE_COUNT]; /* by packed weight type (types.h: internal) */
    /* optional: two consecutive groups (16 rows, out[t*out_stride + r] for r < 16) in one
     * call, with gemm8's arithmetic per row; w is the first group, the second follows it */
    kern_gemm8_fn gemm16[HL_TYPE_COUNT];
    kern_gemm8_fn gemm32[HL_TYPE_COUNT]; /* optional: the same with four groups, 32 rows */
    /* optional: the same with eight groups, 64 rows, for decode (1..KERN_GEMM8_TOKS
     * tokens, wide decode: kernels.c) */
    kern_gemm8_fn gemm64[HL_TYPE_COUNT];
    /* optional: two groups (16 rows) as gemm16, but nt any number of tokens (prefill
     * chunks; the AMX table) */
    kern_gemm8_fn gemm_many[HL_TYPE_COUNT];
    int gemm_many_min[HL_TYPE_COUNT]; /* the fewest tokens a matmul gives gemm_many */
    kern_quantize_fn quantize[HL_TYPE_COUNT]; /* by vec_dot_type */
    /* small f32 ops */
    float (*sum_squares)(const float *x, int64_t n);
    float (*exp_shift_sum)(float *x, int64_t n, float shift); /* x = exp(x - shift) */
    /* exp_shift_sum's bits where every x[i] <= shift or is NaN (optional: the AVX2 online
     * softmax's; exported here for its test) */
    float (*exp_nonpos_shift_sum)(float *x, int64_t n, float shift);
    float (*max)(const float *x, int64_t n); /* n > 0; NaNs are skipped */
    void (*scale)(float *x, float s, int64_t n); /* x *= s */
    void (*swiglu)(float *out, const float *gate, const float *up, int64_t n);
    void (*axpy)(float *y, float a, const float *x, int64_t n); /* y += a * x */
    /* attention: out[j] = scale * dot(q, k + j*ldk) over d; y += sum_j p[j] * (v + j*ldv) */
    void (*dot_rows)(float *out, const float *q, const float *k, int64_t ldk, int64_t nk,
                     int64_t d, float scale);
    void (*axpy_rows)(float *y, const float *p, const float *v, int64_t ldv, int64_t nk,
                      int64_t d);
    /* KV cache rows (kv/layout.h) of f16 and q8_0: the store's f32 -> f16 conversion
     * (round to nearest even), scores over f16 keys (ldk in elements) and value sums over
     * f16 (ldv in elements) or q8_0 rows (ldv in bytes). The value sums do one fmaf per
     * key and element in key order (q8_0: weight p[j] * block scale), as axpy_rows. */
    void (*to_f16)(const float *x, hl_fp16 *dst, int64_t n);
    void (*dot_rows_f16)(float *out, const float *q, const hl_fp16 *k, int64_t ldk, int64_t nk,
                         int64_t d, float scale);
    /* kern_dot_cols_f16 (keys by columns) */
    void (*dot_cols_f16)(float *out, const float *q, const hl_fp16 *k, int64_t ld, int64_t nk,
                         int64_t d, float scale);
    void (*axpy_rows_f16)(float *y, const float *p, const hl_fp16 *v, int64_t ldv, int64_t nk,
                          int64_t d);
    void (*axpy_rows_q8_0)(float *y, const float *p, const void *v, size_t ldv, int64_t nk,
                           int64_t d);
    /* kern_attn_run_block over f16 rows (optional: NULL runs the per-head pieces; over
     * f32 rows the pieces were faster: the pair kernels save conversions only) */
    void (*attn_block_f16)(const kern_attn_block *b);
} kern_table;

/* kern_attn_block from a table's pieces, head by head: what a table's own attn_block_*
 * must equal bit for bit. */
void kern_attn_block_pieces(const kern_table *t, hl_type type, const kern_attn_block *b);

const kern_table *kern_table_ref(void);
/* Row r's (of 8) 6-bit scales and mins from Q4_K_X8's transposed scale bytes (as ggml's
 * get_scale_min_k4 over the row's own 12 bytes); kern_ref.c. */
void kern_q4_K_x8_scales(const block_q4_K_x8 *x, int r, uint8_t sc[8], uint8_t mn[8]);
/* The table kern_init() chose (ref or avx2). */
const kern_table *kern_table_active(void);

/* The variant kern_init() picks for a HEARTH_CPU value (NULL: unset): the best of "ref",
 * "avx2", "avx2-vnni" (plus the AVX-VNNI Q8_0/Q4_0 tiles), "avx512" (AVX-512 tiles for
 * Q8_0/Q4_0/Q4_K/Q6_K) and "amx" (avx512 plus AMX prefill kernels) that the CPU runs; a
 * HEARTH_CPU of one of these names is a ceiling. */
const char *kern_choose_variant(const char *hearth_cpu);
/* True if this CPU runs the AVX2 variants (avx2 + fma + f16c). */
bool kern_cpu_has_avx2(void);
/* Overrides t's entries with the AVX2 ones. Call only if kern_cpu_has_avx2(). */
void kern_avx2_fill(kern_table *t);
/* True on an Intel CPU (CPUID vendor GenuineIntel). */
bool kern_cpu_is_intel(void);
/* True if this CPU also has AVX-VNNI (vpdpbusd on ymm, CPUID.(7,1):EAX[4]). */
bool kern_cpu_has_avx_vnni(void);
/* Overrides t's Q8_0/Q4_0 tiles and X8 kernels with AVX-VNNI ones, after kern_avx2_fill().
 * Results are bit-identical to the AVX2 ones. Call only if kern_cpu_has_avx_vnni(). */
void kern_avx_vnni_fill(kern_table *t);
/* True if this CPU runs the AVX-512 tiles (avx512f/bw/vl/vnni, OS-enabled). */
bool kern_cpu_has_avx512(void);
/* Overrides t's Q8_0/Q4_0/Q4_K/Q6_K tiles, X8 kernels (with gemm16) and f16 attention block
 * with AVX-512 ones (bit-identical to the AVX2 ones). Call only if kern_cpu_has_avx512(). */
void kern_avx512_fill(kern_table *t);
/* True if this CPU has AMX-INT8 (tile multiplies) and the OS granted this process the tile
 * state (the first call asks). */
bool kern_cpu_has_amx(void);
/* Adds the AMX prefill kernels (gemm_many) for Q8_0_X8, Q4_0_X8 and Q4_K_X8, after
 * kern_avx512_fill(); bit-identical to the others. Call only if kern_cpu_has_amx(). */
void kern_amx_fill(kern_table *t);

#endif
