/*
 * options.h - request options for the inference endpoints: Ollama's `options` object
 * (layered over the Modelfile's PARAMETERs), keep_alive durations and `format`.
 *
 * Ownership: opt_parse fills a caller's infer_opts; opt_free releases its stop list.
 */
#ifndef HL_SERVER_OPTIONS_H
#define HL_SERVER_OPTIONS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "sample/sampler.h"
#include "server/engine.h"

typedef struct infer_opts {
    engine_config load;  /* num_ctx, num_batch, num_thread, use_mmap: changing them reloads */
    sampler_opts sp;     /* temperature, top_k, top_p, min_p, penalties, seed */
    int64_t num_predict; /* -1 unbounded, -2 fill the context: both < 0 for the engine */
    int32_t num_keep;
    char **stop;         /* malloc'd strings */
    size_t n_stop;
} infer_opts;

/* Defaults (Ollama's), then params (the Modelfile layer, may be NULL), then options (the
 * request's, may be NULL or null). A wrong type fails with Ollama's message, e.g.
 * `option "temperature" must be of type float32`; unknown names are logged (unless
 * quiet) and ignored; deprecated ones are dropped. Values the sampler rejects fail with
 * HL_ERR_INVALID too. */
hl_status opt_parse(const json_t *params, const json_t *options, bool quiet, infer_opts *out,
                    hl_err *err);
void opt_free(infer_opts *o);

/* The default context: $HEARTH_CONTEXT_LENGTH / $OLLAMA_CONTEXT_LENGTH, else 4096. */
int32_t opt_default_num_ctx(void);
/* The KV cache type $HEARTH_KV_CACHE_TYPE (else $OLLAMA_KV_CACHE_TYPE) names: "f32",
 * "f16" or "q8_0" (static strings); unset or unknown: "f16", with a warning on stderr when
 * warn (the server says so once at startup). */
const char *opt_default_kv_type(bool warn);

/* Go's time.ParseDuration: "300ms", "-1.5h", "1h30m", "0". Errors read like Go's
 * (`time: invalid duration "x"`, `time: missing unit in duration "5"`). */
hl_status opt_parse_duration(const char *s, int64_t *ns, hl_err *err);

/* keep_alive: absent/null -> SCHED_KEEP_UNSET; number = seconds; string = duration;
 * negative = forever (SCHED_KEEP_FOREVER). Other types: `Unsupported type: '<type>'`. */
hl_status opt_keep_alive(const json_t *v, int64_t *ns, hl_err *err);

typedef enum opt_format { OPT_FORMAT_NONE = 0, OPT_FORMAT_JSON, OPT_FORMAT_SCHEMA } opt_format;
/* format: absent/null/"" none; "json"; an object (a JSON schema). Anything else fails
 * with `invalid format: "<raw>"; expected "json" or a valid JSON Schema object`. */
hl_status opt_format_parse(const json_t *v, opt_format *out, hl_err *err);

#endif
