/*
 * layout.c - KV geometry: per-layer offsets of key and value rows (layout.h).
 */
#include "kv/layout.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define KV_MAX_DIM (1 << 20)

bool kv_type_supported(hl_type t) {
    return t == HL_TYPE_F32 || t == HL_TYPE_F16 || t == HL_TYPE_Q8_0;
}

bool kv_type_parse(const char *s, hl_type *out) {
    static const struct {
        const char *name;
        hl_type t;
    } names[] = {{"f32", HL_TYPE_F32}, {"f16", HL_TYPE_F16}, {"q8_0", HL_TYPE_Q8_0}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (s && strcasecmp(s, names[i].name) == 0) {
            *out = names[i].t;
            return true;
        }
    return false;
}

void kv_geom_free(kv_geom *g) {
    if (!g) return;
    free(g->dims);
    free(g->k_off);
    free(g->v_off);
    free(g->k_row);
    free(g->v_row);
    memset(g, 0, sizeof *g);
}

hl_status kv_geom_init(kv_geom *g, int32_t n_layer, const kv_layer_dims *dims, hl_type k_type,
                       hl_type v_type, hl_err *err) {
    memset(g, 0, sizeof *g);
    if (n_layer <= 0 || n_layer > 65536 || !dims)
        return hl_fail(err, HL_ERR_INVALID, "invalid KV geometry: %d layers", n_layer);
    if (!kv_type_supported(k_type) || !kv_type_supported(v_type))
        return hl_fail(err, HL_ERR_UNSUPPORTED, "KV cache type %s/%s is not supported",
                       hl_type_name(k_type), hl_type_name(v_type));
    const size_t n = (size_t)n_layer;
    g->n_layer = n_layer;
    g->k_type = k_type;
    g->v_type = v_type;
    g->dims = malloc(n * sizeof *g->dims);
    g->k_off = malloc(n * sizeof *g->k_off);
    g->v_off = malloc(n * sizeof *g->v_off);
    g->k_row = malloc(n * sizeof *g->k_row);
    g->v_row = malloc(n * sizeof *g->v_row);
    if (!g->dims || !g->k_off || !g->v_off || !g->k_row || !g->v_row) {
        kv_geom_free(g);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    memcpy(g->dims, dims, n * sizeof *dims);
    size_t k_total = 0, v_total = 0, any = 0;
    for (size_t l = 0; l < n; l++) {
        const kv_layer_dims *d = &dims[l];
        const bool bad = d->n_head_kv < 0 || d->n_head_kv > KV_MAX_DIM ||
                         (d->n_head_kv > 0 && (d->head_dim_k <= 0 || d->head_dim_v <= 0 ||
                                               d->head_dim_k > KV_MAX_DIM ||
                                               d->head_dim_v > KV_MAX_DIM));
        size_t rk = d->n_head_kv ? hl_row_size(k_type, d->head_dim_k) : 0;
        size_t rv = d->n_head_kv ? hl_row_size(v_type, d->head_dim_v) : 0;
        if (bad || (d->n_head_kv && (rk == 0 || rv == 0))) {
            kv_geom_free(g);
            return hl_fail(err, HL_ERR_INVALID,
                           "invalid KV shape for layer %zu: %d heads of %d/%d (%s/%s)", l,
                           d->n_head_kv, d->head_dim_k, d->head_dim_v, hl_type_name(k_type),
                           hl_type_name(v_type));
        }
        g->k_row[l] = rk;
        g->v_row[l] = rv;
        g->k_off[l] = k_total;
        k_total += (size_t)d->n_head_kv * rk;
        v_total += (size_t)d->n_head_kv * rv;
        any += (size_t)d->n_head_kv;
    }
    if (any == 0) {
        kv_geom_free(g);
        return hl_fail(err, HL_ERR_INVALID, "invalid KV geometry: no layer stores KV");
    }
    size_t v_run = k_total;
    for (size_t l = 0; l < n; l++) {
        g->v_off[l] = v_run;
        v_run += (size_t)dims[l].n_head_kv * g->v_row[l];
    }
    g->bytes_per_pos = k_total + v_total;
    return HL_OK;
}

hl_status kv_geom_copy(kv_geom *dst, const kv_geom *src, hl_err *err) {
    return kv_geom_init(dst, src->n_layer, src->dims, src->k_type, src->v_type, err);
}
