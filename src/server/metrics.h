/*
 * metrics.h - the server's Prometheus metrics (GET /metrics, text exposition format
 * 0.0.4): what the request path counts, and the rendering.
 *
 * Counted on the request path (cheap: atomics, or a short mutex to find a series):
 *   hearth_http_requests_total{route,status}      every answered request; route is the
 *                                                  matched route's pattern (unmatched
 *                                                  paths count as route="other", so no
 *                                                  client text becomes a label)
 *   hearth_prompt_tokens_total{model}             prompt tokens of finished requests
 *   hearth_prompt_cached_tokens_total{model}      those restored from the prefix cache
 *   hearth_generated_tokens_total{model}          tokens generated (cancelled runs too)
 *   hearth_time_to_first_token_seconds{model}     histogram: request arrival to the first
 *                                                  generated token (load and queue included)
 *   hearth_token_latency_seconds{model}           histogram: time between two generated
 *                                                  tokens of one request
 * Measured when scraped (metrics_gauges, filled by the caller from the loaded models):
 *   hearth_kv_cache_bytes{tier="ram"|"compressed"|"disk"}, hearth_queue_depth,
 *   hearth_loaded_models.
 *
 * A metrics_model pointer (one per model name) stays valid until metrics_destroy, so a
 * request looks it up once and then only touches atomics. All functions accept a NULL
 * metrics / metrics_model and do nothing (a runner process keeps none). Thread-safe.
 */
#ifndef HL_SERVER_METRICS_H
#define HL_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct metrics metrics;
typedef struct metrics_model metrics_model;

typedef struct metrics_gauges {
    uint64_t kv_ram;        /* resident KV blocks (and recurrent states) */
    uint64_t kv_compressed; /* KV blocks compressed in RAM */
    uint64_t kv_disk;       /* KV blocks spilled to disk */
    uint64_t queued;        /* requests waiting for a slot in a model's batch */
    uint64_t loaded;        /* models resident */
} metrics_gauges;

hl_status metrics_create(metrics **out, hl_err *err);
void metrics_destroy(metrics *m); /* accepts NULL */

/* route: the matched route's pattern (a string that outlives m, e.g. from the route
 * table), NULL for none ("other"). status 0 (no reply made) is not counted. */
void metrics_request(metrics *m, const char *route, int status);

/* The series of one model (created on first use); NULL when m is NULL or out of memory. */
metrics_model *metrics_model_get(metrics *m, const char *model);
void metrics_tokens(metrics_model *mm, uint64_t prompt, uint64_t cached, uint64_t generated);
void metrics_ttft(metrics_model *mm, uint64_t ns);
void metrics_token_latency(metrics_model *mm, uint64_t ns);

/* The whole exposition (malloc'd, NUL-terminated) with the gauges given. */
hl_status metrics_render(metrics *m, const metrics_gauges *g, char **out, size_t *len,
                         hl_err *err);

/* Writes a label value escaped as the format requires (\\, \", \n; invalid UTF-8 bytes
 * become '?') into out (cap bytes, cut when longer). Returns out. */
const char *metrics_label_escape(const char *v, char *out, size_t cap);

#endif
