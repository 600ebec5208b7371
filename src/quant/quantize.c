/*
 * quantize.c - per-tensor type rules (llama.cpp's llama_tensor_get_type for the
 * k-quant mixes, see quantize.h), metadata copying and row conversion.
 */
#include "quant/quantize.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ftype_name {
    const char *name;
    quant_ftype ftype;
    hl_type base;
} ftype_name;

static const ftype_name g_ftypes[] = {
    {"F32", QUANT_FTYPE_F32, HL_TYPE_F32},        {"F16", QUANT_FTYPE_F16, HL_TYPE_F16},
    {"BF16", QUANT_FTYPE_BF16, HL_TYPE_BF16},     {"Q8_0", QUANT_FTYPE_Q8_0, HL_TYPE_Q8_0},
    {"Q4_0", QUANT_FTYPE_Q4_0, HL_TYPE_Q4_0},     {"Q4_1", QUANT_FTYPE_Q4_1, HL_TYPE_Q4_1},
    {"Q5_0", QUANT_FTYPE_Q5_0, HL_TYPE_Q5_0},     {"Q5_1", QUANT_FTYPE_Q5_1, HL_TYPE_Q5_1},
    {"Q2_K", QUANT_FTYPE_Q2_K, HL_TYPE_Q2_K},     {"Q3_K_S", QUANT_FTYPE_Q3_K_S, HL_TYPE_Q3_K},
    {"Q3_K_M", QUANT_FTYPE_Q3_K_M, HL_TYPE_Q3_K}, {"Q3_K_L", QUANT_FTYPE_Q3_K_L, HL_TYPE_Q3_K},
    {"Q4_K_S", QUANT_FTYPE_Q4_K_S, HL_TYPE_Q4_K}, {"Q4_K_M", QUANT_FTYPE_Q4_K_M, HL_TYPE_Q4_K},
    {"Q5_K_S", QUANT_FTYPE_Q5_K_S, HL_TYPE_Q5_K}, {"Q5_K_M", QUANT_FTYPE_Q5_K_M, HL_TYPE_Q5_K},
    {"Q6_K", QUANT_FTYPE_Q6_K, HL_TYPE_Q6_K},
};
#define N_FTYPES (sizeof g_ftypes / sizeof g_ftypes[0])

static bool eq_nocase(const char *a, const char *b) {
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return false;
    return *a == *b;
}

bool quant_ftype_parse(const char *name, quant_ftype *out) {
    static const struct { const char *alias, *name; } aliases[] = {
        {"Q3_K", "Q3_K_M"}, {"Q4_K", "Q4_K_M"}, {"Q5_K", "Q5_K_M"}};
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (eq_nocase(name, aliases[i].alias)) name = aliases[i].name;
    for (size_t i = 0; i < N_FTYPES; i++) {
        if (eq_nocase(name, g_ftypes[i].name)) {
            *out = g_ftypes[i].ftype;
            return true;
        }
    }
    return false;
}

const char *quant_ftype_name(quant_ftype ftype) {
    for (size_t i = 0; i < N_FTYPES; i++)
        if (g_ftypes[i].ftype == ftype) return g_ftypes[i].name;
    return "?";
}

hl_type quant_ftype_base_type(quant_ftype ftype) {
    for (size_t i = 0; i < N_FTYPES; i++)
        if (g_ftypes[i].ftype == ftype) return g_ftypes[i].base;
    return HL_TYPE_F32;
}

const char *quant_ftype_names(void) {
    return "F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M "
           "Q5_K_S Q5_K_M Q6_K";
}

/* ---- rules ---------------------------------------------------------------------- */

static bool contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static bool is_float_or_quant(uint32_t type) {
    const hl_type_traits *tr = hl_type_traits_get(type);
    return tr && tr->can_dequantize;
}

static bool should_convert(const quant_tensor_info *t) {
    return t->n_dims >= 2 && ends_with(t->name, "weight") && !contains(t->name, "_norm.weight") &&
           !contains(t->name, "ffn_gate_inp.weight") && is_float_or_quant(t->type);
}

/* llama.cpp gives every third layer in the middle, and the first and last eighth, more
 * bits. */
static bool use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 ||
           (i_layer - n_layers / 8) % 3 == 2;
}

/* A type the row length fits, as llama.cpp falls back. */
static hl_type compatible_type(hl_type t, int64_t ne0) {
    if (ne0 % hl_type_traits_get(t)->block_size == 0) return t;
    switch (t) {
    case HL_TYPE_Q2_K:
    case HL_TYPE_Q3_K: t = HL_TYPE_Q4_0; break;
    case HL_TYPE_Q4_K: t = HL_TYPE_Q5_0; break;
    case HL_TYPE_Q5_K: t = HL_TYPE_Q5_1; break;
    case HL_TYPE_Q6_K: t = HL_TYPE_Q8_0; break;
    default: break;
    }
    return ne0 % hl_type_traits_get(t)->block_size == 0 ? t : HL_TYPE_F16;
}

void quant_plan(quant_ftype f, const quant_tensor_info *tensors, int64_t n, int n_gqa,
                hl_type *types) {
    const hl_type base = quant_ftype_base_type(f);
    const bool mixes = hl_type_traits_get(base)->is_quantized;
    int n_attn_v = 0, n_ffn_down = 0, i_attn_v = 0, i_ffn_down = 0;
    bool has_output = false;
    for (int64_t i = 0; i < n; i++) {
        const char *nm = tensors[i].name;
        if (contains(nm, "attn_v.weight")) n_attn_v++;
        if (contains(nm, "ffn_down")) n_ffn_down++;
        if (strcmp(nm, "output.weight") == 0) has_output = true;
    }
    for (int64_t i = 0; i < n; i++) {
        const quant_tensor_info *t = &tensors[i];
        const char *nm = t->name;
        if (!should_convert(t)) {
            types[i] = (hl_type)t->type;
            continue;
        }
        hl_type nt = base;
        if (mixes) {
            if (strcmp(nm, "output.weight") == 0 ||
                (!has_output && strcmp(nm, "token_embd.weight") == 0)) {
                if (t->ne[0] % QK_K != 0)
                    nt = HL_TYPE_Q8_0;
                else if (nt != HL_TYPE_Q8_0)
                    nt = HL_TYPE_Q6_K;
            } else if (contains(nm, "attn_v.weight")) {
                if (f == QUANT_FTYPE_Q2_K)
                    nt = n_gqa >= 4 ? HL_TYPE_Q4_K : HL_TYPE_Q3_K;
                else if (f == QUANT_FTYPE_Q3_K_M)
                    nt = i_attn_v < 2 ? HL_TYPE_Q5_K : HL_TYPE_Q4_K;
                else if (f == QUANT_FTYPE_Q3_K_L)
                    nt = HL_TYPE_Q5_K;
                else if ((f == QUANT_FTYPE_Q4_K_M || f == QUANT_FTYPE_Q5_K_M) &&
                         use_more_bits(i_attn_v, n_attn_v))
                    nt = HL_TYPE_Q6_K;
                else if (f == QUANT_FTYPE_Q4_K_S && i_attn_v < 4)
                    nt = HL_TYPE_Q5_K;
                i_attn_v++;
            } else if (contains(nm, "ffn_down")) {
                const int il = i_ffn_down, nl = n_ffn_down;
                if (f == QUANT_FTYPE_Q2_K)
                    nt = HL_TYPE_Q3_K;
                else if (f == QUANT_FTYPE_Q3_K_M)
                    nt = il < nl / 16 ? HL_TYPE_Q5_K : HL_TYPE_Q4_K;
                else if (f == QUANT_FTYPE_Q3_K_L)
                    nt = HL_TYPE_Q5_K;
                else if ((f == QUANT_FTYPE_Q4_K_M || f == QUANT_FTYPE_Q5_K_M) &&
                         use_more_bits(il, nl))
                    nt = HL_TYPE_Q6_K;
                else if (f == QUANT_FTYPE_Q4_K_S && il < nl / 8)
                    nt = HL_TYPE_Q5_K;
                i_ffn_down++;
            } else if (contains(nm, "attn_output.weight")) {
                if (f == QUANT_FTYPE_Q2_K)
                    nt = HL_TYPE_Q3_K;
                else if (f == QUANT_FTYPE_Q3_K_M)
                    nt = HL_TYPE_Q4_K;
                else if (f == QUANT_FTYPE_Q3_K_L)
                    nt = HL_TYPE_Q5_K;
            }
            nt = compatible_type(nt, t->ne[0]);
        }
        types[i] = nt;
    }
}

/* ---- conversion ------------------------------------------------------------------- */

typedef struct rows_job {
    hl_type src_type, dst_type;
    const uint8_t *src;
    size_t src_row_bytes, dst_row_bytes;
    uint8_t *dst;
    int64_t n_rows, n_cols;
    float *tmp; /* n_cols floats per thread (NULL when src is f32) */
} rows_job;

static void rows_worker(void *ctx, int ith, int nth) {
    const rows_job *j = ctx;
    const int64_t per = (j->n_rows + nth - 1) / nth;
    const int64_t r0 = per * ith < j->n_rows ? per * ith : j->n_rows;
    const int64_t r1 = r0 + per < j->n_rows ? r0 + per : j->n_rows;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)(j->src + (size_t)r * j->src_row_bytes);
        if (j->src_type != HL_TYPE_F32) {
            float *tmp = j->tmp + (size_t)ith * (size_t)j->n_cols;
            hl_dequantize_row(j->src_type, j->src + (size_t)r * j->src_row_bytes, tmp, j->n_cols);
            x = tmp;
        }
        hl_quantize_row(j->dst_type, x, j->dst + (size_t)r * j->dst_row_bytes, j->n_cols);
    }
}

void quant_rows(hl_pool *pool, hl_type type, const float *src, void *dst, int64_t n_rows,
                int64_t n_cols) {
    rows_job j = {HL_TYPE_F32, type, (const uint8_t *)src, (size_t)n_cols * sizeof(float),
                  hl_row_size(type, n_cols), dst, n_rows, n_cols, NULL};
    hl_pool_run(pool, rows_worker, &j);
}

/* Copies key i of in to w, whatever its type. */
static hl_status copy_kv(const gguf_file *in, int64_t i, gguf_writer *w, hl_err *err) {
    const gguf_str k = gguf_kv_key(in, i);
    char *key = malloc(k.len + 1);
    if (!key) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    memcpy(key, k.ptr, k.len);
    key[k.len] = 0;
    const gguf_type type = gguf_kv_type(in, i);
    hl_status st = HL_OK;
    const uint8_t *p = gguf_kv_scalar(in, i);
    uint64_t u = 0;
    if (p)
        for (size_t b = gguf_type_size(type); b-- > 0;) u = u << 8 | p[b];
    switch (type) {
    case GGUF_TYPE_UINT8: st = gguf_writer_set_u8(w, key, (uint8_t)u); break;
    case GGUF_TYPE_INT8: st = gguf_writer_set_i8(w, key, (int8_t)(uint8_t)u); break;
    case GGUF_TYPE_UINT16: st = gguf_writer_set_u16(w, key, (uint16_t)u); break;
    case GGUF_TYPE_INT16: st = gguf_writer_set_i16(w, key, (int16_t)(uint16_t)u); break;
    case GGUF_TYPE_UINT32: st = gguf_writer_set_u32(w, key, (uint32_t)u); break;
    case GGUF_TYPE_INT32: st = gguf_writer_set_i32(w, key, (int32_t)(uint32_t)u); break;
    case GGUF_TYPE_UINT64: st = gguf_writer_set_u64(w, key, u); break;
    case GGUF_TYPE_INT64: st = gguf_writer_set_i64(w, key, (int64_t)u); break;
    case GGUF_TYPE_BOOL: st = gguf_writer_set_bool(w, key, u != 0); break;
    case GGUF_TYPE_FLOAT32: {
        float v;
        uint32_t u32 = (uint32_t)u;
        memcpy(&v, &u32, sizeof v);
        st = gguf_writer_set_f32(w, key, v);
        break;
    }
    case GGUF_TYPE_FLOAT64: {
        double v;
        memcpy(&v, &u, sizeof v);
        st = gguf_writer_set_f64(w, key, v);
        break;
    }
    case GGUF_TYPE_STRING: {
        const gguf_str s = gguf_kv_str(in, i);
        char *v = malloc(s.len + 1);
        if (!v) {
            st = HL_ERR_NOMEM;
            break;
        }
        memcpy(v, s.ptr, s.len);
        v[s.len] = 0;
        st = gguf_writer_set_str(w, key, v);
        free(v);
        break;
    }
    case GGUF_TYPE_ARRAY: {
        gguf_type et;
        uint64_t n;
        gguf_get_arr(in, key, &et, &n);
        if (et == GGUF_TYPE_STRING) {
            /* one buffer for all the NUL-terminated copies */
            uint64_t total = 0;
            for (uint64_t j = 0; j < n; j++) total += gguf_arr_str(in, key, j).len + 1;
            char *buf = malloc(total ? total : 1);
            const char **v = malloc((n ? n : 1) * sizeof *v);
            if (!buf || !v) {
                free(buf);
                free(v);
                st = HL_ERR_NOMEM;
                break;
            }
            char *q = buf;
            for (uint64_t j = 0; j < n; j++) {
                const gguf_str s = gguf_arr_str(in, key, j);
                if (s.len) memcpy(q, s.ptr, s.len);
                q[s.len] = 0;
                v[j] = q;
                q += s.len + 1;
            }
            st = gguf_writer_set_arr_str(w, key, v, n);
            free(buf);
            free(v);
        } else if (gguf_type_size(et) != 0) {
            st = gguf_writer_set_arr(w, key, et, gguf_arr_data(in, key), n);
        } else {
            free(key);
            return hl_fail(err, HL_ERR_UNSUPPORTED, "metadata '%.*s': nested arrays are not "
                           "supported", (int)k.len, k.ptr);
        }
        break;
    }
    default: st = HL_ERR_UNSUPPORTED; break;
    }
    free(key);
    if (st != HL_OK)
        return hl_fail(err, st, "metadata '%.*s': cannot copy (%s)", (int)k.len, k.ptr,
                       hl_status_str(st));
    return HL_OK;
}

static int gqa_of(const gguf_file *in) {
    gguf_str arch;
    char key[160];
    if (!gguf_get_str(in, "general.architecture", &arch) || arch.len > 100) return 0;
    uint32_t nh = 0, nkv = 0;
    snprintf(key, sizeof key, "%.*s.attention.head_count", (int)arch.len, arch.ptr);
    if (!gguf_get_u32(in, key, &nh)) return 0;
    snprintf(key, sizeof key, "%.*s.attention.head_count_kv", (int)arch.len, arch.ptr);
    if (!gguf_get_u32(in, key, &nkv)) nkv = nh;
    return nkv ? (int)(nh / nkv) : 0;
}

static hl_status convert_tensor(const gguf_tensor *t, const char *name, hl_type dst_type,
                                hl_pool *pool, gguf_writer *w, quant_stats *st, hl_err *err) {
    const int64_t n_cols = t->ne[0];
    int64_t n_rows = 1;
    for (uint32_t d = 1; d < GGUF_MAX_DIMS; d++) n_rows *= t->ne[d]; /* the reader checked */
    if (dst_type == t->type)
        return gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->n_bytes,
                                      err);
    const size_t src_row = hl_row_size(t->type, n_cols), dst_row = hl_row_size(dst_type, n_cols);
    size_t out_bytes;
    if (src_row == 0 || dst_row == 0 ||
        __builtin_mul_overflow(dst_row, (size_t)n_rows, &out_bytes))
        return hl_fail(err, HL_ERR_INVALID, "tensor '%s': cannot convert %s to %s", name,
                       hl_type_name(t->type), hl_type_name(dst_type));
    const int nth = hl_pool_n_threads(pool);
    uint8_t *out = malloc(out_bytes ? out_bytes : 1);
    float *tmp = malloc((size_t)n_cols * sizeof(float) * (size_t)nth);
    if (!out || !tmp) {
        free(out);
        free(tmp);
        return hl_fail(err, HL_ERR_NOMEM, "tensor '%s': out of memory", name);
    }
    rows_job j = {(hl_type)t->type, dst_type, t->data, src_row, dst_row, out, n_rows, n_cols,
                  tmp};
    hl_pool_run(pool, rows_worker, &j);
    hl_status s =
        gguf_writer_add_tensor(w, name, dst_type, t->n_dims, t->ne, out, out_bytes, err);
    free(out);
    free(tmp);
    if (s == HL_OK) st->n_converted++;
    return s;
}

static hl_status quant_model_impl(const gguf_file *in, quant_ftype ftype, hl_pool *pool,
                                  quant_progress_fn fn, void *ud, gguf_writer **out,
                                  quant_stats *stats, hl_err *err) {
    *out = NULL;
    quant_stats st = {0};
    const int64_t n = gguf_n_tensors(in);
    gguf_writer *w = gguf_writer_create();
    quant_tensor_info *infos = calloc((size_t)(n ? n : 1), sizeof *infos);
    hl_type *types = calloc((size_t)(n ? n : 1), sizeof *types);
    char **names = calloc((size_t)(n ? n : 1), sizeof *names);
    hl_status s = HL_OK;
    if (!w || !infos || !types || !names) {
        s = hl_fail(err, HL_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < gguf_n_kv(in) && s == HL_OK; i++) s = copy_kv(in, i, w, err);
    if (s != HL_OK) goto done;
    if ((s = gguf_writer_set_u32(w, "general.file_type", (uint32_t)ftype)) != HL_OK ||
        (s = gguf_writer_set_u32(w, "general.quantization_version", 2)) != HL_OK) {
        s = hl_fail(err, s, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(in, i);
        names[i] = malloc(t->name.len + 1);
        if (!names[i]) {
            s = hl_fail(err, HL_ERR_NOMEM, "out of memory");
            goto done;
        }
        memcpy(names[i], t->name.ptr, t->name.len);
        names[i][t->name.len] = 0;
        infos[i] = (quant_tensor_info){names[i], t->n_dims, {0}, t->type};
        memcpy(infos[i].ne, t->ne, sizeof t->ne);
    }
    quant_plan(ftype, infos, n, gqa_of(in), types);
    uint64_t total_in = 0;
    for (int64_t i = 0; i < n; i++) total_in += gguf_tensor_at(in, i)->n_bytes;
    for (int64_t i = 0; i < n && s == HL_OK; i++) {
        const gguf_tensor *t = gguf_tensor_at(in, i);
        st.bytes_in += t->n_bytes;
        if (types[i] == t->type) st.n_copied++;
        s = convert_tensor(t, names[i], types[i], pool, w, &st, err);
        if (s == HL_OK) st.bytes_out += hl_row_size(types[i], t->ne[0]) *
                                        (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
        if (s == HL_OK && fn && !fn(ud, st.bytes_in, total_in)) s = hl_fail(err, HL_ERR_CANCELLED, "cancelled");
    }
    st.n_tensors = n;
done:
    if (names)
        for (int64_t i = 0; i < n; i++) free(names[i]);
    free(names);
    free(infos);
    free(types);
    if (s != HL_OK) {
        gguf_writer_destroy(w);
        return s;
    }
    if (stats) *stats = st;
    *out = w;
    return HL_OK;
}

hl_status quant_model(const gguf_file *in, quant_ftype ftype, hl_pool *pool, gguf_writer **out,
                      quant_stats *stats, hl_err *err) {
    return quant_model_impl(in, ftype, pool, NULL, NULL, out, stats, err);
}

hl_status quant_model_file(const char *in_path, const char *out_path, quant_ftype ftype,
                           int n_threads, quant_stats *stats, hl_err *err) {
    return quant_model_file_progress(in_path, out_path, ftype, n_threads, NULL, NULL, stats, err);
}

hl_status quant_model_file_progress(const char *in_path, const char *out_path, quant_ftype ftype,
                                    int n_threads, quant_progress_fn fn, void *ud,
                                    quant_stats *stats, hl_err *err) {
    gguf_file *in = NULL;
    hl_pool *pool = NULL;
    gguf_writer *w = NULL;
    hl_status s = gguf_open(in_path, &in, err);
    if (s == HL_OK) s = hl_pool_create(n_threads, &pool, err);
    if (s == HL_OK) s = quant_model_impl(in, ftype, pool, fn, ud, &w, stats, err);
    if (s == HL_OK) s = gguf_writer_write_file(w, out_path, err);
    gguf_writer_destroy(w);
    hl_pool_destroy(pool);
    gguf_close(in);
    return s;
}
