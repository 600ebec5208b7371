/*
 * forward.c - evaluation: the per-sequence KV cache, the evaluation context, and the
 * driver that turns eval calls into batches for an architecture's forward pass.
 *
 * A batch is a list of tokens, each with its id, position and sequence, and per sequence
 * a KV view (block table and geometry). The architecture's forward (llama.c, gemma.c, ...)
 * runs the layers and leaves the last residual stream in c->x; the driver then applies
 * the output norm to the rows whose logits are wanted, the output matmul and the final
 * softcap, or pools the hidden states for embeddings.
 */
#include "model/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "model/ops.h"
#include "tensor/types.h"

#define MODEL_DEFAULT_BATCH 512
#define MODEL_MAX_BATCH 8192

/* ---- KV cache ---- */

/* A contiguous cache is a block table with one block of n_ctx positions. */
struct model_kv {
    const model *m;
    int32_t n_ctx; /* capacity */
    int32_t len;
    kv_geom geom; /* m->kv's shapes with the cache's element types (empty: no KV rows) */
    void *data;   /* laid out by geom with B = n_ctx (NULL: the model keeps no KV rows) */
    float *state; /* recurrent state as of len (NULL: none) */
};

hl_status model_kv_create(const model *m, int32_t n_ctx, model_kv **out, hl_err *err) {
    return model_kv_create_ex(m, n_ctx, HL_TYPE_F32, HL_TYPE_F32, out, err);
}

hl_status model_kv_create_ex(const model *m, int32_t n_ctx, hl_type k_type, hl_type v_type,
                             model_kv **out, hl_err *err) {
    *out = NULL;
    if (n_ctx <= 0)
        return hl_fail(err, HL_ERR_INVALID, "context size must be positive, got %d", n_ctx);
    model_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    kv->m = m;
    kv->n_ctx = n_ctx;
    hl_status st = HL_OK;
    if (m->n_kv_slots > 0) {
        st = kv_geom_init(&kv->geom, m->kv.n_layer, m->kv.dims, k_type, v_type, err);
        if (!st) st = model_check_kv_geom(m, &kv->geom, err);
    }
    if (st) {
        model_kv_free(kv);
        return st;
    }
    size_t bytes;
    bool ok = true;
    if (m->n_kv_slots > 0)
        ok = !__builtin_mul_overflow(kv->geom.bytes_per_pos, (size_t)n_ctx, &bytes) &&
             (kv->data = calloc(1, bytes)) != NULL;
    if (ok && m->state_floats > 0)
        ok = (kv->state = calloc((size_t)m->state_floats, sizeof(float))) != NULL;
    if (!ok) {
        model_kv_free(kv);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory for a KV cache of %d tokens", n_ctx);
    }
    *out = kv;
    return HL_OK;
}

void model_kv_free(model_kv *kv) {
    if (!kv) return;
    free(kv->data);
    free(kv->state);
    kv_geom_free(&kv->geom);
    free(kv);
}

float *model_kv_state(model_kv *kv) { return kv->state; }

int32_t model_kv_len(const model_kv *kv) { return kv->len; }
int32_t model_kv_capacity(const model_kv *kv) { return kv->n_ctx; }
size_t model_kv_bytes(const model_kv *kv) { return kv->geom.bytes_per_pos * (size_t)kv->n_ctx; }

hl_status model_kv_truncate(model_kv *kv, int32_t n, hl_err *err) {
    if (n < 0 || n > kv->len)
        return hl_fail(err, HL_ERR_INVALID, "cannot truncate a KV cache of %d tokens to %d",
                       kv->len, n);
    if (kv->state && n != kv->len) {
        if (n != 0)
            return hl_fail(err, HL_ERR_UNSUPPORTED,
                           "a recurrent state cannot be rewound (from %d to %d tokens)", kv->len,
                           n);
        memset(kv->state, 0, (size_t)kv->m->state_floats * sizeof(float));
    }
    kv->len = n; /* positions >= n are overwritten by the next eval */
    return HL_OK;
}

/* ---- context ---- */

static float *alloc_floats(size_t a, size_t b) {
    size_t n;
    if (__builtin_mul_overflow(a, b, &n)) return NULL;
    return calloc(n ? n : 1, sizeof(float)); /* 0: a buffer no layer uses (mamba2's q) */
}

/* The widest row of each activation buffer over all layers. */
typedef struct ctx_widths {
    size_t q, k, v, att, ff, head, rot2;
} ctx_widths;

static ctx_widths widths(const model *m) {
    ctx_widths w = {0};
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer_hp *h = &m->lhp[l];
        const size_t q = (size_t)h->n_head * (size_t)h->head_dim_k;
        const size_t k = (size_t)h->n_head_kv * (size_t)h->head_dim_k;
        const size_t v = (size_t)h->n_head_kv * (size_t)h->head_dim_v;
        const size_t att = (size_t)h->n_head * (size_t)h->head_dim_v;
#define MAX_(a, b) ((a) > (b) ? (a) : (b))
        w.q = MAX_(w.q, q);
        w.k = MAX_(w.k, k);
        w.v = MAX_(w.v, v);
        w.att = MAX_(w.att, att);
        /* fused projections land in gate before they are split: qkv, gate|up */
        w.ff = MAX_(w.ff, MAX_(2 * (size_t)h->n_ff, q + k + v));
        w.head = MAX_(w.head, MAX_((size_t)h->head_dim_k, (size_t)h->head_dim_v));
        w.rot2 = MAX_(w.rot2, (size_t)h->n_rot / 2);
#undef MAX_
    }
    if (w.rot2 == 0) w.rot2 = 1;
    return w;
}

hl_status model_ctx_create(const model *m, int n_threads, int32_t max_batch, model_ctx **out,
                           hl_err *err) {
    *out = NULL;
    if (max_batch <= 0) max_batch = MODEL_DEFAULT_BATCH;
    if (max_batch > MODEL_MAX_BATCH) max_batch = MODEL_MAX_BATCH;
    const model_hparams *hp = &m->hp;
    model_ctx *c = calloc(1, sizeof *c);
    if (!c) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    c->m = m;
    c->max_batch = max_batch;
    hl_status st = hl_pool_create(n_threads, &c->pool, err);
    if (st) {
        free(c);
        return st;
    }
    const size_t B = (size_t)max_batch, E = (size_t)hp->n_embd;
    const ctx_widths w = widths(m);
    c->extra_floats = m->arch && m->arch->extra_floats ? m->arch->extra_floats(m) : 0;
    c->x = alloc_floats(B, E);
    c->xb = alloc_floats(B, E);
    c->xc = alloc_floats(B, E);
    c->q = alloc_floats(B, w.q);
    c->k = alloc_floats(B, w.k);
    c->v = alloc_floats(B, w.v);
    c->att = alloc_floats(B, w.att);
    c->proj = alloc_floats(B, E);
    c->gate = alloc_floats(B, w.ff);
    c->up = alloc_floats(B, w.ff);
    c->extra = c->extra_floats ? alloc_floats(B, (size_t)c->extra_floats) : NULL;
    c->max_rot = (int32_t)w.rot2 * 2;
    bool rope_ok = true;
    for (int i = 0; i < MODEL_ROPE_TABLES; i++) {
        c->rope[i].cos = alloc_floats(B, w.rot2);
        c->rope[i].sin = alloc_floats(B, w.rot2);
        rope_ok = rope_ok && c->rope[i].cos && c->rope[i].sin;
    }
    c->head_tmp = alloc_floats(w.head, 1);
    const size_t n_th = (size_t)hl_pool_n_threads(c->pool);
    c->attn_tmp_floats = (size_t)op_attn_tmp_floats((int64_t)w.head);
    c->attn_tmp = alloc_floats(n_th, c->attn_tmp_floats);
    c->attn_part_floats = (size_t)OP_ATTN_PART_FLOATS;
    c->attn_part = alloc_floats(c->attn_part_floats, 1);
    c->logits = alloc_floats((size_t)hp->n_vocab, 1);
    c->tok_id = calloc(B, sizeof *c->tok_id);
    c->tok_pos = calloc(B, sizeof *c->tok_pos);
    c->tok_seq = calloc(B, sizeof *c->tok_seq);
    c->seq_kv = calloc(B, sizeof *c->seq_kv);
    c->seq_end = calloc(B, sizeof *c->seq_end);
    c->seq_first = calloc(B + 1, sizeof *c->seq_first);
    c->logit_rows = calloc(B, sizeof *c->logit_rows);
    size_t scratch = 0;
    for (int32_t i = 0; i < m->n_mats; i++) {
        const model_weight *mw = m->mats[i];
        size_t s = kern_matmul_scratch_size((hl_type)mw->type, mw->n_cols, max_batch);
        if (s > scratch) scratch = s;
    }
    c->mm_scratch = malloc(scratch ? scratch : 1);
    {
        size_t floats = B * (5 * E + w.q + w.k + w.v + w.att + 2 * w.ff +
                             2 * MODEL_ROPE_TABLES * w.rot2 + (size_t)c->extra_floats) +
                        w.head + (size_t)hp->n_vocab + n_th * c->attn_tmp_floats +
                        c->attn_part_floats;
        c->scratch_bytes = floats * sizeof(float) + (scratch ? scratch : 1) +
                           B * (5 * sizeof(int32_t) + sizeof(model_seq_views));
    }
    if (!c->x || !c->xb || !c->xc || !c->q || !c->k || !c->v || !c->att || !c->proj || !c->gate ||
        !c->up || (c->extra_floats && !c->extra) || !rope_ok || !c->head_tmp || !c->logits ||
        !c->attn_tmp || !c->attn_part ||
        !c->tok_id || !c->tok_pos || !c->tok_seq || !c->seq_kv || !c->seq_end || !c->seq_first || !c->logit_rows ||
        !c->mm_scratch) {
        model_ctx_free(c);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory for a batch of %d tokens", max_batch);
    }
    *out = c;
    return HL_OK;
}

void model_ctx_free(model_ctx *c) {
    if (!c) return;
    hl_pool_destroy(c->pool);
    float *bufs[] = {c->x,  c->xb,   c->xc,   c->q,        c->k,     c->v,
                     c->att, c->proj, c->gate, c->up,      c->extra, c->head_tmp,
                     c->logits, c->attn_tmp, c->attn_part};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    for (int i = 0; i < MODEL_ROPE_TABLES; i++) {
        free(c->rope[i].cos);
        free(c->rope[i].sin);
    }
    free(c->tok_id);
    free(c->tok_pos);
    free(c->tok_seq);
    free(c->seq_kv);
    free(c->seq_end);
    free(c->seq_first);
    free(c->logit_rows);
    free(c->mm_scratch);
    free(c);
}

int model_ctx_n_threads(const model_ctx *c) { return hl_pool_n_threads(c->pool); }
void model_ctx_set_n_ctx(model_ctx *c, int32_t n_ctx) { c->n_ctx_set = n_ctx > 0 ? n_ctx : 0; }
int32_t model_ctx_max_batch(const model_ctx *c) { return c->max_batch; }
size_t model_ctx_scratch_bytes(const model_ctx *c) { return c->scratch_bytes; }
const float *model_ctx_logits(const model_ctx *c) { return c->logits; }

/* ---- the driver ---- */

/* Normalises hidden row t of c->x with the output norm into out (n_embd floats). */
static void final_norm_row(const model_ctx *c, int32_t t, float *out) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    const float *x = c->x + (int64_t)t * E;
    if (!m->output_norm) memcpy(out, x, (size_t)E * sizeof *out);
    else if (m->x.layer_norm) op_layernorm(out, x, m->output_norm, m->output_norm_b, 1, E, m->x.norm_eps);
    else kern_rmsnorm(out, x, m->output_norm, E, m->x.norm_eps);
}

/* Runs the batch described by c->tok_id/tok_pos/tok_seq and c->seq_kv/seq_end. The
 * matmul results of a row do not depend on the other rows (kernels.h), so a token gets
 * the same result in any batch. Logits: for the n_rows tokens listed in rows (NULL:
 * every token), packed into out. */
static void forward_batch(model_ctx *c, int32_t n_tok, const int32_t *rows, int32_t n_rows,
                          float *out) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    hl_pool_burst_begin(c->pool); /* ~5 pool runs per layer follow back to back */
    for (int i = 0; i < MODEL_ROPE_TABLES; i++) c->rope[i].valid = false; /* new positions */
    m->arch->forward(c, n_tok);
    if (!rows) n_rows = n_tok;
    for (int32_t i = 0; i < n_rows; i++) final_norm_row(c, rows ? rows[i] : i, c->xb + i * E);
    if (n_rows > 0 && out) {
        op_linear(c, &m->output, NULL, c->xb, n_rows, out);
        op_softcap(out, (int64_t)n_rows * m->hp.n_vocab, m->x.final_softcap);
    }
    hl_pool_burst_end(c->pool);
}

static hl_status check_tokens(const model_ctx *c, const int32_t *tokens, int32_t n, hl_err *err) {
    const model_hparams *hp = &c->m->hp;
    if (n <= 0) return hl_fail(err, HL_ERR_INVALID, "no tokens to evaluate");
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return hl_fail(err, HL_ERR_INVALID,
                           "token %d (at index %d) is outside the vocabulary [0, %d)", tokens[i], i,
                           hp->n_vocab);
    return HL_OK;
}

/* The KV geometry a view uses must describe the layers `want` does, in element types the
 * attention reads (kv_type_supported; q8_0 keys up to MODEL_KV_Q8_MAX_HEAD_DIM). */
static hl_status check_geom(const kv_geom *want, const kv_geom *g, hl_err *err) {
    if (g == want) return HL_OK;
    if (g->n_layer != want->n_layer)
        return hl_fail(err, HL_ERR_INVALID,
                       "KV cache layout (%d layers) does not fit this model (%d layers)",
                       g->n_layer, want->n_layer);
    if (!kv_type_supported(g->k_type) || !kv_type_supported(g->v_type))
        return hl_fail(err, HL_ERR_UNSUPPORTED, "KV cache type %s/%s is not supported",
                       hl_type_name(g->k_type), hl_type_name(g->v_type));
    for (int32_t l = 0; l < g->n_layer; l++) {
        const kv_layer_dims *d = &g->dims[l];
        if (memcmp(d, &want->dims[l], sizeof *d) != 0)
            return hl_fail(err, HL_ERR_INVALID, "KV cache layout of layer %d does not fit this "
                           "model", l);
        if (d->n_head_kv > 0 && g->k_type == HL_TYPE_Q8_0 &&
            d->head_dim_k > MODEL_KV_Q8_MAX_HEAD_DIM)
            return hl_fail(err, HL_ERR_UNSUPPORTED,
                           "q8_0 keys of %d elements per head are not supported (at most %d)",
                           d->head_dim_k, MODEL_KV_Q8_MAX_HEAD_DIM);
    }
    return HL_OK;
}

hl_status model_check_kv_geom(const model *m, const kv_geom *g, hl_err *err) {
    return check_geom(&m->kv, g, err);
}

/* Positions must exist; non-causal models see a sequence's later tokens: it must come in
 * one piece. */
static hl_status check_whole(const model_ctx *c, int32_t len, int32_t n, hl_err *err) {
    /* absolute position embeddings (BERT) have a row per position and no more */
    if (c->m->pos_embd.data && (int64_t)len + n > c->m->pos_embd.n_rows)
        return hl_fail(err, HL_ERR_INVALID,
                       "input of %d tokens exceeds the model's %lld positions", len + n,
                       (long long)c->m->pos_embd.n_rows);
    if (c->m->x.causal) return HL_OK;
    if (len != 0)
        return hl_fail(err, HL_ERR_INVALID,
                       "this model attends in both directions: a sequence cannot be extended");
    if (n > c->max_batch)
        return hl_fail(err, HL_ERR_INVALID,
                       "input of %d tokens exceeds the batch size %d (an embedding model needs "
                       "the whole input in one batch)",
                       n, c->max_batch);
    return HL_OK;
}

/* One sequence's tokens in chunks of max_batch; positions follow kv->len. */
static void eval_chunks(model_ctx *c, model_seq_kv *kv, float *state, const int32_t *tokens,
                        int32_t n, float *all_logits) {
    const model_hparams *hp = &c->m->hp;
    for (int32_t done = 0; done < n;) {
        int32_t chunk = n - done < c->max_batch ? n - done : c->max_batch;
        c->seq_kv[0] = (model_seq_views){{*kv, *kv}, state};
        c->seq_end[0] = kv->len + done + chunk;
        c->n_seq = 1;
        c->seq_first[0] = 0;
        c->seq_first[1] = chunk;
        for (int32_t t = 0; t < chunk; t++) {
            c->tok_id[t] = tokens[done + t];
            c->tok_pos[t] = kv->len + done + t;
            c->tok_seq[t] = 0;
        }
        const bool last = done + chunk == n;
        const bool logits = c->m->output.data != NULL;
        if (all_logits && logits) {
            float *out = all_logits + (size_t)done * (size_t)hp->n_vocab;
            forward_batch(c, chunk, NULL, 0, out);
            if (last)
                memcpy(c->logits, out + (size_t)(chunk - 1) * (size_t)hp->n_vocab,
                       (size_t)hp->n_vocab * sizeof(float));
        } else {
            c->logit_rows[0] = chunk - 1;
            forward_batch(c, chunk, c->logit_rows, last && logits ? 1 : 0,
                          logits ? c->logits : NULL);
        }
        done += chunk;
    }
    kv->len += n;
}

hl_status model_eval(model_ctx *c, model_kv *kv, const int32_t *tokens, int32_t n,
                     float *all_logits, hl_err *err) {
    if (kv->m != c->m) return hl_fail(err, HL_ERR_INVALID, "KV cache belongs to another model");
    hl_status st = check_tokens(c, tokens, n, err);
    if (!st) st = check_whole(c, kv->len, n, err);
    if (st) return st;
    if (n > kv->n_ctx - kv->len)
        return hl_fail(err, HL_ERR_KV_FULL,
                       "%d tokens do not fit the context: %d of %d positions are used", n,
                       kv->len, kv->n_ctx);
    void *const blocks[1] = {kv->data};
    c->n_ctx_eval = c->n_ctx_set ? c->n_ctx_set : kv->n_ctx;
    model_seq_kv view = {.blocks = blocks, .B = kv->n_ctx, .len = kv->len, .geom = &kv->geom};
    eval_chunks(c, &view, kv->state, tokens, n, all_logits);
    kv->len = view.len;
    return HL_OK;
}

/* Whether g passed check_geom against want in this context before: the same object
 * with the same layer array, layer count and element types (a pool's geometry does not
 * change while the pool lives). */
static bool geom_seen(const model_ctx *c, const kv_geom *want, const kv_geom *g) {
    const int32_t n = c->n_geom_ok < MODEL_GEOM_SEEN ? c->n_geom_ok : MODEL_GEOM_SEEN;
    for (int32_t i = 0; i < n; i++)
        if (c->geom_ok[i].g == g && c->geom_ok[i].want == want &&
            c->geom_ok[i].dims == g->dims && c->geom_ok[i].n_layer == g->n_layer &&
            c->geom_ok[i].k_type == g->k_type && c->geom_ok[i].v_type == g->v_type)
            return true;
    return false;
}

/* check_geom once per geometry: its per-layer compare ran every batch. */
static hl_status check_geom_once(model_ctx *c, const kv_geom *want, const kv_geom *g,
                                 hl_err *err) {
    if (g == want || geom_seen(c, want, g)) return HL_OK;
    hl_status st = check_geom(want, g, err);
    if (st) return st;
    const int32_t i = c->n_geom_ok++ % MODEL_GEOM_SEEN;
    if (c->n_geom_ok >= 2 * MODEL_GEOM_SEEN) c->n_geom_ok -= MODEL_GEOM_SEEN; /* no overflow */
    c->geom_ok[i].g = g;
    c->geom_ok[i].want = want;
    c->geom_ok[i].dims = g->dims;
    c->geom_ok[i].n_layer = g->n_layer;
    c->geom_ok[i].k_type = g->k_type;
    c->geom_ok[i].v_type = g->v_type;
    return HL_OK;
}

/* slot -1: a view of every layer (the combined geometry); 0 or 1: that slot's. */
static hl_status check_view(model_ctx *c, const model_kv_view *kv, int32_t n, int32_t slot,
                            hl_err *err) {
    if (c->m->state_floats > 0 && slot <= 0 && !kv->state)
        return hl_fail(err, HL_ERR_INVALID, "this model keeps a recurrent state: the view needs it");
    if (c->m->n_kv_slots == 0) { /* no KV rows: only positions matter */
        if (kv->len < 0) return hl_fail(err, HL_ERR_INVALID, "invalid position %d", kv->len);
        return check_whole(c, kv->len, n, err);
    }
    if (kv->block_tokens <= 0 || kv->len < 0 || !kv->blocks)
        return hl_fail(err, HL_ERR_INVALID, "invalid KV block table");
    if ((int64_t)kv->len + n > (int64_t)kv->n_blocks * kv->block_tokens)
        return hl_fail(err, HL_ERR_KV_FULL,
                       "%d tokens do not fit the KV block table: %d of %lld positions are used",
                       n, kv->len, (long long)kv->n_blocks * kv->block_tokens);
    if (slot >= c->m->n_kv_slots)
        return hl_fail(err, HL_ERR_INVALID, "this model has no sliding-window cache slot");
    const kv_geom *want = slot < 0 ? &c->m->kv : &c->m->kv_slot[slot];
    if (slot >= 0 && !kv->geom)
        return hl_fail(err, HL_ERR_INVALID, "a cache slot's view needs its geometry");
    hl_status st = check_geom_once(c, want, kv->geom ? kv->geom : &c->m->kv, err);
    return st ? st : check_whole(c, kv->len, n, err);
}

hl_status model_eval_view(model_ctx *c, const model_kv_view *kv, const int32_t *tokens, int32_t n,
                          float *all_logits, hl_err *err) {
    hl_status st = check_tokens(c, tokens, n, err);
    if (!st) st = check_view(c, kv, n, -1, err);
    if (st) return st;
    model_seq_kv view = {.blocks = kv->blocks, .B = kv->block_tokens, .len = kv->len,
                         .geom = kv->geom ? kv->geom : &c->m->kv};
    c->n_ctx_eval = c->n_ctx_set; /* a block table's size is not its context's */
    eval_chunks(c, &view, kv->state, tokens, n, all_logits);
    return HL_OK;
}

/* Built on model_eval, so it works whatever KV layout the eval uses: after each chunk the
 * residual stream c->x still holds that chunk's final states (the logits step only
 * writes c->xb), which are normalised here exactly as the logits step normalises them. */
hl_status model_eval_hidden(model_ctx *c, model_kv *kv, const int32_t *tokens, int32_t n,
                            float *hidden, hl_err *err) {
    const int64_t E = c->m->hp.n_embd;
    if (n <= 0) return hl_fail(err, HL_ERR_INVALID, "no tokens to evaluate");
    hl_status st = check_whole(c, kv->len, n, err);
    if (st) return st;
    for (int32_t done = 0; done < n;) {
        int32_t chunk = n - done < c->max_batch ? n - done : c->max_batch;
        if ((st = model_eval(c, kv, tokens + done, chunk, NULL, err))) return st;
        for (int32_t t = 0; t < chunk; t++) final_norm_row(c, t, hidden + (int64_t)(done + t) * E);
        done += chunk;
    }
    return HL_OK;
}

hl_status model_eval_batch(model_ctx *c, const model_batch_entry *entries, int32_t n_entries,
                           float *logits, hl_err *err) {
    int64_t total = 0;
    if (n_entries <= 0 || !entries) return hl_fail(err, HL_ERR_INVALID, "empty batch");
    for (int32_t e = 0; e < n_entries; e++) {
        const model_batch_entry *b = &entries[e];
        hl_status st = check_tokens(c, b->tokens, b->n_tokens, err);
        if (!st) st = check_view(c, &b->kv, b->n_tokens, b->kv_window.blocks ? 0 : -1, err);
        if (!st && b->kv_window.blocks) {
            st = check_view(c, &b->kv_window, b->n_tokens, 1, err);
            if (!st && b->kv_window.len != b->kv.len)
                st = hl_fail(err, HL_ERR_INVALID, "the cache slots are at positions %d and %d",
                             b->kv.len, b->kv_window.len);
        }
        if (st) {
            hl_err_prefix(err, "batch entry %d", e);
            return st;
        }
        for (int32_t f = 0; f < e; f++)
            if ((b->kv.blocks && entries[f].kv.blocks == b->kv.blocks) ||
                (b->kv.state && entries[f].kv.state == b->kv.state))
                return hl_fail(err, HL_ERR_INVALID,
                               "batch entries %d and %d use the same block table", f, e);
        total += b->n_tokens;
    }
    if (total > c->max_batch)
        return hl_fail(err, HL_ERR_INVALID, "batch of %lld tokens exceeds the context's maximum %d",
                       (long long)total, c->max_batch);
    int32_t t = 0, n_rows = 0;
    for (int32_t e = 0; e < n_entries; e++) {
        const model_batch_entry *b = &entries[e];
        const model_seq_kv full = {.blocks = b->kv.blocks, .B = b->kv.block_tokens,
                                   .len = b->kv.len, .geom = b->kv.geom ? b->kv.geom : &c->m->kv};
        c->seq_kv[e].slot[0] = full;
        c->seq_kv[e].slot[1] = full;
        if (b->kv_window.blocks)
            c->seq_kv[e].slot[1] = (model_seq_kv){.blocks = b->kv_window.blocks,
                                                  .B = b->kv_window.block_tokens,
                                                  .len = b->kv_window.len,
                                                  .geom = b->kv_window.geom};
        c->seq_kv[e].state = b->kv.state;
        c->seq_end[e] = b->kv.len + b->n_tokens;
        c->seq_first[e] = t;
        for (int32_t i = 0; i < b->n_tokens; i++, t++) {
            c->tok_id[t] = b->tokens[i];
            c->tok_pos[t] = b->kv.len + i;
            c->tok_seq[t] = e;
        }
        if (b->want_logits) c->logit_rows[n_rows++] = t - 1;
    }
    c->n_seq = n_entries;
    c->seq_first[n_entries] = t;
    if (n_rows > 0 && !c->m->output.data)
        return hl_fail(err, HL_ERR_UNSUPPORTED, "this is an embedding model: it has no logits");
    c->n_ctx_eval = c->n_ctx_set;
    forward_batch(c, t, c->logit_rows, logits ? n_rows : 0, logits);
    /* c->x still holds every token's final residual stream (the logits step writes xb) */
    const int64_t E = c->m->hp.n_embd;
    t = 0;
    for (int32_t e = 0; e < n_entries; e++) {
        const model_batch_entry *b = &entries[e];
        for (int32_t i = 0; b->hidden && i < b->n_tokens; i++)
            final_norm_row(c, t + i, b->hidden + (int64_t)i * E);
        t += b->n_tokens;
    }
    return HL_OK;
}

hl_status model_embed(model_ctx *c, const int32_t *tokens, int32_t n, bool normalize, float *out,
                      hl_err *err) {
    const model *m = c->m;
    const int64_t E = m->hp.n_embd;
    if (n <= 0) return hl_fail(err, HL_ERR_INVALID, "no tokens to embed");
    model_kv *kv = NULL;
    float *hidden = malloc((size_t)n * (size_t)E * sizeof *hidden);
    if (!hidden) return hl_fail(err, HL_ERR_NOMEM, "out of memory for %d hidden states", n);
    hl_status st = model_kv_create(m, n, &kv, err);
    if (!st) st = model_eval_hidden(c, kv, tokens, n, hidden, err);
    model_kv_free(kv);
    if (!st) model_pool(m, hidden, n, normalize, out);
    free(hidden);
    return st;
}

void model_pool(const model *m, const float *hidden, int32_t n, bool normalize, float *out) {
    const int64_t E = m->hp.n_embd;
    switch (m->hp.pooling) {
    case MODEL_POOL_CLS: memcpy(out, hidden, (size_t)E * sizeof *out); break;
    case MODEL_POOL_LAST: memcpy(out, hidden + (size_t)(n - 1) * E, (size_t)E * sizeof *out); break;
    default:
        for (int64_t j = 0; j < E; j++) {
            double sum = 0;
            for (int32_t i = 0; i < n; i++) sum += hidden[(size_t)i * E + j];
            out[j] = (float)(sum / n);
        }
    }
    if (normalize) {
        double ss = 0;
        for (int64_t j = 0; j < E; j++) ss += (double)out[j] * out[j];
        if (ss > 0) {
            const float inv = (float)(1.0 / sqrt(ss));
            for (int64_t j = 0; j < E; j++) out[j] *= inv;
        }
    }
}
