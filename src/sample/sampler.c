/*
 * sampler.c - slots, options, history rings and the per-call driver. The per-row
 * numeric work (selection, penalties, filters, draws) is in sampler_row.c.
 */
#include "sample/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "sample/sampler_internal.h"

sampler_opts sampler_opts_defaults(void) {
    sampler_opts o;
    memset(&o, 0, sizeof o);
    o.temperature = 0.8f;
    o.top_k = 40;
    o.top_p = 0.9f;
    o.min_p = 0.0f;
    o.repeat_penalty = 1.0f;
    o.repeat_last_n = 64;
    o.seed = -1;
    o.order = SAMPLER_ORDER_REFERENCE;
    return o;
}

static hl_status check_float(const char *name, float v, hl_err *err) {
    if (!isfinite(v)) return hl_fail(err, HL_ERR_INVALID, "sampler option %s is not finite", name);
    return HL_OK;
}

hl_status sampler_validate_opts(const sampler_opts *o, hl_err *err) {
    if (!o) return hl_fail(err, HL_ERR_INVALID, "sampler options are NULL");
    hl_status st;
    if ((st = check_float("temperature", o->temperature, err)) != HL_OK) return st;
    if ((st = check_float("top_p", o->top_p, err)) != HL_OK) return st;
    if ((st = check_float("min_p", o->min_p, err)) != HL_OK) return st;
    if ((st = check_float("repeat_penalty", o->repeat_penalty, err)) != HL_OK) return st;
    if ((st = check_float("presence_penalty", o->presence_penalty, err)) != HL_OK) return st;
    if ((st = check_float("frequency_penalty", o->frequency_penalty, err)) != HL_OK) return st;
    if (o->temperature < 0)
        return hl_fail(err, HL_ERR_INVALID, "sampler option temperature %g is negative",
                       (double)o->temperature);
    if (o->top_logprobs < 0 || o->top_logprobs > SAMPLER_MAX_TOP_LOGPROBS)
        return hl_fail(err, HL_ERR_INVALID, "top_logprobs must be between 0 and %d (got %d)",
                       SAMPLER_MAX_TOP_LOGPROBS, (int)o->top_logprobs);
    if (o->repeat_last_n > SAMPLER_MAX_WINDOW)
        return hl_fail(err, HL_ERR_INVALID, "repeat_last_n %d is larger than the maximum %d",
                       (int)o->repeat_last_n, SAMPLER_MAX_WINDOW);
    if (o->order != SAMPLER_ORDER_REFERENCE && o->order != SAMPLER_ORDER_PROBS)
        return hl_fail(err, HL_ERR_INVALID, "unknown sampler order %d", (int)o->order);
    return HL_OK;
}

static bool opts_use_history(const sampler_opts *o) {
    return o->repeat_last_n != 0 &&
           (o->repeat_penalty != 1.0f || o->presence_penalty != 0.0f ||
            o->frequency_penalty != 0.0f);
}

/* The reference's normalize(numCtx), plus canonical values for inactive knobs so that
 * slots differing only in meaningless settings still compare equal (and batch). */
static sampler_opts opts_normalize(const sampler_opts *in, int32_t num_ctx, int32_t n_vocab) {
    sampler_opts o = *in;
    if (o.repeat_penalty <= 0) o.repeat_penalty = 1.0f;
    if (o.repeat_last_n < 0) o.repeat_last_n = num_ctx;
    if (!opts_use_history(&o)) {
        o.repeat_last_n = 0;
        o.repeat_penalty = 1.0f;
        o.presence_penalty = 0.0f;
        o.frequency_penalty = 0.0f;
    }
    if (o.top_k <= 0 || o.top_k >= n_vocab) o.top_k = 0;
    if (!(o.top_p > 0 && o.top_p < 1)) o.top_p = 0;
    if (!(o.min_p > 0 && o.min_p <= 1)) o.min_p = 0;
    if (!o.logprobs) o.top_logprobs = 0;
    if (o.seed < 0) o.seed = -1;
    if (o.temperature == 0) {
        /* Greedy is the argmax of the penalised logits, which every filter keeps, so
         * filters and order are irrelevant; canonical values let such slots fuse. */
        o.temperature = 0; /* also turns -0.0 into 0.0 */
        o.top_k = 0;
        o.top_p = 0;
        o.min_p = 0;
        o.order = SAMPLER_ORDER_REFERENCE;
    }
    return o;
}

static void plan_from_opts(sampler_plan *p, const sampler_opts *o) {
    memset(p, 0, sizeof *p);
    p->order = o->order;
    p->greedy = o->temperature == 0;
    p->inv_temp = p->greedy ? 0 : 1.0f / o->temperature;
    if (!p->greedy && !isfinite(p->inv_temp)) p->greedy = true; /* T so small 1/T overflows */
    p->top_k = o->top_k;
    p->top_p = o->top_p;
    p->min_p = o->min_p;
    p->log_min_p = o->min_p > 0 ? logf(o->min_p) : 0;
    p->window = o->repeat_last_n;
    p->repeat_penalty = o->repeat_penalty;
    p->inv_repeat_penalty = 1.0f / o->repeat_penalty;
    p->presence = o->presence_penalty;
    p->frequency = o->frequency_penalty;
    p->apply_repeat_presence = o->repeat_penalty != 1.0f || o->presence_penalty != 0.0f;
}

/* Everything but the per-slot seed and logprob requests decides how a row is
 * transformed; those are what the fused path shares. */
static bool plan_opts_equal(const sampler_opts *a, const sampler_opts *b) {
    return a->temperature == b->temperature && a->top_k == b->top_k && a->top_p == b->top_p &&
           a->min_p == b->min_p && a->repeat_penalty == b->repeat_penalty &&
           a->repeat_last_n == b->repeat_last_n && a->presence_penalty == b->presence_penalty &&
           a->frequency_penalty == b->frequency_penalty && a->order == b->order;
}

static uint64_t splitmix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Upstream's mixSeed: the counter-th draw of a seeded slot. */
uint64_t sampler_mix_seed(uint64_t seed, uint64_t counter) {
    return splitmix64(seed + 0x9e3779b97f4a7c15ULL * (counter + 1));
}

hl_status sampler_create(int32_t n_vocab, int32_t num_ctx, sampler **out, hl_err *err) {
    *out = NULL;
    if (n_vocab < 1)
        return hl_fail(err, HL_ERR_INVALID, "sampler: vocabulary size %d < 1", n_vocab);
    if (num_ctx < 1) return hl_fail(err, HL_ERR_INVALID, "sampler: context length %d < 1", num_ctx);
    sampler *s = calloc(1, sizeof *s);
    if (!s) return hl_fail(err, HL_ERR_NOMEM, "sampler: out of memory");
    s->n_vocab = n_vocab;
    s->num_ctx = num_ctx;
    s->fused_enabled = true;
    size_t v = (size_t)n_vocab;
    s->work = malloc(v * sizeof *s->work);
    s->weights = malloc(v * sizeof *s->weights);
    s->cand_w = malloc(v * sizeof *s->cand_w);
    s->block_sums = malloc((v / SAMPLER_PICK_BLOCK + 1) * sizeof *s->block_sums);
    s->bucket_mass = malloc(SAMPLER_NUCLEUS_BUCKETS * sizeof *s->bucket_mass);
    s->cand = malloc(v * sizeof *s->cand);
    s->cand_work = malloc(v * sizeof *s->cand_work);
    s->stamp = calloc(v, sizeof *s->stamp);
    if (!s->work || !s->weights || !s->cand_w || !s->block_sums || !s->bucket_mass || !s->cand ||
        !s->cand_work || !s->stamp) {
        sampler_destroy(s);
        return hl_fail(err, HL_ERR_NOMEM, "sampler: out of memory for a %d-token vocabulary",
                       n_vocab);
    }
    s->entropy = splitmix64(hl_time_ns() ^ (uint64_t)(uintptr_t)s);
    *out = s;
    return HL_OK;
}

static void slot_free(sampler_slot *sl) {
    if (!sl) return;
    free(sl->ring);
    free(sl);
}

void sampler_destroy(sampler *s) {
    if (!s) return;
    sampler_clear(s);
    free(s->slots);
    free(s->resolved);
    free(s->work);
    free(s->weights);
    free(s->cand_w);
    free(s->block_sums);
    free(s->bucket_mass);
    free(s->cand);
    free(s->cand_work);
    free(s->stamp);
    free(s);
}

void sampler_clear(sampler *s) {
    for (int i = 0; i < s->n_slots; i++) slot_free(s->slots[i]);
    s->n_slots = 0;
}

static int find_slot(const sampler *s, int32_t id) {
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i]->id == id) return i;
    return -1;
}

hl_status sampler_add(sampler *s, int32_t slot, const sampler_opts *opts, const int32_t *prior,
                      size_t n_prior, hl_err *err) {
    hl_status st = sampler_validate_opts(opts, err);
    if (st != HL_OK) {
        hl_err_prefix(err, "sampler slot %d", slot);
        return st;
    }
    if (find_slot(s, slot) >= 0)
        return hl_fail(err, HL_ERR_INVALID, "sampler slot %d is already registered", slot);
    if (n_prior > 0 && !prior)
        return hl_fail(err, HL_ERR_INVALID, "sampler slot %d: %zu prior tokens but no array",
                       slot, n_prior);
    sampler_opts o = opts_normalize(opts, s->num_ctx, s->n_vocab);
    if (o.repeat_last_n > SAMPLER_MAX_WINDOW)
        return hl_fail(err, HL_ERR_INVALID,
                       "sampler slot %d: repeat_last_n -1 means the context length %d, larger "
                       "than the maximum window %d", slot, s->num_ctx, SAMPLER_MAX_WINDOW);
    for (size_t i = 0; i < n_prior; i++)
        if (prior[i] < 0 || prior[i] >= s->n_vocab)
            return hl_fail(err, HL_ERR_INVALID,
                           "sampler slot %d: prior token %d (at %zu) is outside the vocabulary "
                           "(0..%d)", slot, prior[i], i, s->n_vocab - 1);
    int32_t w = o.repeat_last_n;
    size_t take = n_prior < (size_t)w ? n_prior : (size_t)w;
    const int32_t *tail = take ? prior + (n_prior - take) : NULL;

    if (s->n_slots == s->cap_slots) {
        int cap = s->cap_slots ? s->cap_slots * 2 : 8;
        sampler_slot **grown = realloc(s->slots, (size_t)cap * sizeof *grown);
        if (!grown) return hl_fail(err, HL_ERR_NOMEM, "sampler: out of memory adding a slot");
        s->slots = grown;
        sampler_slot **res = realloc(s->resolved, (size_t)cap * sizeof *res);
        if (!res) return hl_fail(err, HL_ERR_NOMEM, "sampler: out of memory adding a slot");
        s->resolved = res;
        s->cap_slots = cap;
    }
    sampler_slot *sl = calloc(1, sizeof *sl);
    if (!sl) return hl_fail(err, HL_ERR_NOMEM, "sampler: out of memory adding a slot");
    if (w > 0) {
        sl->ring = calloc((size_t)w, sizeof *sl->ring);
        if (!sl->ring) {
            free(sl);
            return hl_fail(err, HL_ERR_NOMEM, "sampler slot %d: out of memory for a %d-token "
                           "history", slot, w);
        }
        if (take) memcpy(sl->ring, tail, take * sizeof *tail);
    }
    sl->id = slot;
    sl->opts = o;
    sl->hist_len = (int64_t)take;
    if (o.seed >= 0) {
        sl->rng_seed = (uint64_t)o.seed;
    } else {
        s->entropy = splitmix64(s->entropy + hl_time_ns() + (uint64_t)(uint32_t)slot);
        sl->rng_seed = s->entropy;
    }
    plan_from_opts(&sl->plan, &o);
    s->slots[s->n_slots++] = sl;
    return HL_OK;
}

void sampler_remove(sampler *s, int32_t slot) {
    int i = find_slot(s, slot);
    if (i < 0) return;
    slot_free(s->slots[i]);
    memmove(&s->slots[i], &s->slots[i + 1], (size_t)(s->n_slots - i - 1) * sizeof *s->slots);
    s->n_slots--;
}

static void ring_push(sampler_slot *sl, int32_t token) {
    int32_t w = sl->plan.window;
    if (w > 0) sl->ring[sl->hist_len % w] = token;
    sl->hist_len++;
}

hl_status sampler_commit(sampler *s, int32_t slot, const int32_t *tokens, size_t n, hl_err *err) {
    int i = find_slot(s, slot);
    if (i < 0) return hl_fail(err, HL_ERR_INVALID, "sampler slot %d is not registered", slot);
    if (n > 0 && !tokens)
        return hl_fail(err, HL_ERR_INVALID, "sampler slot %d: %zu tokens but no array", slot, n);
    for (size_t k = 0; k < n; k++)
        if (tokens[k] < 0 || tokens[k] >= s->n_vocab)
            return hl_fail(err, HL_ERR_INVALID,
                           "sampler slot %d: committed token %d is outside the vocabulary (0..%d)",
                           slot, tokens[k], s->n_vocab - 1);
    sampler_slot *sl = s->slots[i];
    size_t w = (size_t)sl->plan.window;
    size_t take = n < w ? n : w;
    /* Only the last `window` tokens can survive; earlier ones only advance the count. */
    sl->hist_len += (int64_t)(n - take);
    for (size_t k = n - take; k < n; k++) ring_push(sl, tokens[k]);
    return HL_OK;
}

hl_status sampler_sample(sampler *s, const int32_t *slots, int n, const float *logits,
                         size_t row_stride, sampler_out *out, hl_err *err) {
    if (n == 0) return HL_OK;
    if (n < 0 || !slots || !logits || !out)
        return hl_fail(err, HL_ERR_INVALID, "sampler_sample: bad arguments (n=%d)", n);
    if (row_stride < (size_t)s->n_vocab)
        return hl_fail(err, HL_ERR_INVALID, "sampler_sample: row stride %zu < vocabulary %d",
                       row_stride, s->n_vocab);
    if (n > s->n_slots)
        return hl_fail(err, HL_ERR_INVALID, "sampler_sample: %d rows but only %d slots", n,
                       s->n_slots);

    /* Resolve ids; a per-call mark catches a slot named twice. */
    s->call_mark++;
    if (s->call_mark == 0) {
        for (int i = 0; i < s->n_slots; i++) s->slots[i]->call_mark = 0;
        s->call_mark = 1;
    }
    bool uniform = true;
    sampler_slot *first = NULL;
    for (int i = 0; i < n; i++) {
        int k = find_slot(s, slots[i]);
        if (k < 0) return hl_fail(err, HL_ERR_INVALID, "sampler slot %d is not registered",
                                  slots[i]);
        sampler_slot *sl = s->slots[k];
        if (sl->call_mark == s->call_mark)
            return hl_fail(err, HL_ERR_INVALID, "sampler slot %d is named twice in one call",
                           slots[i]);
        sl->call_mark = s->call_mark;
        s->resolved[i] = sl;
        if (!first) first = sl;
        else if (uniform && !plan_opts_equal(&first->opts, &sl->opts)) uniform = false;
    }
    bool fused = uniform && s->fused_enabled;

    /* Fused: one plan for every row. Per-slot: each row its own plan. Tokens land in out[];
     * rings and RNG counters advance only once every row succeeded. */
    sampler_plan shared;
    if (fused) shared = first->plan;
    for (int i = 0; i < n; i++) {
        sampler_slot *sl = s->resolved[i];
        const sampler_plan *plan = fused ? &shared : &sl->plan;
        const float *row = logits + (size_t)i * row_stride;
        hl_status st = sampler_row(s, plan, sl, row, &out[i]);
        if (st != HL_OK)
            return hl_fail(err, st, "sampler slot %d: the logits row has no finite value",
                           slots[i]);
    }
    for (int i = 0; i < n; i++) {
        sampler_slot *sl = s->resolved[i];
        ring_push(sl, out[i].token);
        sl->rng_counter++;
    }
    s->last_fused = fused;
    return HL_OK;
}

int sampler_n_slots(const sampler *s) { return s->n_slots; }
bool sampler_has_slot(const sampler *s, int32_t slot) { return find_slot(s, slot) >= 0; }
int32_t sampler_n_vocab(const sampler *s) { return s->n_vocab; }

bool sampler_slot_history(const sampler *s, int32_t slot, const int32_t **ring, int32_t *window,
                          int64_t *history_len) {
    int i = find_slot(s, slot);
    if (i < 0) return false;
    const sampler_slot *sl = s->slots[i];
    if (ring) *ring = sl->ring;
    if (window) *window = sl->plan.window;
    if (history_len) *history_len = sl->hist_len;
    return true;
}

void sampler_set_fused(sampler *s, bool enabled) { s->fused_enabled = enabled; }
bool sampler_last_call_fused(const sampler *s) { return s->last_fused; }
