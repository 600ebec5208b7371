/*
 * model.c - loading GGUF models of any registered architecture: the registry, the common
 * hyperparameters from "{arch}.*" keys, and one loader that walks an architecture's
 * tensor table, checking every tensor against the hyperparameters (shape and type);
 * weights are used in place from the mapping.
 */
#include "model/internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tensor/types.h"

/* Bounds that keep every size computed from hparams far from overflow. */
#define MODEL_MAX_DIM (1 << 20)
#define MODEL_MAX_LAYERS 4096

/* The registry: one descriptor per architecture file. */
static const model_arch_desc *const g_archs[] = {
    &model_arch_llama, &model_arch_qwen2, &model_arch_qwen3,
    &model_arch_gemma2, &model_arch_gemma3, &model_arch_gemma4,
    &model_arch_bert, &model_arch_nomic_bert,
    &model_arch_phi3,
    &model_arch_qwen35,
    &model_arch_qwen3moe,
    &model_arch_lfm2,
    &model_arch_mamba2, &model_arch_nemotron_h,
    &model_arch_gptoss,
    &model_arch_qwen35moe,
    &model_arch_deepseek2,
};
#define N_ARCHS (sizeof g_archs / sizeof g_archs[0])

static const model_arch_desc *arch_find(gguf_str name) {
    for (size_t i = 0; i < N_ARCHS; i++) {
        if (gguf_str_eq(name, g_archs[i]->name)) return g_archs[i];
        for (const char *const *a = g_archs[i]->aliases; a && *a; a++)
            if (gguf_str_eq(name, *a)) return g_archs[i];
    }
    return NULL;
}

static char g_arch_list[512];

static void fill_arch_list(void) {
    size_t o = 0;
    for (size_t i = 0; i < N_ARCHS && o < sizeof g_arch_list; i++) {
        o += (size_t)snprintf(g_arch_list + o, sizeof g_arch_list - o, "%s%s", i ? ", " : "",
                              g_archs[i]->name);
        for (const char *const *a = g_archs[i]->aliases; a && *a && o < sizeof g_arch_list; a++)
            o += (size_t)snprintf(g_arch_list + o, sizeof g_arch_list - o, ", %s", *a);
    }
}

const char *model_supported_archs(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fill_arch_list);
    return g_arch_list;
}

const model_hparams *model_get_hparams(const model *m) { return &m->hp; }

size_t model_weight_bytes(const model *m) { return m->tensor_bytes; }
const kv_geom *model_kv_geom(const model *m) { return &m->kv; }
bool model_is_causal(const model *m) { return m->x.causal; }
bool model_has_logits(const model *m) { return m->output.data != NULL; }
const tok_vocab *model_vocab(const model *m) { return m->vocab; }

void model_free(model *m) {
    if (!m) return;
    free(m->layers);
    free(m->lhp);
    free((void *)m->mats);
    kv_geom_free(&m->kv);
    kv_geom_free(&m->kv_slot[0]);
    kv_geom_free(&m->kv_slot[1]);
    free(m->layer_slot);
    tok_vocab_destroy(m->vocab);
    gguf_close(m->gguf);
    hl_map_close(&m->map);
    free(m);
}

/* ---- hparams ---- */

static bool arch_key(const model_loader *L, const char *suffix, char *key, size_t cap) {
    int n = snprintf(key, cap, "%s.%s", L->prefix, suffix);
    return n > 0 && (size_t)n < cap;
}

/* An integer (or bool) key's value, or false. */
static bool get_int(const gguf_file *f, const char *key, int64_t *out) {
    uint32_t u;
    int32_t i;
    bool b;
    if (gguf_get_u32(f, key, &u)) *out = u;
    else if (gguf_get_i32(f, key, &i)) *out = i;
    else if (gguf_get_bool(f, key, &b)) *out = b;
    else return false;
    return true;
}

/* Element j of a numeric or bool array (data packed little-endian, maybe unaligned). */
static bool arr_int_at(gguf_type t, const uint8_t *data, uint64_t j, int64_t *out) {
    switch (t) {
    case GGUF_TYPE_UINT8: *out = data[j]; return true;
    case GGUF_TYPE_BOOL: *out = data[j] != 0; return true;
    case GGUF_TYPE_INT8: *out = (int8_t)data[j]; return true;
    case GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, data + 2 * j, 2); *out = v; return true; }
    case GGUF_TYPE_INT16: { int16_t v; memcpy(&v, data + 2 * j, 2); *out = v; return true; }
    case GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, data + 4 * j, 4); *out = v; return true; }
    case GGUF_TYPE_INT32: { int32_t v; memcpy(&v, data + 4 * j, 4); *out = v; return true; }
    case GGUF_TYPE_INT64: { int64_t v; memcpy(&v, data + 8 * j, 8); *out = v; return true; }
    case GGUF_TYPE_UINT64: {
        uint64_t v;
        memcpy(&v, data + 8 * j, 8);
        if (v > INT64_MAX) return false;
        *out = (int64_t)v;
        return true;
    }
    default: return false;
    }
}

/* Reads a positive int hparam; absent and required -> FORMAT. */
hl_status model_hp_int(const model_loader *L, const char *suffix, bool required, int32_t dflt,
                       int32_t *out, hl_err *err) {
    char key[128];
    if (!arch_key(L, suffix, key, sizeof key)) return hl_fail(err, HL_ERR_INVALID, "key too long");
    if (gguf_find_key(L->f, key) < 0) {
        if (required) return hl_fail(err, HL_ERR_FORMAT, "missing metadata key '%s'", key);
        *out = dflt;
        return HL_OK;
    }
    int64_t v;
    if (!get_int(L->f, key, &v) || v < 0)
        return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s' is not a non-negative integer", key);
    if (v == 0 || v > MODEL_MAX_DIM)
        return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s' = %lld is out of range [1, %d]", key,
                       (long long)v, MODEL_MAX_DIM);
    *out = (int32_t)v;
    return HL_OK;
}

/* An optional integer that may be 0 (absent: 0). */
static hl_status hp_uint_opt(const model_loader *L, const char *suffix, int32_t *out,
                             hl_err *err) {
    char key[128];
    *out = 0;
    if (!arch_key(L, suffix, key, sizeof key)) return hl_fail(err, HL_ERR_INVALID, "key too long");
    if (gguf_find_key(L->f, key) < 0) return HL_OK;
    int64_t v;
    if (!get_int(L->f, key, &v) || v < 0 || v > MODEL_MAX_DIM)
        return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s' is not a small non-negative integer",
                       key);
    *out = (int32_t)v;
    return HL_OK;
}

hl_status model_hp_float(const model_loader *L, const char *suffix, float dflt, float *out,
                         hl_err *err) {
    char key[128];
    if (!arch_key(L, suffix, key, sizeof key)) return hl_fail(err, HL_ERR_INVALID, "key too long");
    if (gguf_find_key(L->f, key) < 0) {
        *out = dflt;
        return HL_OK;
    }
    float v;
    if (!gguf_get_f32(L->f, key, &v))
        return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s' is not a float", key);
    if (!(v > 0.0f) || v > 1e30f)
        return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s' = %g is out of range", key, v);
    *out = v;
    return HL_OK;
}

hl_status model_hp_layer_ints(const model_loader *L, const char *suffix, int32_t *out,
                              bool *present, hl_err *err) {
    char key[128];
    const int32_t n = L->m->hp.n_layer;
    *present = false;
    if (!arch_key(L, suffix, key, sizeof key)) return hl_fail(err, HL_ERR_INVALID, "key too long");
    if (gguf_find_key(L->f, key) < 0) return HL_OK;
    int64_t v;
    if (get_int(L->f, key, &v)) {
        if (v < 0 || v > MODEL_MAX_DIM)
            return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s' = %lld is out of range", key,
                           (long long)v);
        for (int32_t i = 0; i < n; i++) out[i] = (int32_t)v;
        *present = true;
        return HL_OK;
    }
    gguf_type et;
    uint64_t cnt;
    const uint8_t *data = NULL;
    if (gguf_get_arr(L->f, key, &et, &cnt)) data = gguf_arr_data(L->f, key);
    if (!data || cnt != (uint64_t)n)
        return hl_fail(err, HL_ERR_FORMAT,
                       "metadata key '%s' is neither an integer nor an array of %d integers", key,
                       n);
    for (int32_t i = 0; i < n; i++) {
        int64_t e;
        if (!arr_int_at(et, data, (uint64_t)i, &e) || e < 0 || e > MODEL_MAX_DIM)
            return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s'[%d] is not a valid integer", key,
                           i);
        out[i] = (int32_t)e;
    }
    *present = true;
    return HL_OK;
}

static hl_status read_rope_scaling(const model_loader *L, hl_err *err) {
    model *m = L->m;
    char key[128];
    float factor = 1.0f;
    gguf_str type = {NULL, 0};
    arch_key(L, "rope.scaling.type", key, sizeof key);
    bool has_type = gguf_get_str(L->f, key, &type);
    hl_status st = model_hp_float(L, "rope.scaling.factor", 0.0f, &factor, err);
    if (st) return st;
    if (factor == 0.0f) {
        /* older files: a bare linear factor */
        st = model_hp_float(L, "rope.scale_linear", 1.0f, &factor, err);
        if (st) return st;
    }
    m->x.rope_scaling = factor != 1.0f ? MODEL_ROPE_SCALING_LINEAR : MODEL_ROPE_SCALING_NONE;
    if (has_type && gguf_str_eq(type, "none")) {
        factor = 1.0f;
        m->x.rope_scaling = MODEL_ROPE_SCALING_NONE;
    } else if (has_type && gguf_str_eq(type, "yarn")) {
        m->x.rope_scaling = MODEL_ROPE_SCALING_YARN;
    } else if (has_type && gguf_str_eq(type, "longrope")) {
        m->x.rope_scaling = MODEL_ROPE_SCALING_LONGROPE;
    } else if (has_type && !gguf_str_eq(type, "linear")) {
        return hl_fail(err, HL_ERR_UNSUPPORTED,
                       "unsupported rope scaling type '%.*s' (linear, yarn, longrope)",
                       (int)(type.len > 64 ? 64 : type.len), type.ptr);
    }
    m->hp.rope_freq_scale = 1.0f / factor;
    if ((st = model_hp_int(L, "rope.scaling.original_context_length", false, m->hp.n_ctx_train,
                           &m->x.n_ctx_orig, err)))
        return st;
    if ((st = model_hp_float(L, "rope.scaling.attn_factor", 1.0f, &m->x.rope_attn_factor, err)))
        return st;
    /* llama.cpp's YaRN defaults: extrapolation mix on, beta_fast 32, beta_slow 1 */
    m->x.yarn_ext_factor = m->x.rope_scaling == MODEL_ROPE_SCALING_YARN ? 1.0f : 0.0f;
    if ((st = model_hp_float(L, "rope.scaling.yarn_beta_fast", 32.0f, &m->x.yarn_beta_fast, err)))
        return st;
    return model_hp_float(L, "rope.scaling.yarn_beta_slow", 1.0f, &m->x.yarn_beta_slow, err);
}

static bool key_is_array(const model_loader *L, const char *suffix) {
    char key[128];
    gguf_type et;
    uint64_t n;
    return arch_key(L, suffix, key, sizeof key) && gguf_get_arr(L->f, key, &et, &n);
}

/* n_ff and n_head_kv: one value for all layers, or one per layer. */
static hl_status read_layer_widths(model_loader *L, hl_err *err) {
    model *m = L->m;
    model_hparams *hp = &m->hp;
    int32_t *tmp = calloc((size_t)hp->n_layer, sizeof *tmp);
    if (!tmp) return hl_fail(err, HL_ERR_NOMEM, "out of memory for %d layers", hp->n_layer);
    bool has;
    hl_status st = model_hp_layer_ints(L, "feed_forward_length", tmp, &has, err);
    if (!st && !has)
        st = hl_fail(err, HL_ERR_FORMAT, "missing metadata key '%s.feed_forward_length'",
                     L->prefix);
    /* per-layer arrays may hold 0: a layer without that part (recurrent hybrids) */
    const bool ff_array = key_is_array(L, "feed_forward_length");
    for (int32_t l = 0; !st && l < hp->n_layer; l++) {
        if (tmp[l] <= 0 && !ff_array && !m->arch->ffn_optional)
            st = hl_fail(err, HL_ERR_FORMAT, "feed_forward_length of layer %d is 0", l);
        m->lhp[l].n_ff = tmp[l];
        if (tmp[l] > hp->n_ff) hp->n_ff = tmp[l];
    }
    if (!st) st = model_hp_layer_ints(L, "attention.head_count_kv", tmp, &has, err);
    const bool tmp_is_array = key_is_array(L, "attention.head_count_kv");
    for (int32_t l = 0; !st && l < hp->n_layer; l++) {
        model_layer_hp *h = &m->lhp[l];
        h->n_head = hp->n_head;
        h->n_head_kv = has ? tmp[l] : hp->n_head;
        if (h->n_head_kv > hp->n_head_kv) hp->n_head_kv = h->n_head_kv;
        /* a 0 in a per-layer array: a layer without attention (recurrent hybrids) */
        if (h->n_head_kv == 0 && tmp_is_array) continue;
        if (h->n_head_kv == 0 || h->n_head_kv > hp->n_head || hp->n_head % h->n_head_kv != 0)
            st = hl_fail(err, HL_ERR_FORMAT,
                         "attention.head_count %d is not a multiple of head_count_kv %d",
                         hp->n_head, h->n_head_kv);
    }
    free(tmp);
    return st;
}

/* The keys every architecture shares; per-layer values start uniform (an architecture's
 * read_hparams refines them). */
static hl_status read_hparams(model_loader *L, hl_err *err) {
    model *m = L->m;
    model_hparams *hp = &m->hp;
    hl_status st;
    if ((st = model_hp_int(L, "context_length", true, 0, &hp->n_ctx_train, err))) return st;
    if ((st = model_hp_int(L, "embedding_length", true, 0, &hp->n_embd, err))) return st;
    if ((st = model_hp_int(L, "block_count", true, 0, &hp->n_layer, err))) return st;
    if (hp->n_layer > MODEL_MAX_LAYERS)
        return hl_fail(err, HL_ERR_FORMAT, "block_count %d is too large", hp->n_layer);
    if ((st = model_hp_int(L, "attention.head_count", true, 0, &hp->n_head, err))) return st;
    m->lhp = calloc((size_t)hp->n_layer, sizeof *m->lhp);
    if (!m->lhp) return hl_fail(err, HL_ERR_NOMEM, "out of memory for %d layers", hp->n_layer);
    if ((st = read_layer_widths(L, err))) return st;
    int32_t dflt_hd = hp->n_embd % hp->n_head == 0 ? hp->n_embd / hp->n_head : 0;
    if ((st = model_hp_int(L, "attention.key_length", dflt_hd == 0, dflt_hd, &hp->head_dim_k, err)))
        return st;
    if ((st = model_hp_int(L, "attention.value_length", false, hp->head_dim_k, &hp->head_dim_v,
                           err)))
        return st;
    if ((st = model_hp_int(L, "rope.dimension_count", false, hp->head_dim_k, &hp->n_rot, err)))
        return st;
    if (hp->n_rot > hp->head_dim_k || hp->n_rot % 2 != 0)
        return hl_fail(err, HL_ERR_FORMAT,
                       "rope.dimension_count %d must be even and at most the head size %d",
                       hp->n_rot, hp->head_dim_k);
    if ((int64_t)hp->n_head * hp->head_dim_k > MODEL_MAX_DIM ||
        (int64_t)hp->n_head * hp->head_dim_v > MODEL_MAX_DIM)
        return hl_fail(err, HL_ERR_FORMAT, "attention size is too large");
    /* RMSNorm models name their epsilon so; LayerNorm models (BERT) the other key */
    char key[128];
    arch_key(L, "attention.layer_norm_rms_epsilon", key, sizeof key);
    const bool has_rms = gguf_find_key(L->f, key) >= 0;
    arch_key(L, "attention.layer_norm_epsilon", key, sizeof key);
    m->x.layer_norm = !has_rms && gguf_find_key(L->f, key) >= 0;
    if ((st = model_hp_float(L,
                             m->x.layer_norm ? "attention.layer_norm_epsilon"
                                             : "attention.layer_norm_rms_epsilon",
                             1e-5f, &hp->rms_eps, err)))
        return st;
    m->x.norm_eps = hp->rms_eps;
    if ((st = model_hp_float(L, "rope.freq_base", 10000.0f, &hp->rope_freq_base, err))) return st;
    if ((st = read_rope_scaling(L, err))) return st;
    int32_t pooling = 0;
    if ((st = hp_uint_opt(L, "pooling_type", &pooling, err))) return st;
    if (pooling > MODEL_POOL_LAST)
        return hl_fail(err, HL_ERR_UNSUPPORTED, "unsupported pooling_type %d", pooling);
    hp->pooling = (model_pooling)pooling;
    arch_key(L, "attention.causal", key, sizeof key);
    bool causal = true;
    if (gguf_find_key(L->f, key) >= 0 && !gguf_get_bool(L->f, key, &causal))
        return hl_fail(err, HL_ERR_FORMAT, "metadata key '%s' is not a bool", key);
    m->x.causal = causal;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        model_layer_hp *h = &m->lhp[l];
        h->head_dim_k = hp->head_dim_k;
        h->head_dim_v = hp->head_dim_v;
        h->n_rot = hp->n_rot;
        h->rope_base = hp->rope_freq_base;
        h->rope_scale = hp->rope_freq_scale;
        h->kv_src = l;
    }
    return HL_OK;
}

hl_status model_hp_sliding_window(model_loader *L, int32_t default_pattern, hl_err *err) {
    model *m = L->m;
    int32_t window = 0;
    hl_status st = hp_uint_opt(L, "attention.sliding_window", &window, err);
    if (st || window == 0) return st;
    int32_t *local = calloc((size_t)m->hp.n_layer, sizeof *local);
    if (!local) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    char key[128];
    arch_key(L, "attention.sliding_window_pattern", key, sizeof key);
    gguf_type et;
    uint64_t cnt;
    if (gguf_get_arr(L->f, key, &et, &cnt)) {
        bool has;
        st = model_hp_layer_ints(L, "attention.sliding_window_pattern", local, &has, err);
    } else {
        int32_t pattern = default_pattern;
        st = hp_uint_opt(L, "attention.sliding_window_pattern", &pattern, err);
        if (!st && pattern == 0) pattern = default_pattern;
        /* llama.cpp set_swa_pattern: layer il is local iff il % n < n - 1 */
        for (int32_t l = 0; !st && l < m->hp.n_layer; l++)
            local[l] = pattern > 0 && l % pattern < pattern - 1;
    }
    for (int32_t l = 0; !st && l < m->hp.n_layer; l++) m->lhp[l].window = local[l] ? window : 0;
    free(local);
    return st;
}

/* ---- tensors ---- */

static void shape_str(char *buf, size_t cap, uint32_t n_dims, const int64_t *ne) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (uint32_t i = 0; i < n_dims && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* Finds `name` and checks its shape is exactly ne[0..n_dims). NULL *out when absent and
 * not required. */
static hl_status find_tensor(const model_loader *L, const char *name, uint32_t n_dims,
                             const int64_t *ne, bool required, const gguf_tensor **out,
                             hl_err *err) {
    *out = NULL;
    const gguf_tensor *t = gguf_find_tensor(L->f, name);
    if (!t) {
        if (!required) return HL_OK;
        return hl_fail(err, HL_ERR_FORMAT, "missing tensor '%s'", name);
    }
    uint32_t nd = t->n_dims;
    while (nd > 1 && t->ne[nd - 1] == 1) nd--; /* trailing 1s are not a shape mismatch */
    bool ok = nd <= n_dims;
    for (uint32_t i = 0; ok && i < n_dims; i++) ok = t->ne[i] == ne[i];
    for (uint32_t i = n_dims; ok && i < GGUF_MAX_DIMS && i < t->n_dims; i++) ok = t->ne[i] == 1;
    if (!ok) {
        char got[96], want[96];
        shape_str(got, sizeof got, t->n_dims, t->ne);
        shape_str(want, sizeof want, n_dims, ne);
        return hl_fail(err, HL_ERR_FORMAT, "tensor '%s' has shape %s, expected %s", name, got,
                       want);
    }
    *out = t;
    return HL_OK;
}

enum { NEED_MATMUL = 1, NEED_DEQUANT = 2 };

/* ne2 > 1: a 3-D tensor {n_cols, n_rows, ne2}, loaded as one matrix of n_rows * ne2 rows. */
static hl_status get_weight(const model_loader *L, const char *name, int64_t n_cols,
                            int64_t n_rows, int64_t ne2, bool required, int need,
                            model_weight *out, hl_err *err) {
    memset(out, 0, sizeof *out);
    const gguf_tensor *t;
    int64_t ne[3] = {n_cols, n_rows, ne2};
    hl_status st = find_tensor(L, name, ne2 > 1 ? 3 : 2, ne, required, &t, err);
    if (st || !t) return st;
    const hl_type_traits *tr = hl_type_traits_get(t->type);
    if (!tr)
        return hl_fail(err, HL_ERR_UNSUPPORTED, "tensor '%s' has unknown type %u", name, t->type);
    if ((need & NEED_MATMUL) && !tr->can_matmul)
        return hl_fail(err, HL_ERR_UNSUPPORTED,
                       "tensor '%s' has type %s, which the matmul kernels do not support", name,
                       tr->name);
    if ((need & NEED_DEQUANT) && !tr->can_dequantize)
        return hl_fail(err, HL_ERR_UNSUPPORTED,
                       "tensor '%s' has type %s, which cannot be dequantized", name, tr->name);
    size_t row = hl_row_size(t->type, n_cols);
    const int64_t all_rows = n_rows * ne2;
    if (row == 0 || t->n_bytes / row != (uint64_t)all_rows || t->n_bytes % row != 0)
        return hl_fail(err, HL_ERR_FORMAT,
                       "tensor '%s' (%s) has %llu bytes, expected %lld rows of %zu", name, tr->name,
                       (unsigned long long)t->n_bytes, (long long)all_rows, row);
    *out = (model_weight){.type = t->type, .n_rows = all_rows, .n_cols = n_cols,
                          .ne = {n_cols, n_rows, ne2, 1}, .data = t->data};
    return HL_OK;
}

/* 1-D f32 tensors (norm weights, biases). */
/* An f32 tensor read as a whole: a vector, or (ne1 > 1) a small matrix [ne1][ne0]. */
static hl_status get_vector(const model_loader *L, const char *name, int64_t ne0, int64_t ne1,
                            bool required, const float **out, hl_err *err) {
    *out = NULL;
    const gguf_tensor *t;
    const int64_t ne[2] = {ne0, ne1};
    hl_status st = find_tensor(L, name, ne1 > 1 ? 2 : 1, ne, required, &t, err);
    if (st || !t) return st;
    if (t->type != HL_TYPE_F32)
        return hl_fail(err, HL_ERR_UNSUPPORTED, "tensor '%s' has type %s, expected f32", name,
                       hl_type_name(t->type));
    if (((uintptr_t)t->data & 3) != 0)
        return hl_fail(err, HL_ERR_FORMAT, "tensor '%s' data is not 4-byte aligned", name);
    *out = t->data;
    return HL_OK;
}

/* A shape code's value for layer l (-1: global tensors, which see layer 0's values). */
static int64_t model_dim(const model *m, int32_t l, uint8_t code) {
    const model_hparams *hp = &m->hp;
    const model_layer_hp *h = &m->lhp[l < 0 ? 0 : l];
    switch (code) {
    case MD_ONE: return 1;
    case MD_EMBD: return hp->n_embd;
    case MD_VOCAB: return hp->n_vocab;
    case MD_FF: return h->n_ff;
    case MD_Q: return (int64_t)h->n_head * h->head_dim_k;
    case MD_KVK: return (int64_t)h->n_head_kv * h->head_dim_k;
    case MD_KVV: return (int64_t)h->n_head_kv * h->head_dim_v;
    case MD_O: return (int64_t)h->n_head * h->head_dim_v;
    case MD_HEAD_K: return h->head_dim_k;
    case MD_ROT2: return hp->n_rot / 2;
    case MD_QKV:
        return (int64_t)h->n_head * h->head_dim_k + (int64_t)h->n_head_kv * h->head_dim_k +
               (int64_t)h->n_head_kv * h->head_dim_v;
    case MD_FF2: return 2 * (int64_t)h->n_ff;
    case MD_CTX: return hp->n_ctx_train;
    case MD_TYPES: return m->x.n_token_types;
    case MD_PL: return m->x.n_embd_per_layer;
    case MD_PL_ALL: return (int64_t)m->x.n_embd_per_layer * hp->n_layer;
    case MD_Q2: return 2 * (int64_t)h->n_head * h->head_dim_k;
    case MD_SSM_CONV_K: return h->state_floats ? m->x.ssm_d_conv : 0;
    case MD_SSM_CONV_CH:
        return h->state_floats
                   ? m->x.ssm_d_inner + 2 * (int64_t)m->x.ssm_n_group * m->x.ssm_d_state
                   : 0;
    case MD_SSM_INNER: return h->state_floats ? m->x.ssm_d_inner : 0;
    case MD_SSM_HEADS: return h->state_floats ? m->x.ssm_dt_rank : 0;
    case MD_SSM_HEAD_V:
        return h->state_floats && m->x.ssm_dt_rank ? m->x.ssm_d_inner / m->x.ssm_dt_rank : 0;
    case MD_EXPERTS: return m->x.n_expert;
    case MD_FF_EXP: return m->x.n_ff_exp;
    case MD_SSM_INNER3: return h->state_floats ? 3 * (int64_t)m->x.ssm_d_inner : 0;
    case MD_SSM_IN_M2:
        return h->state_floats ? 2 * (int64_t)m->x.ssm_d_inner +
                                     2 * (int64_t)m->x.ssm_n_group * m->x.ssm_d_state +
                                     m->x.ssm_dt_rank
                               : 0;
    case MD_SSM_GROUPS: return h->state_floats ? m->x.ssm_n_group : 0;
    case MD_SSM_GROUP_INNER:
        return h->state_floats && m->x.ssm_n_group ? m->x.ssm_d_inner / m->x.ssm_n_group : 0;
    case MD_HEADS: return h->n_head;
    case MD_FF_SHEXP: return m->x.n_ff_shexp;
    default: return code >= MD_ARCH && m->arch->dim ? m->arch->dim(m, l, code) : -1;
    }
}

hl_status model_add_mat(model *m, const model_weight *w, hl_err *err) {
    if (m->n_mats % 64 == 0) {
        const model_weight **n = realloc((void *)m->mats, (size_t)(m->n_mats + 64) * sizeof *n);
        if (!n) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
        m->mats = n;
    }
    m->mats[m->n_mats++] = w;
    return HL_OK;
}

/* Loads one table row for layer l (-1: a global tensor). */
static hl_status load_spec(model_loader *L, const model_tensor_spec *sp, int32_t l, hl_err *err) {
    model *m = L->m;
    char name[128];
    snprintf(name, sizeof name, sp->name, (int)l);
    uint8_t *base = l >= 0 ? (uint8_t *)&m->layers[l] : (uint8_t *)m;
    const bool required = !(sp->flags & MT_OPT);
    const int64_t ne0 = model_dim(m, l, sp->ne0), ne1 = model_dim(m, l, sp->ne1);
    if (ne0 <= 0 || ne1 <= 0) {
        /* a dimension this layer does not have (no KV heads, no per-layer inputs) */
        if (gguf_find_tensor(L->f, name))
            return hl_fail(err, HL_ERR_FORMAT, "unexpected tensor '%s' (the hyperparameters give "
                           "it no size)", name);
        return HL_OK;
    }
    hl_status st;
    const int kind = sp->flags & 0x0f;
    if (kind == MT_VEC) {
        const float **v = (const float **)(void *)(base + sp->off);
        if ((st = get_vector(L, name, ne0, ne1, required, v, err))) return st;
        if (*v) m->tensor_bytes += (size_t)(ne0 * ne1) * sizeof(float);
        return HL_OK;
    }
    model_weight *w = (model_weight *)(void *)(base + sp->off);
    const int64_t ne2 = (sp->flags & MT_EXPERTS) ? m->x.n_expert
                        : (sp->flags & MT_HEADS) ? m->lhp[l < 0 ? 0 : l].n_head
                                                 : 1;
    if (ne2 <= 0) return hl_fail(err, HL_ERR_FORMAT, "tensor '%s' needs an expert count", name);
    if ((st = get_weight(L, name, ne0, ne1, ne2, required,
                         kind == MT_MAT ? NEED_MATMUL : NEED_DEQUANT, w, err)))
        return st;
    if (!w->data) return HL_OK;
    m->tensor_bytes += hl_row_size(w->type, w->n_cols) * (size_t)w->n_rows;
    return kind == MT_MAT ? model_add_mat(m, w, err) : HL_OK;
}

static hl_status load_tensors(model_loader *L, hl_err *err) {
    model *m = L->m;
    model_hparams *hp = &m->hp;
    hl_status st;
    const gguf_tensor *emb = gguf_find_tensor(L->f, "token_embd.weight");
    if (!emb) return hl_fail(err, HL_ERR_FORMAT, "missing tensor 'token_embd.weight'");
    if (emb->ne[1] <= 0 || emb->ne[1] > INT32_MAX / 2)
        return hl_fail(err, HL_ERR_FORMAT, "tensor 'token_embd.weight' has a bad vocabulary size");
    hp->n_vocab = (int32_t)emb->ne[1];
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return hl_fail(err, HL_ERR_NOMEM, "out of memory for %d layers", hp->n_layer);
    const model_arch_desc *a = m->arch;
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const model_tensor_spec *sp = &a->tensors[i];
        if (!(sp->flags & MT_LAYER)) {
            if ((st = load_spec(L, sp, -1, err))) return st;
            continue;
        }
        for (int32_t l = 0; l < hp->n_layer; l++)
            if ((st = load_spec(L, sp, l, err))) return st;
    }
    /* a tied output reads the embedding table through the matmul kernels */
    if (!m->output.data && !a->no_output) {
        const hl_type_traits *tr = hl_type_traits_get(m->tok_embd.type);
        if (!tr->can_matmul)
            return hl_fail(err, HL_ERR_UNSUPPORTED,
                           "tensor 'token_embd.weight' (tied output) has type %s, which the "
                           "matmul kernels do not support", tr->name);
        m->output = m->tok_embd;
        if ((st = model_add_mat(m, &m->output, err))) return st;
    }
    return HL_OK;
}

/* A matmul weight the kernels run faster in a layout of their own (kern_packed_type);
 * the embedding tables (a tied output is one) keep the file's layout for row lookups. */
static hl_type packed_type_for(const model *m, const model_weight *w) {
    if (!w->data || w->data == m->tok_embd.data || w->data == m->pl_tok_embd.data)
        return (hl_type)w->type;
    return kern_packed_type((hl_type)w->type, w->ne[1]);
}

/* Rewrites those weights in place, once, before any use: the memory is private (read in,
 * or a private mapping whose written pages are copied), so the file never changes. A
 * GGUF in the caller's memory keeps the file layout. */
static hl_status repack_weights(model *m, hl_err *err) {
    size_t tmp_bytes = 0;
    for (int32_t i = 0; i < m->n_mats; i++) {
        const model_weight *w = m->mats[i];
        const size_t b = 8 * hl_row_size(w->type, w->n_cols);
        if (packed_type_for(m, w) != (hl_type)w->type && b > tmp_bytes) tmp_bytes = b;
    }
    hl_err ignored;
    if (!tmp_bytes || gguf_set_writable(m->gguf, true, &ignored)) return HL_OK;
    void *tmp = malloc(tmp_bytes);
    if (!tmp) {
        gguf_set_writable(m->gguf, false, &ignored);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    for (int32_t i = 0; i < m->n_mats; i++) {
        model_weight *w = (model_weight *)m->mats[i];
        const hl_type pt = packed_type_for(m, w);
        if (pt == (hl_type)w->type) continue;
        bool done = false; /* another entry for the same tensor already rewrote it */
        for (int32_t k = 0; k < i && !done; k++)
            done = m->mats[k]->data == w->data && m->mats[k]->type == (uint32_t)pt;
        if (done || kern_repack(pt, (void *)w->data, w->n_rows, w->n_cols, tmp)) w->type = pt;
    }
    free(tmp);
    return gguf_set_writable(m->gguf, false, err);
}

/* The model's KV geometry: per-layer heads and sizes; layers that read another layer's
 * cache store nothing. */
hl_status model_build_kv_geom(model *m, hl_err *err) {
    const int32_t n = m->hp.n_layer;
    m->state_floats = 0;
    for (int32_t l = 0; l < n; l++) {
        m->lhp[l].state_off = m->state_floats;
        m->state_floats += m->lhp[l].state_floats;
    }
    kv_layer_dims *dims = calloc((size_t)n, sizeof *dims);
    kv_layer_dims *part = calloc((size_t)n, sizeof *part);
    m->layer_slot = calloc((size_t)n, sizeof *m->layer_slot);
    hl_status st = HL_OK;
    if (!dims || !part || !m->layer_slot) st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
    m->n_kv_slots = 1;
    for (int32_t l = 0; !st && l < n; l++) {
        const model_layer_hp *h = &m->lhp[l];
        if (h->kv_src < 0 || h->kv_src >= n || m->lhp[h->kv_src].kv_src != h->kv_src)
            st = hl_fail(err, HL_ERR_FORMAT, "layer %d reads the KV of layer %d, which has none",
                         l, h->kv_src);
        else if (h->kv_src == l)
            dims[l] = (kv_layer_dims){h->n_head_kv, h->head_dim_k, h->head_dim_v};
        const int32_t w = st ? 0 : m->lhp[h->kv_src].window;
        m->layer_slot[l] = w > 0;
        if (w > 0) m->n_kv_slots = 2;
        if (w > m->kv_window) m->kv_window = w;
    }
    /* a slot needs a layer that stores KV: all-windowed models keep one slot */
    bool any_full = false, any_kv = false;
    for (int32_t l = 0; l < n; l++) any_kv |= dims && dims[l].n_head_kv > 0;
    if (!st && !any_kv) { /* a pure recurrent model: no KV rows at all */
        free(dims);
        free(part);
        m->n_kv_slots = 0;
        return HL_OK;
    }
    for (int32_t l = 0; !st && l < n; l++) any_full |= dims[l].n_head_kv > 0 && !m->layer_slot[l];
    if (!any_full) {
        m->n_kv_slots = 1;
        if (m->layer_slot) memset(m->layer_slot, 0, (size_t)n);
    }
    if (!st) st = kv_geom_init(&m->kv, n, dims, HL_TYPE_F32, HL_TYPE_F32, err);
    for (int32_t slot = 0; !st && slot < m->n_kv_slots; slot++) {
        for (int32_t l = 0; l < n; l++)
            part[l] = m->layer_slot[l] == slot ? dims[l] : (kv_layer_dims){0, 0, 0};
        st = kv_geom_init(&m->kv_slot[slot], n, part, HL_TYPE_F32, HL_TYPE_F32, err);
    }
    free(dims);
    free(part);
    return st;
}

int32_t model_kv_slots(const model *m) { return m->n_kv_slots; }
bool model_has_kv(const model *m) { return m->n_kv_slots > 0; }
size_t model_state_floats(const model *m) { return (size_t)m->state_floats; }
int32_t model_kv_window(const model *m) { return m->n_kv_slots > 1 ? m->kv_window : 0; }
const kv_geom *model_kv_slot_geom(const model *m, int32_t slot) {
    return slot >= 0 && slot < m->n_kv_slots ? &m->kv_slot[slot] : NULL;
}

hl_status model_load_gguf_file(gguf_file *f, model **out, hl_err *err) {
    *out = NULL;
    kern_init(); /* type traits' can_* flags are filled in by the kernels */
    model *m = calloc(1, sizeof *m);
    if (!m) {
        gguf_close(f);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    m->gguf = f;
    hl_status st;
    gguf_str arch;
    if (!gguf_get_str(f, "general.architecture", &arch)) {
        st = hl_fail(err, HL_ERR_FORMAT, "missing metadata key 'general.architecture'");
        goto fail;
    }
    m->arch = arch_find(arch);
    if (!m->arch) {
        st = hl_fail(err, HL_ERR_UNSUPPORTED,
                     "unsupported model architecture '%.*s' (supported: %s)",
                     (int)(arch.len > 64 ? 64 : arch.len), arch.ptr ? arch.ptr : "",
                     model_supported_archs());
        goto fail;
    }
    char prefix[72];
    snprintf(prefix, sizeof prefix, "%.*s", (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    model_loader L = {.f = f, .prefix = prefix, .m = m};
    m->hp.arch = m->arch->name;
    m->hp.rope_kind = m->arch->rope_kind;
    if ((st = read_hparams(&L, err))) goto fail;
    if (m->arch->read_hparams && (st = m->arch->read_hparams(&L, err))) goto fail;
    if ((st = load_tensors(&L, err))) goto fail;
    if (m->arch->check && (st = m->arch->check(&L, err))) goto fail;
    if ((st = repack_weights(m, err))) goto fail;
    if ((st = model_build_kv_geom(m, err))) goto fail;
    if ((st = tok_vocab_load_gguf(f, &m->vocab, err))) {
        hl_err_prefix(err, "tokenizer");
        goto fail;
    }
    if (tok_vocab_n_tokens(m->vocab) > m->hp.n_vocab) {
        st = hl_fail(err, HL_ERR_FORMAT, "tokenizer has %d tokens but the model only %d",
                     tok_vocab_n_tokens(m->vocab), m->hp.n_vocab);
        goto fail;
    }
    *out = m;
    return HL_OK;
fail:
    model_free(m);
    return st;
}

static hl_status load_gguf(const char *path, bool use_mmap, model **out, hl_err *err) {
    *out = NULL;
    gguf_file *f;
    hl_status st = use_mmap ? gguf_open(path, &f, err) : gguf_open_read(path, &f, err);
    if (st) return st;
    st = model_load_gguf_file(f, out, err);
    if (st) hl_err_prefix(err, "%s", path);
    return st;
}

hl_status model_load_gguf(const char *path, model **out, hl_err *err) {
    return load_gguf(path, false, out, err);
}

hl_status model_load(const char *path, const char *tokenizer_path, model **out, hl_err *err) {
    return model_load_ex(path, tokenizer_path, NULL, out, err);
}

hl_status model_load_ex(const char *path, const char *tokenizer_path, const model_load_opts *opts,
                        model **out, hl_err *err) {
    const bool use_mmap = opts && opts->use_mmap;
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return hl_fail(err, HL_ERR_IO, "cannot open '%s'", path);
    uint8_t magic[4] = {0};
    size_t n = fread(magic, 1, 4, fp);
    fclose(fp);
    if (n == 4 && memcmp(magic, "GGUF", 4) == 0) {
        if (tokenizer_path)
            return hl_fail(err, HL_ERR_INVALID,
                           "a GGUF model has its own tokenizer; do not pass a tokenizer file");
        return load_gguf(path, use_mmap, out, err);
    }
    if (!tokenizer_path)
        return hl_fail(err, HL_ERR_INVALID,
                       "'%s' is not a GGUF file; a llama2.c checkpoint needs a tokenizer file",
                       path);
    return model_load_llama2c_ex(path, tokenizer_path, opts, out, err);
}
