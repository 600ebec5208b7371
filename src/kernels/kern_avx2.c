/*
 * kern_avx2.c - AVX2/FMA/F16C variants of the hottest kernels. Compiled with
 * -mavx2 -mfma -mf16c (the Makefile rule for *_avx2.c files);
 * nothing here may run before kernels.c has checked the CPU (kern_cpu_has_avx2()).
 *
 * Integer dots use the maddubs sign trick: |x| (unsigned) times y with x's sign.
 * maddubs saturates at 2*128*128, so it relies on quants in [-127, 127]: what ggml
 * and hl_quantize_row produce (Q8 never stores -128; Q4 values are small).
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "kernels/kern_internal.h"

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float fp16_to_f32(hl_fp16 h) { return _cvtsh_ss(h); }

static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* ---- float weights --------------------------------------------------------------- */

static inline __m256 load_f16x8(const hl_fp16 *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256 load_bf16x8(const hl_bf16 *p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* Four accumulators hide the FMA latency. */
#define FLOAT_DOT(NAME, WTYPE, LOAD, SCALAR)                                                       \
    static float NAME(int64_t n, const void *row, const void *vec) {                               \
        const WTYPE *a = row;                                                                      \
        const float *b = vec;                                                                      \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                             \
        __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();                             \
        int64_t i = 0;                                                                             \
        for (; i + 32 <= n; i += 32) {                                                             \
            acc0 = _mm256_fmadd_ps(LOAD(a + i), _mm256_loadu_ps(b + i), acc0);                     \
            acc1 = _mm256_fmadd_ps(LOAD(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);             \
            acc2 = _mm256_fmadd_ps(LOAD(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);           \
            acc3 = _mm256_fmadd_ps(LOAD(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);           \
        }                                                                                          \
        for (; i + 8 <= n; i += 8)                                                                 \
            acc0 = _mm256_fmadd_ps(LOAD(a + i), _mm256_loadu_ps(b + i), acc0);                     \
        float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));  \
        for (; i < n; i++) sum += SCALAR(a[i]) * b[i];                                             \
        return sum;                                                                                \
    }

/* Two activation rows (stride bytes apart) against one weight row, each exactly as
 * FLOAT_DOT computes it (same four accumulators, same order), converting each weight
 * vector once for both; dot4 is two of these (perf: prefill; 4 tokens' 16 accumulators
 * would not fit the registers). */
#define FLOAT_DOT4(NAME, WTYPE, LOAD, SCALAR)                                                      \
    static void NAME##_2(int64_t n, const WTYPE *a, const float *b0, const float *b1,            \
                         float *out) {                                                             \
        __m256 x0 = _mm256_setzero_ps(), x1 = _mm256_setzero_ps();                                 \
        __m256 x2 = _mm256_setzero_ps(), x3 = _mm256_setzero_ps();                                 \
        __m256 z0 = _mm256_setzero_ps(), z1 = _mm256_setzero_ps();                                 \
        __m256 z2 = _mm256_setzero_ps(), z3 = _mm256_setzero_ps();                                 \
        int64_t i = 0;                                                                             \
        for (; i + 32 <= n; i += 32) {                                                             \
            const __m256 w0 = LOAD(a + i), w1 = LOAD(a + i + 8);                                   \
            const __m256 w2 = LOAD(a + i + 16), w3 = LOAD(a + i + 24);                             \
            x0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(b0 + i), x0);                                 \
            x1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(b0 + i + 8), x1);                             \
            x2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(b0 + i + 16), x2);                            \
            x3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(b0 + i + 24), x3);                            \
            z0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(b1 + i), z0);                                 \
            z1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(b1 + i + 8), z1);                             \
            z2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(b1 + i + 16), z2);                            \
            z3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(b1 + i + 24), z3);                            \
        }                                                                                          \
        for (; i + 8 <= n; i += 8) {                                                               \
            const __m256 w = LOAD(a + i);                                                          \
            x0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(b0 + i), x0);                                  \
            z0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(b1 + i), z0);                                  \
        }                                                                                          \
        float s0 = hsum_ps(_mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3)));           \
        float s1 = hsum_ps(_mm256_add_ps(_mm256_add_ps(z0, z1), _mm256_add_ps(z2, z3)));           \
        for (; i < n; i++) {                                                                       \
            s0 += SCALAR(a[i]) * b0[i];                                                            \
            s1 += SCALAR(a[i]) * b1[i];                                                            \
        }                                                                                          \
        out[0] = s0;                                                                               \
        out[1] = s1;                                                                               \
    }                                                                                              \
    static void NAME(int64_t n, const void *row, const void *vec, size_t stride, float *out) {     \
        const uint8_t *b = vec;                                                                    \
        NAME##_2(n, row, (const float *)b, (const float *)(b + stride), out);                      \
        NAME##_2(n, row, (const float *)(b + 2 * stride), (const float *)(b + 3 * stride),        \
                 out + 2);                                                                         \
    }

#define F32_SCALAR(v) (v)
FLOAT_DOT(dot_f32, float, _mm256_loadu_ps, F32_SCALAR)
FLOAT_DOT(dot_f16, hl_fp16, load_f16x8, fp16_to_f32)
FLOAT_DOT(dot_bf16, hl_bf16, load_bf16x8, hl_bf16_to_fp32)
FLOAT_DOT4(dot4_f32, float, _mm256_loadu_ps, F32_SCALAR)
FLOAT_DOT4(dot4_f16, hl_fp16, load_f16x8, fp16_to_f32)
FLOAT_DOT4(dot4_bf16, hl_bf16, load_bf16x8, hl_bf16_to_fp32)

/* ---- 32-element blocks ------------------------------------------------------------ */

/* sum of x*y over 32 int8 pairs, as 8 float partial sums */
static inline __m256 dot_i8x32(__m256i x, __m256i y) {
    const __m256i ax = _mm256_sign_epi8(x, x);
    const __m256i sy = _mm256_sign_epi8(y, x);
    const __m256i d16 = _mm256_maddubs_epi16(ax, sy);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(d16, _mm256_set1_epi16(1)));
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15), then high (16..31) */
static inline __m256i unpack_nibbles(const uint8_t *qs) {
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both =
        _mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

/* The *_rows kernels dot one weight row with nt (1..4) activation rows `stride`
 * bytes apart, unpacking each weight block once for all of them. Per token the
 * arithmetic is the same for any nt, so multi-token matmul results equal the
 * single-token dot bit for bit (prefill and decode agree exactly). */
#define ROWS_INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
/* perf: an empty asm that takes a running sum in a register and gives it back. In the
 * unrolled multi-token loops gcc otherwise computes every step's products first, spills
 * them, and adds them up later (Q4_K_X8 at 4 tokens: 55 -> 83 GMAC/s per core on Zen 3);
 * the sum's bits are the same. */
#define KEEP_IN_REG(v) __asm__("" : "+x"(v))
/* perf: decode reads every weight from DRAM once per token, and these loops spend ~10
 * instructions per 32 bytes, so the out-of-order window reaches ~12 lines ahead where a
 * core wants ~30 in flight (~100 ns x ~18 GB/s); the hardware prefetchers did not make
 * up the rest on a Zen 3 VM with a 32-38 GB/s bus (kernels at 78-84% of a plain read).
 * Each loop step of a 1- or 2-token call asks for the lines STREAM_AHEAD bytes past the
 * bytes it starts at, one per 64 bytes or closer, so every line of the stream is asked
 * for once or twice. Zen 3, alternated pairs: decode Q4_K_M +15-41% (5 of 5), Q4_0
 * +9-23% (4 of 4), Q8_0 +1% (median, faster in 8 of 13); a forward pass of 2 sequences
 * +20% (bench/README, "Zen 3 ...: decode prefetches its stream"). 1.1 KiB ahead gained
 * less, 4.5 KiB as much. Prefill's 4-token calls, mostly on weights already in cache,
 * do without. */
#define STREAM_AHEAD 2304
/* The same for the vpdpbusd kernels (AVX-VNNI, AVX-512 VNNI), further ahead: they spend
 * about half the time per byte. On Zen 5 (a bus reading 30-75 GB/s from minute to
 * minute), one process switching it run by run, 8 pairs each: Q4_K_M decode +2.5% and
 * +4.5% (15 of 16 faster; 2304 bytes: +1.5%, 5 of 8), Q4_0 +12% (8 of 8). Q8_0_X8's lean
 * loop ran 7% slower with it there (0 of 8), and x0.93 in the kernel alone (bench/README,
 * "Zen 5: the decode prefetch in the vpdpbusd kernels"), so it prefetches only where
 * kern_stream_prefetch is set (Intel by default): on a Xeon (Emerald Rapids) running the
 * AVX-VNNI kernels (HEARTH_CPU=avx2-vnni, as on Intel's client CPUs without AVX-512), one
 * kern_matmul of one token streamed Q8_0_X8 at 69-75% of a plain read without it and
 * 87-92% with it (3456-6912 bytes ahead alike), and Q8_0 decode ran 25% faster (per pair
 * median, 8 of 8 pairs; bench/README). */
#define STREAM_AHEAD_VNNI 4608
/* The same for each group of the wide AVX-512 kernels (16-64 rows a call, 2-8 streams
 * side by side), much nearer: a 64-row call has 8 streams, so 512 bytes each is 4 KiB
 * ahead in all. Intel's L2 streamer stops at every 4 KiB page and, with the kernels busy
 * between loads, kept too few lines in flight: on a Xeon (Emerald Rapids, 2 threads, a
 * 28-33 GB/s bus) one kern_matmul of one token streamed Q4_K_X8 at 73-75% of a plain
 * read, Q8_0_X8 at 88-92%, Q6_K_X8 at 83-85%, Q4_0_X8 at 82-83%; 384-896 bytes ahead,
 * 86-93%, 95-104%, 87-95%, 92-96% (bench_dot_stream; 2304 and more gained less, and L2
 * hints (T1) less still). Decode 128, switched run by run in one process: Q4_K_M +15%
 * (per pair median, 16 of 16 pairs faster), Q8_0 +8% (14 of 14); a batched step of 2,
 * 4 and 8 sequences 11%, 11% and 7% shorter (bench/README). Only where a matmul reads
 * its weights once (kern_stream_prefetch): in prefill, whose calls find the groups in
 * cache, it cost up to 10%. It replaces a prefetch of each next call's rows into L1
 * before the call (up to 200 KiB into a 48 KiB L1), which changed nothing next to it
 * (Q4_K_M, 8 pairs). Intel only for now: AMD decodes wide only on long Q8_0 and Q4_0
 * rows, and that was not measured with it. */
#define STREAM_AHEAD_WIDE 512
/* The prefetch of a loop step of an nt-token call: nothing for 3 or 4 tokens. */
ROWS_INLINE void prefetch_at(int nt, const void *p, size_t ahead, int lines) {
    if (nt > 2) return;
    const char *a = (const char *)p + ahead;
    UNROLL for (int l = 0; l < lines; l++) _mm_prefetch(a + 64 * l, _MM_HINT_T0);
}
ROWS_INLINE void prefetch_ahead(int nt, const void *p, int lines) {
    prefetch_at(nt, p, STREAM_AHEAD, lines);
}
ROWS_INLINE void prefetch_ahead_vnni(int nt, const void *p, int lines) {
    prefetch_at(nt, p, STREAM_AHEAD_VNNI, lines);
}
/* A wide kernel's loop step reads `bytes` of each of its groups: the lines as far ahead,
 * for any token count (a batch's 3-4 tokens stream the weights as one token does) */
#define WIDE_STEP_LINES(bytes) ((int)(((bytes) + 63) / 64))
ROWS_INLINE void prefetch_group_ahead(const void *p, int lines) {
    if (!kern_stream_prefetch) return;
    const char *a = (const char *)p + STREAM_AHEAD_WIDE;
    UNROLL for (int l = 0; l < lines; l++) _mm_prefetch(a + 64 * l, _MM_HINT_T0);
}
/* A kern_gemm8_fn over an inline kernel of 1-4 tokens: the switch makes the token count a
 * constant, so the kernel's loops unroll and its sums stay in registers. The kernel takes
 * the arguments given (those of the kern_gemm8_fn before nt it uses), nt, out and
 * out_stride. */
#define GEMM8_BY_TOKENS(ATTR, NAME, KERNEL, ...)                                                \
    ATTR void NAME(int64_t n, const void *w, const void *vec, size_t stride, const float *ad,  \
                   const int32_t *as, int nt, float *out, size_t out_stride) {                 \
        (void)ad;                                                                             \
        (void)as;                                                                             \
        switch (nt) {                                                                         \
        case 1: KERNEL(__VA_ARGS__, 1, out, out_stride); break;                               \
        case 2: KERNEL(__VA_ARGS__, 2, out, out_stride); break;                               \
        case 3: KERNEL(__VA_ARGS__, 3, out, out_stride); break;                               \
        default: KERNEL(__VA_ARGS__, 4, out, out_stride); break;                              \
        }                                                                                     \
    }
_Static_assert(KERN_GEMM8_TOKS == 4, "GEMM8_BY_TOKENS covers 1-4 tokens");
/* A kern_gemm8_fn of 2 * NG groups over an inline kernel of NG pairs of groups: up to
 * ONE_PASS (1 or 2) tokens in one pass of KERNEL (one stream of weights per group, all in
 * flight together: decode), more as two calls of HALF, NG groups each (KERNEL's sums
 * for more tokens would not fit the registers). KERNEL takes the arguments given, ng,
 * nt, out and out_stride; BLOCK / QK: the layout's block and its columns. */
#define GEMM_BY_HALVES(ATTR, NAME, HALF, BLOCK, QK, NG, ONE_PASS, KERNEL, ...)                \
    ATTR void NAME(int64_t n, const void *w, const void *vec, size_t stride, const float *ad,  \
                   const int32_t *as, int nt, float *out, size_t out_stride) {                 \
        if (nt == 1) {                                                                        \
            KERNEL(__VA_ARGS__, NG, 1, out, out_stride);                                      \
            return;                                                                           \
        }                                                                                     \
        if ((ONE_PASS) >= 2 && nt == 2) {                                                     \
            KERNEL(__VA_ARGS__, NG, 2, out, out_stride);                                      \
            return;                                                                           \
        }                                                                                     \
        const size_t half = (size_t)(NG) * (size_t)(n / (QK)) * sizeof(BLOCK);               \
        HALF(n, w, vec, stride, ad, as, nt, out, out_stride);                                 \
        HALF(n, (const uint8_t *)w + half, vec, stride, ad, as, nt, out + 8 * (NG),          \
             out_stride);                                                                     \
    }

ROWS_INLINE void q4_0_rows(int64_t n, const void *row, const uint8_t *vec, size_t stride, int nt,
                           float *out) {
    const block_q4_0 *x = row;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    /* perf: the nibbles stay unsigned (0..15) and the bias comes off as 8 * (y0 + y1) per
     * int16 pair: maddubs(q, y) - maddubs(8, y) is exactly (q0-8)y0 + (q1-8)y1, the pair
     * sums of dot_i8x32, with two multiplies in place of the three sign ops (Zen 3: 1.25x
     * in cache). The nibbles come from one broadcast load and one per-lane shift. */
    const __m256i nib_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    const __m256i low4 = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)x[i].qs));
        const __m256i q = _mm256_and_si256(_mm256_srlv_epi32(b, nib_shift), low4);
        const float dx = fp16_to_f32(x[i].d);
        UNROLL for (int t = 0; t < nt; t++) {
            const block_q8_0 *y = (const block_q8_0 *)(vec + (size_t)t * stride) + i;
            const __m256i yv = load256(y->qs);
            const __m256i p16 =
                _mm256_sub_epi16(_mm256_maddubs_epi16(q, yv), _mm256_maddubs_epi16(eight, yv));
            const __m256 d = _mm256_set1_ps(dx * fp16_to_f32(y->d));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones)), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < nt; t++) out[t] = hsum_ps(acc[t]);
}

static float dot_q4_0(int64_t n, const void *row, const void *vec) {
    float out;
    q4_0_rows(n, row, vec, 0, 1, &out);
    return out;
}

static void dot4_q4_0(int64_t n, const void *row, const void *vec, size_t stride, float *out) {
    q4_0_rows(n, row, vec, stride, 4, out);
}

/* Q4_0_X8 (8 rows interleaved, types.h): lane r of every vector is row r. A chunk of
 * 32 bytes holds two steps of 4 quants per row (low nibbles: elements 4c..4c+3, high:
 * 16+4c..), so step s (elements 4s..4s+3, s < 8) pairs with the activation's 4 bytes at
 * 4s broadcast to all lanes. The nibbles stay unsigned: one maddubs per step, whose
 * int16 pair sums (at most 2 * 15 * 128) add up over the 8 steps without overflow
 * (8 * 3840 < 32768), then one madd makes the rows' int32 sums and the bias comes off as
 * 8 * sum(y) (as). perf: per block and token 8 maddubs + 7 adds + 5 ops for 8 rows, where
 * the row-at-a-time dot needs ~6 ops per row. */
ROWS_INLINE void q4_0_x8_tokens(int64_t n, const block_q4_0_x8 *x, const uint8_t *vec,
                                size_t stride, const float *ad, const int32_t *as, int nt,
                                float *out, size_t out_stride) {
    const int64_t nb = n / QK4_0;
    const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 acc[KERN_GEMM8_TOKS];
    UNROLL for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(nt, &x[i], 3); /* 144 bytes */
        const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x[i].d));
        __m256i q[8];
        UNROLL for (int c = 0; c < 4; c++) {
            const __m256i v = load256(x[i].qs[c]);
            q[c] = _mm256_and_si256(v, low4);
            q[c + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
        UNROLL for (int t = 0; t < nt; t++) {
            const int8_t *y = ((const block_q8_0 *)(vec + (size_t)t * stride) + i)->qs;
            int32_t y4;
            memcpy(&y4, y, 4);
            __m256i s16 = _mm256_maddubs_epi16(q[0], _mm256_set1_epi32(y4));
            UNROLL for (int st = 1; st < 8; st++) {
                memcpy(&y4, y + 4 * st, 4);
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(q[st], _mm256_set1_epi32(y4)));
            }
            const __m256i sumi = _mm256_sub_epi32(_mm256_madd_epi16(s16, ones),
                                                  _mm256_set1_epi32(as[(int64_t)t * nb + i]));
            const __m256 dd = _mm256_mul_ps(dx, _mm256_set1_ps(ad[(int64_t)t * nb + i]));
            acc[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sumi), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < nt; t++) _mm256_storeu_ps(out + (size_t)t * out_stride, acc[t]);
}

GEMM8_BY_TOKENS(static, gemm8_q4_0_x8, q4_0_x8_tokens, n, w, vec, stride, ad, as)

/* Q8_0_X8 (types.h): signed weights, so each step takes the sign trick (maddubs of |w|
 * and y with w's sign), whose int16 pairs (up to 2 * 127 * 128) cannot add up across
 * steps: one madd per step. */
static inline __m256i q8_0_x8_step(__m256i aw, __m256i w, const int8_t *y4p) {
    int32_t y4;
    memcpy(&y4, y4p, 4);
    const __m256i sy = _mm256_sign_epi8(_mm256_set1_epi32(y4), w);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sy), _mm256_set1_epi16(1));
}

/* nt tokens with their sums in registers: per step the 32 weight bytes and their
 * absolute values are made once for all tokens. */
ROWS_INLINE void q8_0_x8_tokens(int64_t n, const block_q8_0_x8 *x, const uint8_t *vec,
                                size_t stride, const float *ad, int nt, float *out,
                                size_t out_stride) {
    const int64_t nb = n / QK8_0;
    __m256 acc[KERN_GEMM8_TOKS];
    UNROLL for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        prefetch_ahead(nt, &x[i], 5); /* 272 bytes */
        const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x[i].d));
        __m256i sumi[KERN_GEMM8_TOKS];
        UNROLL for (int t = 0; t < nt; t++) sumi[t] = _mm256_setzero_si256();
        UNROLL for (int st = 0; st < 8; st++) {
            const __m256i wv = load256(x[i].qs[st]);
            const __m256i aw = _mm256_sign_epi8(wv, wv);
            UNROLL for (int t = 0; t < nt; t++) {
                const int8_t *y = ((const block_q8_0 *)(vec + (size_t)t * stride) + i)->qs;
                sumi[t] = _mm256_add_epi32(sumi[t], q8_0_x8_step(aw, wv, y + 4 * st));
                KEEP_IN_REG(sumi[t]);
            }
        }
        UNROLL for (int t = 0; t < nt; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(ad[(int64_t)t * nb + i])),
                                     _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    }
    UNROLL for (int t = 0; t < nt; t++) _mm256_storeu_ps(out + (size_t)t * out_stride, acc[t]);
}

GEMM8_BY_TOKENS(static, gemm8_q8_0_x8, q8_0_x8_tokens, n, w, vec, stride, ad)

/* Q4_K_X8 (types.h): the 8 rows' scales and mins of a super-block come out of the
 * transposed scale bytes with a few vector ops (ggml's get_scale_min_k4 for all rows at
 * once) into sc and mn, [sub-block * 8 + row]. */
ROWS_INLINE void q4_K_x8_scales(const block_q4_K_x8 *x, uint8_t sc[64], uint8_t mn[64]) {
    const __m256i m63 = _mm256_set1_epi8(63), m0f = _mm256_set1_epi8(0x0f);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    const __m256i a = load256(x->scales[0]), b = load256(x->scales[4]), c = load256(x->scales[8]);
    _mm256_store_si256((__m256i *)sc, _mm256_and_si256(a, m63));
    _mm256_store_si256((__m256i *)(sc + 32),
                       _mm256_or_si256(_mm256_and_si256(c, m0f),
                                       _mm256_and_si256(_mm256_srli_epi16(a, 2), m30)));
    _mm256_store_si256((__m256i *)mn, _mm256_and_si256(b, m63));
    _mm256_store_si256((__m256i *)(mn + 32),
                       _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m0f),
                                       _mm256_and_si256(_mm256_srli_epi16(b, 2), m30)));
}

/* madd operands: lane r = (v[r], v[r]) for 8 bytes v; lane r = (u[r], v[r]) for two. */
static inline __m256i bytes_x2(const uint8_t *v) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)v);
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(b, b));
}
static inline __m256i bytes_pair(const uint8_t *u, const uint8_t *v) {
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)u),
                                                  _mm_loadl_epi64((const __m128i *)v)));
}

/* The end of a Q4_K_X8 super-block for one token: the rows' mins against the
 * activation's sub-block sums (4 madds), then both float sums. */
ROWS_INLINE void q4_K_x8_finish(const block_q4_K_x8 *x, const block_q8_K *y, const uint8_t mn[64],
                                __m256i sumi, __m256 *acc, __m256 *accm) {
    const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x->d));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x->dmin));
    const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums),
                                      _mm_loadu_si128((const __m128i *)(y->bsums + 8)));
    const __m256i bs8 = _mm256_castsi128_si256(bs);
    __m256i summ = _mm256_setzero_si256();
    UNROLL for (int p = 0; p < 4; p++)
        summ = _mm256_add_epi32(
            summ, _mm256_madd_epi16(bytes_pair(mn + 16 * p, mn + 16 * p + 8),
                                    _mm256_permutevar8x32_epi32(bs8, _mm256_set1_epi32(p))));
    const __m256 yd = _mm256_set1_ps(y->d);
    *acc = _mm256_fmadd_ps(_mm256_mul_ps(dx, yd), _mm256_cvtepi32_ps(sumi), *acc);
    *accm = _mm256_fmadd_ps(_mm256_mul_ps(dmin, yd), _mm256_cvtepi32_ps(summ), *accm);
}

/* nt (1 to 4) tokens of a Q4_K_X8 group with every sum in registers. Per step (4 quants
 * of each row) the 32 bytes are unpacked once for all tokens; a sub-block's 8 maddubs add
 * up in int16 (8 * 2 * 15 * 128 < 32768), one madd applies the rows' scales. The loop
 * over sub-block pairs stays rolled: unrolled, one token ran 20% slower (code size). */
ROWS_INLINE void q4_K_x8_tokens(int64_t n, const block_q4_K_x8 *x, const uint8_t *vec,
                                size_t stride, int nt, float *out, size_t out_stride) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256 acc[KERN_GEMM8_TOKS], accm[KERN_GEMM8_TOKS];
    UNROLL for (int t = 0; t < nt; t++) acc[t] = accm[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const block_q8_K *y[KERN_GEMM8_TOKS];
        UNROLL for (int t = 0; t < nt; t++) y[t] = (const block_q8_K *)(vec + (size_t)t * stride) + i;
        _Alignas(32) uint8_t sc[64], mn[64];
        q4_K_x8_scales(&x[i], sc, mn);
        __m256i sumi[KERN_GEMM8_TOKS];
        UNROLL for (int t = 0; t < nt; t++) sumi[t] = _mm256_setzero_si256();
        _Pragma("GCC unroll 1") for (int j = 0; j < 4; j++) {
            __m256i a_lo[KERN_GEMM8_TOKS], a_hi[KERN_GEMM8_TOKS];
            prefetch_ahead(nt, (const uint8_t *)&x[i] + j * (sizeof x[i] / 4), 5);
            UNROLL for (int st = 0; st < 8; st++) {
                const __m256i v = load256(x[i].qs[j][st]);
                const __m256i lo = _mm256_and_si256(v, low4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                UNROLL for (int t = 0; t < nt; t++) {
                    int32_t yl, yh;
                    memcpy(&yl, y[t]->qs + 64 * j + 4 * st, 4);
                    memcpy(&yh, y[t]->qs + 64 * j + 32 + 4 * st, 4);
                    const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(yl));
                    const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(yh));
                    a_lo[t] = st ? _mm256_add_epi16(a_lo[t], pl) : pl;
                    a_hi[t] = st ? _mm256_add_epi16(a_hi[t], ph) : ph;
                    KEEP_IN_REG(a_lo[t]);
                    KEEP_IN_REG(a_hi[t]);
                }
            }
            const __m256i s0 = bytes_x2(sc + 16 * j), s1 = bytes_x2(sc + 16 * j + 8);
            UNROLL for (int t = 0; t < nt; t++)
                sumi[t] = _mm256_add_epi32(sumi[t],
                                           _mm256_add_epi32(_mm256_madd_epi16(a_lo[t], s0),
                                                            _mm256_madd_epi16(a_hi[t], s1)));
        }
        UNROLL for (int t = 0; t < nt; t++)
            q4_K_x8_finish(&x[i], y[t], mn, sumi[t], &acc[t], &accm[t]);
    }
    UNROLL for (int t = 0; t < nt; t++)
        _mm256_storeu_ps(out + (size_t)t * out_stride, _mm256_sub_ps(acc[t], accm[t]));
}

GEMM8_BY_TOKENS(static, gemm8_q4_K_x8, q4_K_x8_tokens, n, w, vec, stride)

/* The target of every AVX-512 VNNI kernel below (tiles, X8 and X16 kernels). */
#define TARGET_AVX512_VNNI "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"

/* The X8 kernels with vpdpbusd: AVX-VNNI (VEX) and AVX-512 VNNI (EVEX, 256-bit), for
 * kern_avx_vnni_fill and kern_avx512_fill. */
#define X8V_TARGET "avx2,fma,f16c,avxvnni"
#define X8V_DPBUSD _mm256_dpbusd_avx_epi32
#define X8V(name) name##_avxvnni
#include "kern_x8_vnni.inc"
#undef X8V_TARGET
#undef X8V_DPBUSD
#undef X8V
#define X8V_TARGET TARGET_AVX512_VNNI
#define X8V_DPBUSD _mm256_dpbusd_epi32
#define X8V(name) name##_avx512vnni
#define X8V_NO_Q4_K
#include "kern_x8_vnni.inc"
#undef X8V_TARGET
#undef X8V_DPBUSD
#undef X8V
#undef X8V_NO_Q4_K

/* Q6_K_X8 in ymm with AVX-VNNI (AVX-512 has its own, gemm8_q6_K_x8_avx512 below; plain
 * AVX2 keeps Q6_K's file layout: with maddubs and madd in place of vpdpbusd, the X8 kernel
 * streamed Q6_K at 19-24 GB/s in decode against the file layout's 33-38, and prefill
 * gained nothing; bench/README). Per group of 16 elements and token, the sum starts at
 * -32 * bsum (the bias of Q6_K's quants, from the Q8_K activations' group sums), takes 4
 * dots of 4 elements per row, and is multiplied by the rows' scales of the group: per
 * super-block the exact integer sum of the reference (kern_ref.c), then
 * sum += (y.d * d) * isum. */
#define Q6V_TARGET "avx2,fma,f16c,avxvnni"

static inline __attribute__((always_inline, target(Q6V_TARGET))) void
q6_K_x8_tokens_avxvnni(int64_t n, const block_q6_K_x8 *x, const uint8_t *vec, size_t stride,
                       int nt, float *out, size_t out_stride) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    __m256 acc[KERN_GEMM8_TOKS];
    UNROLL for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const block_q8_K *y[KERN_GEMM8_TOKS];
        __m256i sumi[KERN_GEMM8_TOKS];
        UNROLL for (int t = 0; t < nt; t++) {
            y[t] = (const block_q8_K *)(vec + (size_t)t * stride) + i;
            sumi[t] = _mm256_setzero_si256();
        }
        /* g constant per unrolled copy: which nibble, which two bits of qh; half before g,
         * so a super-block is read front to back (from DRAM, out of order ran slower) */
        _Pragma("GCC unroll 1") for (int h = 0; h < 2; h++) {
            UNROLL for (int half = 0; half < 2; half++) {
                const size_t quarter = (size_t)(2 * h + half) * (sizeof x[i] / 4); /* 420 B */
                prefetch_ahead_vnni(nt, (const uint8_t *)&x[i] + quarter, 7);
                UNROLL for (int g = 0; g < 4; g++) {
                    const int grp = 8 * h + 2 * g + half;
                    __m256i s[KERN_GEMM8_TOKS];
                    UNROLL for (int t = 0; t < nt; t++)
                        s[t] = _mm256_set1_epi32(-32 * y[t]->bsums[grp]);
                    UNROLL for (int k = 0; k < 4; k++) {
                        const int st = 4 * half + k;
                        const __m256i l = load256(q6_K_x8_ql(&x[i], 2 * h + g % 2, st));
                        const __m256i hb = load256(q6_K_x8_qh(&x[i], h, st));
                        const __m256i lo = g < 2 ? _mm256_and_si256(l, m4)
                                                 : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
                        const __m256i hi =
                            g == 0   ? _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30)
                            : g == 1 ? _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30)
                            : g == 2 ? _mm256_and_si256(hb, m30)
                                     : _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30);
                        const __m256i q = _mm256_or_si256(lo, hi);
                        UNROLL for (int t = 0; t < nt; t++) {
                            int32_t y4;
                            memcpy(&y4, y[t]->qs + 128 * h + 32 * g + 4 * st, 4);
                            s[t] = _mm256_dpbusd_avx_epi32(s[t], q, _mm256_set1_epi32(y4));
                        }
                    }
                    const __m256i sc =
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)x[i].scales[grp]));
                    UNROLL for (int t = 0; t < nt; t++)
                        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_mullo_epi32(s[t], sc));
                }
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x[i].d));
        UNROLL for (int t = 0; t < nt; t++)
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(y[t]->d), d),
                                                         _mm256_cvtepi32_ps(sumi[t])));
    }
    UNROLL for (int t = 0; t < nt; t++) _mm256_storeu_ps(out + (size_t)t * out_stride, acc[t]);
}

GEMM8_BY_TOKENS(static __attribute__((target(Q6V_TARGET))), gemm8_q6_K_x8_avxvnni,
                q6_K_x8_tokens_avxvnni, n, w, vec, stride)

#undef Q6V_TARGET

/* Two X8 groups (16 rows) per call in zmm, AVX-512 VNNI: lanes 0-7 are the rows of group
 * g, lanes 8-15 those of g + 1 (the group after it, gs bytes on), so each activation
 * broadcast, vpdpbusd, and scale step serves 16 rows where the ymm kernels above serve 8
 * (on Zen 5 a zmm vpdpbusd issues as fast as a ymm one: 2 per cycle). Per row the integer
 * sums and float steps are those of the ymm kernels, lane by lane, so the bits are too. */
#define X16_FN static __attribute__((target(TARGET_AVX512_VNNI)))
#define X16_INLINE static inline __attribute__((always_inline, target(TARGET_AVX512_VNNI)))

X16_INLINE __m512i x16_load(const void *a, size_t gs) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(load256(a)),
                              load256((const uint8_t *)a + gs), 1);
}
/* 8 f16 scales of each group */
X16_INLINE __m512 x16_scales(const void *a, size_t gs) {
    const __m128i lo = _mm_loadu_si128((const __m128i *)a);
    const __m128i hi = _mm_loadu_si128((const __m128i *)((const uint8_t *)a + gs));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

X16_INLINE void q4_0_x16_tokens(int64_t n, const block_q4_0_x8 *x, const uint8_t *vec,
                                size_t stride, const float *ad, const int32_t *as, int nt,
                                float *out, size_t out_stride) {
    const int64_t nb = n / QK4_0;
    const size_t gs = (size_t)nb * sizeof *x;
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512 acc[KERN_GEMM8_TOKS];
    UNROLL for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *y[KERN_GEMM8_TOKS];
        __m512i slo[KERN_GEMM8_TOKS], shi[KERN_GEMM8_TOKS];
        UNROLL for (int t = 0; t < nt; t++) {
            y[t] = ((const block_q8_0 *)(vec + (size_t)t * stride) + i)->qs;
            slo[t] = _mm512_set1_epi32(-as[(int64_t)t * nb + i]);
            shi[t] = _mm512_setzero_si512();
        }
        UNROLL for (int c = 0; c < 4; c++) {
            const __m512i v = x16_load(x[i].qs[c], gs);
            const __m512i lo = _mm512_and_si512(v, low4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            UNROLL for (int t = 0; t < nt; t++) {
                int32_t yl, yh;
                memcpy(&yl, y[t] + 4 * c, 4);
                memcpy(&yh, y[t] + 16 + 4 * c, 4);
                slo[t] = _mm512_dpbusd_epi32(slo[t], lo, _mm512_set1_epi32(yl));
                shi[t] = _mm512_dpbusd_epi32(shi[t], hi, _mm512_set1_epi32(yh));
            }
        }
        const __m512 dx = x16_scales(x[i].d, gs);
        UNROLL for (int t = 0; t < nt; t++) {
            const __m512 dd = _mm512_mul_ps(dx, _mm512_set1_ps(ad[(int64_t)t * nb + i]));
            acc[t] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(_mm512_add_epi32(slo[t], shi[t])),
                                     acc[t]);
        }
    }
    UNROLL for (int t = 0; t < nt; t++) _mm512_storeu_ps(out + (size_t)t * out_stride, acc[t]);
}

GEMM8_BY_TOKENS(X16_FN, gemm16_q4_0_x8_avx512vnni, q4_0_x16_tokens, n, w, vec, stride, ad, as)

/* Four X8 groups (32 rows) per call: each activation broadcast serves two vpdpbusd, so
 * the loads per vpdpbusd fall from 1.5 to under 1 (with two load ports for vectors, the
 * 16-row kernel's broadcasts bound it before its vpdpbusd). The low and high nibbles
 * share one integer sum per row (exact: the order of integer adds does not matter). */
X16_INLINE void q4_0_xg_tokens(int64_t n, const block_q4_0_x8 *x, const uint8_t *vec,
                               size_t stride, const float *ad, const int32_t *as, int ng, int nt,
                               float *out, size_t out_stride) {
    const int64_t nb = n / QK4_0;
    const size_t gs = (size_t)nb * sizeof *x;
    const block_q4_0_x8 *xg[4]; /* ng (2 or 4) pairs of groups: 32 or 64 rows */
    UNROLL for (int g = 0; g < ng; g++)
        xg[g] = (const block_q4_0_x8 *)((const uint8_t *)x + 2 * g * gs);
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512 acc[4][KERN_GEMM8_TOKS];
    UNROLL for (int g = 0; g < ng; g++) UNROLL for (int t = 0; t < nt; t++) acc[g][t] =
        _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *y[KERN_GEMM8_TOKS];
        __m512i s[4][KERN_GEMM8_TOKS];
        UNROLL for (int h = 0; h < 2 * ng; h++)
            prefetch_group_ahead((const uint8_t *)&xg[h / 2][i] + h % 2 * gs,
                                 WIDE_STEP_LINES(sizeof *x));
        UNROLL for (int t = 0; t < nt; t++) {
            y[t] = ((const block_q8_0 *)(vec + (size_t)t * stride) + i)->qs;
            UNROLL for (int g = 0; g < ng; g++) s[g][t] =
                _mm512_set1_epi32(-as[(int64_t)t * nb + i]);
        }
        UNROLL for (int c = 0; c < 4; c++) {
            __m512i v[4], q[4];
            UNROLL for (int g = 0; g < ng; g++) {
                v[g] = x16_load(xg[g][i].qs[c], gs);
                q[g] = _mm512_and_si512(v[g], low4);
            }
            UNROLL for (int t = 0; t < nt; t++) {
                int32_t yl;
                memcpy(&yl, y[t] + 4 * c, 4);
                const __m512i b = _mm512_set1_epi32(yl);
                UNROLL for (int g = 0; g < ng; g++) s[g][t] = _mm512_dpbusd_epi32(s[g][t], q[g], b);
            }
            UNROLL for (int g = 0; g < ng; g++)
                q[g] = _mm512_and_si512(_mm512_srli_epi16(v[g], 4), low4);
            UNROLL for (int t = 0; t < nt; t++) {
                int32_t yh;
                memcpy(&yh, y[t] + 16 + 4 * c, 4);
                const __m512i b = _mm512_set1_epi32(yh);
                UNROLL for (int g = 0; g < ng; g++) s[g][t] = _mm512_dpbusd_epi32(s[g][t], q[g], b);
            }
        }
        UNROLL for (int g = 0; g < ng; g++) {
            const __m512 dx = x16_scales(xg[g][i].d, gs);
            UNROLL for (int t = 0; t < nt; t++) {
                const __m512 a = _mm512_set1_ps(ad[(int64_t)t * nb + i]);
                acc[g][t] = _mm512_fmadd_ps(_mm512_mul_ps(dx, a), _mm512_cvtepi32_ps(s[g][t]),
                                            acc[g][t]);
            }
        }
    }
    UNROLL for (int g = 0; g < ng; g++) UNROLL for (int t = 0; t < nt; t++)
        _mm512_storeu_ps(out + (size_t)t * out_stride + 16 * g, acc[g][t]);
}

GEMM8_BY_TOKENS(X16_FN, gemm32_q4_0_x8_avx512vnni, q4_0_xg_tokens, n, w, vec, stride, ad, as, 2)

GEMM_BY_HALVES(X16_FN, gemm64_q4_0_x8_avx512vnni, gemm32_q4_0_x8_avx512vnni, block_q4_0_x8,
               QK4_0, 4, 1, q4_0_xg_tokens, n, w, vec, stride, ad, as)

/* Q8_0: AVX-512 has no vpsignb; y takes w's sign by a masked negation (where w is 0, |w|
 * is too, so what y becomes there does not count), the same bytes as the sign trick.
 * ng (1, 2 or 4) pairs of groups: 16, 32 or 64 rows, each pair as x16_load reads it. */
X16_INLINE void q8_0_xg_tokens(int64_t n, const block_q8_0_x8 *x, const uint8_t *vec,
                               size_t stride, const float *ad, int ng, int nt, float *out,
                               size_t out_stride) {
    const int64_t nb = n / QK8_0;
    const size_t gs = (size_t)nb * sizeof *x;
    const __m512i zero = _mm512_setzero_si512();
    const block_q8_0_x8 *xg[4];
    UNROLL for (int g = 0; g < ng; g++)
        xg[g] = (const block_q8_0_x8 *)((const uint8_t *)x + 2 * g * gs);
    __m512 acc[4][KERN_GEMM8_TOKS];
    UNROLL for (int g = 0; g < ng; g++) UNROLL for (int t = 0; t < nt; t++) acc[g][t] =
        _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *y[KERN_GEMM8_TOKS];
        __m512i s[4][2][KERN_GEMM8_TOKS];
        UNROLL for (int h = 0; h < 2 * ng; h++)
            prefetch_group_ahead((const uint8_t *)&xg[h / 2][i] + h % 2 * gs,
                                 WIDE_STEP_LINES(sizeof *x));
        UNROLL for (int t = 0; t < nt; t++) {
            y[t] = ((const block_q8_0 *)(vec + (size_t)t * stride) + i)->qs;
            UNROLL for (int g = 0; g < ng; g++) s[g][0][t] = s[g][1][t] = zero;
        }
        UNROLL for (int st = 0; st < 8; st++) {
            UNROLL for (int g = 0; g < ng; g++) {
                const __m512i wv = x16_load(xg[g][i].qs[st], gs);
                const __m512i aw = _mm512_abs_epi8(wv);
                const __mmask64 neg = _mm512_movepi8_mask(wv);
                UNROLL for (int t = 0; t < nt; t++) {
                    int32_t y4;
                    memcpy(&y4, y[t] + 4 * st, 4);
                    const __m512i yv = _mm512_set1_epi32(y4);
                    const __m512i sy = _mm512_mask_sub_epi8(yv, neg, zero, yv);
                    s[g][st & 1][t] = _mm512_dpbusd_epi32(s[g][st & 1][t], aw, sy);
                }
            }
        }
        UNROLL for (int g = 0; g < ng; g++) {
            const __m512 dx = x16_scales(xg[g][i].d, gs);
            UNROLL for (int t = 0; t < nt; t++)
                acc[g][t] = _mm512_fmadd_ps(
                    _mm512_mul_ps(dx, _mm512_set1_ps(ad[(int64_t)t * nb + i])),
                    _mm512_cvtepi32_ps(_mm512_add_epi32(s[g][0][t], s[g][1][t])), acc[g][t]);
        }
    }
    UNROLL for (int g = 0; g < ng; g++) UNROLL for (int t = 0; t < nt; t++)
        _mm512_storeu_ps(out + (size_t)t * out_stride + 16 * g, acc[g][t]);
}

GEMM8_BY_TOKENS(X16_FN, gemm16_q8_0_x8_avx512vnni, q8_0_xg_tokens, n, w, vec, stride, ad, 1)
GEMM8_BY_TOKENS(X16_FN, gemm32_q8_0_x8_avx512vnni, q8_0_xg_tokens, n, w, vec, stride, ad, 2)

GEMM_BY_HALVES(X16_FN, gemm64_q8_0_x8_avx512vnni, gemm32_q8_0_x8_avx512vnni, block_q8_0_x8,
               QK8_0, 4, 1, q8_0_xg_tokens, n, w, vec, stride, ad)

/* Q4_K: the sub-block sums of 16 rows in zmm; each group's super-block ends as in the
 * ymm kernel (q4_K_x8_finish, its mins). ng (1, 2 or 4) pairs of groups: 16, 32 or 64
 * rows. */
X16_INLINE void q4_K_xg_tokens(int64_t n, const block_q4_K_x8 *x, const uint8_t *vec,
                               size_t stride, int ng, int nt, float *out, size_t out_stride) {
    const size_t gs = (size_t)(n / QK_K) * sizeof *x;
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m256 acc[8][KERN_GEMM8_TOKS], accm[8][KERN_GEMM8_TOKS];
    UNROLL for (int h = 0; h < 2 * ng; h++) UNROLL for (int t = 0; t < nt; t++) acc[h][t] =
        accm[h][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const block_q4_K_x8 *xh[8]; /* the groups: h = 2 * pair + half */
        UNROLL for (int h = 0; h < 2 * ng; h++)
            xh[h] = (const block_q4_K_x8 *)((const uint8_t *)&x[i] + h * gs);
        const block_q8_K *y[KERN_GEMM8_TOKS];
        UNROLL for (int t = 0; t < nt; t++)
            y[t] = (const block_q8_K *)(vec + (size_t)t * stride) + i;
        _Alignas(32) uint8_t sc[8][64], mn[8][64];
        UNROLL for (int h = 0; h < 2 * ng; h++) q4_K_x8_scales(xh[h], sc[h], mn[h]);
        __m512i sumi[4][KERN_GEMM8_TOKS];
        UNROLL for (int g = 0; g < ng; g++) UNROLL for (int t = 0; t < nt; t++) sumi[g][t] =
            _mm512_setzero_si512();
        _Pragma("GCC unroll 1") for (int j = 0; j < 4; j++) {
            __m512i a_lo[4][KERN_GEMM8_TOKS], a_hi[4][KERN_GEMM8_TOKS];
            UNROLL for (int h = 0; h < 2 * ng; h++)
                prefetch_group_ahead((const uint8_t *)xh[h] + j * (sizeof *x / 4),
                                     WIDE_STEP_LINES(sizeof *x / 4));
            UNROLL for (int g = 0; g < ng; g++) UNROLL for (int t = 0; t < nt; t++) a_lo[g][t] =
                a_hi[g][t] = _mm512_setzero_si512();
            UNROLL for (int st = 0; st < 8; st++) {
                UNROLL for (int g = 0; g < ng; g++) {
                    const __m512i v = x16_load(xh[2 * g]->qs[j][st], gs);
                    const __m512i lo = _mm512_and_si512(v, low4);
                    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
                    UNROLL for (int t = 0; t < nt; t++) {
                        int32_t yl, yh;
                        memcpy(&yl, y[t]->qs + 64 * j + 4 * st, 4);
                        memcpy(&yh, y[t]->qs + 64 * j + 32 + 4 * st, 4);
                        a_lo[g][t] = _mm512_dpbusd_epi32(a_lo[g][t], lo, _mm512_set1_epi32(yl));
                        a_hi[g][t] = _mm512_dpbusd_epi32(a_hi[g][t], hi, _mm512_set1_epi32(yh));
                    }
                }
            }
            UNROLL for (int g = 0; g < ng; g++) {
                const uint8_t *s0 = sc[2 * g], *s1 = sc[2 * g + 1];
                const __m512i c0 = _mm512_cvtepu8_epi32(
                    _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(s0 + 16 * j)),
                                       _mm_loadl_epi64((const __m128i *)(s1 + 16 * j))));
                const __m512i c1 = _mm512_cvtepu8_epi32(
                    _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(s0 + 16 * j + 8)),
                                       _mm_loadl_epi64((const __m128i *)(s1 + 16 * j + 8))));
                UNROLL for (int t = 0; t < nt; t++)
                    sumi[g][t] = _mm512_add_epi32(
                        sumi[g][t], _mm512_add_epi32(_mm512_mullo_epi32(a_lo[g][t], c0),
                                                     _mm512_mullo_epi32(a_hi[g][t], c1)));
            }
        }
        UNROLL for (int g = 0; g < ng; g++) UNROLL for (int t = 0; t < nt; t++) {
            q4_K_x8_finish(xh[2 * g], y[t], mn[2 * g], _mm512_castsi512_si256(sumi[g][t]),
                           &acc[2 * g][t], &accm[2 * g][t]);
            q4_K_x8_finish(xh[2 * g + 1], y[t], mn[2 * g + 1],
                           _mm512_extracti64x4_epi64(sumi[g][t], 1), &acc[2 * g + 1][t],
                           &accm[2 * g + 1][t]);
        }
    }
    UNROLL for (int h = 0; h < 2 * ng; h++) UNROLL for (int t = 0; t < nt; t++)
        _mm256_storeu_ps(out + (size_t)t * out_stride + 8 * h,
                         _mm256_sub_ps(acc[h][t], accm[h][t]));
}

GEMM8_BY_TOKENS(X16_FN, gemm16_q4_K_x8_avx512vnni, q4_K_xg_tokens, n, w, vec, stride, 1)

/* 32 rows (one pass for 1-2 tokens) and 64 rows (one pass for one token). */
GEMM_BY_HALVES(X16_FN, gemm32_q4_K_x8_avx512vnni, gemm16_q4_K_x8_avx512vnni, block_q4_K_x8,
               QK_K, 2, 2, q4_K_xg_tokens, n, w, vec, stride)

GEMM_BY_HALVES(X16_FN, gemm64_q4_K_x8_avx512vnni, gemm32_q4_K_x8_avx512vnni, block_q4_K_x8,
               QK_K, 4, 1, q4_K_xg_tokens, n, w, vec, stride)

/* The step-pair kernels below: the activation's 4 bytes of step st in lanes 0-7, those of
 * st + 1 in lanes 8-15 (y: their 8 bytes), and a row's sum as the sum of its two lanes. */
X16_INLINE __m512i x8_step_pair_bcast(const int8_t *y) {
    const __m512i pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_epi32(
        pair, _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)y)));
}
X16_INLINE __m256i x8_step_pair_sum(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* Q4_K_X8 for one group of 8 rows in zmm, for decode: lanes 0-7 take step st, lanes 8-15
 * step st + 1 (64 contiguous bytes), as gemm8_q6_K_x8_avx512; the halves' integer sums
 * add up to the ymm kernel's, so the bits are its bits. perf (Zen 5): in cache 1.3-1.5x
 * the ymm kernel at 1-4 tokens; a Q4_K_M decode step, alternated in one process, ~2%
 * faster (7 rounds, 0.99-1.05); with the loop over j unrolled, 5-8% slower (code size). */
X16_INLINE void q4_K_x8_step_pairs(int64_t n, const block_q4_K_x8 *x, const uint8_t *vec,
                                   size_t stride, int nt, float *out, size_t out_stride) {
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m256 acc[KERN_GEMM8_TOKS], accm[KERN_GEMM8_TOKS];
    UNROLL for (int t = 0; t < nt; t++) acc[t] = accm[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const block_q8_K *y[KERN_GEMM8_TOKS];
        UNROLL for (int t = 0; t < nt; t++)
            y[t] = (const block_q8_K *)(vec + (size_t)t * stride) + i;
        _Alignas(32) uint8_t sc[64], mn[64];
        q4_K_x8_scales(&x[i], sc, mn);
        __m512i sumi[KERN_GEMM8_TOKS];
        UNROLL for (int t = 0; t < nt; t++) sumi[t] = _mm512_setzero_si512();
        _Pragma("GCC unroll 1") for (int j = 0; j < 4; j++) {
            __m512i a_lo[KERN_GEMM8_TOKS], a_hi[KERN_GEMM8_TOKS];
            prefetch_ahead_vnni(nt, (const uint8_t *)&x[i] + j * (sizeof x[i] / 4), 5);
            UNROLL for (int t = 0; t < nt; t++) a_lo[t] = a_hi[t] = _mm512_setzero_si512();
            UNROLL for (int p = 0; p < 4; p++) {
                const __m512i v = _mm512_loadu_si512(x[i].qs[j][2 * p]);
                const __m512i lo = _mm512_and_si512(v, low4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
                UNROLL for (int t = 0; t < nt; t++) {
                    const int8_t *yq = y[t]->qs + 64 * j + 8 * p;
                    a_lo[t] = _mm512_dpbusd_epi32(a_lo[t], lo, x8_step_pair_bcast(yq));
                    a_hi[t] = _mm512_dpbusd_epi32(a_hi[t], hi, x8_step_pair_bcast(yq + 32));
                }
            }
            const __m128i s0 = _mm_loadl_epi64((const __m128i *)(sc + 16 * j));
            const __m128i s1 = _mm_loadl_epi64((const __m128i *)(sc + 16 * j + 8));
            const __m512i sc0 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(s0, s0));
            const __m512i sc1 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(s1, s1));
            UNROLL for (int t = 0; t < nt; t++)
                sumi[t] = _mm512_add_epi32(sumi[t],
                                           _mm512_add_epi32(_mm512_mullo_epi32(a_lo[t], sc0),
                                                            _mm512_mullo_epi32(a_hi[t], sc1)));
        }
        UNROLL for (int t = 0; t < nt; t++)
            q4_K_x8_finish(&x[i], y[t], mn, x8_step_pair_sum(sumi[t]), &acc[t], &accm[t]);
    }
    UNROLL for (int t = 0; t < nt; t++)
        _mm256_storeu_ps(out + (size_t)t * out_stride, _mm256_sub_ps(acc[t], accm[t]));
}

GEMM8_BY_TOKENS(X16_FN, gemm8_q4_K_x8_avx512, q4_K_x8_step_pairs, n, w, vec, stride)

/* Q6_K: per step st the 32 bytes of ql (two nibble planes) and qh of 16 rows make the
 * quants of four groups at once; q = low nibble | two bits of qh at bits 4-5, one
 * vpternlogd (bits 4-5 from the shifted qh, the rest from the masked nibble). Each group's
 * sum starts at -32 * bsum and is multiplied by its 16 rows' scales, as in the ymm kernel. */
X16_INLINE __m512i q6_K_x16_quant(__m512i lo, __m512i hs, __m512i m30) {
    return _mm512_ternarylogic_epi32(m30, hs, lo, 0xca); /* m30 ? hs : lo */
}
/* The quants of groups g = 0..3 out of the bytes of ql planes 2h, 2h + 1 and qh plane h */
X16_INLINE void q6_K_x16_quants(__m512i l0, __m512i l1, __m512i hb, __m512i q[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    q[0] = q6_K_x16_quant(_mm512_and_si512(l0, m4), _mm512_slli_epi16(hb, 4), m30);
    q[1] = q6_K_x16_quant(_mm512_and_si512(l1, m4), _mm512_slli_epi16(hb, 2), m30);
    q[2] = q6_K_x16_quant(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), hb, m30);
    q[3] = q6_K_x16_quant(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),
                          _mm512_srli_epi16(hb, 2), m30);
}
/* Each group's bias, -32 * bsum, in `parts` equal parts (the lanes that sum one row) */
X16_INLINE void q6_K_x16_bias(const block_q8_K *y, int parts, int32_t bias[QK_K / 16]) {
    const __m512i bs = _mm512_cvtepi16_epi32(load256(y->bsums));
    _mm512_store_si512(bias, _mm512_mullo_epi32(bs, _mm512_set1_epi32(-32 / parts)));
}

/* ng (1, 2 or 4) pairs of groups: 16, 32 or 64 rows. */
X16_INLINE void q6_K_xg_tokens(int64_t n, const block_q6_K_x8 *x, const uint8_t *vec,
                               size_t stride, int ng, int nt, float *out, size_t out_stride) {
    const size_t gs = (size_t)(n / QK_K) * sizeof *x;
    __m512 acc[4][KERN_GEMM8_TOKS];
    UNROLL for (int p = 0; p < ng; p++) UNROLL for (int t = 0; t < nt; t++) acc[p][t] =
        _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const block_q6_K_x8 *xh[8]; /* the groups: h = 2 * pair + half */
        UNROLL for (int h = 0; h < 2 * ng; h++)
            xh[h] = (const block_q6_K_x8 *)((const uint8_t *)&x[i] + h * gs);
        const block_q8_K *y[KERN_GEMM8_TOKS];
        _Alignas(64) int32_t bias[KERN_GEMM8_TOKS][QK_K / 16];
        __m512i sumi[4][KERN_GEMM8_TOKS];
        UNROLL for (int t = 0; t < nt; t++) {
            y[t] = (const block_q8_K *)(vec + (size_t)t * stride) + i;
            q6_K_x16_bias(y[t], 1, bias[t]);
            UNROLL for (int p = 0; p < ng; p++) sumi[p][t] = _mm512_setzero_si512();
        }
        _Pragma("GCC unroll 1") for (int hh = 0; hh < 4; hh++) {
            const int h = hh >> 1, half = hh & 1;
            UNROLL for (int q = 0; q < 2 * ng; q++)
                prefetch_group_ahead((const uint8_t *)xh[q] + hh * (sizeof *x / 4),
                                     WIDE_STEP_LINES(sizeof *x / 4));
            __m512i s[4][4][KERN_GEMM8_TOKS];
            UNROLL for (int p = 0; p < ng; p++) UNROLL for (int g = 0; g < 4; g++)
                UNROLL for (int t = 0; t < nt; t++)
                    s[p][g][t] = _mm512_set1_epi32(bias[t][8 * h + 2 * g + half]);
            UNROLL for (int k = 0; k < 4; k++) {
                const int st = 4 * half + k;
                UNROLL for (int p = 0; p < ng; p++) {
                    const block_q6_K_x8 *xp = xh[2 * p];
                    const __m512i l0 = x16_load(q6_K_x8_ql(xp, 2 * h, st), gs);
                    const __m512i l1 = x16_load(q6_K_x8_ql(xp, 2 * h + 1, st), gs);
                    const __m512i hb = x16_load(q6_K_x8_qh(xp, h, st), gs);
                    __m512i q[4];
                    q6_K_x16_quants(l0, l1, hb, q);
                    UNROLL for (int g = 0; g < 4; g++) UNROLL for (int t = 0; t < nt; t++) {
                        int32_t y4;
                        memcpy(&y4, y[t]->qs + 128 * h + 32 * g + 4 * st, 4);
                        s[p][g][t] =
                            _mm512_dpbusd_epi32(s[p][g][t], q[g], _mm512_set1_epi32(y4));
                    }
                }
            }
            UNROLL for (int p = 0; p < ng; p++) UNROLL for (int g = 0; g < 4; g++) {
                const int grp = 8 * h + 2 * g + half;
                const __m512i sc = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(
                    _mm_loadl_epi64((const __m128i *)xh[2 * p]->scales[grp]),
                    _mm_loadl_epi64((const __m128i *)xh[2 * p + 1]->scales[grp])));
                UNROLL for (int t = 0; t < nt; t++)
                    sumi[p][t] = _mm512_add_epi32(sumi[p][t], _mm512_mullo_epi32(s[p][g][t], sc));
            }
        }
        UNROLL for (int p = 0; p < ng; p++) {
            const __m512 d = x16_scales(xh[2 * p]->d, gs);
            UNROLL for (int t = 0; t < nt; t++)
                acc[p][t] = _mm512_add_ps(
                    acc[p][t], _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(y[t]->d), d),
                                             _mm512_cvtepi32_ps(sumi[p][t])));
        }
    }
    UNROLL for (int p = 0; p < ng; p++) UNROLL for (int t = 0; t < nt; t++)
        _mm512_storeu_ps(out + (size_t)t * out_stride + 16 * p, acc[p][t]);
}

/* Q6_K_X8 for one group of 8 rows in zmm, for decode: lanes 0-7 take step st, lanes 8-15
 * step st + 1 (a plane's 64 contiguous bytes of both steps), so the weights stream from
 * one place as in the ymm kernel (the 16-row kernel reads two groups gs apart: from DRAM,
 * slower on Zen 5; on Intel decode takes the 64-row kernel, kernels.c) with half its
 * instructions. The two halves are the same rows and group, so
 * each starts at half the bias and takes the same scales; their sum at the end of the
 * super-block is the ymm kernel's exact integer sum, so the bits are its bits. */
X16_INLINE void q6_K_x8_step_pairs(int64_t n, const block_q6_K_x8 *x, const uint8_t *vec,
                                   size_t stride, int nt, float *out, size_t out_stride) {
    __m256 acc[KERN_GEMM8_TOKS];
    UNROLL for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const block_q8_K *y[KERN_GEMM8_TOKS];
        _Alignas(64) int32_t bias[KERN_GEMM8_TOKS][QK_K / 16];
        __m512i sumi[KERN_GEMM8_TOKS];
        UNROLL for (int t = 0; t < nt; t++) {
            y[t] = (const block_q8_K *)(vec + (size_t)t * stride) + i;
            q6_K_x16_bias(y[t], 2, bias[t]);
            sumi[t] = _mm512_setzero_si512();
        }
        UNROLL for (int hh = 0; hh < 4; hh++) {
            const int h = hh >> 1, half = hh & 1;
            prefetch_ahead_vnni(nt, (const uint8_t *)&x[i] + hh * (sizeof x[i] / 4), 7);
            __m512i s[4][KERN_GEMM8_TOKS];
            UNROLL for (int g = 0; g < 4; g++) UNROLL for (int t = 0; t < nt; t++)
                s[g][t] = _mm512_set1_epi32(bias[t][8 * h + 2 * g + half]);
            UNROLL for (int p = 0; p < 2; p++) {
                const int st = 4 * half + 2 * p;
                const __m512i l0 = _mm512_loadu_si512(q6_K_x8_ql(&x[i], 2 * h, st));
                const __m512i l1 = _mm512_loadu_si512(q6_K_x8_ql(&x[i], 2 * h + 1, st));
                const __m512i hb = _mm512_loadu_si512(q6_K_x8_qh(&x[i], h, st));
                __m512i q[4];
                q6_K_x16_quants(l0, l1, hb, q);
                UNROLL for (int g = 0; g < 4; g++) UNROLL for (int t = 0; t < nt; t++)
                    s[g][t] = _mm512_dpbusd_epi32(
                        s[g][t], q[g], x8_step_pair_bcast(y[t]->qs + 128 * h + 32 * g + 4 * st));
            }
            UNROLL for (int g = 0; g < 4; g++) {
                const __m128i sc8 =
                    _mm_loadl_epi64((const __m128i *)x[i].scales[8 * h + 2 * g + half]);
                const __m512i sc = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(sc8, sc8));
                UNROLL for (int t = 0; t < nt; t++)
                    sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(s[g][t], sc));
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x[i].d));
        UNROLL for (int t = 0; t < nt; t++) {
            const __m256i isum = x8_step_pair_sum(sumi[t]);
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(y[t]->d), d),
                                                         _mm256_cvtepi32_ps(isum)));
        }
    }
    UNROLL for (int t = 0; t < nt; t++) _mm256_storeu_ps(out + (size_t)t * out_stride, acc[t]);
}

GEMM8_BY_TOKENS(X16_FN, gemm8_q6_K_x8_avx512, q6_K_x8_step_pairs, n, w, vec, stride)

GEMM8_BY_TOKENS(X16_FN, gemm16_q6_K_x8_avx512vnni, q6_K_xg_tokens, n, w, vec, stride, 1)

/* 32 and 64 rows, one pass for one token. */
GEMM_BY_HALVES(X16_FN, gemm32_q6_K_x8_avx512vnni, gemm16_q6_K_x8_avx512vnni, block_q6_K_x8,
               QK_K, 2, 1, q6_K_xg_tokens, n, w, vec, stride)

GEMM_BY_HALVES(X16_FN, gemm64_q6_K_x8_avx512vnni, gemm32_q6_K_x8_avx512vnni, block_q6_K_x8,
               QK_K, 4, 1, q6_K_xg_tokens, n, w, vec, stride)

#undef X16_FN
#undef X16_INLINE

/* MXFP4: the nibbles index the doubled E2M1 table with one byte shuffle, then the
 * signed products use the sign trick of dot_i8x32; the integer block sum is exact, so
 * per block this is the reference's arithmetic with the float sums in 8 lanes. */
ROWS_INLINE void mxfp4_rows(int64_t n, const void *row, const uint8_t *vec, size_t stride, int nt,
                            float *out) {
    const block_mxfp4 *x = row;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    const __m256i table =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)hl_kvalues_mxfp4));
    for (int64_t i = 0; i < n / QK_MXFP4; i++) {
        const __m256i q = _mm256_shuffle_epi8(table, unpack_nibbles(x[i].qs));
        const float dx = hl_e8m0_to_fp32_half(x[i].e);
        UNROLL for (int t = 0; t < nt; t++) {
            const block_q8_0 *y = (const block_q8_0 *)(vec + (size_t)t * stride) + i;
            const __m256 d = _mm256_set1_ps(dx * fp16_to_f32(y->d));
            acc[t] = _mm256_fmadd_ps(d, dot_i8x32(q, load256(y->qs)), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < nt; t++) out[t] = hsum_ps(acc[t]);
}

static float dot_mxfp4(int64_t n, const void *row, const void *vec) {
    float out;
    mxfp4_rows(n, row, vec, 0, 1, &out);
    return out;
}

static void dot4_mxfp4(int64_t n, const void *row, const void *vec, size_t stride, float *out) {
    mxfp4_rows(n, row, vec, stride, 4, out);
}

/* 32 bits -> 32 bytes, byte k = 0xff if bit k is set (Q5 high bits) */
static inline __m256i bits_to_bytes(const uint8_t qh[4]) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)bits), _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                                         0x0202020202020202, 0x0303030303030303));
    /* every bit but bit k%8 forced on: all ones iff bit k%8 was set */
    const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1));
}

/* The 32 quants of a 16-byte nibble block as bytes 0..15 (low nibbles, elements 0..15,
 * then high nibbles, 16..31), from one broadcast load and a per-lane shift. */
static inline __m256i nibbles_bcast(const uint8_t *qs) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi32(b, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                            _mm256_set1_epi8(0x0f));
}

/* Q4_1/Q5_1 (against Q8_1, whose s = d * sum(y)): unsigned quants need no sign trick; the
 * min term is m * s, summed per block in a float beside the vector sum. Q5_0: quants
 * 0..31 with a bias of 16, taken off as maddubs(16, y) per int16 pair, exactly the pair
 * sums of the sign trick (see q4_0_rows). The 5th bits: bits_to_bytes. nt tokens share
 * each weight block's unpacking (dot4 = prefill); per token the arithmetic is that of
 * nt = 1, so prefill and decode agree bit for bit. */
#define Q_1_ROWS(NAME, WBLOCK, QUANTS)                                                             \
    ROWS_INLINE void NAME(int64_t n, const void *row, const uint8_t *vec, size_t stride, int nt,   \
                          float *out) {                                                            \
        const WBLOCK *x = row;                                                                     \
        const __m256i ones = _mm256_set1_epi16(1);                                                 \
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),            \
                         _mm256_setzero_ps()};                                                     \
        float summs[4] = {0, 0, 0, 0};                                                             \
        for (int64_t i = 0; i < n / 32; i++) {                                                     \
            const __m256i q = QUANTS(&x[i]);                                                       \
            const float dx = fp16_to_f32(x[i].d), mx = fp16_to_f32(x[i].m);                        \
            UNROLL for (int t = 0; t < nt; t++) {                                                  \
                const block_q8_1 *y = (const block_q8_1 *)(vec + (size_t)t * stride) + i;         \
                const __m256i p =                                                                  \
                    _mm256_madd_epi16(_mm256_maddubs_epi16(q, load256(y->qs)), ones);              \
                const __m256 d = _mm256_set1_ps(dx * fp16_to_f32(y->d));                           \
                acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t]);                        \
                summs[t] += mx * fp16_to_f32(y->s);                                                \
            }                                                                                      \
        }                                                                                          \
        UNROLL for (int t = 0; t < nt; t++) out[t] = hsum_ps(acc[t]) + summs[t];                   \
    }

static inline __m256i q4_1_quants(const block_q4_1 *b) { return nibbles_bcast(b->qs); }
static inline __m256i q5_1_quants(const block_q5_1 *b) {
    return _mm256_or_si256(nibbles_bcast(b->qs),
                           _mm256_and_si256(bits_to_bytes(b->qh), _mm256_set1_epi8(0x10)));
}
Q_1_ROWS(q4_1_rows, block_q4_1, q4_1_quants)
Q_1_ROWS(q5_1_rows, block_q5_1, q5_1_quants)

ROWS_INLINE void q5_0_rows(int64_t n, const void *row, const uint8_t *vec, size_t stride, int nt,
                           float *out) {
    const block_q5_0 *x = row;
    const __m256i ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi8(16);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / QK5_0; i++) {
        const __m256i q = _mm256_or_si256(
            nibbles_bcast(x[i].qs), _mm256_and_si256(bits_to_bytes(x[i].qh), sixteen));
        const float dx = fp16_to_f32(x[i].d);
        UNROLL for (int t = 0; t < nt; t++) {
            const block_q8_0 *y = (const block_q8_0 *)(vec + (size_t)t * stride) + i;
            const __m256i yv = load256(y->qs);
            const __m256i p16 =
                _mm256_sub_epi16(_mm256_maddubs_epi16(q, yv), _mm256_maddubs_epi16(sixteen, yv));
            const __m256 d = _mm256_set1_ps(dx * fp16_to_f32(y->d));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones)), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < nt; t++) out[t] = hsum_ps(acc[t]);
}

#define ROWS_DOTS(TYPE)                                                                            \
    static float dot_##TYPE(int64_t n, const void *row, const void *vec) {                         \
        float out;                                                                                 \
        TYPE##_rows(n, row, vec, 0, 1, &out);                                                      \
        return out;                                                                                \
    }                                                                                              \
    static void dot4_##TYPE(int64_t n, const void *row, const void *vec, size_t stride,            \
                            float *out) {                                                          \
        TYPE##_rows(n, row, vec, stride, 4, out);                                                  \
    }
ROWS_DOTS(q4_1)
ROWS_DOTS(q5_0)
ROWS_DOTS(q5_1)

ROWS_INLINE void q8_0_rows(int64_t n, const void *row, const uint8_t *vec, size_t stride, int nt,
                           float *out) {
    const block_q8_0 *x = row;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const __m256i q = load256(x[i].qs);
        const float dx = fp16_to_f32(x[i].d);
        UNROLL for (int t = 0; t < nt; t++) {
            const block_q8_0 *y = (const block_q8_0 *)(vec + (size_t)t * stride) + i;
            const __m256 d = _mm256_set1_ps(dx * fp16_to_f32(y->d));
            acc[t] = _mm256_fmadd_ps(d, dot_i8x32(q, load256(y->qs)), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < nt; t++) out[t] = hsum_ps(acc[t]);
}

static float dot_q8_0(int64_t n, const void *row, const void *vec) {
    float out;
    q8_0_rows(n, row, vec, 0, 1, &out);
    return out;
}

static void dot4_q8_0(int64_t n, const void *row, const void *vec, size_t stride, float *out) {
    q8_0_rows(n, row, vec, stride, 4, out);
}

/* ---- register-blocked prefill tiles (KERN_TILE_ROWS x KERN_TILE_TOKS) ---------------
 * Per (row, token) pair the arithmetic is exactly that of the dots above (same int32
 * lanes, same float scale product, same fma chain over blocks, same final hsum), so a
 * tile's outputs equal vec_dot bit for bit; what changes is that the 8 accumulators stay
 * in registers and each loaded block serves the whole tile. */

static inline __m256i q8_0_block_quants(const block_q8_0 *b) { return load256(b->qs); }
static inline __m256i q4_0_block_quants(const block_q4_0 *b) {
    return _mm256_sub_epi8(unpack_nibbles(b->qs), _mm256_set1_epi8(8));
}

/* With vscale (the activations' scales already in float, 4 tokens per block side by
 * side) the 8 scale products of a block are one vector multiply, broadcast back from
 * memory; without it each is converted and multiplied alone. The products are the same
 * floats either way (dx * dy), so are the results. perf: in a standalone copy of this
 * tile the scale work was 9-10 of 25 cycles per block; with vscale, 22 cycles. */
#define BLOCK32_TILE(NAME, WBLOCK, QUANTS)                                                         \
    static void NAME(int64_t n, const void *w, size_t w_stride, const void *vec, size_t stride,    \
                     const float *vscale, float *out, size_t out_stride) {                         \
        const WBLOCK *x0 = w;                                                                      \
        const WBLOCK *x1 = (const WBLOCK *)((const uint8_t *)w + w_stride);                        \
        const uint8_t *v = vec;                                                                    \
        const __m256i ones = _mm256_set1_epi16(1);                                                 \
        __m256 acc0[4], acc1[4];                                                                   \
        _Alignas(32) float dd[8]; /* dx[r] * dy[t] at 4r + t */                                    \
        UNROLL for (int t = 0; t < 4; t++) acc0[t] = acc1[t] = _mm256_setzero_ps();               \
        for (int64_t i = 0; i < n / 32; i++) {                                                     \
            const __m256i q0 = QUANTS(&x0[i]), q1 = QUANTS(&x1[i]);                                \
            const __m256i a0 = _mm256_sign_epi8(q0, q0), a1 = _mm256_sign_epi8(q1, q1);            \
            const float d0 = fp16_to_f32(x0[i].d), d1 = fp16_to_f32(x1[i].d);                      \
            if (vscale) {                                                                          \
                const __m128 dy = _mm_loadu_ps(vscale + 4 * i);                                    \
                const __m256 dx = _mm256_set_m128(_mm_set1_ps(d1), _mm_set1_ps(d0));               \
                _mm256_store_ps(dd, _mm256_mul_ps(dx, _mm256_set_m128(dy, dy)));                   \
            } else {                                                                               \
                UNROLL for (int t = 0; t < 4; t++) {                                               \
                    const float dy =                                                               \
                        fp16_to_f32(((const block_q8_0 *)(v + (size_t)t * stride) + i)->d);        \
                    dd[t] = d0 * dy;                                                               \
                    dd[4 + t] = d1 * dy;                                                           \
                }                                                                                  \
            }                                                                                      \
            UNROLL for (int t = 0; t < 4; t++) {                                                   \
                const block_q8_0 *y = (const block_q8_0 *)(v + (size_t)t * stride) + i;            \
                const __m256i yv = load256(y->qs);                                                 \
                const __m256i p0 = _mm256_madd_epi16(                                              \
                    _mm256_maddubs_epi16(a0, _mm256_sign_epi8(yv, q0)), ones);                     \
                const __m256i p1 = _mm256_madd_epi16(                                              \
                    _mm256_maddubs_epi16(a1, _mm256_sign_epi8(yv, q1)), ones);                     \
                acc0[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd[t]), _mm256_cvtepi32_ps(p0),     \
                                          acc0[t]);                                                \
                acc1[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd[4 + t]),                         \
                                          _mm256_cvtepi32_ps(p1), acc1[t]);                        \
            }                                                                                      \
        }                                                                                          \
        UNROLL for (int t = 0; t < 4; t++) {                                                       \
            out[(size_t)t * out_stride] = hsum_ps(acc0[t]);                                        \
            out[(size_t)t * out_stride + 1] = hsum_ps(acc1[t]);                                    \
        }                                                                                          \
    }

BLOCK32_TILE(tile_q8_0, block_q8_0, q8_0_block_quants)
BLOCK32_TILE(tile_q4_0, block_q4_0, q4_0_block_quants)

/* AVX-VNNI variant (run time choice, kern_cpu_has_avx_vnni()): vpdpbusd multiplies
 * unsigned by signed bytes and sums each 4 into an int32 lane without saturating, so
 * with u = y + 128 (y xor 0x80) and the weights signed, lane = sum(x*y) + 128*sum(x).
 * Starting the lane at -128*sum(x) (once per weight block) leaves exactly the int32 lanes
 * of madd(maddubs(|x|, sign(y, x)), 1): results stay bit-identical to the dots above,
 * with one instruction per pair where the AVX2 path needs three. The 8 scale products
 * of a block come from one vector multiply (lane-wise the same float product as the
 * scalar dx * dy) and are broadcast from memory. */
#define VNNI_FN static __attribute__((target("avx2,fma,f16c,avxvnni")))
#define BLOCK32_TILE_VNNI(NAME, WBLOCK, QUANTS)                                                    \
    VNNI_FN void NAME(int64_t n, const void *w, size_t w_stride, const void *vec, size_t stride,   \
                      const float *vscale, float *out, size_t out_stride) {                        \
        (void)vscale;                                                                              \
        const WBLOCK *x0 = w;                                                                      \
        const WBLOCK *x1 = (const WBLOCK *)((const uint8_t *)w + w_stride);                        \
        const block_q8_0 *y[4];                                                                    \
        UNROLL for (int t = 0; t < 4; t++)                                                         \
            y[t] = (const block_q8_0 *)((const uint8_t *)vec + (size_t)t * stride);                \
        const __m256i k80 = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();          \
        __m256 acc0[4], acc1[4];                                                                   \
        _Alignas(32) float dd[8]; /* dx[r] * dy[t] at 4r + t */                                    \
        UNROLL for (int t = 0; t < 4; t++) acc0[t] = acc1[t] = _mm256_setzero_ps();               \
        for (int64_t i = 0; i < n / 32; i++) {                                                     \
            const __m128 dy = _mm_cvtph_ps(_mm_setr_epi16((short)y[0][i].d, (short)y[1][i].d,      \
                                                          (short)y[2][i].d, (short)y[3][i].d, 0,   \
                                                          0, 0, 0));                               \
            const __m128i dxh = _mm_setr_epi16((short)x0[i].d, (short)x0[i].d, (short)x0[i].d,     \
                                               (short)x0[i].d, (short)x1[i].d, (short)x1[i].d,     \
                                               (short)x1[i].d, (short)x1[i].d);                    \
            _mm256_store_ps(dd, _mm256_mul_ps(_mm256_cvtph_ps(dxh), _mm256_set_m128(dy, dy)));     \
            const __m256i q0 = QUANTS(&x0[i]), q1 = QUANTS(&x1[i]);                                \
            const __m256i c0 = _mm256_sub_epi32(zero, _mm256_dpbusd_avx_epi32(zero, k80, q0));     \
            const __m256i c1 = _mm256_sub_epi32(zero, _mm256_dpbusd_avx_epi32(zero, k80, q1));     \
            UNROLL for (int t = 0; t < 4; t++) {                                                   \
                const __m256i u = _mm256_xor_si256(load256(y[t][i].qs), k80);                      \
                const __m256i p0 = _mm256_dpbusd_avx_epi32(c0, u, q0);                             \
                const __m256i p1 = _mm256_dpbusd_avx_epi32(c1, u, q1);                             \
                acc0[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd[t]), _mm256_cvtepi32_ps(p0),     \
                                          acc0[t]);                                                \
                acc1[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd[4 + t]),                         \
                                          _mm256_cvtepi32_ps(p1), acc1[t]);                        \
            }                                                                                      \
        }                                                                                          \
        UNROLL for (int t = 0; t < 4; t++) {                                                       \
            out[(size_t)t * out_stride] = hsum_ps(acc0[t]);                                        \
            out[(size_t)t * out_stride + 1] = hsum_ps(acc1[t]);                                    \
        }                                                                                          \
    }

BLOCK32_TILE_VNNI(tile_q8_0_vnni, block_q8_0, q8_0_block_quants)
BLOCK32_TILE_VNNI(tile_q4_0_vnni, block_q4_0, q4_0_block_quants)

/* ---- K-quants against Q8_K ---------------------------------------------------------- */

/* Scale vectors for madd from 8 int16 scales s[0..7] (one half of a 16-scale K-quant
 * block): out[g] holds s[2g] in its low 128-bit lane and s[2g+1] in its high one, the
 * scales of a 32-byte group's elements 0..15 and 16..31. One broadcast and four in-lane
 * shuffles, in place of eight scalar broadcasts and four inserts. */
static inline __m256i pair_scale(__m256i b, int g) {
    return _mm256_shuffle_epi8(
        b, _mm256_set_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * g + 1))),
                            _mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * g)))));
}
static inline void pair_scales(__m128i s16, __m256i out[4]) {
    const __m256i b = _mm256_broadcastsi128_si256(s16);
    UNROLL for (int g = 0; g < 4; g++) out[g] = pair_scale(b, g);
}

/* The 8 int8 scales of one Q6_K half, as int16 in both lanes (pair_scale's b). */
static inline __m256i q6_K_half_scales(const int8_t *sc) {
    return _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
}

/* Q6_K's quants are 0..63 with a bias of 32: the bias comes off once per super-block as
 * 32 * sum over the 16 sub-blocks of scale * (the activation's 16-element sum), in the
 * lanes of one madd, before the int32 sums become floats. Every Q6_K kernel subtracts
 * this same vector, so they all give the same bits. */
static inline __m256i q6_K_bias(const block_q6_K *x, const block_q8_K *y) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    return _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(y->bsums)), 5);
}

/* The 16 Q3_K scales (6 bits, packed in 12 bytes as hl_q3_K_scale reads them), minus 32,
 * as 16 int8: low nibbles of bytes 0..7 are scales 0..7, their high nibbles 8..15, and
 * byte 8 + j%4 holds the top two bits of scale j at bit 2*(j/4). */
static inline __m128i q3_K_scales(const uint8_t packed[12]) {
    uint32_t a0, a1, a2;
    memcpy(&a0, packed, 4);
    memcpy(&a1, packed + 4, 4);
    memcpy(&a2, packed + 8, 4);
    const uint32_t lo4 = 0x0f0f0f0fu, hi2 = 0x03030303u;
    const __m128i v = _mm_setr_epi32((int)((a0 & lo4) | (a2 & hi2) << 4),
                                     (int)((a1 & lo4) | (a2 >> 2 & hi2) << 4),
                                     (int)((a0 >> 4 & lo4) | (a2 >> 4 & hi2) << 4),
                                     (int)((a1 >> 4 & lo4) | (a2 >> 6 & hi2) << 4));
    return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* Q2_K: 2-bit quants; per 16 elements a 4-bit scale (low nibble) and 4-bit min
 * (high nibble). 32 bytes of qs hold 4 groups of 32 elements at shifts 0,2,4,6;
 * in each group bytes 0..15 belong to one sub-block and 16..31 to the next. */
ROWS_INLINE void q2_K_rows(int64_t n, const void *row, const uint8_t *vec, size_t stride, int nt,
                           float *out) {
    const block_q2_K *x = row;
    const __m256i three = _mm256_set1_epi8(3);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    float acc_min[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i mins =
            _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0f)));
        const float dminx = fp16_to_f32(x[i].dmin), dx = fp16_to_f32(x[i].d);
        UNROLL for (int t = 0; t < nt; t++) {
            const block_q8_K *y = (const block_q8_K *)(vec + (size_t)t * stride) + i;
            const int summ = hsum_epi32(_mm256_madd_epi16(mins, load256(y->bsums)));
            acc_min[t] += y->d * dminx * (float)summ;
        }
        __m256i sumi[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                           _mm256_setzero_si256()};
        const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, _mm_set1_epi8(0x0f)));
        UNROLL for (int half = 0; half < 2; half++) {
            const __m256i q2 = load256(x[i].qs + 32 * half);
            __m256i sc[4];
            pair_scales(half ? _mm256_extracti128_si256(sc16, 1) : _mm256_castsi256_si128(sc16),
                        sc);
            UNROLL for (int s = 0; s < 4; s++) {
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(q2, 2 * s), three);
                UNROLL for (int t = 0; t < nt; t++) {
                    const block_q8_K *y = (const block_q8_K *)(vec + (size_t)t * stride) + i;
                    const __m256i yv = load256(y->qs + 128 * half + 32 * s);
                    sumi[t] = _mm256_add_epi32(
                        sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, yv), sc[s]));
                    KEEP_IN_REG(sumi[t]);
                }
            }
        }
        UNROLL for (int t = 0; t < nt; t++) {
            const block_q8_K *y = (const block_q8_K *)(vec + (size_t)t * stride) + i;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * dx), _mm256_cvtepi32_ps(sumi[t]),
                                     acc[t]);
        }
    }
    UNROLL for (int t = 0; t < nt; t++) out[t] = hsum_ps(acc[t]) - acc_min[t];
}

static float dot_q2_K(int64_t n, const void *row, const void *vec) {
    float out;
    q2_K_rows(n, row, vec, 0, 1, &out);
    return out;
}

/* perf: prefill (4 tokens per weight unpack) */
static void dot4_q2_K(int64_t n, const void *row, const void *vec, size_t stride, float *out) {
    q2_K_rows(n, row, vec, stride, 4, out);
}

/* Q3_K: Q2_K's layout plus a high bit per element in hmask (byte e%32, bit e/32);
 * value = low2 | high<<2, minus 4. The bias is taken off as 4 * sum(y). */
ROWS_INLINE void q3_K_rows(int64_t n, const void *row, const uint8_t *vec, size_t stride, int nt,
                           float *out) {
    const block_q3_K *x = row;
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const __m256i four = _mm256_set1_epi8(4);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / QK_K; i++) {
        /* perf: the 16 scales by 32-bit masks and one vector, not 16 calls */
        const __m128i sc8 = q3_K_scales(x[i].scales);
        /* shifting 16-bit lanes by <8 keeps each byte's own bits in its low bits */
        __m256i hm = load256(x[i].hmask);
        __m256i sumi[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                           _mm256_setzero_si256()};
        UNROLL for (int half = 0; half < 2; half++) {
            const __m256i q2 = load256(x[i].qs + 32 * half);
            __m256i sc[4];
            pair_scales(_mm_cvtepi8_epi16(half ? _mm_unpackhi_epi64(sc8, sc8) : sc8), sc);
            UNROLL for (int s = 0; s < 4; s++, hm = _mm256_srli_epi16(hm, 1)) {
                const __m256i q =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q2, 2 * s), three),
                                    _mm256_slli_epi16(_mm256_and_si256(hm, one), 2));
                UNROLL for (int t = 0; t < nt; t++) {
                    const block_q8_K *y = (const block_q8_K *)(vec + (size_t)t * stride) + i;
                    const __m256i yv = load256(y->qs + 128 * half + 32 * s);
                    const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q, yv),
                                                         _mm256_maddubs_epi16(four, yv));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p16, sc[s]));
                    KEEP_IN_REG(sumi[t]);
                }
            }
        }
        const float dx = fp16_to_f32(x[i].d);
        UNROLL for (int t = 0; t < nt; t++) {
            const block_q8_K *y = (const block_q8_K *)(vec + (size_t)t * stride) + i;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * dx), _mm256_cvtepi32_ps(sumi[t]),
                                     acc[t]);
        }
    }
    UNROLL for (int t = 0; t < nt; t++) out[t] = hsum_ps(acc[t]);
}

static float dot_q3_K(int64_t n, const void *row, const void *vec) {
    float out;
    q3_K_rows(n, row, vec, 0, 1, &out);
    return out;
}

/* perf: prefill (4 tokens per weight unpack) */
static void dot4_q3_K(int64_t n, const void *row, const void *vec, size_t stride, float *out) {
    q3_K_rows(n, row, vec, stride, 4, out);
}

/* The 8 scales and 8 mins of a Q4_K/Q5_K block (6 bits each, packed in 12 bytes, see
 * hl_q4_K_scale_min), unpacked four at a time with 32-bit masks. */
static inline void q4_K_scales_mins(const uint8_t *packed, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t w0, w1, w2;
    memcpy(&w0, packed, 4);
    memcpy(&w1, packed + 4, 4);
    memcpy(&w2, packed + 8, 4);
    const uint32_t s_lo = w0 & 0x3f3f3f3fu, m_lo = w1 & 0x3f3f3f3fu;
    const uint32_t s_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
    const uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
    memcpy(sc, &s_lo, 4);
    memcpy(sc + 4, &s_hi, 4);
    memcpy(mn, &m_lo, 4);
    memcpy(mn + 4, &m_hi, 4);
}

ROWS_INLINE void q4_K_rows(int64_t n, const void *row, const uint8_t *vec, size_t stride, int nt,
                           float *out) {
    const block_q4_K *x = row;
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    float acc_min[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        q4_K_scales_mins(x[i].scales, sc, mn);
        /* d and dmin are adjacent: one load and one conversion for both */
        uint32_t d_dmin;
        _Static_assert(offsetof(block_q4_K, dmin) == 2, "d, dmin adjacent at the start");
        memcpy(&d_dmin, &x[i], sizeof d_dmin);
        const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128((int)d_dmin));
        const float dx = _mm_cvtss_f32(dd), dminx = _mm_cvtss_f32(_mm_movehdup_ps(dd));
        /* each 32 bytes of qs hold sub-block 2j (low nibbles) and 2j+1 (high) */
        __m256i lo[4], hi[4], scv[8];
        UNROLL for (int j = 0; j < 4; j++) {
            const __m256i q4 = load256(x[i].qs + 32 * j);
            lo[j] = _mm256_and_si256(q4, low4);
            hi[j] = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4);
        }
        /* the 8 scales as int16 in both halves; pshufb broadcasts scale k (bytes 2k, 2k+1) */
        uint64_t sc8;
        memcpy(&sc8, sc, 8);
        const __m256i sc16 = _mm256_broadcastsi128_si256(
            _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
        UNROLL for (int k = 0; k < 8; k++)
            scv[k] = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * k)));
        /* mins as 16 int16, each twice: bsums 2j and 2j+1 cover sub-block j; one madd
         * per token then gives sum(mn[j] * bsums of j) exactly, as the scalar loop did */
        uint64_t mn8;
        memcpy(&mn8, mn, 8);
        const __m128i mnb = _mm_cvtsi64_si128((long long)mn8);
        const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mnb, mnb));
        UNROLL for (int t = 0; t < nt; t++) {
            const block_q8_K *y = (const block_q8_K *)(vec + (size_t)t * stride) + i;
            const int summ = hsum_epi32(_mm256_madd_epi16(load256(y->bsums), mins16));
            acc_min[t] += y->d * dminx * (float)summ;
            __m256i sumi = _mm256_setzero_si256();
            UNROLL for (int j = 0; j < 4; j++) {
                const __m256i y0 = load256(y->qs + 64 * j);
                const __m256i y1 = load256(y->qs + 64 * j + 32);
                /* unsigned nibbles: maddubs needs no sign trick (15*127*2 fits int16) */
                const __m256i p0 =
                    _mm256_madd_epi16(_mm256_maddubs_epi16(lo[j], y0), scv[2 * j]);
                const __m256i p1 =
                    _mm256_madd_epi16(_mm256_maddubs_epi16(hi[j], y1), scv[2 * j + 1]);
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
            }
            const __m256 d = _mm256_set1_ps(y->d * dx);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < nt; t++) out[t] = hsum_ps(acc[t]) - acc_min[t];
}

static float dot_q4_K(int64_t n, const void *row, const void *vec) {
    float out;
    q4_K_rows(n, row, vec, 0, 1, &out);
    return out;
}

static void dot4_q4_K(int64_t n, const void *row, const void *vec, size_t stride, float *out) {
    q4_K_rows(n, row, vec, stride, 4, out);
}

/* sums of 8 int32 lanes of four vectors: {sum(a), sum(b), sum(c), sum(d)} (exact) */
static inline __m128i hsum4_epi32(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* 2 rows x 4 tokens of q4_K_rows. The min term is computed for the 4 tokens at once: the
 * integer sums exactly, then (y.d * dmin) * summ and the running sum as 4-lane float ops,
 * which round each lane as the scalar code does. */
static void tile_q4_K(int64_t n, const void *w, size_t w_stride, const void *vec, size_t stride,
                      const float *vscale, float *out, size_t out_stride) {
    (void)vscale; /* Q8_K carries float scales already */
    const block_q4_K *xr[2] = {w, (const block_q4_K *)((const uint8_t *)w + w_stride)};
    const uint8_t *v = vec;
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256 acc[2][4];
    __m128 acc_min[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    UNROLL for (int t = 0; t < 4; t++) acc[0][t] = acc[1][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const block_q8_K *y[4];
        UNROLL for (int t = 0; t < 4; t++) y[t] = (const block_q8_K *)(v + (size_t)t * stride) + i;
        const __m128 yd = _mm_setr_ps(y[0]->d, y[1]->d, y[2]->d, y[3]->d);
        __m256i sc16[2];
        float dx[2];
        UNROLL for (int r = 0; r < 2; r++) {
            const block_q4_K *x = &xr[r][i];
            uint8_t sc[8], mn[8];
            q4_K_scales_mins(x->scales, sc, mn);
            dx[r] = fp16_to_f32(x->d);
            uint64_t sc8, mn8;
            memcpy(&sc8, sc, 8);
            memcpy(&mn8, mn, 8);
            sc16[r] = _mm256_broadcastsi128_si256(
                _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
            const __m128i mnb = _mm_cvtsi64_si128((long long)mn8);
            const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mnb, mnb));
            const __m128i summ = hsum4_epi32(_mm256_madd_epi16(load256(y[0]->bsums), mins16),
                                             _mm256_madd_epi16(load256(y[1]->bsums), mins16),
                                             _mm256_madd_epi16(load256(y[2]->bsums), mins16),
                                             _mm256_madd_epi16(load256(y[3]->bsums), mins16));
            const __m128 dmin = _mm_mul_ps(yd, _mm_set1_ps(fp16_to_f32(x->dmin)));
            acc_min[r] = _mm_add_ps(acc_min[r], _mm_mul_ps(dmin, _mm_cvtepi32_ps(summ)));
        }
        /* perf: one row at a time, so that its 4 sums, unpacked quants and scales fit the
         * 16 ymm registers (both rows at once spilled them on every sub-block); the
         * activations are loaded again for the second row, from L1. */
        UNROLL for (int r = 0; r < 2; r++) {
            __m256i sumi[4];
            UNROLL for (int t = 0; t < 4; t++) sumi[t] = _mm256_setzero_si256();
            UNROLL for (int j = 0; j < 4; j++) {
                const __m256i q4 = load256(xr[r][i].qs + 32 * j);
                const __m256i lo = _mm256_and_si256(q4, low4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4);
                const __m256i s0 =
                    _mm256_shuffle_epi8(sc16[r], _mm256_set1_epi16((short)(0x0100 + 0x0404 * j)));
                const __m256i s1 =
                    _mm256_shuffle_epi8(sc16[r], _mm256_set1_epi16((short)(0x0302 + 0x0404 * j)));
                UNROLL for (int t = 0; t < 4; t++) {
                    const __m256i p0 =
                        _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load256(y[t]->qs + 64 * j)), s0);
                    const __m256i p1 = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(hi, load256(y[t]->qs + 64 * j + 32)), s1);
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p0, p1));
                }
            }
            UNROLL for (int t = 0; t < 4; t++)
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(y[t]->d * dx[r]),
                                            _mm256_cvtepi32_ps(sumi[t]), acc[r][t]);
        }
    }
    float mins[2][4];
    _mm_storeu_ps(mins[0], acc_min[0]);
    _mm_storeu_ps(mins[1], acc_min[1]);
    UNROLL for (int t = 0; t < 4; t++) {
        out[(size_t)t * out_stride] = hsum_ps(acc[0][t]) - mins[0][t];
        out[(size_t)t * out_stride + 1] = hsum_ps(acc[1][t]) - mins[1][t];
    }
}

/* AVX-512 (run time choice, kern_cpu_has_avx512()) version of tile_q4_K: one zmm holds
 * both sub-blocks of a 32-byte run of quants (low nibbles, then high), matching the 64
 * contiguous activation bytes, so each maddubs/madd/add covers 64 elements. Folding the
 * two 256-bit halves of the int32 sums before the float step gives exactly the int32
 * lanes of the AVX2 code (integer sums), so the float arithmetic and the results are
 * identical to tile_q4_K and dot_q4_K. */
#define AVX512_FN static __attribute__((target(TARGET_AVX512_VNNI)))
AVX512_FN void tile_q4_K_avx512(int64_t n, const void *w, size_t w_stride, const void *vec,
                                size_t stride, const float *vscale, float *out,
                                size_t out_stride) {
    (void)vscale; /* Q8_K carries float scales already */
    const block_q4_K *xr[2] = {w, (const block_q4_K *)((const uint8_t *)w + w_stride)};
    const uint8_t *v = vec;
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i nib_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    __m256 acc[2][4];
    __m128 acc_min[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    UNROLL for (int t = 0; t < 4; t++) acc[0][t] = acc[1][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const block_q8_K *y[4];
        UNROLL for (int t = 0; t < 4; t++) y[t] = (const block_q8_K *)(v + (size_t)t * stride) + i;
        const __m128 yd = _mm_setr_ps(y[0]->d, y[1]->d, y[2]->d, y[3]->d);
        __m512i sc16[2];
        float dx[2];
        UNROLL for (int r = 0; r < 2; r++) {
            const block_q4_K *x = &xr[r][i];
            uint8_t sc[8], mn[8];
            q4_K_scales_mins(x->scales, sc, mn);
            dx[r] = fp16_to_f32(x->d);
            uint64_t sc8, mn8;
            memcpy(&sc8, sc, 8);
            memcpy(&mn8, mn, 8);
            sc16[r] = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
            const __m128i mnb = _mm_cvtsi64_si128((long long)mn8);
            const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mnb, mnb));
            const __m128i summ = hsum4_epi32(_mm256_madd_epi16(load256(y[0]->bsums), mins16),
                                             _mm256_madd_epi16(load256(y[1]->bsums), mins16),
                                             _mm256_madd_epi16(load256(y[2]->bsums), mins16),
                                             _mm256_madd_epi16(load256(y[3]->bsums), mins16));
            const __m128 dmin = _mm_mul_ps(yd, _mm_set1_ps(fp16_to_f32(x->dmin)));
            acc_min[r] = _mm_add_ps(acc_min[r], _mm_mul_ps(dmin, _mm_cvtepi32_ps(summ)));
        }
        __m512i sumi[2][4];
        UNROLL for (int t = 0; t < 4; t++) sumi[0][t] = sumi[1][t] = _mm512_setzero_si512();
        UNROLL for (int j = 0; j < 4; j++) {
            /* int16 lanes 0..15 take scale 2j, 16..31 scale 2j+1 */
            const __m512i sidx = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_set1_epi16((short)(2 * j))),
                _mm256_set1_epi16((short)(2 * j + 1)), 1);
            __m512i q[2], s[2];
            UNROLL for (int r = 0; r < 2; r++) {
                const __m512i q4 = _mm512_broadcast_i64x4(load256(xr[r][i].qs + 32 * j));
                q[r] = _mm512_and_si512(_mm512_srlv_epi16(q4, nib_shift), low4);
                s[r] = _mm512_permutexvar_epi16(sidx, sc16[r]);
            }
            UNROLL for (int t = 0; t < 4; t++) {
                const __m512i yv = _mm512_loadu_si512((const void *)(y[t]->qs + 64 * j));
                UNROLL for (int r = 0; r < 2; r++)
                    sumi[r][t] = _mm512_add_epi32(
                        sumi[r][t], _mm512_madd_epi16(_mm512_maddubs_epi16(q[r], yv), s[r]));
            }
        }
        UNROLL for (int t = 0; t < 4; t++) {
            UNROLL for (int r = 0; r < 2; r++) {
                const __m256i si = _mm256_add_epi32(_mm512_castsi512_si256(sumi[r][t]),
                                                    _mm512_extracti64x4_epi64(sumi[r][t], 1));
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(y[t]->d * dx[r]),
                                            _mm256_cvtepi32_ps(si), acc[r][t]);
            }
        }
    }
    float mins[2][4];
    _mm_storeu_ps(mins[0], acc_min[0]);
    _mm_storeu_ps(mins[1], acc_min[1]);
    UNROLL for (int t = 0; t < 4; t++) {
        out[(size_t)t * out_stride] = hsum_ps(acc[0][t]) - mins[0][t];
        out[(size_t)t * out_stride + 1] = hsum_ps(acc[1][t]) - mins[1][t];
    }
}

/* Q5_K: Q4_K plus a 5th bit per element: bit 2j / 2j+1 of qh[l] for sub-blocks 2j / 2j+1. */
ROWS_INLINE void q5_K_rows(int64_t n, const void *row, const uint8_t *vec, size_t stride, int nt,
                           float *out) {
    const block_q5_K *x = row;
    const __m256i low4 = _mm256_set1_epi8(0x0f), bit0 = _mm256_set1_epi8(1);
    const __m256i bit1 = _mm256_set1_epi8(2);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    float acc_min[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        q4_K_scales_mins(x[i].scales, sc, mn);
        uint64_t sc8, mn8;
        memcpy(&sc8, sc, 8);
        memcpy(&mn8, mn, 8);
        /* scales as int16 in both halves (pshufb picks scale k); mins twice each, so one
         * madd with bsums gives sum(mn[j] * (bsums[2j] + bsums[2j+1])) exactly */
        const __m256i sc16 =
            _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
        const __m128i mnb = _mm_cvtsi64_si128((long long)mn8);
        const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mnb, mnb));
        const float dx = fp16_to_f32(x[i].d), dminx = fp16_to_f32(x[i].dmin);
        UNROLL for (int t = 0; t < nt; t++) {
            const block_q8_K *y = (const block_q8_K *)(vec + (size_t)t * stride) + i;
            const int summ = hsum_epi32(_mm256_madd_epi16(load256(y->bsums), mins16));
            acc_min[t] += y->d * dminx * (float)summ;
        }
        __m256i sumi[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                           _mm256_setzero_si256()};
        /* shifting 16-bit lanes by <8 keeps each byte's own bits in its low bits */
        __m256i qh = load256(x[i].qh);
        UNROLL for (int j = 0; j < 4; j++, qh = _mm256_srli_epi16(qh, 2)) {
            const __m256i q4 = load256(x[i].qs + 32 * j);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q4, low4),
                                               _mm256_slli_epi16(_mm256_and_si256(qh, bit0), 4));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), low4),
                                               _mm256_slli_epi16(_mm256_and_si256(qh, bit1), 3));
            const __m256i s0 =
                _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0404 * j)));
            const __m256i s1 =
                _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0302 + 0x0404 * j)));
            UNROLL for (int t = 0; t < nt; t++) {
                const block_q8_K *y = (const block_q8_K *)(vec + (size_t)t * stride) + i;
                const __m256i p0 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(lo, load256(y->qs + 64 * j)), s0);
                const __m256i p1 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(hi, load256(y->qs + 64 * j + 32)), s1);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p0, p1));
                KEEP_IN_REG(sumi[t]);
            }
        }
        UNROLL for (int t = 0; t < nt; t++) {
            const block_q8_K *y = (const block_q8_K *)(vec + (size_t)t * stride) + i;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * dx), _mm256_cvtepi32_ps(sumi[t]),
                                     acc[t]);
        }
    }
    UNROLL for (int t = 0; t < nt; t++) out[t] = hsum_ps(acc[t]) - acc_min[t];
}

static float dot_q5_K(int64_t n, const void *row, const void *vec) {
    float out;
    q5_K_rows(n, row, vec, 0, 1, &out);
    return out;
}

/* perf: prefill (4 tokens per weight unpack; Q5_K has no register tile) */
static void dot4_q5_K(int64_t n, const void *row, const void *vec, size_t stride, float *out) {
    q5_K_rows(n, row, vec, stride, 4, out);
}

/* Q6_K: the unsigned quants against the activation, the bias off at the end of each
 * super-block (q6_K_bias). */
ROWS_INLINE void q6_K_rows(int64_t n, const void *row, const uint8_t *vec, size_t stride, int nt,
                           float *out) {
    const block_q6_K *x = row;
    const __m256i low4 = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m256i sumi[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                           _mm256_setzero_si256()};
        UNROLL for (int half = 0; half < 2; half++) {
            prefetch_ahead(nt, (const uint8_t *)&x[i] + 128 * half, 2); /* 4 lines per 210 B */
            const uint8_t *ql = x[i].ql + 64 * half;
            const __m256i qh = load256(x[i].qh + 32 * half);
            const __m256i ql0 = load256(ql);
            const __m256i ql1 = load256(ql + 32);
            const __m256i sb = q6_K_half_scales(x[i].scales + 8 * half);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4),
                                   _mm256_slli_epi16(_mm256_and_si256(qh, two), 4));
            q[1] = _mm256_or_si256(
                _mm256_and_si256(ql1, low4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two), 4));
            q[2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two), 4));
            q[3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two), 4));
            UNROLL for (int g = 0; g < 4; g++) {
                const __m256i scale = pair_scale(sb, g);
                UNROLL for (int t = 0; t < nt; t++) {
                    const int8_t *q8 =
                        ((const block_q8_K *)(vec + (size_t)t * stride) + i)->qs + 128 * half;
                    const __m256i p16 = _mm256_maddubs_epi16(q[g], load256(q8 + 32 * g));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p16, scale));
                    KEEP_IN_REG(sumi[t]);
                }
            }
        }
        const float dx = fp16_to_f32(x[i].d);
        UNROLL for (int t = 0; t < nt; t++) {
            const block_q8_K *y = (const block_q8_K *)(vec + (size_t)t * stride) + i;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * dx),
                                     _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[t], q6_K_bias(&x[i], y))),
                                     acc[t]);
        }
    }
    UNROLL for (int t = 0; t < nt; t++) out[t] = hsum_ps(acc[t]);
}

static float dot_q6_K(int64_t n, const void *row, const void *vec) {
    float out;
    q6_K_rows(n, row, vec, 0, 1, &out);
    return out;
}

static void dot4_q6_K(int64_t n, const void *row, const void *vec, size_t stride, float *out) {
    q6_K_rows(n, row, vec, stride, 4, out);
}

/* 2 rows x 4 tokens of q6_K_rows. */
static void tile_q6_K(int64_t n, const void *w, size_t w_stride, const void *vec, size_t stride,
                      const float *vscale, float *out, size_t out_stride) {
    (void)vscale; /* Q8_K carries float scales already */
    const block_q6_K *xr[2] = {w, (const block_q6_K *)((const uint8_t *)w + w_stride)};
    const uint8_t *v = vec;
    const __m256i low4 = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3);
    __m256 acc[2][4];
    UNROLL for (int t = 0; t < 4; t++) acc[0][t] = acc[1][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const block_q8_K *y[4];
        UNROLL for (int t = 0; t < 4; t++) y[t] = (const block_q8_K *)(v + (size_t)t * stride) + i;
        __m256i sumi[2][4];
        UNROLL for (int t = 0; t < 4; t++) sumi[0][t] = sumi[1][t] = _mm256_setzero_si256();
        UNROLL for (int half = 0; half < 2; half++) {
            UNROLL for (int g = 0; g < 4; g++) {
                __m256i q[2], scale[2];
                UNROLL for (int r = 0; r < 2; r++) {
                    const block_q6_K *x = &xr[r][i];
                    const __m256i ql = load256(x->ql + 64 * half + 32 * (g & 1));
                    const __m256i qh = load256(x->qh + 32 * half);
                    const __m256i l = g < 2 ? ql : _mm256_srli_epi16(ql, 4);
                    q[r] = _mm256_or_si256(
                        _mm256_and_si256(l, low4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), two), 4));
                    scale[r] = pair_scale(q6_K_half_scales(x->scales + 8 * half), g);
                }
                UNROLL for (int t = 0; t < 4; t++) {
                    const __m256i yv = load256(y[t]->qs + 128 * half + 32 * g);
                    UNROLL for (int r = 0; r < 2; r++) {
                        const __m256i p16 = _mm256_maddubs_epi16(q[r], yv);
                        sumi[r][t] = _mm256_add_epi32(sumi[r][t], _mm256_madd_epi16(p16, scale[r]));
                        KEEP_IN_REG(sumi[r][t]);
                    }
                }
            }
        }
        UNROLL for (int r = 0; r < 2; r++) {
            const float dx = fp16_to_f32(xr[r][i].d);
            UNROLL for (int t = 0; t < 4; t++)
                acc[r][t] = _mm256_fmadd_ps(
                    _mm256_set1_ps(y[t]->d * dx),
                    _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[r][t], q6_K_bias(&xr[r][i], y[t]))),
                    acc[r][t]);
        }
    }
    UNROLL for (int t = 0; t < 4; t++) {
        out[(size_t)t * out_stride] = hsum_ps(acc[0][t]);
        out[(size_t)t * out_stride + 1] = hsum_ps(acc[1][t]);
    }
}

/* AVX-512 version of tile_q6_K: a zmm holds two consecutive 32-element groups (their
 * 64 activation bytes are contiguous); the int32 sums are folded to 256 bits before the
 * float step, so results are identical to tile_q6_K and dot_q6_K. */
AVX512_FN void tile_q6_K_avx512(int64_t n, const void *w, size_t w_stride, const void *vec,
                                size_t stride, const float *vscale, float *out,
                                size_t out_stride) {
    (void)vscale; /* Q8_K carries float scales already */
    const block_q6_K *xr[2] = {w, (const block_q6_K *)((const uint8_t *)w + w_stride)};
    const uint8_t *v = vec;
    const __m512i low4 = _mm512_set1_epi8(0x0f), three = _mm512_set1_epi8(3);
    __m256 acc[2][4];
    UNROLL for (int t = 0; t < 4; t++) acc[0][t] = acc[1][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const block_q8_K *y[4];
        UNROLL for (int t = 0; t < 4; t++) y[t] = (const block_q8_K *)(v + (size_t)t * stride) + i;
        __m512i sumi[2][4];
        UNROLL for (int t = 0; t < 4; t++) sumi[0][t] = sumi[1][t] = _mm512_setzero_si512();
        UNROLL for (int half = 0; half < 2; half++) {
            UNROLL for (int pr = 0; pr < 2; pr++) { /* groups g = 2pr, 2pr+1 */
                /* high bits of group g sit at bit 2g of qh; scale of int16 lane l is
                 * sc[4pr + l/8] */
                const __m512i hshift =
                    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(4 * pr))),
                                       _mm256_set1_epi16((short)(4 * pr + 2)), 1);
                const __m512i sidx = _mm512_set_epi64(
                    0x0003000300030003LL + 0x0004000400040004LL * pr,
                    0x0003000300030003LL + 0x0004000400040004LL * pr,
                    0x0002000200020002LL + 0x0004000400040004LL * pr,
                    0x0002000200020002LL + 0x0004000400040004LL * pr,
                    0x0001000100010001LL + 0x0004000400040004LL * pr,
                    0x0001000100010001LL + 0x0004000400040004LL * pr,
                    0x0000000000000000LL + 0x0004000400040004LL * pr,
                    0x0000000000000000LL + 0x0004000400040004LL * pr);
                __m512i q[2], scale[2];
                UNROLL for (int r = 0; r < 2; r++) {
                    const block_q6_K *x = &xr[r][i];
                    const __m512i ql = _mm512_loadu_si512((const void *)(x->ql + 64 * half));
                    const __m512i qh = _mm512_broadcast_i64x4(load256(x->qh + 32 * half));
                    const __m512i l = pr ? _mm512_srli_epi16(ql, 4) : ql;
                    q[r] = _mm512_or_si512(
                        _mm512_and_si512(l, low4),
                        _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, hshift), three),
                                          4));
                    int64_t sc8;
                    memcpy(&sc8, x->scales + 8 * half, 8);
                    scale[r] = _mm512_permutexvar_epi16(
                        sidx, _mm512_castsi128_si512(_mm_cvtepi8_epi16(_mm_cvtsi64_si128(sc8))));
                }
                UNROLL for (int t = 0; t < 4; t++) {
                    const __m512i yv =
                        _mm512_loadu_si512((const void *)(y[t]->qs + 128 * half + 64 * pr));
                    UNROLL for (int r = 0; r < 2; r++) {
                        const __m512i p16 = _mm512_maddubs_epi16(q[r], yv);
                        sumi[r][t] = _mm512_add_epi32(sumi[r][t], _mm512_madd_epi16(p16, scale[r]));
                    }
                }
            }
        }
        UNROLL for (int r = 0; r < 2; r++) {
            const float dx = fp16_to_f32(xr[r][i].d);
            UNROLL for (int t = 0; t < 4; t++) {
                const __m256i si = _mm256_add_epi32(_mm512_castsi512_si256(sumi[r][t]),
                                                    _mm512_extracti64x4_epi64(sumi[r][t], 1));
                acc[r][t] = _mm256_fmadd_ps(
                    _mm256_set1_ps(y[t]->d * dx),
                    _mm256_cvtepi32_ps(_mm256_sub_epi32(si, q6_K_bias(&xr[r][i], y[t]))),
                    acc[r][t]);
            }
        }
    }
    UNROLL for (int t = 0; t < 4; t++) {
        out[(size_t)t * out_stride] = hsum_ps(acc[0][t]);
        out[(size_t)t * out_stride + 1] = hsum_ps(acc[1][t]);
    }
}

/* AVX-512 version of the 32-element tiles: a zmm holds one weight block twice and the
 * same block of two tokens, so one vpdpbusd/cvt/fma does two (row, token) pairs. Each
 * 256-bit half accumulates its pair exactly as the ymm code does (same int32 lanes,
 * same scale product dx * dy, same fma chain, same final hsum), so results are
 * identical to the AVX2 and AVX-VNNI tiles and dots. */
static inline __m256 zmm_high_ps(__m512 v) __attribute__((target("avx512f")));
static inline __m256 zmm_high_ps(__m512 v) {
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

#define BLOCK32_TILE_AVX512(NAME, WBLOCK, QUANTS)                                                  \
    AVX512_FN void NAME(int64_t n, const void *w, size_t w_stride, const void *vec, size_t stride, \
                        const float *vscale, float *out, size_t out_stride) {                      \
        (void)vscale;                                                                              \
        const WBLOCK *x[2] = {w, (const WBLOCK *)((const uint8_t *)w + w_stride)};                 \
        const block_q8_0 *y[4];                                                                    \
        UNROLL for (int t = 0; t < 4; t++)                                                         \
            y[t] = (const block_q8_0 *)((const uint8_t *)vec + (size_t)t * stride);                \
        const __m512i k80 = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();          \
        /* dy of tokens 2p (lanes 0..7) and 2p+1 (lanes 8..15) */                                  \
        const __m512i pidx[2] = {                                                                  \
            _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi32(1), 1),                   \
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(2)),                       \
                               _mm256_set1_epi32(3), 1)};                                          \
        __m512 acc[2][2];                                                                          \
        UNROLL for (int r = 0; r < 2; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();           \
        for (int64_t i = 0; i < n / 32; i++) {                                                     \
            const __m512 dy = _mm512_castps128_ps512(                                              \
                _mm_cvtph_ps(_mm_setr_epi16((short)y[0][i].d, (short)y[1][i].d,                    \
                                            (short)y[2][i].d, (short)y[3][i].d, 0, 0, 0, 0)));     \
            __m512 dyp[2];                                                                         \
            __m512i u[2];                                                                          \
            UNROLL for (int p = 0; p < 2; p++) {                                                   \
                dyp[p] = _mm512_permutexvar_ps(pidx[p], dy);                                       \
                u[p] = _mm512_xor_si512(                                                           \
                    _mm512_inserti64x4(_mm512_castsi256_si512(load256(y[2 * p][i].qs)),            \
                                       load256(y[2 * p + 1][i].qs), 1),                            \
                    k80);                                                                          \
            }                                                                                      \
            UNROLL for (int r = 0; r < 2; r++) {                                                   \
                const __m512i q = _mm512_broadcast_i64x4(QUANTS(&x[r][i]));                        \
                const __m512i c = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, k80, q));       \
                const __m512 dx = _mm512_set1_ps(fp16_to_f32(x[r][i].d));                          \
                UNROLL for (int p = 0; p < 2; p++)                                                 \
                    acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(dx, dyp[p]),                         \
                                                _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c, u[p], q)), \
                                                acc[r][p]);                                        \
            }                                                                                      \
        }                                                                                          \
        UNROLL for (int p = 0; p < 2; p++) {                                                       \
            UNROLL for (int r = 0; r < 2; r++) {                                                   \
                out[(size_t)(2 * p) * out_stride + r] = hsum_ps(_mm512_castps512_ps256(acc[r][p])); \
                out[(size_t)(2 * p + 1) * out_stride + r] = hsum_ps(zmm_high_ps(acc[r][p]));       \
            }                                                                                      \
        }                                                                                          \
    }

BLOCK32_TILE_AVX512(tile_q8_0_avx512, block_q8_0, q8_0_block_quants)
BLOCK32_TILE_AVX512(tile_q4_0_avx512, block_q4_0, q4_0_block_quants)

/* AVX-512 single-token dots for decode: tile_q4_K_avx512 / tile_q6_K_avx512 for one row and
 * one token. They fold to the same int32 lanes and then do the float steps of
 * dot_q4_K / dot_q6_K, so they return the same bits (tested against the AVX2 dots). */
AVX512_FN float dot_q4_K_avx512(int64_t n, const void *row, const void *vec) {
    const block_q4_K *x = row;
    const block_q8_K *y = vec;
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i nib_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    __m256 acc = _mm256_setzero_ps();
    float acc_min = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        q4_K_scales_mins(x[i].scales, sc, mn);
        uint64_t sc8, mn8;
        memcpy(&sc8, sc, 8);
        memcpy(&mn8, mn, 8);
        const __m128i mnb = _mm_cvtsi64_si128((long long)mn8);
        const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mnb, mnb));
        const int summ = hsum_epi32(_mm256_madd_epi16(load256(y[i].bsums), mins16));
        acc_min += y[i].d * fp16_to_f32(x[i].dmin) * (float)summ;
        const __m512i sc16 =
            _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
        __m512i sumi = _mm512_setzero_si512();
        UNROLL for (int j = 0; j < 4; j++) {
            const __m512i sidx = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_set1_epi16((short)(2 * j))),
                _mm256_set1_epi16((short)(2 * j + 1)), 1);
            const __m512i q4 = _mm512_broadcast_i64x4(load256(x[i].qs + 32 * j));
            const __m512i q = _mm512_and_si512(_mm512_srlv_epi16(q4, nib_shift), low4);
            const __m512i yv = _mm512_loadu_si512((const void *)(y[i].qs + 64 * j));
            sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_maddubs_epi16(q, yv),
                                                            _mm512_permutexvar_epi16(sidx, sc16)));
        }
        const __m256i si =
            _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * fp16_to_f32(x[i].d)), _mm256_cvtepi32_ps(si),
                              acc);
    }
    return hsum_ps(acc) - acc_min;
}

AVX512_FN float dot_q6_K_avx512(int64_t n, const void *row, const void *vec) {
    const block_q6_K *x = row;
    const block_q8_K *y = vec;
    const __m512i low4 = _mm512_set1_epi8(0x0f), three = _mm512_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m512i sumi = _mm512_setzero_si512();
        UNROLL for (int half = 0; half < 2; half++) {
            const __m512i ql = _mm512_loadu_si512((const void *)(x[i].ql + 64 * half));
            const __m512i qh = _mm512_broadcast_i64x4(load256(x[i].qh + 32 * half));
            int64_t sc8;
            memcpy(&sc8, x[i].scales + 8 * half, 8);
            const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepi8_epi16(_mm_cvtsi64_si128(sc8)));
            UNROLL for (int pr = 0; pr < 2; pr++) {
                const __m512i hshift =
                    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(4 * pr))),
                                       _mm256_set1_epi16((short)(4 * pr + 2)), 1);
                const __m512i sidx = _mm512_set_epi64(
                    0x0003000300030003LL + 0x0004000400040004LL * pr,
                    0x0003000300030003LL + 0x0004000400040004LL * pr,
                    0x0002000200020002LL + 0x0004000400040004LL * pr,
                    0x0002000200020002LL + 0x0004000400040004LL * pr,
                    0x0001000100010001LL + 0x0004000400040004LL * pr,
                    0x0001000100010001LL + 0x0004000400040004LL * pr,
                    0x0000000000000000LL + 0x0004000400040004LL * pr,
                    0x0000000000000000LL + 0x0004000400040004LL * pr);
                const __m512i l = pr ? _mm512_srli_epi16(ql, 4) : ql;
                const __m512i q = _mm512_or_si512(
                    _mm512_and_si512(l, low4),
                    _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, hshift), three), 4));
                const __m512i yv =
                    _mm512_loadu_si512((const void *)(y[i].qs + 128 * half + 64 * pr));
                const __m512i p16 = _mm512_maddubs_epi16(q, yv);
                sumi = _mm512_add_epi32(
                    sumi, _mm512_madd_epi16(p16, _mm512_permutexvar_epi16(sidx, sc16)));
            }
        }
        const __m256i si =
            _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * fp16_to_f32(x[i].d)),
                              _mm256_cvtepi32_ps(_mm256_sub_epi32(si, q6_K_bias(&x[i], &y[i]))),
                              acc);
    }
    return hsum_ps(acc);
}

/* AVX-512 single-token Q4_0 dot: the integer part of two blocks in one zmm (block i in
 * the low 256 bits, i+1 in the high), then block i's and block i+1's float steps one
 * after the other, exactly as dot_q4_0 does them, so it returns dot_q4_0's bits. The
 * int32 lanes are the same integers: with u the unsigned nibble, maddubs(u, y) -
 * maddubs(8, y) is (u - 8) * y summed in pairs (no int16 saturation: |sums| <= 3810),
 * as the sign trick computes it. Q4_0 decode is bound by vector uops, not memory:
 * this does a block's integer work in about half of them. */
AVX512_FN float dot_q4_0_avx512(int64_t n, const void *row, const void *vec) {
    const block_q4_0 *x = row;
    const block_q8_0 *y = vec;
    const int64_t nb = n / QK4_0;
    const __m512i low4 = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
    const __m512i ones = _mm512_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m256i qs = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)x[i].qs)),
            _mm_loadu_si128((const __m128i *)x[i + 1].qs), 1);
        /* 128-bit lanes [qs_i, qs_i+1, qs_i>>4, qs_i+1>>4] -> [lo_i, hi_i, lo_i+1, hi_i+1] */
        const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(qs),
                                                _mm256_srli_epi16(qs, 4), 1);
        const __m512i u =
            _mm512_and_si512(_mm512_shuffle_i64x2(both, both, _MM_SHUFFLE(3, 1, 2, 0)), low4);
        const __m512i yv = _mm512_inserti64x4(_mm512_castsi256_si512(load256(y[i].qs)),
                                              load256(y[i + 1].qs), 1);
        const __m512i p16 =
            _mm512_sub_epi16(_mm512_maddubs_epi16(u, yv), _mm512_maddubs_epi16(eight, yv));
        const __m512 p = _mm512_cvtepi32_ps(_mm512_madd_epi16(p16, ones));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_to_f32(x[i].d) * fp16_to_f32(y[i].d)),
                              _mm512_castps512_ps256(p), acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_to_f32(x[i + 1].d) * fp16_to_f32(y[i + 1].d)),
                              zmm_high_ps(p), acc);
    }
    for (; i < nb; i++) {
        const __m256i q = _mm256_sub_epi8(unpack_nibbles(x[i].qs), _mm256_set1_epi8(8));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_to_f32(x[i].d) * fp16_to_f32(y[i].d)),
                              dot_i8x32(q, load256(y[i].qs)), acc);
    }
    return hsum_ps(acc);
}

/* ---- activation quantizer --------------------------------------------------------- */

/* roundf(): half away from zero, as the reference quantizer rounds. v - trunc(v)
 * is exact, so the comparison with 0.5 is too. */
static inline __m256 round_half_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    const __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(up, one));
}

/* Bit-identical to hl_quantize_row(HL_TYPE_Q8_0) for finite input. */
static void quantize_q8_0(const float *x, void *dst, int64_t n) {
    block_q8_0 *y = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        __m256 v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 8 * k);
        __m256 m = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = hl_fp32_to_fp16(d);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvtps_epi32(round_half_away(_mm256_mul_ps(v[k], vid)));
        /* packs interleave 128-bit lanes; the permute restores element order */
        const __m256i p =
            _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)y[i].qs, _mm256_permutevar8x32_epi32(p, perm));
    }
}

/* Bit-identical to hl_quantize_row(HL_TYPE_Q8_K) for finite input: the scale comes
 * from the first element of largest magnitude, with its sign; rounding is to
 * nearest even (the default MXCSR mode, as rintf). */
static void quantize_q8_K(const float *x, void *dst, int64_t n) {
    block_q8_K *y = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < QK_K; k += 8)
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        if (amax == 0.0f || !(amax <= 3.4e38f)) { /* zero, inf or NaN: as the reference */
            hl_quantize_row(HL_TYPE_Q8_K, x, &y[i], QK_K);
            continue;
        }
        float max = 0.0f;
        for (int k = 0; k < QK_K; k++) {
            if (x[k] == amax || x[k] == -amax) {
                max = x[k];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        for (int k = 0; k < QK_K; k += 32) {
            __m256i q[4];
            for (int v = 0; v < 4; v++)
                q[v] = _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + k + 8 * v)));
            const __m256i p =
                _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            const __m256i qs = _mm256_permutevar8x32_epi32(p, perm);
            _mm256_storeu_si256((__m256i *)(y[i].qs + k), qs);
            /* two bsums of 16: widen to int16, pairwise-add to int32, then to int16 */
            const __m256i w = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), qs),
                                                _mm256_set1_epi16(1));
            int32_t part[8];
            _mm256_storeu_si256((__m256i *)part, w);
            y[i].bsums[k / 16] = (int16_t)(part[0] + part[1] + part[2] + part[3]);
            y[i].bsums[k / 16 + 1] = (int16_t)(part[4] + part[5] + part[6] + part[7]);
        }
        y[i].d = 1.0f / iscale;
    }
}

/* ---- small f32 ops ------------------------------------------------------------------ */

/* exp(x) = 2^n * exp(r) for x already clamped: n = round(x / ln2), r = x - n*ln2 (ln2 split
 * in two so n*ln2 is exact enough), exp(r) by its degree-6 Taylor polynomial; returns
 * the polynomial, n into *n. */
static inline __m256 exp_reduced(__m256 xc, __m256 *n_out) {
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), xc); /* ln2 high bits */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);       /* ln2 low bits */
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    *n_out = n;
    return p;
}

/* exp(x) for 8 floats: x = n*ln2 + r with |r| <= ln2/2 (ln2 split in two so n*ln2
 * is exact enough), exp(r) by its degree-6 Taylor polynomial (error < 2e-7
 * relative), times 2^n built in the exponent bits. Below -87.3 the result is 0
 * (the subnormal range is dropped), above 88.7 +inf; NaN stays NaN. */
static inline __m256 exp_ps(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.72f), lo = _mm256_set1_ps(-87.33f);
    const __m256 too_small = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    const __m256 too_big = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
    const __m256 xc = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
    __m256 n;
    const __m256 p = exp_reduced(xc, &n);
    /* n in [-126, 128]: split 2^n = 2^(n/2) * 2^(n - n/2) so both are normal floats */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256 s1 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    const __m256 s2 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    y = _mm256_andnot_ps(too_small, y);
    y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), too_big);
    /* NaN in, NaN out */
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* exp_ps for x <= 0 or NaN, with exp_ps's bits: n = round(x / ln2) is then in [-126, 0],
 * so 2^n is one normal float and p * 2^n rounds once, as exp_ps's p * 2^(n/2) * 2^(n -
 * n/2) does (its first product is exact); no upper clamp. perf: 19 operations instead of
 * 26 for the online softmax, whose arguments are scores minus their running max: decode
 * attention at 4096 positions 2-6% less time (one binary switching per step, 3 runs).
 * Every float <= 0 was checked against exp_ps once (2^31 values, no bit differs). */
static inline __m256 exp_nonpos_ps(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33f);
    const __m256 too_small = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    const __m256 xc = _mm256_max_ps(x, lo); /* NaN: lo, replaced by x at the end */
    __m256 n;
    const __m256 p = exp_reduced(xc, &n);
    const __m256 s = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
    const __m256 y = _mm256_andnot_ps(too_small, _mm256_mul_ps(p, s));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

static float sum_squares(const float *x, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        acc0 = _mm256_fmadd_ps(a, a, acc0);
        acc1 = _mm256_fmadd_ps(b, b, acc1);
    }
    float sum = hsum_ps(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += x[i] * x[i];
    return sum;
}

/* x = exp(x - shift), returning the sum; nonpos: every x <= shift (or NaN), so the
 * cheaper exp_nonpos_ps gives the same bits (a constant, so each caller gets its own
 * loop). The tail runs the general exp, every element computed alike. */
ROWS_INLINE float exp_shift_sum_body(float *x, int64_t n, float shift, bool nonpos) {
    const __m256 vs = _mm256_set1_ps(shift);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), vs);
        const __m256 e = nonpos ? exp_nonpos_ps(d) : exp_ps(d);
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum_ps(acc);
    if (i < n) {
        float tmp[8] = {0};
        const int64_t rest = n - i;
        for (int64_t k = 0; k < rest; k++) tmp[k] = x[i + k] - shift;
        _mm256_storeu_ps(tmp, exp_ps(_mm256_loadu_ps(tmp)));
        for (int64_t k = 0; k < rest; k++) {
            x[i + k] = tmp[k];
            sum += tmp[k];
        }
    }
    return sum;
}

static float exp_shift_sum(float *x, int64_t n, float shift) {
    return exp_shift_sum_body(x, n, shift, false);
}

/* exp_shift_sum where every x[i] <= shift (or NaN): the online softmax's step, shift its
 * running max. The same bits as exp_shift_sum. */
static float exp_nonpos_shift_sum(float *x, int64_t n, float shift) {
    return exp_shift_sum_body(x, n, shift, true);
}

/* max(x, m) keeps m where x is NaN, as the reference's x > m does. perf: the scalar
 * loop's maxss chain took 3-4 cycles per element (attention's block max: 1 ns per query
 * head and key, more than the exps). */
static float max_f32(const float *x, int64_t n) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
    }
    if (i + 8 <= n) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
        i += 8;
    }
    m0 = _mm256_max_ps(m0, m1);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float m = _mm_cvtss_f32(h);
    for (; i < n; i++)
        if (x[i] > m) m = x[i];
    return m;
}

static void scale(float *x, float s, int64_t n) {
    const __m256 vs = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
    for (; i < n; i++) x[i] *= s;
}

static inline __m256 silu_mul(__m256 g, __m256 u) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

static void swiglu(float *out, const float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, silu_mul(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n) {
        float g[8] = {0}, u[8] = {0};
        const int64_t rest = n - i;
        memcpy(g, gate + i, (size_t)rest * sizeof(float));
        memcpy(u, up + i, (size_t)rest * sizeof(float));
        _mm256_storeu_ps(g, silu_mul(_mm256_loadu_ps(g), _mm256_loadu_ps(u)));
        memcpy(out + i, g, (size_t)rest * sizeof(float));
    }
}

static void axpy(float *y, float a, const float *x, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]); /* fused like the vector lanes */
}

/* Attention scores: four keys at a time share each load of q, and their four sums come
 * out of one hadd tree. A key's arithmetic is the same in every slot (the tail runs a
 * full group with repeated keys), so its score does not depend on nk or its position. */
static void dot_rows(float *out, const float *q, const float *k, int64_t ldk, int64_t nk,
                     int64_t d, float scale) {
    if (d % 8 != 0) {
        for (int64_t j = 0; j < nk; j++) out[j] = scale * dot_f32(d, k + j * ldk, q);
        return;
    }
    int64_t j = 0;
    /* perf: 8 keys per pass while there are 8 (8 FMA chains hide the FMA latency that 4
     * left exposed); per key the lanes, the order and the reduction are those of the
     * 4-key pass below, so every score is the same whichever pass computes it */
    for (; j + 8 <= nk; j += 8) {
        const float *kr = k + j * ldk;
        __m256 a[8];
        UNROLL for (int r = 0; r < 8; r++) a[r] = _mm256_setzero_ps();
        for (int64_t i = 0; i < d; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            UNROLL for (int r = 0; r < 8; r++)
                a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(kr + r * ldk + i), qv, a[r]);
        }
        UNROLL for (int g = 0; g < 2; g++) {
            const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[4 * g], a[4 * g + 1]),
                                            _mm256_hadd_ps(a[4 * g + 2], a[4 * g + 3]));
            _mm_storeu_ps(out + j + 4 * g,
                          _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(h),
                                                _mm256_extractf128_ps(h, 1)),
                                     _mm_set1_ps(scale)));
        }
    }
    for (; j < nk; j += 4) {
        const float *kr[4];
        for (int r = 0; r < 4; r++) kr[r] = k + (j + r < nk ? j + r : j) * ldk;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int64_t i = 0; i < d; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(kr[0] + i), qv, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(kr[1] + i), qv, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(kr[2] + i), qv, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(kr[3] + i), qv, a3);
        }
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        const __m128 s = _mm_mul_ps(
            _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)), _mm_set1_ps(scale));
        if (j + 4 <= nk) {
            _mm_storeu_ps(out + j, s);
        } else {
            float tmp[4];
            _mm_storeu_ps(tmp, s);
            for (int64_t r = 0; j + r < nk; r++) out[j + r] = tmp[r];
        }
    }
}

/* Weighted sums of values (the same bits as kern_axpy per key; F16C conversion is exact).
 * y[0 .. 8 * nc) += sum_j p[j] * v_j[0 ..): nc outputs of 8 in registers across the keys,
 * one fma per key and element in key order, for value rows of floats or f16. perf: 8 of
 * them (64 outputs) where the head has them: each output's chain of fmas waits 4 cycles
 * per key, so 4 chains left the FMA units half idle. */
#define AXPY_CHUNKS(NAME, T, LOAD)                                                                 \
    ROWS_INLINE void NAME(float *y, const float *p, const T *v, int64_t ldv, int64_t nk, int nc) { \
        __m256 acc[8];                                                                             \
        UNROLL for (int r = 0; r < nc; r++) acc[r] = _mm256_loadu_ps(y + 8 * r);                   \
        for (int64_t j = 0; j < nk; j++) {                                                         \
            const __m256 pj = _mm256_set1_ps(p[j]);                                                \
            UNROLL for (int r = 0; r < nc; r++)                                                    \
                acc[r] = _mm256_fmadd_ps(pj, LOAD(v + j * ldv + 8 * r), acc[r]);                   \
        }                                                                                          \
        UNROLL for (int r = 0; r < nc; r++) _mm256_storeu_ps(y + 8 * r, acc[r]);                   \
    }
AXPY_CHUNKS(axpy_chunks_f32, float, _mm256_loadu_ps)
AXPY_CHUNKS(axpy_chunks_f16, hl_fp16, load_f16x8)

/* The widest chunks first, then the scalar tail; the same bits for any split. */
#define AXPY_ROWS(NAME, T, CHUNKS, SCALAR)                                                         \
    static void NAME(float *y, const float *p, const T *v, int64_t ldv, int64_t nk, int64_t d) {   \
        int64_t i = 0;                                                                             \
        for (; i + 64 <= d; i += 64) CHUNKS(y + i, p, v + i, ldv, nk, 8);                          \
        for (; i + 32 <= d; i += 32) CHUNKS(y + i, p, v + i, ldv, nk, 4);                          \
        for (; i + 8 <= d; i += 8) CHUNKS(y + i, p, v + i, ldv, nk, 1);                            \
        for (; i < d; i++) {                                                                       \
            float acc = y[i];                                                                      \
            for (int64_t j = 0; j < nk; j++) acc = fmaf(p[j], SCALAR(v[j * ldv + i]), acc);        \
            y[i] = acc;                                                                            \
        }                                                                                          \
    }
AXPY_ROWS(axpy_rows, float, axpy_chunks_f32, F32_SCALAR)

/* ---- KV cache rows of f16 / q8_0 ------------------------------------------------- */

/* Round to nearest even, as hl_fp32_to_fp16 (F16C). */
static void to_f16(const float *x, hl_fp16 *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

/* dot_rows over f16 keys: the same passes, each key row converted by F16C as it loads. */
static void dot_rows_f16(float *out, const float *q, const hl_fp16 *k, int64_t ldk, int64_t nk,
                         int64_t d, float scale) {
    if (d % 8 != 0) {
        for (int64_t j = 0; j < nk; j++) out[j] = scale * dot_f16(d, k + j * ldk, q);
        return;
    }
    int64_t j = 0;
    for (; j + 8 <= nk; j += 8) {
        const hl_fp16 *kr = k + j * ldk;
        __m256 a[8];
        UNROLL for (int r = 0; r < 8; r++) a[r] = _mm256_setzero_ps();
        for (int64_t i = 0; i < d; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            UNROLL for (int r = 0; r < 8; r++)
                a[r] = _mm256_fmadd_ps(load_f16x8(kr + r * ldk + i), qv, a[r]);
        }
        UNROLL for (int g = 0; g < 2; g++) {
            const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[4 * g], a[4 * g + 1]),
                                            _mm256_hadd_ps(a[4 * g + 2], a[4 * g + 3]));
            _mm_storeu_ps(out + j + 4 * g,
                          _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(h),
                                                _mm256_extractf128_ps(h, 1)),
                                     _mm_set1_ps(scale)));
        }
    }
    for (; j < nk; j += 4) {
        const hl_fp16 *kr[4];
        for (int r = 0; r < 4; r++) kr[r] = k + (j + r < nk ? j + r : j) * ldk;
        __m256 a[4];
        UNROLL for (int r = 0; r < 4; r++) a[r] = _mm256_setzero_ps();
        for (int64_t i = 0; i < d; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            UNROLL for (int r = 0; r < 4; r++)
                a[r] = _mm256_fmadd_ps(load_f16x8(kr[r] + i), qv, a[r]);
        }
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
        const __m128 s = _mm_mul_ps(
            _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)), _mm_set1_ps(scale));
        float tmp[4];
        _mm_storeu_ps(tmp, s);
        for (int64_t r = 0; r < 4 && j + r < nk; r++) out[j + r] = tmp[r];
    }
}

AXPY_ROWS(axpy_rows_f16, hl_fp16, axpy_chunks_f16, fp16_to_f32)

/* axpy_rows over q8_0 values: per 32 outputs, each key adds (p[j] * scale) * q with one
 * fma per element, keys in order (the reference's bits). */
static void axpy_rows_q8_0(float *y, const float *p, const void *v, size_t ldv, int64_t nk,
                           int64_t d) {
    for (int64_t ib = 0; ib < d / QK8_0; ib++) {
        float *yb = y + ib * QK8_0;
        __m256 acc[4];
        UNROLL for (int r = 0; r < 4; r++) acc[r] = _mm256_loadu_ps(yb + 8 * r);
        for (int64_t j = 0; j < nk; j++) {
            const block_q8_0 *b = (const block_q8_0 *)((const uint8_t *)v + (size_t)j * ldv) + ib;
            const __m256 s = _mm256_set1_ps(p[j] * fp16_to_f32(b->d));
            UNROLL for (int r = 0; r < 4; r++) {
                const __m256 qf = _mm256_cvtepi32_ps(
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * r))));
                acc[r] = _mm256_fmadd_ps(s, qf, acc[r]);
            }
        }
        UNROLL for (int r = 0; r < 4; r++) _mm256_storeu_ps(yb + 8 * r, acc[r]);
    }
}

/* ---- decode attention: one block of keys for several query heads (kern_attn_block) -- */

/* The next block's K and V lines, prefetched a few per step of every head pair's score
 * pass (8 key elements a step), so they arrive while this block computes. perf: decode attention
 * at 4096 positions took 20-36% less time (bench_attn), most with the runner's
 * 32-position blocks, whose 4 KB runs per layer and head the hardware prefetchers only
 * find after their first misses; all the lines at once, or all in the first pair's pass,
 * measured no better than none (bench/README.md). */
typedef struct attn_prefetch {
    const char *k[KERN_ATTN_RUNS], *v[KERN_ATTN_RUNS];
    int64_t k_lines[KERN_ATTN_RUNS], v_lines[KERN_ATTN_RUNS]; /* of the next step's runs */
    int64_t line, per_step; /* the next line of K and of V (over the runs in order), lines
                               of each per step */
} attn_prefetch;
_Static_assert(KERN_ATTN_RUNS == 2, "attn_prefetch_line walks two runs");

/* Line i of two runs laid end to end. One prefetch with the address chosen: gcc 12 -O2
 * dropped every prefetch of an if / else-if pair (no prefetcht0 left in the binary;
 * .ci/run fails if that happens again). */
static inline void attn_prefetch_line(const char *r0, const char *r1, int64_t lines0,
                                      int64_t lines1, int64_t i) {
    const char *p = i < lines0 ? r0 + 64 * i : r1 + 64 * (i - lines0);
    if (i < lines0 + lines1) _mm_prefetch(p, _MM_HINT_T0);
}

static inline void attn_prefetch_step(attn_prefetch *pf) {
    for (int64_t e = pf->line + pf->per_step; pf->line < e; pf->line++) {
        attn_prefetch_line(pf->k[0], pf->k[1], pf->k_lines[0], pf->k_lines[1], pf->line);
        attn_prefetch_line(pf->v[0], pf->v[1], pf->v_lines[0], pf->v_lines[1], pf->line);
    }
}

/* ---- keys by columns (kv/layout.h): key j's element i at k[i * ld + j] ---- */

/* One pass over ng (1, 2 or 4) groups of 8 keys for one or two heads: lane l of group g is
 * key 8g + l, its score one fma chain over the elements from 0 in order, then the scale:
 * kern_dot_cols_f16's bits, whatever the pass. A short last group (nk < 8) reads its keys
 * through a zero-padded copy, so no load passes the run's last key. perf: the scores come
 * out eight keys to a vector with no horizontal sums, and each chain runs the whole head
 * (decode attention's scores: ~30% less time than rows, bench/README.md). The next step's
 * prefetch advances once per 8 elements. */
ROWS_INLINE void cols_pass(float *out0, float *out1, const float *q0, const float *q1,
                           const hl_fp16 *k, int64_t ld, int64_t nk, int64_t d, int ng, bool two,
                           __m256 vs, attn_prefetch *pf) {
    __m256 a[4], b[4];
    UNROLL for (int g = 0; g < ng; g++) a[g] = b[g] = _mm256_setzero_ps();
    for (int64_t i0 = 0; i0 < d; i0 += 8) {
        if (pf) attn_prefetch_step(pf);
        const int64_t i1 = i0 + 8 < d ? i0 + 8 : d;
        for (int64_t i = i0; i < i1; i++) {
            const hl_fp16 *r = k + i * ld;
            const __m256 x = _mm256_broadcast_ss(q0 + i);
            const __m256 y = two ? _mm256_broadcast_ss(q1 + i) : x;
            UNROLL for (int g = 0; g < ng; g++) {
                __m256 kv;
                if (nk < 8) {
                    hl_fp16 pad[8] = {0};
                    memcpy(pad, r, (size_t)nk * sizeof *pad);
                    kv = load_f16x8(pad);
                } else {
                    kv = load_f16x8(r + 8 * g);
                }
                a[g] = _mm256_fmadd_ps(kv, x, a[g]);
                if (two) b[g] = _mm256_fmadd_ps(kv, y, b[g]);
            }
        }
    }
    if (nk < 8) {
        float t[8];
        _mm256_storeu_ps(t, _mm256_mul_ps(a[0], vs));
        memcpy(out0, t, (size_t)nk * sizeof *t);
        if (two) {
            _mm256_storeu_ps(t, _mm256_mul_ps(b[0], vs));
            memcpy(out1, t, (size_t)nk * sizeof *t);
        }
        return;
    }
    UNROLL for (int g = 0; g < ng; g++) {
        _mm256_storeu_ps(out0 + 8 * g, _mm256_mul_ps(a[g], vs));
        if (two) _mm256_storeu_ps(out1 + 8 * g, _mm256_mul_ps(b[g], vs));
    }
}

/* The passes over nk keys: 32 at a time (the runner's blocks and tiles), then 16, 8, and
 * the rest. */
static inline int64_t cols_passes(int64_t nk) {
    return nk / 32 + nk % 32 / 16 + nk % 16 / 8 + (nk % 8 != 0);
}

ROWS_INLINE void scores_cols(float *out0, float *out1, const float *q0, const float *q1,
                             const hl_fp16 *k, int64_t ld, int64_t nk, int64_t d, float scale,
                             bool two, attn_prefetch *pf) {
    const __m256 vs = _mm256_set1_ps(scale);
    int64_t j = 0;
    for (; j + 32 <= nk; j += 32)
        cols_pass(out0 + j, two ? out1 + j : NULL, q0, q1, k + j, ld, 32, d, 4, two, vs, pf);
    if (j + 16 <= nk) {
        cols_pass(out0 + j, two ? out1 + j : NULL, q0, q1, k + j, ld, 16, d, 2, two, vs, pf);
        j += 16;
    }
    if (j + 8 <= nk) {
        cols_pass(out0 + j, two ? out1 + j : NULL, q0, q1, k + j, ld, 8, d, 1, two, vs, pf);
        j += 8;
    }
    if (j < nk)
        cols_pass(out0 + j, two ? out1 + j : NULL, q0, q1, k + j, ld, nk - j, d, 1, two, vs, pf);
}

static void dot_cols_f16(float *out, const float *q, const hl_fp16 *k, int64_t ld, int64_t nk,
                         int64_t d, float scale) {
    scores_cols(out, NULL, q, q, k, ld, nk, d, scale, false, NULL);
}

/* Two heads' scores over the same keys by columns, each key vector converted once for
 * both. */
static void scores2_cols_f16(float *out0, float *out1, const float *q0, const float *q1,
                             const hl_fp16 *k, int64_t ld, int64_t nk, int64_t d, float scale,
                             attn_prefetch *pf) {
    scores_cols(out0, out1, q0, q1, k, ld, nk, d, scale, true, pf);
}

/* Value sums of two heads over the same f16 rows, each row chunk converted once for both:
 * nc (4 or 1) chunks of W outputs per head in registers (with 4: 8 fma chains), one fma
 * per key and element in key order, so each output has axpy_rows_f16's bits. One body for
 * ymm (W = 8) and zmm (W = 16, below). */
#define AXPY2_CHUNKS(NAME, QUAL, VEC, W, LOADU, STOREU, SET1, LOAD_F16, FMADD)                    \
    QUAL void NAME(float *y0, float *y1, const float *p0, const float *p1, const hl_fp16 *v,     \
                   int64_t ldv, int64_t nk, int nc) {                                             \
        VEC a[4], b[4];                                                                           \
        UNROLL for (int r = 0; r < nc; r++) {                                                     \
            a[r] = LOADU(y0 + W * r);                                                             \
            b[r] = LOADU(y1 + W * r);                                                             \
        }                                                                                         \
        for (int64_t j = 0; j < nk; j++) {                                                        \
            const VEC pa = SET1(p0[j]), pb = SET1(p1[j]);                                         \
            UNROLL for (int r = 0; r < nc; r++) {                                                 \
                const VEC x = LOAD_F16(v + j * ldv + W * r);                                      \
                a[r] = FMADD(pa, x, a[r]);                                                        \
                b[r] = FMADD(pb, x, b[r]);                                                        \
            }                                                                                     \
        }                                                                                         \
        UNROLL for (int r = 0; r < nc; r++) {                                                     \
            STOREU(y0 + W * r, a[r]);                                                             \
            STOREU(y1 + W * r, b[r]);                                                             \
        }                                                                                         \
    }

AXPY2_CHUNKS(axpy2_chunks_f16, ROWS_INLINE, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps,
             _mm256_set1_ps, load_f16x8, _mm256_fmadd_ps)

static void axpy2_rows_f16(float *y0, float *y1, const float *p0, const float *p1,
                           const hl_fp16 *v, int64_t ldv, int64_t nk, int64_t d) {
    int64_t i = 0;
    for (; i + 32 <= d; i += 32) axpy2_chunks_f16(y0 + i, y1 + i, p0, p1, v + i, ldv, nk, 4);
    for (; i + 8 <= d; i += 8) axpy2_chunks_f16(y0 + i, y1 + i, p0, p1, v + i, ldv, nk, 1);
    for (; i < d; i++) {
        float a = y0[i], b = y1[i];
        for (int64_t j = 0; j < nk; j++) {
            a = fmaf(p0[j], fp16_to_f32(v[j * ldv + i]), a);
            b = fmaf(p1[j], fp16_to_f32(v[j * ldv + i]), b);
        }
        y0[i] = a;
        y1[i] = b;
    }
}

/* The online softmax step of one head over its block's scores x (kern_attn_block). */
static inline void softmax_step(float *x, int64_t nk, float *m, float *s, float *o, int64_t dv) {
    const float mx = max_f32(x, nk);
    if (mx > *m) {
        const float r = expf(*m - mx);
        *s *= r;
        scale(o, r, dv);
        *m = mx;
    }
    *s += exp_nonpos_shift_sum(x, nk, *m); /* every x <= *m now (or NaN) */
}

/* The prefetch of the next step's keys and values, spread over this step's score passes
 * (of heads_per_pass heads each; a share every 8 elements of a pass): per_step 0 when there is no next
 * step, or keys by rows (no pair kernel walks them). */
static attn_prefetch attn_prefetch_plan(const kern_attn_block *b, int32_t heads_per_pass) {
    attn_prefetch pf = {0};
    if (!b->k_cols) return pf;
    int64_t k_lines = 0, v_lines = 0, groups = 0;
    for (int r = 0; r < KERN_ATTN_RUNS; r++) {
        const kern_attn_run *u = &b->next[r];
        groups += cols_passes(b->run[r].n) * ((b->dk + 7) / 8);
        if (u->n <= 0) continue;
        pf.k[r] = u->k;
        pf.v[r] = u->v;
        pf.k_lines[r] = (((b->dk - 1) * u->kld + u->n) * (int64_t)sizeof(hl_fp16) + 63) / 64;
        pf.v_lines[r] = (u->n * b->ldv * (int64_t)sizeof(hl_fp16) + 63) / 64;
        k_lines += pf.k_lines[r];
        v_lines += pf.v_lines[r];
    }
    const int64_t steps = (b->nh / heads_per_pass) * groups;
    const int64_t most = k_lines > v_lines ? k_lines : v_lines;
    pf.per_step = steps > 0 ? (most + steps - 1) / steps : 0;
    return pf;
}

/* The two kernels a head pair runs: both heads' scores over a run of keys by columns,
 * then both heads' value sums over its rows (the ymm ones above, the zmm ones below). */
typedef void (*attn_scores2_fn)(float *out0, float *out1, const float *q0, const float *q1,
                                const hl_fp16 *k, int64_t ld, int64_t nk, int64_t d,
                                float scale, attn_prefetch *pf);
typedef void (*attn_values2_fn)(float *y0, float *y1, const float *p0, const float *p1,
                                const hl_fp16 *v, int64_t ldv, int64_t nk, int64_t d);

/* Heads in pairs (keys by columns, the cache's f16 layout), an odd last one alone, run by
 * run: every head's arithmetic is that of kern_attn_block_pieces. Keys by rows (no cache
 * stores f16 keys so now) are scored head by head. Over f32 rows the pieces were faster:
 * pairs save conversions only. Inlined with constant kernels, the calls are direct. */
ROWS_INLINE void attn_block_walk(const kern_attn_block *b, attn_scores2_fn scores2,
                                 attn_values2_fn values2) {
    const int64_t nk = kern_attn_block_keys(b);
    attn_prefetch pf = attn_prefetch_plan(b, 2);
    for (int32_t i = 0; i < b->nh; i += 2) {
        const bool two = i + 1 < b->nh;
        const float *q0 = b->q + i * b->ldq, *q1 = q0 + b->ldq;
        float *x0 = b->score, *x1 = b->score + nk;
        float *o0 = b->o + i * b->dv, *o1 = o0 + b->dv;
        int64_t j = 0;
        for (int r = 0; r < KERN_ATTN_RUNS; j += b->run[r].n, r++) {
            const hl_fp16 *k = b->run[r].k;
            const int64_t n = b->run[r].n;
            if (n <= 0) continue;
            if (b->k_cols && two) {
                scores2(x0 + j, x1 + j, q0, q1, k, b->run[r].kld, n, b->dk, b->scale, &pf);
            } else if (b->k_cols) {
                dot_cols_f16(x0 + j, q0, k, b->run[r].kld, n, b->dk, b->scale);
            } else {
                dot_rows_f16(x0 + j, q0, k, b->ldk, n, b->dk, b->scale);
                if (two) dot_rows_f16(x1 + j, q1, k, b->ldk, n, b->dk, b->scale);
            }
        }
        softmax_step(x0, nk, &b->m[i], &b->s[i], o0, b->dv);
        if (two) softmax_step(x1, nk, &b->m[i + 1], &b->s[i + 1], o1, b->dv);
        j = 0;
        for (int r = 0; r < KERN_ATTN_RUNS; j += b->run[r].n, r++) {
            const hl_fp16 *v = b->run[r].v;
            const int64_t n = b->run[r].n;
            if (n <= 0) continue;
            if (two) values2(o0, o1, x0 + j, x1 + j, v, b->ldv, n, b->dv);
            else axpy_rows_f16(o0, x0 + j, v, b->ldv, n, b->dv);
        }
    }
}

static void attn_block_f16(const kern_attn_block *b) {
    attn_block_walk(b, scores2_cols_f16, axpy2_rows_f16);
}

/* ---- decode attention in zmm (AVX-512, kern_avx512_fill) ---------------------------- */

/* attn_block_f16 with 16 keys per score vector and 16 outputs per value vector: lane by
 * lane the same fma chains (a score over the head from element 0, then the scale; an
 * output over the keys in order), so the bits of the ymm kernel and of the pieces. Key
 * counts under 16 and head sizes under 16 take the ymm code. */
#define ATTN512_FN static __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))
#define ATTN512_INLINE                                                                      \
    static inline __attribute__((always_inline,                                            \
                                 target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))

ATTN512_INLINE __m512 load_f16x16(const hl_fp16 *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* ng (1 or 2) groups of 16 keys, two heads; cols_pass's prefetch cadence. */
ATTN512_INLINE void cols_pass16(float *out0, float *out1, const float *q0, const float *q1,
                                const hl_fp16 *k, int64_t ld, int64_t d, int ng, float scale,
                                attn_prefetch *pf) {
    __m512 a[2], b[2];
    UNROLL for (int g = 0; g < ng; g++) a[g] = b[g] = _mm512_setzero_ps();
    for (int64_t i0 = 0; i0 < d; i0 += 8) {
        if (pf) attn_prefetch_step(pf);
        const int64_t i1 = i0 + 8 < d ? i0 + 8 : d;
        for (int64_t i = i0; i < i1; i++) {
            const hl_fp16 *r = k + i * ld;
            const __m512 x = _mm512_set1_ps(q0[i]), y = _mm512_set1_ps(q1[i]);
            UNROLL for (int g = 0; g < ng; g++) {
                const __m512 kv = load_f16x16(r + 16 * g);
                a[g] = _mm512_fmadd_ps(kv, x, a[g]);
                b[g] = _mm512_fmadd_ps(kv, y, b[g]);
            }
        }
    }
    const __m512 vs = _mm512_set1_ps(scale);
    UNROLL for (int g = 0; g < ng; g++) {
        _mm512_storeu_ps(out0 + 16 * g, _mm512_mul_ps(a[g], vs));
        _mm512_storeu_ps(out1 + 16 * g, _mm512_mul_ps(b[g], vs));
    }
}

ATTN512_INLINE void scores2_cols16(float *out0, float *out1, const float *q0, const float *q1,
                                   const hl_fp16 *k, int64_t ld, int64_t nk, int64_t d,
                                   float scale, attn_prefetch *pf) {
    int64_t j = 0;
    for (; j + 32 <= nk; j += 32)
        cols_pass16(out0 + j, out1 + j, q0, q1, k + j, ld, d, 2, scale, pf);
    if (j + 16 <= nk) {
        cols_pass16(out0 + j, out1 + j, q0, q1, k + j, ld, d, 1, scale, pf);
        j += 16;
    }
    if (j < nk) scores_cols(out0 + j, out1 + j, q0, q1, k + j, ld, nk - j, d, scale, true, pf);
}

AXPY2_CHUNKS(axpy2_chunks16, ATTN512_INLINE, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps,
             _mm512_set1_ps, load_f16x16, _mm512_fmadd_ps)

ATTN512_INLINE void axpy2_rows16(float *y0, float *y1, const float *p0, const float *p1,
                                 const hl_fp16 *v, int64_t ldv, int64_t nk, int64_t d) {
    int64_t i = 0;
    for (; i + 64 <= d; i += 64) axpy2_chunks16(y0 + i, y1 + i, p0, p1, v + i, ldv, nk, 4);
    for (; i + 16 <= d; i += 16) axpy2_chunks16(y0 + i, y1 + i, p0, p1, v + i, ldv, nk, 1);
    if (i < d) axpy2_rows_f16(y0 + i, y1 + i, p0, p1, v + i, ldv, nk, d - i);
}

/* nh (4 or 8) heads at a time: each key column and value row converted once for nh heads
 * instead of two. perf: on Intel a zmm f16 conversion costs the FMA ports about three
 * multiply-adds (Xeon, Emerald Rapids: 16 FMAs and 4 conversions take 13.6 cycles, not
 * 8), so a GQA group of 8 (Llama 3, TinyLlama, Qwen2.5) shares each conversion among
 * eight heads (bench/README). Lane by lane the chains of the pair kernels above, so the
 * same bits. Scores: ng (1 or 2) groups of 16 keys, nh * ng accumulators. */
ATTN512_INLINE void cols_pass16xh(float *const out[8], const float *const q[8], int nh,
                                  const hl_fp16 *k, int64_t ld, int64_t d, int ng, float scale,
                                  attn_prefetch *pf) {
    __m512 a[8][2];
    UNROLL for (int h = 0; h < nh; h++) a[h][0] = a[h][1] = _mm512_setzero_ps();
    for (int64_t i0 = 0; i0 < d; i0 += 8) {
        attn_prefetch_step(pf);
        const int64_t i1 = i0 + 8 < d ? i0 + 8 : d;
        for (int64_t i = i0; i < i1; i++) {
            const hl_fp16 *r = k + i * ld;
            __m512 kv[2];
            UNROLL for (int g = 0; g < ng; g++) kv[g] = load_f16x16(r + 16 * g);
            UNROLL for (int h = 0; h < nh; h++) {
                const __m512 x = _mm512_set1_ps(q[h][i]);
                UNROLL for (int g = 0; g < ng; g++) a[h][g] = _mm512_fmadd_ps(kv[g], x, a[h][g]);
            }
        }
    }
    const __m512 vs = _mm512_set1_ps(scale);
    UNROLL for (int h = 0; h < nh; h++) UNROLL for (int g = 0; g < ng; g++)
        _mm512_storeu_ps(out[h] + 16 * g, _mm512_mul_ps(a[h][g], vs));
}

/* nh heads' scores of nk keys from key j0 into x[h] + j0; under 16 keys left, the pair
 * kernel per pair (the prefetch advances with the first pair only, as the plan counts). */
ATTN512_INLINE void scoresh_cols16(float *const x[8], int64_t j0, const float *const q[8], int nh,
                                   const hl_fp16 *k, int64_t ld, int64_t nk, int64_t d,
                                   float scale, attn_prefetch *pf) {
    int64_t j = 0;
    for (; j + 16 <= nk; j += j + 32 <= nk ? 32 : 16) {
        float *out[8];
        UNROLL for (int h = 0; h < nh; h++) out[h] = x[h] + j0 + j;
        cols_pass16xh(out, q, nh, k + j, ld, d, j + 32 <= nk ? 2 : 1, scale, pf);
    }
    if (j < nk)
        for (int h = 0; h < nh; h += 2)
            scores_cols(x[h] + j0 + j, x[h + 1] + j0 + j, q[h], q[h + 1], k + j, ld, nk - j, d,
                        scale, true, h == 0 ? pf : NULL);
}

/* nh heads' value sums: nc chunks of 16 outputs per head in registers (nh * nc <= 16). */
ATTN512_INLINE void axpyh_chunks16(float *const y[8], int64_t i, const float *const p[8], int nh,
                                   int64_t j0, const hl_fp16 *v, int64_t ldv, int64_t nk, int nc) {
    __m512 a[8][4];
    UNROLL for (int h = 0; h < nh; h++) UNROLL for (int r = 0; r < nc; r++) a[h][r] =
        _mm512_loadu_ps(y[h] + i + 16 * r);
    for (int64_t j = 0; j < nk; j++) {
        __m512 ph[8];
        UNROLL for (int h = 0; h < nh; h++) ph[h] = _mm512_set1_ps(p[h][j0 + j]);
        UNROLL for (int r = 0; r < nc; r++) {
            const __m512 x = load_f16x16(v + j * ldv + i + 16 * r);
            UNROLL for (int h = 0; h < nh; h++) a[h][r] = _mm512_fmadd_ps(ph[h], x, a[h][r]);
        }
    }
    UNROLL for (int h = 0; h < nh; h++) UNROLL for (int r = 0; r < nc; r++)
        _mm512_storeu_ps(y[h] + i + 16 * r, a[h][r]);
}

/* The value sums in chunks of 64 outputs (4 heads) or 32 (8 heads), then 16, then the
 * pair kernel for the rest. */
ATTN512_INLINE void axpyh_rows16(float *const y[8], const float *const p[8], int nh, int64_t j0,
                                 const hl_fp16 *v, int64_t ldv, int64_t nk, int64_t d) {
    const int nc = 16 / nh;
    int64_t i = 0;
    for (; i + 16 * nc <= d; i += 16 * nc) axpyh_chunks16(y, i, p, nh, j0, v, ldv, nk, nc);
    for (; i + 16 <= d; i += 16) axpyh_chunks16(y, i, p, nh, j0, v, ldv, nk, 1);
    if (i < d)
        for (int h = 0; h < nh; h += 2)
            axpy2_rows_f16(y[h] + i, y[h + 1] + i, p[h] + j0, p[h + 1] + j0, v + i, ldv, nk,
                           d - i);
}

/* One step of heads [i, i + nh) of the block: scores, softmax steps, value sums. */
ATTN512_INLINE void attn_heads16(const kern_attn_block *b, int32_t i, int nh, int64_t nk,
                                 attn_prefetch *pf) {
    const float *q[8];
    float *x[8], *o[8];
    UNROLL for (int h = 0; h < nh; h++) {
        q[h] = b->q + (i + h) * b->ldq;
        x[h] = b->score + h * nk;
        o[h] = b->o + (i + h) * b->dv;
    }
    int64_t j = 0;
    for (int r = 0; r < KERN_ATTN_RUNS; j += b->run[r].n, r++)
        if (b->run[r].n > 0)
            scoresh_cols16(x, j, q, nh, b->run[r].k, b->run[r].kld, b->run[r].n, b->dk,
                           b->scale, pf);
    for (int h = 0; h < nh; h++) softmax_step(x[h], nk, &b->m[i + h], &b->s[i + h], o[h], b->dv);
    j = 0;
    for (int r = 0; r < KERN_ATTN_RUNS; j += b->run[r].n, r++)
        if (b->run[r].n > 0)
            axpyh_rows16(o, (const float *const *)x, nh, j, b->run[r].v, b->ldv, b->run[r].n,
                         b->dv);
}

/* Keys by columns: heads eight at a time, then four, the rest (nh % 4) in pairs by
 * attn_block_walk; only the widest pass prefetches (its plan covers the next step). perf:
 * bench_attn at 4096 positions: see bench/README.md. */
ATTN512_FN void attn_block_f16_avx512(const kern_attn_block *b) {
    if (!b->k_cols || b->nh < 4) {
        attn_block_walk(b, scores2_cols16, axpy2_rows16);
        return;
    }
    const int64_t nk = kern_attn_block_keys(b);
    const int per_pass = b->nh >= 8 ? 8 : 4;
    attn_prefetch pf = attn_prefetch_plan(b, per_pass);
    attn_prefetch none = {0};
    int32_t i = 0;
    for (; i + 8 <= b->nh; i += 8) attn_heads16(b, i, 8, nk, &pf);
    for (; i + 4 <= b->nh; i += 4) attn_heads16(b, i, 4, nk, per_pass == 4 ? &pf : &none);
    if (i < b->nh) {
        kern_attn_block rest = *b;
        rest.nh -= i;
        rest.q += i * b->ldq;
        rest.o += i * b->dv;
        rest.m += i;
        rest.s += i;
        rest.next[0].n = rest.next[1].n = 0;
        attn_block_walk(&rest, scores2_cols16, axpy2_rows16);
    }
}

#undef ATTN512_FN
#undef ATTN512_INLINE

void kern_avx2_fill(kern_table *t) {
    t->name = "avx2";
    t->vec_dot[HL_TYPE_F32] = dot_f32;
    t->vec_dot[HL_TYPE_F16] = dot_f16;
    t->vec_dot[HL_TYPE_BF16] = dot_bf16;
    t->vec_dot[HL_TYPE_Q4_0] = dot_q4_0;
    t->vec_dot[HL_TYPE_Q8_0] = dot_q8_0;
    t->vec_dot[HL_TYPE_MXFP4] = dot_mxfp4;
    t->vec_dot[HL_TYPE_Q4_1] = dot_q4_1;
    t->vec_dot[HL_TYPE_Q5_0] = dot_q5_0;
    t->vec_dot[HL_TYPE_Q5_1] = dot_q5_1;
    t->vec_dot[HL_TYPE_Q2_K] = dot_q2_K;
    t->vec_dot[HL_TYPE_Q3_K] = dot_q3_K;
    t->vec_dot[HL_TYPE_Q4_K] = dot_q4_K;
    t->vec_dot[HL_TYPE_Q5_K] = dot_q5_K;
    t->vec_dot[HL_TYPE_Q6_K] = dot_q6_K;
    t->vec_dot4[HL_TYPE_F32] = dot4_f32;
    t->vec_dot4[HL_TYPE_F16] = dot4_f16;
    t->vec_dot4[HL_TYPE_BF16] = dot4_bf16;
    t->vec_dot4[HL_TYPE_Q4_0] = dot4_q4_0;
    t->vec_dot4[HL_TYPE_MXFP4] = dot4_mxfp4;
    t->vec_dot4[HL_TYPE_Q8_0] = dot4_q8_0;
    t->vec_dot4[HL_TYPE_Q4_1] = dot4_q4_1;
    t->vec_dot4[HL_TYPE_Q5_0] = dot4_q5_0;
    t->vec_dot4[HL_TYPE_Q5_1] = dot4_q5_1;
    t->vec_dot4[HL_TYPE_Q2_K] = dot4_q2_K;
    t->vec_dot4[HL_TYPE_Q3_K] = dot4_q3_K;
    t->vec_dot4[HL_TYPE_Q4_K] = dot4_q4_K;
    t->vec_dot4[HL_TYPE_Q5_K] = dot4_q5_K;
    t->vec_dot4[HL_TYPE_Q6_K] = dot4_q6_K;
    t->vec_dot_tile[HL_TYPE_Q4_0] = tile_q4_0;
    t->vec_dot_tile[HL_TYPE_Q8_0] = tile_q8_0;
    t->vec_dot_tile[HL_TYPE_Q4_K] = tile_q4_K;
    t->vec_dot_tile[HL_TYPE_Q6_K] = tile_q6_K;
    t->gemm8[HL_TYPE_Q4_0_X8] = gemm8_q4_0_x8;
    t->gemm8[HL_TYPE_Q4_K_X8] = gemm8_q4_K_x8;
    t->gemm8[HL_TYPE_Q8_0_X8] = gemm8_q8_0_x8;
    t->gemm8[HL_TYPE_Q6_K_X8] = NULL; /* Q6_K stays in its file layout: faster here */
    t->quantize[HL_TYPE_Q8_0] = quantize_q8_0;
    t->quantize[HL_TYPE_Q8_K] = quantize_q8_K;
    t->sum_squares = sum_squares;
    t->exp_shift_sum = exp_shift_sum;
    t->exp_nonpos_shift_sum = exp_nonpos_shift_sum;
    t->max = max_f32;
    t->scale = scale;
    t->swiglu = swiglu;
    t->axpy = axpy;
    t->dot_rows = dot_rows;
    t->axpy_rows = axpy_rows;
    t->to_f16 = to_f16;
    t->dot_rows_f16 = dot_rows_f16;
    t->dot_cols_f16 = dot_cols_f16;
    t->axpy_rows_f16 = axpy_rows_f16;
    t->axpy_rows_q8_0 = axpy_rows_q8_0;
    t->attn_block_f16 = attn_block_f16;
}

/* The AVX-VNNI and AVX-512 fills add their own tiles for the file layouts, yet weights that
 * repack (kern_packed_type: Q4_0, Q8_0, Q4_K and Q6_K with rows in eights) keep their X8
 * layouts, whose kernels (here with vpdpbusd; AVX-512 also 16 rows per call) measured
 * faster on Zen 5 than those tiles: with the AVX2 X8 kernels already, prefill 512 Q4_0
 * 147-160 tok/s against the AVX-512 tile's 93-98 and the AVX-VNNI tile's 74-80, Q4_K_M
 * 144-179 against 141-144, Q8_0 112-126 against 109-116 and 73-91; decode Q4_0 50-57
 * against 39-43, the others within noise (bench/README.md). */
void kern_avx_vnni_fill(kern_table *t) {
    t->name = "avx2-vnni";
    t->gemm8[HL_TYPE_Q4_0_X8] = gemm8_q4_0_x8_avxvnni;
    t->gemm8[HL_TYPE_Q8_0_X8] = gemm8_q8_0_x8_avxvnni;
    t->gemm8[HL_TYPE_Q4_K_X8] = gemm8_q4_K_x8_avxvnni;
    t->gemm8[HL_TYPE_Q6_K_X8] = gemm8_q6_K_x8_avxvnni;
    t->vec_dot_tile[HL_TYPE_Q4_0] = tile_q4_0_vnni;
    t->vec_dot_tile[HL_TYPE_Q8_0] = tile_q8_0_vnni;
}

void kern_avx512_fill(kern_table *t) {
    t->name = "avx512";
    t->gemm8[HL_TYPE_Q4_0_X8] = gemm8_q4_0_x8_avx512vnni;
    t->gemm8[HL_TYPE_Q8_0_X8] = gemm8_q8_0_x8_avx512vnni;
    t->gemm8[HL_TYPE_Q4_K_X8] = gemm8_q4_K_x8_avx512;
    t->gemm8[HL_TYPE_Q6_K_X8] = gemm8_q6_K_x8_avx512;
    t->gemm16[HL_TYPE_Q4_0_X8] = gemm16_q4_0_x8_avx512vnni;
    t->gemm32[HL_TYPE_Q4_0_X8] = gemm32_q4_0_x8_avx512vnni;
    t->gemm64[HL_TYPE_Q4_0_X8] = gemm64_q4_0_x8_avx512vnni;
    t->gemm16[HL_TYPE_Q8_0_X8] = gemm16_q8_0_x8_avx512vnni;
    t->gemm32[HL_TYPE_Q8_0_X8] = gemm32_q8_0_x8_avx512vnni;
    t->gemm64[HL_TYPE_Q8_0_X8] = gemm64_q8_0_x8_avx512vnni;
    t->gemm16[HL_TYPE_Q4_K_X8] = gemm16_q4_K_x8_avx512vnni;
    t->gemm32[HL_TYPE_Q4_K_X8] = gemm32_q4_K_x8_avx512vnni;
    t->gemm64[HL_TYPE_Q4_K_X8] = gemm64_q4_K_x8_avx512vnni;
    t->gemm16[HL_TYPE_Q6_K_X8] = gemm16_q6_K_x8_avx512vnni;
    t->gemm32[HL_TYPE_Q6_K_X8] = gemm32_q6_K_x8_avx512vnni;
    t->gemm64[HL_TYPE_Q6_K_X8] = gemm64_q6_K_x8_avx512vnni;
    t->vec_dot_tile[HL_TYPE_Q4_0] = tile_q4_0_avx512;
    t->vec_dot_tile[HL_TYPE_Q8_0] = tile_q8_0_avx512;
    t->vec_dot_tile[HL_TYPE_Q4_K] = tile_q4_K_avx512;
    t->vec_dot_tile[HL_TYPE_Q6_K] = tile_q6_K_avx512;
    t->vec_dot[HL_TYPE_Q4_K] = dot_q4_K_avx512;
    t->vec_dot[HL_TYPE_Q6_K] = dot_q6_K_avx512;
    t->vec_dot[HL_TYPE_Q4_0] = dot_q4_0_avx512;
    t->attn_block_f16 = attn_block_f16_avx512;
}
