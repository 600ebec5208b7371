/* metrics.c - Prometheus metrics (metrics.h). */
#define _GNU_SOURCE
#include "server/metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"

/* Bucket bounds (seconds). TTFT spans a warm cache hit to a cold multi-GB load; the gap
 * between tokens spans a tiny model on a fast CPU to a large one on a slow CPU. */
static const double k_ttft_le[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                   2.5,   5,    10,    30,   60, 120};
static const double k_tok_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                  0.25,  0.5,    1,     2.5,  5,     10};
#define N_TTFT (sizeof k_ttft_le / sizeof k_ttft_le[0])
#define N_TOK (sizeof k_tok_le / sizeof k_tok_le[0])
#define MAX_BUCKETS 16

typedef struct histo {
    const double *le;
    size_t n_le;
    atomic_uint_fast64_t bucket[MAX_BUCKETS + 1]; /* per bound, not cumulative; last: +Inf */
    atomic_uint_fast64_t sum_ns;
} histo;

struct metrics_model {
    struct metrics_model *next;
    char *name;
    atomic_uint_fast64_t prompt, cached, generated;
    histo ttft, tok;
};

typedef struct req_series {
    const char *route; /* NULL: "other" */
    int status;
    uint64_t count;
} req_series;

struct metrics {
    pthread_mutex_t mu; /* guards reqs and the models list's links */
    req_series *reqs;
    size_t n_reqs, cap_reqs;
    metrics_model *models; /* newest first; never removed before destroy */
};

hl_status metrics_create(metrics **out, hl_err *err) {
    metrics *m = calloc(1, sizeof *m);
    if (!m) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&m->mu, NULL);
    *out = m;
    return HL_OK;
}

void metrics_destroy(metrics *m) {
    if (!m) return;
    for (metrics_model *mm = m->models, *next; mm; mm = next) {
        next = mm->next;
        free(mm->name);
        free(mm);
    }
    free(m->reqs);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void metrics_request(metrics *m, const char *route, int status) {
    if (!m || status <= 0) return;
    pthread_mutex_lock(&m->mu);
    size_t i = 0;
    while (i < m->n_reqs && !(m->reqs[i].status == status &&
                              (m->reqs[i].route == route ||
                               (route && m->reqs[i].route && !strcmp(m->reqs[i].route, route)))))
        i++;
    if (i == m->n_reqs) {
        if (m->n_reqs == m->cap_reqs) {
            size_t cap = m->cap_reqs ? m->cap_reqs * 2 : 32;
            req_series *nr = realloc(m->reqs, cap * sizeof *nr);
            if (!nr) {
                pthread_mutex_unlock(&m->mu);
                return;
            }
            m->reqs = nr;
            m->cap_reqs = cap;
        }
        m->reqs[m->n_reqs++] = (req_series){.route = route, .status = status};
    }
    m->reqs[i].count++;
    pthread_mutex_unlock(&m->mu);
}

metrics_model *metrics_model_get(metrics *m, const char *model) {
    if (!m || !model) return NULL;
    pthread_mutex_lock(&m->mu);
    metrics_model *mm = m->models;
    while (mm && strcmp(mm->name, model) != 0) mm = mm->next;
    if (!mm && (mm = calloc(1, sizeof *mm)) != NULL) {
        if (!(mm->name = strdup(model))) {
            free(mm);
            mm = NULL;
        } else {
            mm->ttft.le = k_ttft_le;
            mm->ttft.n_le = N_TTFT;
            mm->tok.le = k_tok_le;
            mm->tok.n_le = N_TOK;
            mm->next = m->models;
            m->models = mm;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return mm;
}

void metrics_tokens(metrics_model *mm, uint64_t prompt, uint64_t cached, uint64_t generated) {
    if (!mm) return;
    atomic_fetch_add_explicit(&mm->prompt, prompt, memory_order_relaxed);
    atomic_fetch_add_explicit(&mm->cached, cached, memory_order_relaxed);
    atomic_fetch_add_explicit(&mm->generated, generated, memory_order_relaxed);
}

static void observe(histo *h, uint64_t ns) {
    double s = (double)ns / 1e9;
    size_t i = 0;
    while (i < h->n_le && s > h->le[i]) i++;
    atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

void metrics_ttft(metrics_model *mm, uint64_t ns) {
    if (mm) observe(&mm->ttft, ns);
}

void metrics_token_latency(metrics_model *mm, uint64_t ns) {
    if (mm) observe(&mm->tok, ns);
}

const char *metrics_label_escape(const char *v, char *out, size_t cap) {
    size_t w = 0, n = strlen(v ? v : "");
    if (!cap) return out;
    for (size_t i = 0; i < n;) {
        size_t l = hl_utf8_valid_len(v + i, n - i);
        char e[4];
        size_t k;
        if (l == 0) {
            e[0] = '?', k = 1, l = 1;
        } else if (v[i] == '\\' || v[i] == '"') {
            e[0] = '\\', e[1] = v[i], k = 2;
        } else if (v[i] == '\n') {
            e[0] = '\\', e[1] = 'n', k = 2;
        } else {
            memcpy(e, v + i, l);
            k = l;
        }
        if (w + k + 1 > cap) break;
        memcpy(out + w, e, k);
        w += k;
        i += l;
    }
    out[w] = '\0';
    return out;
}

static void family(FILE *f, const char *name, const char *type, const char *help) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void histo_write(FILE *f, const char *name, const char *model_label, const histo *h) {
    uint64_t cum = 0;
    for (size_t i = 0; i <= h->n_le; i++) {
        cum += atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
        if (i < h->n_le)
            fprintf(f, "%s_bucket{model=\"%s\",le=\"%g\"} %llu\n", name, model_label, h->le[i],
                    (unsigned long long)cum);
        else
            fprintf(f, "%s_bucket{model=\"%s\",le=\"+Inf\"} %llu\n", name, model_label,
                    (unsigned long long)cum);
    }
    /* _count equals the +Inf bucket (read once above), as the format requires */
    fprintf(f, "%s_sum{model=\"%s\"} %.9f\n", name, model_label,
            (double)atomic_load_explicit(&h->sum_ns, memory_order_relaxed) / 1e9);
    fprintf(f, "%s_count{model=\"%s\"} %llu\n", name, model_label, (unsigned long long)cum);
}

hl_status metrics_render(metrics *m, const metrics_gauges *g, char **out, size_t *len,
                         hl_err *err) {
    *out = NULL;
    *len = 0;
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    char esc[1024];

    family(f, "hearth_http_requests_total", "counter",
           "HTTP requests answered, by route and status code.");
    if (m) {
        pthread_mutex_lock(&m->mu);
        for (size_t i = 0; i < m->n_reqs; i++)
            fprintf(f, "hearth_http_requests_total{route=\"%s\",status=\"%d\"} %llu\n",
                    metrics_label_escape(m->reqs[i].route ? m->reqs[i].route : "other", esc,
                                         sizeof esc),
                    m->reqs[i].status, (unsigned long long)m->reqs[i].count);
        pthread_mutex_unlock(&m->mu);
    }

    /* the model list only grows at its head: a snapshot of the head is safe to walk */
    metrics_model *head = NULL;
    if (m) {
        pthread_mutex_lock(&m->mu);
        head = m->models;
        pthread_mutex_unlock(&m->mu);
    }
    static const struct {
        const char *name, *help;
        size_t off;
    } k_counters[] = {
        {"hearth_prompt_tokens_total", "Prompt tokens of finished generations (cache hits included).",
         offsetof(metrics_model, prompt)},
        {"hearth_prompt_cached_tokens_total", "Prompt tokens served from the prefix cache.",
         offsetof(metrics_model, cached)},
        {"hearth_generated_tokens_total", "Tokens generated.", offsetof(metrics_model, generated)},
    };
    for (size_t c = 0; c < sizeof k_counters / sizeof k_counters[0]; c++) {
        family(f, k_counters[c].name, "counter", k_counters[c].help);
        for (metrics_model *mm = head; mm; mm = mm->next) {
            atomic_uint_fast64_t *v = (atomic_uint_fast64_t *)((char *)mm + k_counters[c].off);
            fprintf(f, "%s{model=\"%s\"} %llu\n", k_counters[c].name,
                    metrics_label_escape(mm->name, esc, sizeof esc),
                    (unsigned long long)atomic_load_explicit(v, memory_order_relaxed));
        }
    }
    family(f, "hearth_time_to_first_token_seconds", "histogram",
           "Time from a generation request's arrival to its first token.");
    for (metrics_model *mm = head; mm; mm = mm->next)
        histo_write(f, "hearth_time_to_first_token_seconds",
                    metrics_label_escape(mm->name, esc, sizeof esc), &mm->ttft);
    family(f, "hearth_token_latency_seconds", "histogram",
           "Time between two generated tokens of a request.");
    for (metrics_model *mm = head; mm; mm = mm->next)
        histo_write(f, "hearth_token_latency_seconds",
                    metrics_label_escape(mm->name, esc, sizeof esc), &mm->tok);

    metrics_gauges z = {0};
    if (!g) g = &z;
    family(f, "hearth_kv_cache_bytes", "gauge",
           "Bytes of cached KV state of the loaded models, by tier.");
    fprintf(f, "hearth_kv_cache_bytes{tier=\"ram\"} %llu\n", (unsigned long long)g->kv_ram);
    fprintf(f, "hearth_kv_cache_bytes{tier=\"compressed\"} %llu\n",
            (unsigned long long)g->kv_compressed);
    fprintf(f, "hearth_kv_cache_bytes{tier=\"disk\"} %llu\n", (unsigned long long)g->kv_disk);
    family(f, "hearth_queue_depth", "gauge", "Requests waiting for a slot in a model's batch.");
    fprintf(f, "hearth_queue_depth %llu\n", (unsigned long long)g->queued);
    family(f, "hearth_loaded_models", "gauge", "Models loaded.");
    fprintf(f, "hearth_loaded_models %llu\n", (unsigned long long)g->loaded);

    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad || !buf) {
        free(buf);
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    *out = buf;
    *len = n;
    return HL_OK;
}
