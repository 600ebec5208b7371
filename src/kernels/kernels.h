/*
 * kernels.h - the compute kernels the forward pass calls: dot products and matrix
 * multiplication over any weight type, plus the small f32 ops.
 *
 * Each kernel has a scalar reference (_ref, always built, never removed) and may
 * have SIMD variants chosen once at run time (kern_init(), __builtin_cpu_supports).
 * HEARTH_CPU=ref forces the reference path, for tests and comparisons; HEARTH_CPU=avx2,
 * avx2-vnni or avx512 caps the choice below the AVX-VNNI / AVX-512 prefill tiles or the
 * AMX prefill kernels (kern_amx.c).
 *
 * Matmul: W is n_rows x n_cols of a weight type, row-major, each row hl_row_size()
 * bytes; x is n_tok x n_cols f32; out is n_tok x n_rows f32 (out[t*n_rows + r] =
 * dot(W[r], x[t])). Activations are first converted to the weight type's
 * vec_dot_type in caller-provided scratch (kern_matmul_scratch_size() bytes), so the
 * hot path never allocates. The pool threads claim chunks of rows x tokens dynamically.
 *
 * Activation types (vec_dot_type): Q8_0 for Q4_0/Q5_0/Q8_0/MXFP4, Q8_1 for Q4_1/Q5_1, Q8_K
 * for the K-quants, F32 for F32/F16/BF16 (no scratch needed). n_cols must be a
 * multiple of the weight type's block size. Results for a token do not depend on
 * n_tok, the thread count or how the work is chunked (prefill and decode agree bit for
 * bit). The AVX2 integer dots assume quants in [-127, 127], as every ggml/hearth quantizer writes them.
 * Variants live in kern_ref.c and kern_avx2.c; kern_internal.h has the table.
 */
#ifndef HL_KERNELS_H
#define HL_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"
#include "tensor/types.h"

/* Selects SIMD variants (idempotent; called by everything below on first use). */
void kern_init(void);
const char *kern_variant(void); /* "ref", "avx2", ... */

/* Dot of n elements: a row of `type` with a row of traits(type)->vec_dot_type. */
float kern_vec_dot(hl_type type, int64_t n, const void *row, const void *vec);

size_t kern_matmul_scratch_size(hl_type type, int64_t n_cols, int64_t n_tok);
void kern_matmul(hl_pool *pool, hl_type type, const void *w, int64_t n_rows, int64_t n_cols,
                 const float *x, int64_t n_tok, float *out, void *scratch);

/* Weight layouts of hearth's own (types.h: internal), for faster matmuls.
 * kern_packed_type() names the layout the active kernels run a weight of `type` fastest
 * in, or returns `type`: today Q4_0, Q8_0, Q4_K and Q6_K become their X8 layouts (8
 * rows interleaved, types.h) when the rows its
 * users take at a time (all of them, or one expert's or head's slice) are a multiple of 8.
 * HEARTH_REPACK=0 (or off) keeps every weight as the file has it.
 * kern_repack() rewrites n_rows x n_cols of the file type in place into `packed`, which
 * takes the same bytes (tmp: 8 * hl_row_size(file type, n_cols) bytes); false if it cannot
 * (then nothing was changed). A packed weight is only for kern_matmul / kern_matmul_many
 * (no kern_vec_dot: a row is not readable alone) with n_rows a multiple of 8, from row
 * offsets that are multiples of 8. Its results are within rounding of the file layout's
 * (the sum over blocks runs per row in another order), bit for bit the same for any
 * n_tok, thread count or variant. */
hl_type kern_packed_type(hl_type type, int64_t rows_per_slice);
bool kern_repack(hl_type packed, void *data, int64_t n_rows, int64_t n_cols, void *tmp);

/* Several matmuls over the same activations x (n_tok x n_cols), e.g. Wq/Wk/Wv or
 * Wgate/Wup: x is quantized once and one pool run covers the rows of all of them, so a
 * decoded token pays one hand-off instead of n. Each item's output is exactly what
 * kern_matmul would give. Items whose weight types have different activation types fall
 * back to separate kern_matmul calls, as do packed items mixed with plain ones. scratch: the
 * largest kern_matmul_scratch_size() of the items. */
typedef struct kern_matmul_item {
    hl_type type;
    const void *w;
    int64_t n_rows;
    float *out; /* n_tok x n_rows */
} kern_matmul_item;
enum { KERN_MATMUL_MAX_ITEMS = 4 };
void kern_matmul_many(hl_pool *pool, const kern_matmul_item *items, int n_items, int64_t n_cols,
                      const float *x, int64_t n_tok, void *scratch);

/* Small f32 ops. */
void kern_rmsnorm(float *out, const float *x, const float *weight, int64_t n, float eps);
void kern_softmax(float *x, int64_t n);
/* out[i] = silu(gate[i]) * up[i] */
void kern_swiglu(float *out, const float *gate, const float *up, int64_t n);
/* y[i] += a * x[i] (attention's weighted sum of values). */
void kern_axpy(float *y, float a, const float *x, int64_t n);
/* Attention over a run of keys: out[j] = scale * dot(q, k_j) with k_j = k + j*ldk, for
 * j < nk, each of d floats. The result for a key does not depend on nk or j. */
void kern_dot_rows(float *out, const float *q, const float *k, int64_t ldk, int64_t nk, int64_t d,
                   float scale);
/* y[i] += sum_j p[j] * v_j[i] with v_j = v + j*ldv: one fused multiply-add (fmaf) per key
 * and element, in key order, in every variant. */
void kern_axpy_rows(float *y, const float *p, const float *v, int64_t ldv, int64_t nk, int64_t d);
/* KV cache rows of another element type (kv/layout.h: f32, f16, q8_0), ld in bytes.
 * kern_kv_store_row writes n floats as one row of `type`: a copy, f16 rounded to nearest
 * even, or q8_0 blocks exactly as hl_quantize_row (llama.cpp's quantize_row_q8_0).
 * kern_dot_rows_kv scores keys as a weight row of their type times q in that type's
 * activation form (kern_vec_dot): q is f32 for f32 and f16 keys, and q8_0 blocks (made
 * by kern_kv_store_row) for q8_0 keys, the integer dot llama.cpp's KQ matmul does.
 * f32 rows go to kern_dot_rows / kern_axpy_rows unchanged. q8_0 needs d % 32 == 0. */
void kern_kv_store_row(hl_type type, const float *x, void *dst, int64_t n);
void kern_dot_rows_kv(hl_type type, float *out, const void *q, const void *k, size_t ldk,
                      int64_t nk, int64_t d, float scale);
void kern_axpy_rows_kv(hl_type type, float *y, const float *p, const void *v, size_t ldv,
                       int64_t nk, int64_t d);
/* Keys of a cache that stores f16 keys by columns (kv/layout.h): key j's element i at
 * k[i * ld + j]. kern_kv_store_key writes n floats as one key whose elements are `stride`
 * elements apart (1: kern_kv_store_row; more: f16 only, the same rounding).
 * kern_dot_cols_f16: out[j] = scale * sum_i q[i] k_ij, the sum one fmaf per element in
 * element order from 0, in every variant (so a score does not depend on nk, j or ld). */
void kern_kv_store_key(hl_type type, const float *x, void *dst, int64_t n, int64_t stride);
void kern_dot_cols_f16(float *out, const float *q, const hl_fp16 *k, int64_t ld, int64_t nk,
                       int64_t d, float scale);
/* x[i] = exp(x[i] - shift); returns the sum (attention's online softmax). */
float kern_exp_shift_sum(float *x, int64_t n, float shift);
/* One step of decode attention's online softmax, for nh query heads that share one KV
 * head (GQA), keys and values of f32 or f16 rows (ldk, ldv in elements). The step's nk
 * keys are the rows of up to KERN_ATTN_RUNS runs, in order (a step may span two of the
 * cache's blocks; a run with n = 0 is unused). Per head i (query q + i*ldq, state
 * o + i*dv, m[i], s[i]): scores x_j = scale * q.k_j over the nk keys; with
 * M = max(m[i], max_j x_j), o and s[i] are first scaled by exp(m[i] - M) (when M grew),
 * then s[i] += sum_j exp(x_j - M), o += sum_j exp(x_j - M) v_j, m[i] = M. score: 8 * nk
 * floats of scratch. The result is bit for bit that of the per-head sequence
 * kern_dot_rows_kv or kern_dot_cols_f16 (run by run), kern_max, kern_scale, kern_exp_shift_sum,
 * kern_axpy_rows_kv (run by run), so a head's output does not depend on nh, nor on where
 * the runs split the keys. perf: two heads (AVX-512: eight or four) share each conversion
 * of a key or value row, and a step costs one call instead of five per head. */
typedef struct kern_attn_run {
    const void *k, *v;
    int64_t n;   /* keys */
    int64_t kld; /* keys by columns (k_cols): elements between a key's elements */
} kern_attn_run;
enum { KERN_ATTN_RUNS = 2 };
typedef struct kern_attn_block {
    int32_t nh;
    const float *q;
    int64_t ldq;
    kern_attn_run run[KERN_ATTN_RUNS];
    int64_t ldk, ldv; /* elements; ldk: keys by rows only */
    bool k_cols;      /* f16 keys by columns (kern_dot_cols_f16), each run's kld apart */
    int64_t dk, dv;
    float scale;
    float *o, *m, *s, *score;
    /* the step this head group walks next (runs of n = 0: none), laid out as run. The
     * f16 kernel prefetches it while this step runs: each cache block's rows are a short
     * run (4 KB per layer and head in the runner's 32-position blocks) that the hardware
     * prefetchers only find after its first misses. No effect on the result. */
    kern_attn_run next[KERN_ATTN_RUNS];
} kern_attn_block;
/* The keys of a step: the sum of its runs' rows. */
int64_t kern_attn_block_keys(const kern_attn_block *b);
void kern_attn_run_block(hl_type type, const kern_attn_block *b);

/* The largest of x[0 .. n), NaNs skipped; -inf if n <= 0 or all are NaN. */
float kern_max(const float *x, int64_t n);
/* x[i] *= s. */
void kern_scale(float *x, float s, int64_t n);

#endif
