/*
 * sched.h - the loaded-model manager: which models are resident, who is using them, and
 * when they are unloaded (Ollama's scheduler, spec section 5).
 *
 * A request acquires a model (sched_acquire): the first use loads it from the store
 * (engine_open on its GGUF); later requests share the loaded engine. Releasing it
 * (sched_release) starts the keep-alive timer: keep_alive <= 0 unloads as soon as no
 * request uses it, otherwise it expires keep_alive after the last release (a reaper
 * thread unloads it). The keep_alive of a request overrides and is remembered for the
 * model; absent (SCHED_KEEP_UNSET) keeps the remembered value (at load: the default,
 * $HEARTH_KEEP_ALIVE / $OLLAMA_KEEP_ALIVE, else 5m).
 *
 * Residency (spec 5.3/5.4): several models stay loaded at once, at most
 * $HEARTH_MAX_LOADED_MODELS ($OLLAMA_MAX_LOADED_MODELS, default 3) and within a memory
 * budget: $HEARTH_MAX_MEMORY bytes ("512M", "2G") for all resident models, else 90% of
 * MemAvailable for the new one. A model is predicted to need its file size; a loaded
 * one counts what its engine measures. A model that does not fit makes room by
 * unloading idle models, shortest keep_alive first (then by name); when every model is
 * busy, the shortest-keep_alive one is marked to unload once idle (new requests for it
 * wait and reload it afterwards) and the request waits (cancellable) for it. With
 * nothing loaded a model always loads (best effort). Loads run one at a time, outside
 * the lock: requests for loaded models go on meanwhile. A request for a loaded model
 * with other load options (num_ctx, num_batch, num_thread, use_mmap), or whose engine died (a
 * runner process crashed), waits until it is idle, unloads it and loads anew.
 * Health (spec 5.2): before an idle model in a runner process is reused, its runner must
 * answer GET /health within $HEARTH_RUNNER_HEALTH_TIMEOUT (integer seconds or a Go
 * duration such as "300ms"; default 10s; <= 0 disables the check). The ping runs outside
 * the lock (other requests for that model wait for it; everything else goes on); a runner
 * that does not answer is killed and reaped, and the model is loaded anew for the
 * request. Busy runners are not pinged; a request whose runner goes silent ends after
 * $HEARTH_RUNNER_STALL_TIMEOUT (engine_remote.h). The in-process engine has no ping.
 *
 * Ownership: the sched owns every sched_model and its engine; a sched_model pointer is
 * valid from sched_acquire until the matching sched_release. Thread-safe.
 */
#ifndef HL_SERVER_SCHED_H
#define HL_SERVER_SCHED_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "server/engine.h"
#include "server/metrics.h"
#include "store/store.h"

#define SCHED_KEEP_FOREVER INT64_MAX
#define SCHED_KEEP_UNSET INT64_MIN

typedef struct sched sched;

typedef struct sched_model {
    char name[512];      /* display name, e.g. "m:latest" */
    store_name sname;
    char digest[65];
    char *model_path;
    json_t *details;     /* the /api/tags "details" object */
    engine *eng;
    engine_info info;
    engine_config cfg;   /* as requested (reload when a request asks for another) */
    /* guarded by the sched's lock */
    int refs;
    int64_t keep_alive_ns;
    int64_t expires_at_ns; /* wall clock; meaningful when refs == 0 */
    bool unload_when_idle;
    bool loading;            /* engine_open in progress (eng is NULL) */
    bool checking;           /* a health check before reuse in progress (refs held) */
    uint64_t predicted_bytes; /* the fitting estimate made before loading */
} sched_model;

hl_status sched_create(sched **out, hl_err *err);
void sched_destroy(sched *s); /* unloads everything; accepts NULL */
/* Server shutdown begins: a load waiting for its runner process fails now (so that the
 * request holding it ends and the HTTP server can stop). Accepts NULL. */
void sched_abort_loads(sched *s);

/* The health-check timeout before reusing an idle runner, in ms (0: none). */
int sched_health_timeout_ms(void);

/* The default keep-alive (environment, else 5 minutes) in ns. */
int64_t sched_default_keep_alive(void);

/* Gets sm loaded with cfg and takes a reference. *load_ns: time spent waiting and
 * loading. cancelled (may be NULL) is polled while waiting for a busy model. */
hl_status sched_acquire(sched *s, const store_model *sm, const engine_config *cfg,
                        int64_t keep_alive_ns, bool (*cancelled)(void *), void *ud,
                        sched_model **out, uint64_t *load_ns, hl_err *err);
void sched_release(sched *s, sched_model *m, int64_t keep_alive_ns);

/* Unloads a model as soon as it is idle (keep_alive 0 with an empty prompt). Returns
 * whether it was loaded. */
bool sched_expire(sched *s, const store_name *name);

/* {"models":[...]} for /api/ps, newest expiry first. */
json_t *sched_ps(sched *s);

/* The loaded models' totals for /metrics (what each engine measured last: KV bytes by
 * tier, requests waiting for a batch slot; the number of models loaded). Never waits
 * on a load or a run. */
void sched_gauges(sched *s, metrics_gauges *g);

#endif
