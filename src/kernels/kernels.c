/*
 * kernels.c - kernel selection (kern_init) and matmul.
 *
 * kern_init() picks the AVX2 table when the CPU has avx2+fma+f16c, unless
 * HEARTH_CPU=ref, plus the AVX-VNNI and AVX-512 tiles and vpdpbusd X8 kernels when the
 * CPU has them (HEARTH_CPU=avx2 or avx2-vnni caps the choice). kern_matmul() quantizes the
 * activations once into the caller's scratch, then the pool's threads claim chunks of
 * rows x tokens (many_job). Within a chunk the rows are walked once per tile of KERN_TOK_TILE tokens, so a weight row
 * comes from L2 once per tile and from L1 for the other tokens of the tile. Weights in
 * a packed layout (kern_repack: 8 rows interleaved) go through the table's gemm8
 * kernels a group of 8 rows at a time instead (matmul_groups; AVX-512 takes two groups
 * per call, gemm16, or four, gemm32, where a type has it, in prefill everywhere and in
 * decode on Intel, where decode takes eight, gemm64); their activations carry
 * per-block side tables (aux_bytes) in the same scratch.
 */
#define _POSIX_C_SOURCE 200809L
#include "kernels/kernels.h"

#include <math.h>
#include <pthread.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern_internal.h"

enum {
    KERN_TOK_TILE = 8,         /* tokens per pass over a chunk's rows (activations in L1) */
    KERN_TOK_BLOCK = 64,       /* tokens per work chunk (prefill) */
    /* with a gemm_many kernel (AMX), which lays out a row group's weights as tiles once per
     * call for all the chunk's tokens */
    KERN_TOK_BLOCK_MANY = 256,
    KERN_ROW_ALIGN = 16,       /* chunk rows are a multiple of this (no shared out lines) */
    KERN_WIDE_LONG_COLS = 4096, /* rows this long decode in wide calls (matmul_groups) */
    KERN_PREFILL_ROWS = 64,    /* at most this many rows per prefill chunk (stay in L2) */
    KERN_CHUNKS_PER_THREAD = 8, /* prefill: row chunks per thread before the L2 cap */
    KERN_INLINE_QUANT_TOKS = 16 /* up to this many tokens the caller quantizes alone */
};

static kern_table g_active;
static bool g_wide_decode;         /* see matmul_groups */
static bool g_wide_long = true;    /* the same, only for long rows of Q8_0 activations */
static bool g_repack = true; /* HEARTH_REPACK=0/off keeps weights in their file layout */
static bool g_stream_prefetch;     /* HEARTH_PREFETCH; see kern_stream_prefetch */
_Thread_local bool kern_stream_prefetch;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

bool kern_cpu_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    /* clang does not know "f16c" in __builtin_cpu_supports: read CPUID.1:ECX.F16C. */
    unsigned a, b, c, d;
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
    return false;
#endif
}

bool kern_cpu_is_intel(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    /* "GenuineIntel" in EBX, EDX, ECX */
    return __get_cpuid(0, &a, &b, &c, &d) && b == 0x756e6547u && d == 0x49656e69u &&
           c == 0x6c65746eu;
#else
    return false;
#endif
}

bool kern_cpu_has_avx_vnni(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    return kern_cpu_has_avx2() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
#else
    return false;
#endif
}

bool kern_cpu_has_avx512(void) {
#if defined(__x86_64__) || defined(__i386__)
    /* __builtin_cpu_supports also checks that the OS saves the zmm state */
    return kern_cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}

/* From the most capable down; HEARTH_CPU names a ceiling. */
const char *kern_choose_variant(const char *hearth_cpu) {
    static const char *const ladder[] = {"amx", "avx512", "avx2-vnni", "avx2", "ref"};
    const bool have[] = {kern_cpu_has_amx(), kern_cpu_has_avx512(), kern_cpu_has_avx_vnni(),
                         kern_cpu_has_avx2(), true};
    size_t start = 0;
    for (size_t i = 0; hearth_cpu && i < 5; i++)
        if (strcmp(hearth_cpu, ladder[i]) == 0) start = i;
    for (size_t i = start; i < 5; i++)
        if (have[i]) return ladder[i];
    return "ref";
}

static void init_once(void) {
    const char *rp = getenv("HEARTH_REPACK");
    g_repack = !(rp && (!strcmp(rp, "0") || !strcmp(rp, "off") || !strcmp(rp, "false")));
    g_active = *kern_table_ref();
    const char *pf = getenv("HEARTH_PREFETCH");
    g_stream_prefetch = pf && *pf ? strcmp(pf, "0") != 0 : kern_cpu_is_intel();
    const char *wd = getenv("HEARTH_WIDE_DECODE");
    g_wide_decode = wd && *wd ? strcmp(wd, "0") != 0 : kern_cpu_is_intel();
    g_wide_long = !(wd && *wd && strcmp(wd, "0") == 0);
    const char *v = kern_choose_variant(getenv("HEARTH_CPU"));
    if (strcmp(v, "ref") == 0) return;
    kern_avx2_fill(&g_active);
    if (strcmp(v, "avx2") == 0) return;
    if (kern_cpu_has_avx_vnni()) kern_avx_vnni_fill(&g_active);
    if (strcmp(v, "avx512") == 0 || strcmp(v, "amx") == 0) kern_avx512_fill(&g_active);
    if (strcmp(v, "amx") == 0) kern_amx_fill(&g_active);
}

void kern_init(void) { pthread_once(&g_once, init_once); }

const kern_table *kern_table_active(void) {
    kern_init();
    return &g_active;
}

const char *kern_variant(void) { return kern_table_active()->name; }

float kern_vec_dot(hl_type type, int64_t n, const void *row, const void *vec) {
    const kern_table *t = kern_table_active();
    if ((unsigned)type >= HL_TYPE_COUNT || !t->vec_dot[type]) return 0.0f;
    return t->vec_dot[type](n, row, vec);
}

/* Q8_0 activations of a multi-token matmul also get their block scales as floats, token-
 * interleaved per group of KERN_TILE_TOKS tokens, for the tiles (kern_internal.h). */
static bool wants_vscale(hl_type vec_dot_type, int64_t n_tok) {
    return vec_dot_type == HL_TYPE_Q8_0 && n_tok >= KERN_TILE_TOKS;
}

static size_t vscale_offset(hl_type vec_dot_type, int64_t n_cols, int64_t n_tok) {
    return (hl_row_size(vec_dot_type, n_cols) * (size_t)n_tok + 63) / 64 * 64;
}

/* A packed weight type's activations also get, per block, the scale as a float and 8
 * times the sum of the quants (kern_gemm8_fn's ad and as), where the tiles' vscale is. */
static size_t aux_bytes(int64_t n_cols, int64_t n_tok) {
    return (size_t)n_tok * (size_t)(n_cols / QK8_0) * (sizeof(float) + sizeof(int32_t));
}

size_t kern_matmul_scratch_size(hl_type type, int64_t n_cols, int64_t n_tok) {
    const hl_type_traits *tr = hl_type_traits_get(type);
    if (!tr || tr->vec_dot_type == HL_TYPE_F32 || n_tok <= 0) return 0;
    if (tr->internal && tr->vec_dot_type == HL_TYPE_Q8_0)
        return vscale_offset(tr->vec_dot_type, n_cols, n_tok) + aux_bytes(n_cols, n_tok);
    if (tr->internal || !wants_vscale(tr->vec_dot_type, n_tok))
        return hl_row_size(tr->vec_dot_type, n_cols) * (size_t)n_tok;
    const size_t groups = ((size_t)n_tok + KERN_TILE_TOKS - 1) / KERN_TILE_TOKS;
    return vscale_offset(tr->vec_dot_type, n_cols, n_tok) +
           groups * KERN_TILE_TOKS * (size_t)(n_cols / QK8_0) * sizeof(float);
}

typedef struct matmul_job {
    kern_vec_dot_fn dot;
    kern_vec_dot4_fn dot4; /* NULL if the variant has none for this type */
    kern_vec_dot_tile_fn tile; /* NULL if the variant has none for this type */
    kern_gemm8_fn gemm8;       /* packed weight types only (then dot, dot4, tile are NULL) */
    kern_gemm8_fn gemm16;      /* optional: two groups per call */
    kern_gemm8_fn gemm32;      /* optional: four groups per call */
    kern_gemm8_fn gemm64;      /* optional: eight groups per call */
    bool wide_long;            /* decode takes the widest calls too (matmul_groups) */
    /* two groups x every token of the chunk per call (AMX); NULL when the table has none
     * or the matmul has fewer tokens than the table's gemm_many_min */
    kern_gemm8_fn gemm_many;
    kern_quantize_fn quantize;
    const uint8_t *w;
    size_t w_row_bytes;
    int64_t n_rows, n_cols;
    const float *x;
    const uint8_t *xq; /* activations in the vec_dot type, n_tok rows */
    size_t xq_row_bytes;
    float *vscale; /* Q8_0 activations' scales for the tiles, or NULL (wants_vscale) */
    float *ad;     /* packed types, Q8_0 activations: per block scales (aux_bytes) */
    int32_t *as;   /* and 8 * quant sums, for the layouts that want them (NULL: not filled) */
    int64_t n_tok;
    float *out;
} matmul_job;

static void range_split(int64_t n, int64_t align, int ith, int nth, int64_t *lo, int64_t *hi) {
    int64_t per = (n + nth - 1) / nth;
    per = (per + align - 1) / align * align;
    *lo = per * ith < n ? per * ith : n;
    *hi = *lo + per < n ? *lo + per : n;
}

static void quantize_worker(void *ctx, int ith, int nth) {
    const matmul_job *j = ctx;
    int64_t t0, t1;
    range_split(j->n_tok, 1, ith, nth, &t0, &t1);
    const int64_t nb = j->n_cols / QK8_0;
    for (int64_t t = t0; t < t1; t++) {
        uint8_t *row = (uint8_t *)j->xq + (size_t)t * j->xq_row_bytes;
        j->quantize(j->x + t * j->n_cols, row, j->n_cols);
        const block_q8_0 *b = (const block_q8_0 *)row;
        for (int64_t i = 0; j->ad && i < nb; i++) j->ad[t * nb + i] = hl_fp16_to_fp32(b[i].d);
        for (int64_t i = 0; j->as && i < nb; i++) {
            int32_t sum = 0;
            for (int k = 0; k < QK8_0; k++) sum += b[i].qs[k];
            j->as[t * nb + i] = 8 * sum;
        }
        if (!j->vscale) continue;
        float *vs = j->vscale + (t / KERN_TILE_TOKS) * KERN_TILE_TOKS * nb + t % KERN_TILE_TOKS;
        for (int64_t i = 0; i < nb; i++)
            vs[KERN_TILE_TOKS * i] = hl_fp16_to_fp32(((const block_q8_0 *)row)[i].d);
    }
}

/* One row against tokens [t0, t1): 4 at a time through dot4 where there is one. */
static void matmul_row(const matmul_job *j, int64_t r, int64_t t0, int64_t t1) {
    const uint8_t *row = j->w + (size_t)r * j->w_row_bytes;
    int64_t t = t0;
    if (j->dot4) {
        for (; t + 4 <= t1; t += 4) {
            float o[4];
            j->dot4(j->n_cols, row, j->xq + (size_t)t * j->xq_row_bytes, j->xq_row_bytes, o);
            for (int k = 0; k < 4; k++) j->out[(t + k) * j->n_rows + r] = o[k];
        }
    }
    for (; t < t1; t++)
        j->out[t * j->n_rows + r] = j->dot(j->n_cols, row, j->xq + (size_t)t * j->xq_row_bytes);
}

/* Packed rows [r0, r1) (multiples of 8) x tokens [tb0, tb1): one, two or four groups of 8
 * rows at a time, over KERN_TOK_TILE tokens (the groups stay in L1) in calls of up to
 * KERN_GEMM8_TOKS. */
static void matmul_groups(const matmul_job *j, int64_t r0, int64_t r1, int64_t tb0, int64_t tb1) {
    const int64_t nb = j->n_cols / QK8_0;
    /* perf: 16, 32 or 64 rows for matmuls of more than 4 tokens everywhere (Xeon: a
     * forward pass of 5-8 sequences 10-20% faster than two 8-row calls per group), and for
     * fewer on Intel (g_wide_decode; HEARTH_WIDE_DECODE=0/1 overrides). Streamed from DRAM
     * for 1-4 tokens, 8 rows at a time ran faster on Zen 5 (Q4_K_M decode 62-65 tok/s
     * against 41-43, a forward pass of 4 sequences 917-935 against 681-748), wide ran
     * faster on a Xeon (Emerald Rapids: decode Q4_K_M +14%, Q8_0 +17%, Q4_0 +40%, forward
     * passes of 2-4 sequences +15-35%), and 32 rows, then 64 per call (gemm64, decode
     * only) faster still there: each group is a stream of its own, more of them in flight
     * per core (bench/README). On Zen 5 too for the layouts of Q8_0 activations (Q8_0_X8,
     * Q4_0_X8) once a row has KERN_WIDE_LONG_COLS columns or more (wide_long): a group of
     * 8 rows streams so many bytes between two reads of the same activation block that
     * the activations leave L1, and 64 rows a call read each block once for 8 groups.
     * Decode 128 (TinyLlama: the down projection's 5632 columns), switched run by run in
     * one process, in two sittings: Q8_0 +7.9% and +5.4% (8 of 8 pairs each), Q4_0 +5.6%
     * (4 of 4) and +2.3% (7 of 8); at Llama-3-8B's proportions (bench_model --shape 8b,
     * every row 4096+ columns) Q8_0 +22% (8 of 8); every row wide, 2048 columns too:
     * Q8_0 -2% (0 of 4).
     * The K-quants' wide kernels lost end to end (Q4_K_M -4%, 0 of 12; at --shape 8b
     * Q4_K's -8%, Q6_K's -14%), though q4_K_x8 alone streamed 5632-column rows faster
     * wide (bench_dot_stream). */
    const bool decode = j->n_tok <= KERN_GEMM8_TOKS;
    const bool wide_decode = decode && (g_wide_decode || j->wide_long);
    kern_stream_prefetch = g_stream_prefetch && j->n_tok <= KERN_TOK_TILE;
    const bool wide = !decode || wide_decode;
    const kern_gemm8_fn by_width[4] = {j->gemm8, wide ? j->gemm16 : NULL,
                                       wide ? j->gemm32 : NULL, wide_decode ? j->gemm64 : NULL};
    if (j->gemm_many) { /* AMX: 16 rows x all the tokens */
        for (; r0 + 2 * KERN_GEMM8_ROWS <= r1; r0 += 2 * KERN_GEMM8_ROWS)
            j->gemm_many(j->n_cols, j->w + (size_t)r0 * j->w_row_bytes,
                         j->xq + (size_t)tb0 * j->xq_row_bytes, j->xq_row_bytes,
                         j->ad + tb0 * nb, j->as ? j->as + tb0 * nb : NULL, (int)(tb1 - tb0),
                         j->out + tb0 * j->n_rows + r0, (size_t)j->n_rows);
        if (r0 == r1) return;
    }
    for (int64_t t0 = tb0; t0 < tb1; t0 += KERN_TOK_TILE) {
        const int64_t t1 = t0 + KERN_TOK_TILE < tb1 ? t0 + KERN_TOK_TILE : tb1;
        for (int64_t r = r0; r < r1;) {
            int k = 3; /* the widest call that the rows left take: 2^k groups */
            while (k > 0 && !(by_width[k] && r + (KERN_GEMM8_ROWS << k) <= r1)) k--;
            const int groups = 1 << k;
            const kern_gemm8_fn fn = by_width[k];
            for (int64_t t = t0; t < t1; t += KERN_GEMM8_TOKS)
                fn(j->n_cols, j->w + (size_t)r * j->w_row_bytes,
                   j->xq + (size_t)t * j->xq_row_bytes, j->xq_row_bytes,
                   j->ad ? j->ad + t * nb : NULL, j->as ? j->as + t * nb : NULL,
                   (int)(t1 - t < KERN_GEMM8_TOKS ? t1 - t : KERN_GEMM8_TOKS),
                   j->out + t * j->n_rows + r, (size_t)j->n_rows);
            r += groups * KERN_GEMM8_ROWS;
        }
    }
}

/* Rows [r0, r1) x tokens [tb0, tb1), a token tile at a time. */
static void matmul_rows(const matmul_job *j, int64_t r0, int64_t r1, int64_t tb0, int64_t tb1) {
    if (j->gemm8) {
        matmul_groups(j, r0, r1, tb0, tb1);
        return;
    }
    for (int64_t t0 = tb0; t0 < tb1; t0 += KERN_TOK_TILE) {
        const int64_t t1 = t0 + KERN_TOK_TILE < tb1 ? t0 + KERN_TOK_TILE : tb1;
        int64_t r = r0;
        /* perf: register tiles of KERN_TILE_ROWS x KERN_TILE_TOKS, then the leftovers */
        const int64_t t_tiles = j->tile ? t0 + (t1 - t0) / KERN_TILE_TOKS * KERN_TILE_TOKS : t0;
        if (t_tiles > t0) {
            for (; r + KERN_TILE_ROWS <= r1; r += KERN_TILE_ROWS) {
                const uint8_t *w = j->w + (size_t)r * j->w_row_bytes;
                for (int64_t t = t0; t < t_tiles; t += KERN_TILE_TOKS) {
                    /* t is a multiple of KERN_TILE_TOKS (token blocks and tiles are) */
                    const float *vs = j->vscale && t % KERN_TILE_TOKS == 0
                                          ? j->vscale + t * (j->n_cols / QK8_0)
                                          : NULL;
                    j->tile(j->n_cols, w, j->w_row_bytes, j->xq + (size_t)t * j->xq_row_bytes,
                            j->xq_row_bytes, vs, j->out + t * j->n_rows + r, (size_t)j->n_rows);
                }
                for (int64_t rr = r; rr < r + KERN_TILE_ROWS; rr++) matmul_row(j, rr, t_tiles, t1);
            }
        }
        for (; r < r1; r++) matmul_row(j, r, t0, t1);
    }
}

/* Block i of 8 rows of Q4_0 or Q8_0 into its X8 block (types.h): the 8 scales, then each
 * step of 4 quant bytes of every row, row r at byte 4r. */
#define PACK_BLOCK32_X8(name, blk, blk_x8)                                                   \
    static void name(const uint8_t *rows, size_t row, int64_t i, void *dst) {                 \
        blk_x8 *b = dst;                                                                      \
        for (int r = 0; r < KERN_GEMM8_ROWS; r++) {                                           \
            const blk *x = (const blk *)(rows + r * row) + i;                                 \
            b->d[r] = x->d;                                                                   \
            for (size_t st = 0; st < sizeof b->qs / sizeof b->qs[0]; st++)                    \
                memcpy(&b->qs[st][4 * r], (const uint8_t *)x->qs + 4 * st, 4);                \
        }                                                                                     \
    }
PACK_BLOCK32_X8(pack_q4_0_x8, block_q4_0, block_q4_0_x8)
PACK_BLOCK32_X8(pack_q8_0_x8, block_q8_0, block_q8_0_x8)

static void pack_q4_K_x8(const uint8_t *rows, size_t row, int64_t i, void *dst) {
    block_q4_K_x8 *b = dst;
    for (int r = 0; r < KERN_GEMM8_ROWS; r++) {
        const block_q4_K *x = (const block_q4_K *)(rows + r * row) + i;
        b->d[r] = x->d;
        b->dmin[r] = x->dmin;
        for (int k = 0; k < K_SCALE_SIZE; k++) b->scales[k][r] = x->scales[k];
        for (int j = 0; j < 4; j++)
            for (int st = 0; st < 8; st++) memcpy(&b->qs[j][st][4 * r], x->qs + 32 * j + 4 * st, 4);
    }
}

static void pack_q6_K_x8(const uint8_t *rows, size_t row, int64_t i, void *dst) {
    block_q6_K_x8 *b = dst;
    for (int r = 0; r < KERN_GEMM8_ROWS; r++) {
        const block_q6_K *x = (const block_q6_K *)(rows + r * row) + i;
        b->d[r] = x->d;
        for (int g = 0; g < QK_K / 16; g++) b->scales[g][r] = x->scales[g];
        for (int st = 0; st < 8; st++) {
            for (int j = 0; j < 4; j++)
                memcpy((uint8_t *)q6_K_x8_ql(b, j, st) + 4 * r, x->ql + 32 * j + 4 * st, 4);
            for (int h = 0; h < 2; h++)
                memcpy((uint8_t *)q6_K_x8_qh(b, h, st) + 4 * r, x->qh + 32 * h + 4 * st, 4);
        }
    }
}

/* The packed layouts (types.h: internal): each file type's, how a block of 8 rows is
 * written, and whether its kernel takes 8 * sum(y) per activation block (kern_gemm8_fn's
 * as) besides the float scales. */
typedef void (*pack_fn)(const uint8_t *rows, size_t row, int64_t i, void *dst);
typedef struct packed_layout {
    hl_type file, packed;
    pack_fn pack;
    bool qsum;
} packed_layout;
static const packed_layout g_layouts[] = {
    {HL_TYPE_Q4_0, HL_TYPE_Q4_0_X8, pack_q4_0_x8, true},
    {HL_TYPE_Q8_0, HL_TYPE_Q8_0_X8, pack_q8_0_x8, false},
    {HL_TYPE_Q4_K, HL_TYPE_Q4_K_X8, pack_q4_K_x8, false},
    {HL_TYPE_Q6_K, HL_TYPE_Q6_K_X8, pack_q6_K_x8, false},
};

/* The layout whose file or packed type is t, or NULL. */
static const packed_layout *layout_of(hl_type t) {
    for (size_t i = 0; i < sizeof g_layouts / sizeof g_layouts[0]; i++)
        if (g_layouts[i].file == t || g_layouts[i].packed == t) return &g_layouts[i];
    return NULL;
}

static matmul_job matmul_job_for(const kern_table *tab, const kern_matmul_item *it,
                                 int64_t n_cols, const float *x, int64_t n_tok, void *scratch) {
    const hl_type_traits *tr = hl_type_traits_get(it->type);
    matmul_job j = {
        .dot = tab->vec_dot[it->type],
        .dot4 = tab->vec_dot4[it->type],
        .tile = tab->vec_dot_tile[it->type],
        .gemm8 = tab->gemm8[it->type], /* every table has one per packed type */
        .gemm16 = tab->gemm16[it->type],
        .gemm32 = tab->gemm32[it->type],
        .gemm64 = tab->gemm64[it->type],
        .wide_long = g_wide_long && tr->internal && tr->vec_dot_type == HL_TYPE_Q8_0 &&
                     n_cols >= KERN_WIDE_LONG_COLS,
        .gemm_many = n_tok >= tab->gemm_many_min[it->type] ? tab->gemm_many[it->type] : NULL,
        .quantize = tab->quantize[tr->vec_dot_type],
        .w = it->w,
        .w_row_bytes = hl_row_size(it->type, n_cols),
        .n_rows = it->n_rows,
        .n_cols = n_cols,
        .x = x,
        .n_tok = n_tok,
        .out = it->out,
    };
    if (tr->vec_dot_type == HL_TYPE_F32) {
        j.xq = (const uint8_t *)x;
        j.xq_row_bytes = (size_t)n_cols * sizeof(float);
    } else {
        j.xq = scratch;
        j.xq_row_bytes = hl_row_size(tr->vec_dot_type, n_cols);
        if (tr->internal && tr->vec_dot_type == HL_TYPE_Q8_0) {
            j.ad = (float *)((uint8_t *)scratch + vscale_offset(tr->vec_dot_type, n_cols, n_tok));
            if (layout_of(it->type)->qsum) j.as = (int32_t *)(j.ad + n_tok * (n_cols / QK8_0));
        } else if (!tr->internal && wants_vscale(tr->vec_dot_type, n_tok))
            j.vscale = (float *)((uint8_t *)scratch +
                                 vscale_offset(tr->vec_dot_type, n_cols, n_tok));
    }
    return j;
}

/* Fills the job's scratch with x in the activation type (nothing for f32). */
static void quantize_activations(hl_pool *pool, matmul_job *j) {
    if (j->xq == (const uint8_t *)j->x) return;
    /* A batched decode step's few tokens (one per sequence) quantize in tens of us, less
     * than a hand-off costs, and hl_pool_run waits for every worker: on a busy machine a
     * descheduled worker held up each of the ~110 matmuls of a step. */
    if (j->n_tok <= KERN_INLINE_QUANT_TOKS)
        quantize_worker(j, 0, 1);
    else
        hl_pool_run(pool, quantize_worker, j);
}

/* One or more matmuls over the same quantized activations, as one pool run. The work
 * is cut into chunks (a range of the items' rows laid end to end x a block of tokens)
 * that the threads claim from an atomic counter: a thread that is descheduled on a busy
 * machine takes fewer chunks instead of holding up the others. Per (row, token) the
 * arithmetic does not depend on the chunking (tile, dot4 and dot agree bit for bit), so
 * outputs equal those of any split. Chunks of one token block are numbered
 * consecutively, so the threads work on the same activations at the same time.
 *
 * Decode (at most KERN_TOK_TILE tokens, one pass over the rows) splits the rows into one
 * part per thread instead, each streamed front to back, with stealing at the end
 * (many_worker_owned). perf (Zen 5, 2 threads): the two cores' rates differ from run to
 * run, and with static halves the faster one waited ~1.7 ms of a 9.8 ms pass over a
 * step's 88 matmul runs (bench_stream_runs); guided self-scheduling (each claim 1/(2 *
 * threads) of the rows left) evened the ends but restarted a thread's stream at every
 * claim, ~20 per run. Owned parts with stealing, in one process run by run against
 * guided: Q4_K_M decode +3.8% (per pair median, faster in 7 of 8), Q8_0 +1.4% (7 of 8). */
enum { KERN_OWNED_MAX_THREADS = 64, KERN_OWNED_CLAIM = 4 /* units per claim */ };
/* A thread's part, row units [lo, hi) of KERN_ROW_ALIGN rows packed as lo << 32 | hi,
 * on a cache line of its own: its owner claims from the front, a thief from the back. */
typedef struct owned_range {
    _Alignas(64) _Atomic uint64_t lohi;
} owned_range;

typedef struct many_job {
    matmul_job items[KERN_MATMUL_MAX_ITEMS];
    int n_items;
    int64_t total_rows, n_tok;
    int64_t rows_per_chunk, n_row_chunks, n_chunks, tok_block;
    _Atomic int64_t next_chunk;
    bool owned; /* decode: claim from the threads' parts (ranges) instead */
    owned_range ranges[KERN_OWNED_MAX_THREADS];
    /* decode with more threads than ranges: guided claims from next_row (1/(2 * threads)
     * of the rows left, at least KERN_ROW_ALIGN) */
    bool guided;
    _Atomic int64_t next_row;
} many_job;

static void many_rows(const many_job *m, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
    int64_t base = 0;
    for (int k = 0; k < m->n_items && base < r1; base += m->items[k].n_rows, k++) {
        const matmul_job *j = &m->items[k];
        const int64_t lo = r0 > base ? r0 - base : 0;
        const int64_t hi = r1 - base < j->n_rows ? r1 - base : j->n_rows;
        if (lo < hi) matmul_rows(j, lo, hi, t0, t1);
    }
}

static void many_worker_guided(many_job *m, int nth) {
    int64_t r0 = atomic_load_explicit(&m->next_row, memory_order_relaxed);
    for (;;) {
        if (r0 >= m->total_rows) return;
        int64_t take = (m->total_rows - r0) / (2 * (int64_t)nth);
        take = (take + KERN_ROW_ALIGN - 1) / KERN_ROW_ALIGN * KERN_ROW_ALIGN;
        if (take < KERN_ROW_ALIGN) take = KERN_ROW_ALIGN;
        const int64_t r1 = r0 + take < m->total_rows ? r0 + take : m->total_rows;
        if (!atomic_compare_exchange_weak_explicit(&m->next_row, &r0, r1, memory_order_relaxed,
                                                   memory_order_relaxed))
            continue; /* r0 now holds the current value */
        many_rows(m, r0, r1, 0, m->n_tok);
        r0 = atomic_load_explicit(&m->next_row, memory_order_relaxed);
    }
}

static uint64_t lohi(int64_t lo, int64_t hi) { return (uint64_t)lo << 32 | (uint64_t)hi; }

/* Claims up to `want` units from the front of range r into [*lo, *hi); false if empty. */
static bool owned_claim(owned_range *r, int64_t want, int64_t *lo, int64_t *hi) {
    uint64_t v = atomic_load_explicit(&r->lohi, memory_order_relaxed);
    for (;;) {
        const int64_t a = (int64_t)(v >> 32), b = (int64_t)(v & 0xffffffffu);
        if (a >= b) return false;
        const int64_t e = a + want < b ? a + want : b;
        if (atomic_compare_exchange_weak_explicit(&r->lohi, &v, lohi(e, b), memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *lo = a, *hi = e;
            return true;
        }
    }
}

/* Moves the back half (at least one unit) of the fullest other part into thread ith's
 * part, which is empty and which only ith refills; false when every part is empty. */
static bool owned_steal(many_job *m, int ith, int nth) {
    for (;;) {
        int victim = -1;
        int64_t most = 0;
        uint64_t seen = 0;
        for (int t = 0; t < nth; t++) {
            const uint64_t v = atomic_load_explicit(&m->ranges[t].lohi, memory_order_relaxed);
            const int64_t left = (int64_t)(v & 0xffffffffu) - (int64_t)(v >> 32);
            if (t != ith && left > most) victim = t, most = left, seen = v;
        }
        if (victim < 0) return false;
        const int64_t a = (int64_t)(seen >> 32), b = (int64_t)(seen & 0xffffffffu);
        const int64_t cut = a + (b - a) / 2;
        if (atomic_compare_exchange_strong_explicit(&m->ranges[victim].lohi, &seen, lohi(a, cut),
                                                    memory_order_relaxed, memory_order_relaxed)) {
            atomic_store_explicit(&m->ranges[ith].lohi, lohi(cut, b), memory_order_relaxed);
            return true;
        }
    }
}

/* Decode: thread ith streams its part front to back in claims of KERN_OWNED_CLAIM units
 * (one stream per thread, whatever the chunking); once it is empty, the thread takes the
 * back half of the fullest part left as its own and goes on, so the threads end within a
 * claim of each other however their rates differ, and the part of a worker that never
 * joins (hl_pool_run_any) goes to the others, halves at a time. A unit is claimed once:
 * every change of a part is a CAS, and units taken from a part never return to it, so a
 * thief's stale view fails its CAS. */
static void many_worker_owned(many_job *m, int ith, int nth) {
    for (;;) {
        int64_t lo, hi;
        while (owned_claim(&m->ranges[ith], KERN_OWNED_CLAIM, &lo, &hi)) {
            const int64_t r1 = hi * KERN_ROW_ALIGN;
            many_rows(m, lo * KERN_ROW_ALIGN, r1 < m->total_rows ? r1 : m->total_rows, 0,
                      m->n_tok);
        }
        if (!owned_steal(m, ith, nth)) return;
    }
}

static void many_worker(void *ctx, int ith, int nth) {
    many_job *m = ctx;
    if (m->owned) {
        many_worker_owned(m, ith, nth);
        return;
    }
    if (m->guided) {
        many_worker_guided(m, nth);
        return;
    }
    for (;;) {
        const int64_t c = atomic_fetch_add_explicit(&m->next_chunk, 1, memory_order_relaxed);
        if (c >= m->n_chunks) break;
        const int64_t r0 = c % m->n_row_chunks * m->rows_per_chunk;
        const int64_t r1 = r0 + m->rows_per_chunk < m->total_rows ? r0 + m->rows_per_chunk
                                                                  : m->total_rows;
        const int64_t t0 = c / m->n_row_chunks * m->tok_block;
        const int64_t t1 = t0 + m->tok_block < m->n_tok ? t0 + m->tok_block : m->n_tok;
        many_rows(m, r0, r1, t0, t1);
    }
}

static void many_run(hl_pool *pool, many_job *m) {
    const int64_t nth = hl_pool_n_threads(pool);
    int64_t per = (m->total_rows + nth * KERN_CHUNKS_PER_THREAD - 1) / (nth * KERN_CHUNKS_PER_THREAD);
    per = (per + KERN_ROW_ALIGN - 1) / KERN_ROW_ALIGN * KERN_ROW_ALIGN;
    if (m->n_tok > KERN_TOK_TILE && per > KERN_PREFILL_ROWS) per = KERN_PREFILL_ROWS;
    m->rows_per_chunk = per;
    m->n_row_chunks = (m->total_rows + per - 1) / per;
    m->tok_block = KERN_TOK_BLOCK;
    for (int k = 0; k < m->n_items; k++)
        if (m->items[k].gemm_many) m->tok_block = KERN_TOK_BLOCK_MANY;
    m->n_chunks = m->n_row_chunks * ((m->n_tok + m->tok_block - 1) / m->tok_block);
    atomic_store_explicit(&m->next_chunk, 0, memory_order_relaxed);
    const bool decode = m->n_tok <= KERN_TOK_TILE;
    const int64_t units = (m->total_rows + KERN_ROW_ALIGN - 1) / KERN_ROW_ALIGN;
    m->owned = decode && nth <= KERN_OWNED_MAX_THREADS && units < INT32_MAX;
    m->guided = decode && !m->owned;
    atomic_store_explicit(&m->next_row, 0, memory_order_relaxed);
    for (int64_t t = 0; m->owned && t < nth; t++)
        atomic_store_explicit(&m->ranges[t].lohi, lohi(units * t / nth, units * (t + 1) / nth),
                              memory_order_relaxed);
    quantize_activations(pool, &m->items[0]); /* the items share x's quantized rows */
    hl_pool_run_any(pool, many_worker, m); /* a late worker skips instead of stalling it */
}

void kern_matmul(hl_pool *pool, hl_type type, const void *w, int64_t n_rows, int64_t n_cols,
                 const float *x, int64_t n_tok, float *out, void *scratch) {
    const hl_type_traits *tr = hl_type_traits_get(type);
    if (!tr || !tr->can_matmul || n_rows <= 0 || n_tok <= 0) return;
    if (tr->internal && n_rows % KERN_GEMM8_ROWS) return; /* kern_repack never makes one */
    const kern_matmul_item it = {type, w, n_rows, out};
    many_job m = {.n_items = 1, .total_rows = n_rows, .n_tok = n_tok};
    m.items[0] = matmul_job_for(kern_table_active(), &it, n_cols, x, n_tok, scratch);
    many_run(pool, &m);
}

void kern_matmul_many(hl_pool *pool, const kern_matmul_item *items, int n_items, int64_t n_cols,
                      const float *x, int64_t n_tok, void *scratch) {
    const kern_table *tab = kern_table_active();
    bool same = n_items >= 1 && n_items <= KERN_MATMUL_MAX_ITEMS, packed = false, rows8 = true;
    const hl_type_traits *tr0 = same ? hl_type_traits_get(items[0].type) : NULL;
    for (int k = 0; same && k < n_items; k++) {
        const hl_type_traits *tr = hl_type_traits_get(items[k].type);
        /* Q8_0 activations of packed and plain items fill different side tables */
        same = tr && tr0 && tr->can_matmul && items[k].n_rows > 0 &&
               tr->vec_dot_type == tr0->vec_dot_type &&
               (tr->vec_dot_type != HL_TYPE_Q8_0 || tr->internal == tr0->internal);
        packed |= same && tr->internal;
        rows8 &= items[k].n_rows % KERN_GEMM8_ROWS == 0;
    }
    same &= !packed || rows8; /* packed rows start at multiples of 8 in the run */
    if (!same || n_tok <= 0) {
        for (int k = 0; k < n_items; k++)
            kern_matmul(pool, items[k].type, items[k].w, items[k].n_rows, n_cols, x, n_tok,
                        items[k].out, scratch);
        return;
    }
    many_job m = {.n_items = n_items, .n_tok = n_tok};
    for (int k = 0; k < n_items; k++) {
        m.items[k] = matmul_job_for(tab, &items[k], n_cols, x, n_tok, scratch);
        m.total_rows += items[k].n_rows;
    }
    many_run(pool, &m);
}

hl_type kern_packed_type(hl_type type, int64_t rows_per_slice) {
    const packed_layout *l = layout_of(type);
    if (g_repack && l && l->file == type && rows_per_slice > 0 &&
        rows_per_slice % KERN_GEMM8_ROWS == 0 && kern_table_active()->gemm8[l->packed])
        return l->packed;
    return type;
}

bool kern_repack(hl_type packed, void *data, int64_t n_rows, int64_t n_cols, void *tmp) {
    const packed_layout *l = layout_of(packed);
    if (!l || l->packed != packed) return false;
    const hl_type_traits *tr = hl_type_traits_get(l->file);
    if (n_rows % KERN_GEMM8_ROWS || n_cols % tr->block_size) return false;
    const size_t row = hl_row_size(l->file, n_cols), group = KERN_GEMM8_ROWS * row;
    const size_t block = KERN_GEMM8_ROWS * tr->type_size;
    for (int64_t g = 0; g < n_rows / KERN_GEMM8_ROWS; g++) {
        uint8_t *dst = (uint8_t *)data + (size_t)g * group;
        memcpy(tmp, dst, group);
        for (int64_t i = 0; i < n_cols / tr->block_size; i++)
            l->pack(tmp, row, i, dst + (size_t)i * block);
    }
    return true;
}

void kern_rmsnorm(float *out, const float *x, const float *weight, int64_t n, float eps) {
    if (n <= 0) return;
    const float ss = kern_table_active()->sum_squares(x, n);
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    if (weight) {
        for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * weight[i];
    } else {
        for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale;
    }
}

/* Subtracting the max keeps exp() from overflowing. A row of only -inf (everything
 * masked) becomes uniform rather than NaN. */
void kern_softmax(float *x, int64_t n) {
    if (n <= 0) return;
    const float max = kern_max(x, n);
    if (max == -INFINITY) {
        for (int64_t i = 0; i < n; i++) x[i] = 1.0f / (float)n;
        return;
    }
    const float inv = 1.0f / kern_table_active()->exp_shift_sum(x, n, max);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void kern_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    if (n > 0) kern_table_active()->swiglu(out, gate, up, n);
}

void kern_axpy(float *y, float a, const float *x, int64_t n) {
    if (n > 0) kern_table_active()->axpy(y, a, x, n);
}

void kern_dot_rows(float *out, const float *q, const float *k, int64_t ldk, int64_t nk, int64_t d,
                   float scale) {
    if (nk > 0 && d > 0) kern_table_active()->dot_rows(out, q, k, ldk, nk, d, scale);
}

void kern_axpy_rows(float *y, const float *p, const float *v, int64_t ldv, int64_t nk, int64_t d) {
    if (nk > 0 && d > 0) kern_table_active()->axpy_rows(y, p, v, ldv, nk, d);
}

float kern_exp_shift_sum(float *x, int64_t n, float shift) {
    return n > 0 ? kern_table_active()->exp_shift_sum(x, n, shift) : 0.0f;
}

float kern_max(const float *x, int64_t n) {
    return n > 0 ? kern_table_active()->max(x, n) : -INFINITY;
}

void kern_scale(float *x, float s, int64_t n) {
    if (n > 0) kern_table_active()->scale(x, s, n);
}

int64_t kern_attn_block_keys(const kern_attn_block *b) {
    int64_t nk = 0;
    for (int r = 0; r < KERN_ATTN_RUNS; r++) nk += b->run[r].n;
    return nk;
}

void kern_attn_block_pieces(const kern_table *t, hl_type type, const kern_attn_block *b) {
    const bool f16 = type == HL_TYPE_F16;
    const int64_t nk = kern_attn_block_keys(b);
    for (int32_t i = 0; i < b->nh; i++) {
        const float *q = b->q + i * b->ldq;
        float *o = b->o + i * b->dv, *x = b->score;
        int64_t j = 0;
        for (int r = 0; r < KERN_ATTN_RUNS; j += b->run[r].n, r++) {
            const kern_attn_run *u = &b->run[r];
            if (u->n <= 0) continue;
            if (f16 && b->k_cols) t->dot_cols_f16(x + j, q, u->k, u->kld, u->n, b->dk, b->scale);
            else if (f16) t->dot_rows_f16(x + j, q, u->k, b->ldk, u->n, b->dk, b->scale);
            else t->dot_rows(x + j, q, u->k, b->ldk, u->n, b->dk, b->scale);
        }
        const float mx = t->max(x, nk);
        if (mx > b->m[i]) {
            const float r = expf(b->m[i] - mx); /* 0 on a head's first block */
            b->s[i] *= r;
            t->scale(o, r, b->dv);
            b->m[i] = mx;
        }
        b->s[i] += t->exp_shift_sum(x, nk, b->m[i]);
        j = 0;
        for (int r = 0; r < KERN_ATTN_RUNS; j += b->run[r].n, r++) {
            const kern_attn_run *u = &b->run[r];
            if (u->n <= 0) continue;
            if (f16) t->axpy_rows_f16(o, x + j, u->v, b->ldv, u->n, b->dv);
            else t->axpy_rows(o, x + j, u->v, b->ldv, u->n, b->dv);
        }
    }
}

void kern_attn_run_block(hl_type type, const kern_attn_block *b) {
    if (kern_attn_block_keys(b) <= 0 || b->nh <= 0) return;
    const kern_table *t = kern_table_active();
    if (type == HL_TYPE_F16 && t->attn_block_f16) t->attn_block_f16(b);
    else kern_attn_block_pieces(t, type, b);
}

void kern_kv_store_row(hl_type type, const float *x, void *dst, int64_t n) {
    if (n <= 0) return;
    const kern_table *t = kern_table_active();
    switch (type) {
    case HL_TYPE_F16: t->to_f16(x, dst, n); break;
    case HL_TYPE_Q8_0: t->quantize[HL_TYPE_Q8_0](x, dst, n); break;
    default: memcpy(dst, x, (size_t)n * sizeof(float)); break;
    }
}

void kern_kv_store_key(hl_type type, const float *x, void *dst, int64_t n, int64_t stride) {
    if (stride <= 1 || type != HL_TYPE_F16) {
        kern_kv_store_row(type, x, dst, n);
        return;
    }
    hl_fp16 *k = dst, tmp[64];
    const kern_table *t = kern_table_active();
    for (int64_t i = 0; i < n; i += 64) { /* converted as kern_kv_store_row converts */
        const int64_t m = n - i < 64 ? n - i : 64;
        t->to_f16(x + i, tmp, m);
        for (int64_t e = 0; e < m; e++) k[(i + e) * stride] = tmp[e];
    }
}

void kern_dot_cols_f16(float *out, const float *q, const hl_fp16 *k, int64_t ld, int64_t nk,
                       int64_t d, float scale) {
    if (nk > 0 && d > 0) kern_table_active()->dot_cols_f16(out, q, k, ld, nk, d, scale);
}

void kern_dot_rows_kv(hl_type type, float *out, const void *q, const void *k, size_t ldk,
                      int64_t nk, int64_t d, float scale) {
    if (nk <= 0 || d <= 0) return;
    const kern_table *t = kern_table_active();
    switch (type) {
    case HL_TYPE_F16:
        t->dot_rows_f16(out, q, k, (int64_t)(ldk / sizeof(hl_fp16)), nk, d, scale);
        break;
    case HL_TYPE_Q8_0: {
        /* the integer dot of a Q8_0 weight row with Q8_0 activations, key by key */
        const kern_vec_dot_fn dot = t->vec_dot[HL_TYPE_Q8_0];
        for (int64_t j = 0; j < nk; j++)
            out[j] = scale * dot(d, (const uint8_t *)k + (size_t)j * ldk, q);
        break;
    }
    default: t->dot_rows(out, q, k, (int64_t)(ldk / sizeof(float)), nk, d, scale); break;
    }
}

void kern_axpy_rows_kv(hl_type type, float *y, const float *p, const void *v, size_t ldv,
                       int64_t nk, int64_t d) {
    if (nk <= 0 || d <= 0) return;
    const kern_table *t = kern_table_active();
    switch (type) {
    case HL_TYPE_F16: t->axpy_rows_f16(y, p, v, (int64_t)(ldv / sizeof(hl_fp16)), nk, d); break;
    case HL_TYPE_Q8_0: t->axpy_rows_q8_0(y, p, v, ldv, nk, d); break;
    default: t->axpy_rows(y, p, v, (int64_t)(ldv / sizeof(float)), nk, d); break;
    }
}
