/*
 * layout.h - where each key and value row lives inside a KV buffer: the one place that
 * does this address math, for the block pool (block.h) and the forward pass alike.
 *
 * A KV buffer holds `B` consecutive positions of every layer that stores KV. Keys come
 * first, layer by layer, then values:
 *     K: for each layer l: [n_head_kv(l)][B][row_k(l)], then
 *     V: for each layer l: [n_head_kv(l)][B][row_v(l)]
 * so attention reads one head's keys of a buffer contiguously. A row is one head at one
 * position: head_dim elements of the K (or V) element type (f32, f16 or q8_0 blocks).
 *
 * f16 keys are stored by columns inside tiles of KV_K_TILE positions: a head's keys at
 * positions [t, t + w) of a buffer (t a multiple of KV_K_TILE, w = min(KV_K_TILE, B - t))
 * fill the same bytes their w rows would, element d of position t + j at d * w + j. A
 * decode step then scores 8 keys per vector lane-wise (each score one chain of fmas over
 * the head's elements) instead of 8 elements of one key with a horizontal sum per key:
 * ~30% less time for the scores (bench/README.md, "Keys by columns"). kv_geom_k gives the
 * address of a key's element 0 and kv_geom_k_stride the distance of its elements.
 * Layers may differ in heads and head sizes (gemma4); a layer with 0 KV heads stores
 * nothing (it reads another layer's cache). B is a parameter of each address, so the same
 * geometry serves blocks of the pool (B = block_tokens) and a contiguous cache of n_ctx
 * positions (B = n_ctx).
 *
 * kv_geom_init builds the per-layer offsets once (it allocates; kv_geom_free releases);
 * the address functions are then a multiply-add each.
 */
#ifndef HL_KV_LAYOUT_H
#define HL_KV_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tensor/types.h"

/* One layer's KV shape. n_head_kv 0: the layer keeps no cache of its own. */
typedef struct kv_layer_dims {
    int32_t n_head_kv;
    int32_t head_dim_k;
    int32_t head_dim_v;
} kv_layer_dims;

typedef struct kv_geom {
    int32_t n_layer;
    hl_type k_type, v_type;
    kv_layer_dims *dims; /* [n_layer] */
    size_t *k_off;       /* [n_layer] bytes per position before layer l's K part */
    size_t *v_off;       /* [n_layer] bytes per position before layer l's V part */
    size_t *k_row;       /* [n_layer] bytes of one key row */
    size_t *v_row;       /* [n_layer] bytes of one value row */
    size_t bytes_per_pos; /* all layers, K and V */
} kv_geom;

/* True for the element types a KV cache can hold: f32, f16, q8_0 (q8_0 needs head
 * sizes that are multiples of 32). */
bool kv_type_supported(hl_type t);
/* Parses "f32", "f16", "q8_0" (case-insensitive). */
bool kv_type_parse(const char *s, hl_type *out);

/* dims[n_layer] is copied. Fails on empty or oversized shapes, or a type the head sizes
 * cannot hold. */
hl_status kv_geom_init(kv_geom *g, int32_t n_layer, const kv_layer_dims *dims, hl_type k_type,
                       hl_type v_type, hl_err *err);
/* A copy of src (deep). */
hl_status kv_geom_copy(kv_geom *dst, const kv_geom *src, hl_err *err);
void kv_geom_free(kv_geom *g); /* accepts a zeroed geom */

enum { KV_K_TILE = 32 };

/* True when keys are stored by columns (f16 keys). */
static inline bool kv_geom_k_cols(const kv_geom *g) { return g->k_type == HL_TYPE_F16; }

/* Elements between consecutive elements of the key at `row`: its tile's width for keys by
 * columns, 1 for rows. Keys of one tile are adjacent (key row + 1 is one element on). */
static inline int32_t kv_geom_k_stride(const kv_geom *g, int32_t B, int32_t row) {
    if (!kv_geom_k_cols(g)) return 1;
    const int32_t t = row - row % KV_K_TILE;
    return B - t < KV_K_TILE ? B - t : KV_K_TILE;
}

/* The key of `head` at `row`: its first element (keys by columns) or its row. */
static inline uint8_t *kv_geom_k(const kv_geom *g, void *base, int32_t B, int32_t layer,
                                 int32_t head, int32_t row) {
    uint8_t *h = (uint8_t *)base + (size_t)B * g->k_off[layer] +
                 (size_t)head * (size_t)B * g->k_row[layer];
    if (!kv_geom_k_cols(g)) return h + (size_t)row * g->k_row[layer];
    const int32_t t = row - row % KV_K_TILE;
    return h + (size_t)t * g->k_row[layer] + (size_t)(row - t) * sizeof(uint16_t);
}

static inline uint8_t *kv_geom_v(const kv_geom *g, void *base, int32_t B, int32_t layer,
                                 int32_t head, int32_t row) {
    return (uint8_t *)base + (size_t)B * g->v_off[layer] +
           ((size_t)head * (size_t)B + (size_t)row) * g->v_row[layer];
}

#endif
