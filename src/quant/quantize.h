/*
 * quantize.h - converting a model's weights to another type (`hearth quantize`).
 *
 * A file type (quant_ftype, llama.cpp's LLAMA_FTYPE numbering, written to
 * general.file_type) names either one weight type ("Q8_0", "Q4_K_S", ...) or one of
 * llama.cpp's mixes ("Q4_K_M": mostly Q4_K, with output.weight and part of attn_v /
 * ffn_down in Q6_K). quant_plan() decides each tensor's type with llama.cpp's rules:
 *   - only weight matrices are converted: 2+-D tensors named "*weight", not norms, not
 *     MoE routers (ffn_gate_inp); 1-D tensors and integer tensors are copied as they are;
 *   - output.weight (or token_embd.weight when there is no output) goes to Q6_K unless
 *     the type is Q8_0; attn_v/ffn_down/attn_output get more bits per the mix;
 *   - a row length the chosen type cannot hold falls back as llama.cpp does (Q4_K ->
 *     Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0 where llama.cpp uses IQ4_NL,
 *     which hearth lacks), and to F16 if that still does not fit.
 * quant_model() builds the output in a gguf_writer (metadata copied, general.file_type
 * and general.quantization_version set); quant_model_file() goes file to file. Source
 * tensors may be F32, F16, BF16 or any type hearth dequantizes.
 */
#ifndef HL_QUANT_QUANTIZE_H
#define HL_QUANT_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/pool.h"
#include "base/status.h"
#include "gguf/gguf.h"
#include "tensor/types.h"

typedef enum quant_ftype {
    QUANT_FTYPE_F32 = 0,
    QUANT_FTYPE_F16 = 1,
    QUANT_FTYPE_Q4_0 = 2,
    QUANT_FTYPE_Q4_1 = 3,
    QUANT_FTYPE_Q8_0 = 7,
    QUANT_FTYPE_Q5_0 = 8,
    QUANT_FTYPE_Q5_1 = 9,
    QUANT_FTYPE_Q2_K = 10,
    QUANT_FTYPE_Q3_K_S = 11,
    QUANT_FTYPE_Q3_K_M = 12,
    QUANT_FTYPE_Q3_K_L = 13,
    QUANT_FTYPE_Q4_K_S = 14,
    QUANT_FTYPE_Q4_K_M = 15,
    QUANT_FTYPE_Q5_K_S = 16,
    QUANT_FTYPE_Q5_K_M = 17,
    QUANT_FTYPE_Q6_K = 18,
    QUANT_FTYPE_BF16 = 32,
} quant_ftype;

/* Case-insensitive: "Q4_K_M", "q8_0", "F16", "BF16", ...; "Q3_K"/"Q4_K"/"Q5_K" mean the
 * _M mixes as in llama.cpp. False if unknown. */
bool quant_ftype_parse(const char *name, quant_ftype *out);
const char *quant_ftype_name(quant_ftype ftype); /* "Q4_K_M", ...; "?" if unknown */
hl_type quant_ftype_base_type(quant_ftype ftype); /* the type most tensors get */
/* The names quant_ftype_parse() accepts, space-separated, for usage messages. */
const char *quant_ftype_names(void);

typedef struct quant_tensor_info {
    const char *name; /* NUL-terminated */
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint32_t type; /* the source type */
} quant_tensor_info;

/* types[i] = the output type of tensors[i]; tensors in file order (the attn_v/ffn_down
 * layer rules count them in order, as llama.cpp does). n_gqa = n_head / n_head_kv (0 if
 * unknown). */
void quant_plan(quant_ftype ftype, const quant_tensor_info *tensors, int64_t n, int n_gqa,
                hl_type *types);

/* Quantizes n_rows rows of n_cols f32 values into dst (hl_row_size(type, n_cols) bytes per
 * row), rows split across pool (NULL: this thread). */
void quant_rows(hl_pool *pool, hl_type type, const float *src, void *dst, int64_t n_rows,
                int64_t n_cols);

typedef struct quant_stats {
    int64_t n_tensors, n_converted, n_copied;
    uint64_t bytes_in, bytes_out; /* tensor data only */
} quant_stats;

/* Builds the quantized model in a new writer (*out, freed by the caller with
 * gguf_writer_destroy). stats may be NULL. */
hl_status quant_model(const gguf_file *in, quant_ftype ftype, hl_pool *pool, gguf_writer **out,
                      quant_stats *stats, hl_err *err);
/* n_threads <= 0: all CPUs. */
hl_status quant_model_file(const char *in_path, const char *out_path, quant_ftype ftype,
                           int n_threads, quant_stats *stats, hl_err *err);

/* Progress of a conversion: source tensor bytes done of total, after each tensor.
 * Returning false stops it (HL_ERR_CANCELLED). */
typedef bool (*quant_progress_fn)(void *ud, uint64_t done, uint64_t total);
/* quant_model_file with progress (fn may be NULL). */
hl_status quant_model_file_progress(const char *in_path, const char *out_path, quant_ftype ftype,
                                    int n_threads, quant_progress_fn fn, void *ud,
                                    quant_stats *stats, hl_err *err);

#endif
