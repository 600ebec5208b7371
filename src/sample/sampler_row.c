/*
 * sampler_row.c - the per-row kernel: sanitise, logprobs, penalties, filters, draw.
 *
 * Works on candidates instead of a sorted vocabulary: top-k is a bounded heap (or a
 * quickselect for large k); top-p first tries a sorted prefix of 64 candidates and
 * otherwise finds the nucleus by bucketing the row by logit (O(V), no sort). Full-row
 * passes (max, exp sums, thresholds) are vectorised in sampler_vec*.c.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "sample/sampler_internal.h"

#define SAMPLER_HEAP_MAX 256
#define TOPP_FIRST_GUESS 64

static inline bool better(sampler_cand a, sampler_cand b) {
    return a.score > b.score || (a.score == b.score && a.id < b.id);
}

static inline void swap_cand(sampler_cand *a, sampler_cand *b) {
    sampler_cand t = *a;
    *a = *b;
    *b = t;
}

/* Min-heap on "better": the root is the worst kept candidate. */
static void sift_down(sampler_cand *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t worst = i, l = 2 * i + 1, r = l + 1;
        if (l < n && better(h[worst], h[l])) worst = l;
        if (r < n && better(h[worst], h[r])) worst = r;
        if (worst == i) return;
        swap_cand(&h[i], &h[worst]);
        i = worst;
    }
}

static void heapify(sampler_cand *h, int32_t n) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) sift_down(h, n, i);
}

/* Heap sort of a min-heap: the worst goes last each round, leaving best-first order. */
static void heap_sort_desc(sampler_cand *h, int32_t n) {
    for (int32_t end = n - 1; end > 0; end--) {
        swap_cand(&h[0], &h[end]);
        sift_down(h, end, 0);
    }
}

/* Lomuto partition around a median-of-three pivot; branch-free inner loop (the
 * comparisons are unpredictable). Returns the pivot's final index. */
static int32_t partition(sampler_cand *a, int32_t lo, int32_t hi) {
    int32_t mid = lo + (hi - lo) / 2;
    if (better(a[mid], a[lo])) swap_cand(&a[mid], &a[lo]);
    if (better(a[hi], a[lo])) swap_cand(&a[hi], &a[lo]);
    if (better(a[hi], a[mid])) swap_cand(&a[hi], &a[mid]);
    swap_cand(&a[mid], &a[hi]); /* median as pivot */
    const sampler_cand pivot = a[hi];
    int32_t store = lo;
    for (int32_t i = lo; i < hi; i++) {
        sampler_cand t = a[i];
        int32_t is_better =
            (t.score > pivot.score) | ((t.score == pivot.score) & (t.id < pivot.id));
        a[i] = a[store];
        a[store] = t;
        store += is_better;
    }
    swap_cand(&a[store], &a[hi]);
    return store;
}

/* Moves the k best of a[0..n) to the front (unordered). Quickselect; if the pivots
 * keep failing (adversarial input), heap-sorts what is left, so O(n log n) at worst. */
static void partial_select(sampler_cand *a, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n - 1, target = k - 1, budget = 64;
    while (lo < hi) {
        if (--budget == 0) {
            heapify(a + lo, hi - lo + 1);
            heap_sort_desc(a + lo, hi - lo + 1);
            return;
        }
        int32_t p = partition(a, lo, hi);
        if (p == target) return;
        if (p < target) lo = p + 1;
        else hi = p - 1;
    }
}

void sampler_select_top(const float *scores, int32_t v, int32_t n, sampler_cand *out,
                        sampler_cand *work) {
    if (n <= 0) return;
    if (n > v) n = v;
    if (n <= SAMPLER_HEAP_MAX && n < v) {
        for (int32_t i = 0; i < n; i++) out[i] = (sampler_cand){scores[i], i};
        heapify(out, n);
        /* Later ids lose ties, so only a strictly larger score enters the heap. */
        float floor_score = out[0].score;
        for (int32_t i = sampler_vec_first_above(scores, n, v, floor_score); i < v;
             i = sampler_vec_first_above(scores, i + 1, v, floor_score)) {
            out[0] = (sampler_cand){scores[i], i};
            sift_down(out, n, 0);
            floor_score = out[0].score;
        }
        heap_sort_desc(out, n);
        return;
    }
    for (int32_t i = 0; i < v; i++) work[i] = (sampler_cand){scores[i], i};
    if (n < v) partial_select(work, v, n);
    memcpy(out, work, (size_t)n * sizeof *out);
    heapify(out, n);
    heap_sort_desc(out, n);
}

static inline float sanitize(float x) {
    if (x != x) return -INFINITY;
    if (x > FLT_MAX) return FLT_MAX;
    return x;
}

/* A finite logit stays finite under penalties (so a row never loses its last finite
 * entry); -inf stays -inf. */
static inline float penalize_clamp(float before, float after) {
    if (before == -INFINITY) return before;
    if (after > FLT_MAX) return FLT_MAX;
    if (after < -FLT_MAX) return -FLT_MAX;
    return after;
}

/* Penalties on x (a private copy of the row), reading the filled part of the ring
 * only. Repeat and presence apply once per distinct token, frequency per occurrence. */
static void apply_penalties(sampler *s, const sampler_plan *p, const sampler_slot *sl, float *x,
                            int32_t filled) {
    const int32_t *ring = sl->ring;
    if (p->apply_repeat_presence) {
        if (++s->stamp_epoch == 0) {
            memset(s->stamp, 0, (size_t)s->n_vocab * sizeof *s->stamp);
            s->stamp_epoch = 1;
        }
        uint32_t e = s->stamp_epoch;
        for (int32_t i = 0; i < filled; i++) {
            int32_t t = ring[i];
            if (s->stamp[t] == e) continue;
            s->stamp[t] = e;
            float v0 = x[t], v = v0;
            /* 0 stays 0 (0 * (1/R) would be NaN when 1/R overflows). */
            if (v < 0) v *= p->repeat_penalty;
            else if (v > 0) v *= p->inv_repeat_penalty;
            x[t] = penalize_clamp(v0, v - p->presence);
        }
    }
    if (p->frequency != 0)
        for (int32_t i = 0; i < filled; i++) {
            float v0 = x[ring[i]];
            x[ring[i]] = penalize_clamp(v0, v0 - p->frequency);
        }
}

/* Picks the candidate where u (in [0,1)) falls in the cumulative weights w[0..n). */
static int32_t pick_sparse(const float *w, int32_t n, double u) {
    double total = 0;
    for (int32_t j = 0; j < n; j++) total += w[j];
    double target = u * total, acc = 0;
    int32_t last = -1;
    for (int32_t j = 0; j < n; j++) {
        if (w[j] <= 0) continue;
        acc += w[j];
        last = j;
        if (acc > target) return j;
    }
    return last; /* rounding left target at the very top */
}

/* The same over a dense weight vector with per-block sums: whole blocks are skipped. */
static int32_t pick_dense(const float *w, const double *block_sums, int32_t n, double total,
                          double u) {
    double target = u * total, acc = 0;
    for (int32_t b0 = 0; b0 < n; b0 += SAMPLER_PICK_BLOCK) {
        double bs = block_sums[b0 / SAMPLER_PICK_BLOCK];
        if (acc + bs > target) {
            int32_t end = b0 + SAMPLER_PICK_BLOCK < n ? b0 + SAMPLER_PICK_BLOCK : n;
            double a = acc;
            for (int32_t i = b0; i < end; i++) {
                a += w[i];
                if (w[i] > 0 && a > target) return i;
            }
        }
        acc += bs;
    }
    int32_t i = n - 1;
    while (i > 0 && !(w[i] > 0)) i--;
    return i;
}

/* Keeps, from a[0..n), the candidates whose exclusive cumulative mass in (score desc,
 * id asc) order is below limit; mass of token t is w[t]. Expected O(n): a quickselect
 * that recurses into the side holding the cut. Kept ones end up in a[0..ret). */
static int32_t nucleus_partition(sampler_cand *a, int32_t n, const float *w, double limit) {
    int32_t lo = 0, hi = n;
    double base = 0; /* mass of a[0..lo), all kept and better than the rest */
    while (lo < hi && base < limit) {
        int32_t p = partition(a, lo, hi - 1);
        double better = 0;
        for (int32_t i = lo; i < p; i++) better += w[a[i].id];
        if (base + better >= limit) {
            hi = p; /* the pivot and everything worse start at or past the cut */
        } else {
            base += better + w[a[p].id];
            lo = p + 1;
        }
    }
    return lo;
}

static inline int32_t nucleus_bucket(float x, float m, float k) {
    float f = (m - x) * k; /* +inf for x = -inf */
    return f < (float)(SAMPLER_NUCLEUS_BUCKETS - 1) ? (int32_t)f : SAMPLER_NUCLEUS_BUCKETS - 1;
}

/* The nucleus of a whole row in O(V): tokens are bucketed by (m - x) * scale, which
 * is monotone in the logit, so every bucket before the one where the cumulative mass
 * crosses limit is kept whole, every bucket after it dropped, and only the crossing
 * bucket needs nucleus_partition. Needs s->weights filled at this scale. */
static int32_t nucleus_by_buckets(sampler *s, const float *x, float m, float scale,
                                  double limit) {
    int32_t v = s->n_vocab;
    double *mass = s->bucket_mass;
    memset(mass, 0, SAMPLER_NUCLEUS_BUCKETS * sizeof *mass);
    const float k = scale * ((float)SAMPLER_NUCLEUS_BUCKETS / SAMPLER_NUCLEUS_RANGE);
    for (int32_t i = 0; i < v; i++) mass[nucleus_bucket(x[i], m, k)] += s->weights[i];
    double before = 0;
    int32_t cross = SAMPLER_NUCLEUS_BUCKETS;
    for (int32_t b = 0; b < SAMPLER_NUCLEUS_BUCKETS; b++) {
        if (before + mass[b] >= limit) {
            cross = b;
            break;
        }
        before += mass[b];
    }
    int32_t kept = 0, n_cross = 0;
    for (int32_t i = 0; i < v; i++) {
        int32_t b = nucleus_bucket(x[i], m, k);
        if (b < cross) s->cand[kept++] = (sampler_cand){x[i], i};
        else if (b == cross) s->cand_work[n_cross++] = (sampler_cand){x[i], i};
    }
    if (n_cross > 0) {
        int32_t more = nucleus_partition(s->cand_work, n_cross, s->weights, limit - before);
        memcpy(s->cand + kept, s->cand_work, (size_t)more * sizeof *s->cand);
        kept += more;
    }
    return kept;
}

/* top-p with the reference's sorted-prefix semantics: keep candidates whose exclusive
 * cumulative probability is < top_p (the best is always kept), at most kcap of them.
 * Probabilities are exp((x - m) * scale) over the whole row. The first guess is a
 * small sorted prefix; a nucleus that needs more falls back to nucleus_partition.
 * Leaves the survivors in s->cand[0..ret). */
static int32_t top_p_select(sampler *s, const float *x, float m, float scale, float top_p,
                            int32_t kcap) {
    int32_t v = s->n_vocab;
    double z = sampler_vec_exp_sum(x, v, m, scale);
    double limit = (double)top_p * z;
    int32_t n = kcap < TOPP_FIRST_GUESS ? kcap : TOPP_FIRST_GUESS;
    sampler_select_top(x, v, n, s->cand, s->cand_work);
    double cum = 0;
    for (int32_t j = 0; j < n; j++) {
        if (j > 0 && cum >= limit) return j;
        cum += sampler_exp_nonpos((s->cand[j].score - m) * scale);
    }
    if (n >= kcap) return n;
    z = sampler_vec_exp_fill(x, v, m, scale, s->weights, s->block_sums);
    limit = (double)top_p * z;
    if (kcap >= v) return nucleus_by_buckets(s, x, m, scale, limit);
    for (int32_t i = 0; i < v; i++) s->cand[i] = (sampler_cand){x[i], i};
    partial_select(s->cand, v, kcap);
    return nucleus_partition(s->cand, kcap, s->weights, limit);
}

static int32_t collect_at_least(const float *x, int32_t v, float threshold, sampler_cand *c) {
    int32_t n = 0;
    for (int32_t i = sampler_vec_first_at_least(x, 0, v, threshold); i < v;
         i = sampler_vec_first_at_least(x, i + 1, v, threshold))
        c[n++] = (sampler_cand){x[i], i};
    return n;
}

/* Non-greedy draw over x (penalised logits, max m). */
static int32_t draw(sampler *s, const sampler_plan *p, const float *x, float m, double u) {
    int32_t v = s->n_vocab;
    sampler_cand *c = s->cand;
    bool sparse = false;
    int32_t nc = 0;

    if (p->order == SAMPLER_ORDER_REFERENCE) {
        /* Filters on the raw logits; temperature only shapes the final draw. */
        if (p->top_p > 0) {
            nc = top_p_select(s, x, m, 1.0f, p->top_p, p->top_k > 0 ? p->top_k : v);
            sparse = true;
        } else if (p->top_k > 0) {
            sampler_select_top(x, v, p->top_k, c, s->cand_work);
            nc = p->top_k;
            sparse = true;
        }
        if (p->min_p > 0) {
            float threshold = m + p->log_min_p;
            if (sparse) {
                int32_t kept = 0;
                for (int32_t j = 0; j < nc; j++)
                    if (c[j].score >= threshold) c[kept++] = c[j];
                nc = kept;
            } else {
                nc = collect_at_least(x, v, threshold, c);
                sparse = true;
            }
        }
    } else {
        /* top-k, then softmax(x/T), then top-p and min-p on those probabilities. */
        if (p->top_k > 0) {
            sampler_select_top(x, v, p->top_k, c, s->cand_work);
            nc = p->top_k;
            sparse = true;
        }
        if (p->top_p > 0) {
            if (sparse) {
                double z = 0;
                for (int32_t j = 0; j < nc; j++)
                    z += s->cand_w[j] = sampler_exp_nonpos((c[j].score - m) * p->inv_temp);
                double limit = (double)p->top_p * z, cum = 0;
                int32_t j = 0;
                for (; j < nc; j++) {
                    if (j > 0 && cum >= limit) break;
                    cum += s->cand_w[j];
                }
                nc = j;
            } else {
                nc = top_p_select(s, x, m, p->inv_temp, p->top_p, v);
                sparse = true;
            }
        }
        if (p->min_p > 0) {
            /* p < min_p * max(p)  <=>  (x - m) / T < ln(min_p) */
            if (sparse) {
                int32_t kept = 0;
                for (int32_t j = 0; j < nc; j++)
                    if ((c[j].score - m) * p->inv_temp >= p->log_min_p) c[kept++] = c[j];
                nc = kept;
            } else {
                nc = collect_at_least(x, v, m + p->log_min_p / p->inv_temp, c);
                sparse = true;
            }
        }
    }

    if (sparse) {
        for (int32_t j = 0; j < nc; j++)
            s->cand_w[j] = sampler_exp_nonpos((c[j].score - m) * p->inv_temp);
        return c[pick_sparse(s->cand_w, nc, u)].id;
    }
    double total = sampler_vec_exp_fill(x, v, m, p->inv_temp, s->weights, s->block_sums);
    return pick_dense(s->weights, s->block_sums, v, total, u);
}

hl_status sampler_row(sampler *s, const sampler_plan *p, const sampler_slot *sl,
                      const float *row, sampler_out *out) {
    int32_t v = s->n_vocab;
    float m;
    int32_t am;
    const float *raw = row;
    if (sampler_vec_scan(row, v, &m, &am)) {
        m = -INFINITY;
        am = 0;
        for (int32_t i = 0; i < v; i++) {
            float xi = sanitize(row[i]);
            s->work[i] = xi;
            if (xi > m) {
                m = xi;
                am = i;
            }
        }
        raw = s->work;
    }
    if (m == -INFINITY) return HL_ERR_INVALID;

    /* Logprobs come from the original (sanitised) logits, before anything else. */
    const float raw_max = m;
    float log_z = 0;
    out->logprob = 0;
    out->n_top = 0;
    if (sl->opts.logprobs) {
        log_z = (float)log(sampler_vec_exp_sum(raw, v, m, 1.0f));
        int32_t k = sl->opts.top_logprobs < v ? sl->opts.top_logprobs : v;
        if (k > 0) {
            sampler_select_top(raw, v, k, s->cand, s->cand_work);
            for (int32_t j = 0; j < k; j++) {
                out->top_tokens[j] = s->cand[j].id;
                out->top_logprobs[j] = (s->cand[j].score - raw_max) - log_z;
            }
            out->n_top = k;
        }
    }

    const float *x = raw;
    int32_t window = p->window;
    int32_t filled = (int32_t)(sl->hist_len < window ? sl->hist_len : window);
    if (filled > 0) {
        if (raw != s->work) memcpy(s->work, raw, (size_t)v * sizeof *raw);
        apply_penalties(s, p, sl, s->work, filled);
        x = s->work;
        /* Only ring tokens changed: rescan just those unless the old max was one. */
        bool max_touched = false;
        for (int32_t i = 0; i < filled && !max_touched; i++) max_touched = sl->ring[i] == am;
        if (max_touched) {
            (void)sampler_vec_scan(x, v, &m, &am); /* x holds no NaN/+inf by now */
        } else {
            for (int32_t i = 0; i < filled; i++) {
                int32_t t = sl->ring[i];
                if (x[t] > m || (x[t] == m && t < am)) {
                    m = x[t];
                    am = t;
                }
            }
        }
    }

    int32_t token;
    if (p->greedy) {
        token = am;
    } else {
        uint64_t bits = sampler_mix_seed(sl->rng_seed, sl->rng_counter);
        double u = (double)(bits >> 11) * 0x1.0p-53;
        token = draw(s, p, x, m, u);
    }
    out->token = token;
    if (sl->opts.logprobs) out->logprob = (sanitize(row[token]) - raw_max) - log_z;
    return HL_OK;
}
