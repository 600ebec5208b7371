/* sched.c - the loaded-model manager (sched.h). */
#define _GNU_SOURCE
#include "server/sched.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/file.h"
#include "server/internal.h"
#include "server/options.h"

#define SCHED_MAX_SLOTS 64
#define SCHED_DEFAULT_MAX_LOADED 3

struct sched {
    pthread_mutex_t lock;
    pthread_cond_t cv; /* refs dropped, a model (un)loaded, or the reaper has work */
    sched_model *loaded[SCHED_MAX_SLOTS];
    int n_loaded;
    int max_loaded;       /* models resident at once */
    uint64_t mem_budget;  /* bytes for all resident models; 0: from free RAM at each load */
    bool loading;         /* one load at a time */
    int pinging;          /* health checks in flight (outside the lock) */
    int health_ms;        /* ping an idle runner this long before reusing it; 0: never */
    _Atomic bool aborting; /* shutting down: a load in progress gives up */
    bool stopping;
    pthread_t reaper;
    bool reaper_started;
};

static int64_t wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t sched_default_keep_alive(void) {
    const char *names[] = {"HEARTH_KEEP_ALIVE", "OLLAMA_KEEP_ALIVE"};
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(names[i]);
        if (!v || !*v) continue;
        int64_t ns;
        char *end;
        errno = 0;
        long long secs = strtoll(v, &end, 10);
        if (!errno && end != v && !*end) /* plain integer seconds */
            return secs < 0 ? SCHED_KEEP_FOREVER
                            : (secs > INT64_MAX / 1000000000 ? SCHED_KEEP_FOREVER
                                                              : secs * 1000000000);
        if (opt_parse_duration(v, &ns, NULL) == HL_OK) return ns < 0 ? SCHED_KEEP_FOREVER : ns;
    }
    return 5LL * 60 * 1000000000;
}

int sched_health_timeout_ms(void) {
    const char *v = getenv("HEARTH_RUNNER_HEALTH_TIMEOUT");
    if (v && *v) {
        char *end;
        errno = 0;
        long long secs = strtoll(v, &end, 10);
        if (!errno && end != v && !*end)
            return secs <= 0 ? 0 : secs >= INT32_MAX / 1000 ? INT32_MAX : (int)(secs * 1000);
        int64_t ns;
        if (opt_parse_duration(v, &ns, NULL) == HL_OK) {
            if (ns <= 0) return 0;
            int64_t ms = ns / 1000000;
            return ms < 1 ? 1 : ms >= INT32_MAX ? INT32_MAX : (int)ms;
        }
    }
    return 10 * 1000; /* Ollama's 10 s for a loaded runner */
}

static int64_t expiry_from(int64_t now, int64_t keep) {
    if (keep == SCHED_KEEP_FOREVER || keep > INT64_MAX - now) return INT64_MAX;
    return now + keep;
}

static void model_unload(sched_model *m) {
    engine_close(m->eng);
    free(m->model_path);
    json_decref(m->details);
    free(m);
}

/* Removes loaded[i] (lock held) and frees it. */
static void remove_at(sched *s, int i) {
    sched_model *m = s->loaded[i];
    s->loaded[i] = s->loaded[--s->n_loaded];
    s->loaded[s->n_loaded] = NULL;
    model_unload(m);
    pthread_cond_broadcast(&s->cv);
}

static void *reaper_main(void *arg) {
    sched *s = arg;
    pthread_mutex_lock(&s->lock);
    while (!s->stopping) {
        int64_t now = wall_ns(), next = INT64_MAX;
        for (int i = 0; i < s->n_loaded;) {
            sched_model *m = s->loaded[i];
            if (m->loading) {
                i++;
                continue;
            }
            if (m->refs == 0 && (m->unload_when_idle || m->expires_at_ns <= now ||
                                 !engine_alive(m->eng))) {
                remove_at(s, i);
                continue;
            }
            if (m->refs == 0 && m->expires_at_ns < next) next = m->expires_at_ns;
            i++;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t wake = next == INT64_MAX ? now + 3600LL * 1000000000 : next;
        ts.tv_sec = (time_t)(wake / 1000000000);
        ts.tv_nsec = (long)(wake % 1000000000);
        pthread_cond_timedwait(&s->cv, &s->lock, &ts);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static int env_int(const char *a, const char *b, int dflt) {
    const char *names[] = {a, b};
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(names[i]);
        if (!v || !*v) continue;
        char *end;
        long n = strtol(v, &end, 10);
        if (end != v && !*end && n >= 0 && n < 1000000) return (int)n;
    }
    return dflt;
}

/* "123", "64M", "1.5G" (binary units) -> bytes; 0 when absent or malformed. */
static uint64_t env_bytes(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    double n = strtod(v, &end);
    if (end == v || !(n > 0)) return 0;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B' || *end == 'b') end++;
    if (*end == 'B') end++;
    if (*end) return 0;
    double b = n * mul;
    return b >= 1.8e19 ? UINT64_MAX : (uint64_t)b;
}

/* MemAvailable from /proc/meminfo (0 when unknown). */
static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

hl_status sched_create(sched **out, hl_err *err) {
    sched *s = calloc(1, sizeof *s);
    if (!s) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    /* Ollama's default is 3 per GPU; hearth runs on the CPU: 3 */
    s->max_loaded = env_int("HEARTH_MAX_LOADED_MODELS", "OLLAMA_MAX_LOADED_MODELS",
                            SCHED_DEFAULT_MAX_LOADED);
    if (s->max_loaded <= 0) s->max_loaded = SCHED_DEFAULT_MAX_LOADED;
    if (s->max_loaded > SCHED_MAX_SLOTS) s->max_loaded = SCHED_MAX_SLOTS;
    s->mem_budget = env_bytes("HEARTH_MAX_MEMORY");
    s->health_ms = sched_health_timeout_ms();
    pthread_mutex_init(&s->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_cond_init(&s->cv, &ca); /* CLOCK_REALTIME: expiries are wall-clock times */
    pthread_condattr_destroy(&ca);
    if (pthread_create(&s->reaper, NULL, reaper_main, s) != 0) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return hl_fail(err, HL_ERR_NOMEM, "cannot start the model reaper thread");
    }
    s->reaper_started = true;
    *out = s;
    return HL_OK;
}

void sched_abort_loads(sched *s) {
    if (s) atomic_store(&s->aborting, true);
}

void sched_destroy(sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_broadcast(&s->cv);
    /* a load in flight ends (a runner process being waited for is given up) */
    atomic_store(&s->aborting, true);
    while (s->loading || s->pinging > 0) pthread_cond_wait(&s->cv, &s->lock);
    pthread_mutex_unlock(&s->lock);
    if (s->reaper_started) pthread_join(s->reaper, NULL);
    while (s->n_loaded > 0) remove_at(s, s->n_loaded - 1);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static const char *kv_type_or_default(const engine_config *c) {
    return c->kv_type && *c->kv_type ? c->kv_type : "f16";
}

static bool same_cfg(const engine_config *a, const engine_config *b) {
    return a->num_ctx == b->num_ctx && a->num_batch == b->num_batch &&
           a->n_threads == b->n_threads && a->use_mmap == b->use_mmap &&
           strcmp(kv_type_or_default(a), kv_type_or_default(b)) == 0;
}

/* Whether a request for sm with cfg may share m (lock held; m not loading). */
static bool reusable(const sched_model *m, const store_model *sm, const engine_config *cfg) {
    return !m->unload_when_idle && same_cfg(&m->cfg, cfg) &&
           strcmp(m->model_path, sm->model_path) == 0 && engine_alive(m->eng);
}

static sched_model *find_locked(sched *s, const store_name *n) {
    for (int i = 0; i < s->n_loaded; i++)
        if (store_name_equal(&s->loaded[i]->sname, n)) return s->loaded[i];
    return NULL;
}

static void remove_model(sched *s, sched_model *m) {
    for (int i = 0; i < s->n_loaded; i++)
        if (s->loaded[i] == m) {
            remove_at(s, i);
            return;
        }
}

/* Memory a model holds (measured) or will need (predicted while loading). */
static uint64_t model_bytes(const sched_model *m) {
    if (m->loading || !m->eng) return m->predicted_bytes;
    engine_info info;
    engine_get_info(m->eng, &info);
    return info.mem_bytes > m->predicted_bytes ? info.mem_bytes : m->predicted_bytes;
}

/* Fitting (spec 5.4 in spirit, for the CPU): the weights file plus the KV cache of the
 * context must fit in what the budget leaves. */
static uint64_t predict_bytes(const store_model *sm, const engine_config *cfg) {
    uint64_t file = 0;
    struct stat st;
    if (stat(sm->model_path, &st) == 0 && st.st_size > 0) file = (uint64_t)st.st_size;
    (void)cfg; /* the KV pool grows on demand; its budget is shared, not reserved */
    return file;
}

static bool fits(const sched *s, uint64_t need) {
    uint64_t used = 0;
    for (int i = 0; i < s->n_loaded; i++) used += model_bytes(s->loaded[i]);
    if (s->mem_budget) return used + need <= s->mem_budget;
    /* runners are processes: what they hold is already gone from MemAvailable */
    uint64_t avail = mem_available();
    return avail == 0 || need <= avail / 10 * 9;
}

/* The model to make room with: idle first, shortest keep_alive first, then by name
 * (spec 5.3 findRunnerToUnload); NULL when nothing is loaded. *idle says which kind. */
static sched_model *pick_victim(sched *s, bool *idle) {
    sched_model *best = NULL;
    for (int pass = 0; pass < 2 && !best; pass++)
        for (int i = 0; i < s->n_loaded; i++) {
            sched_model *m = s->loaded[i];
            if (m->loading || (pass == 0 && m->refs > 0)) continue;
            if (!best || m->keep_alive_ns < best->keep_alive_ns ||
                (m->keep_alive_ns == best->keep_alive_ns && strcmp(m->name, best->name) < 0))
                best = m;
        }
    *idle = best && best->refs == 0;
    return best;
}

hl_status sched_acquire(sched *s, const store_model *sm, const engine_config *cfg,
                        int64_t keep_alive_ns, bool (*cancelled)(void *), void *ud,
                        sched_model **out, uint64_t *load_ns, hl_err *err) {
    uint64_t t0 = hl_time_ns();
    if (!sm->model_path)
        return hl_fail(err, HL_ERR_INVALID, "model \"%s\" has no model file", sm->name.model);
    uint64_t need = predict_bytes(sm, cfg);
    pthread_mutex_lock(&s->lock);
    hl_status st = HL_OK;
    for (;;) {
        if (s->stopping) {
            st = hl_fail(err, HL_ERR_CANCELLED, "server shutting down");
            break;
        }
        sched_model *m = find_locked(s, &sm->name);
        if (m && !m->loading && !m->checking) {
            if (reusable(m, sm, cfg) && m->refs == 0 && s->health_ms > 0 &&
                engine_pid(m->eng) > 0) {
                /* an idle runner may be stuck while alive: it must answer a health check
                 * first (spec 5.2). Outside the lock; the reference keeps it loaded and
                 * `checking` makes other requests for it wait for the verdict. */
                m->checking = true;
                m->refs++;
                s->pinging++;
                pthread_mutex_unlock(&s->lock);
                bool ok = engine_ping(m->eng, s->health_ms);
                pthread_mutex_lock(&s->lock);
                m->checking = false;
                s->pinging--;
                m->refs--;
                pthread_cond_broadcast(&s->cv);
                if (!ok) { /* killed by the ping: unload, then load anew below */
                    if (m->refs == 0) remove_model(s, m);
                    else m->unload_when_idle = true;
                    continue;
                }
                if (s->stopping) continue;
            }
            if (reusable(m, sm, cfg)) {
                m->refs++;
                if (keep_alive_ns != SCHED_KEEP_UNSET) m->keep_alive_ns = keep_alive_ns;
                pthread_mutex_unlock(&s->lock);
                *out = m;
                *load_ns = hl_time_ns() - t0;
                return HL_OK;
            }
            /* other options, a dead runner or draining: reload once it is idle; new
             * users wait meanwhile, so that it drains */
            if (m->refs == 0) {
                remove_model(s, m);
                continue;
            }
            m->unload_when_idle = true;
        } else if (!m && !s->loading) {
            bool made_room = false;
            while (s->n_loaded > 0 && (s->n_loaded >= s->max_loaded || !fits(s, need))) {
                bool idle;
                sched_model *v = pick_victim(s, &idle);
                if (!v) break;
                if (!idle) {
                    v->unload_when_idle = true; /* evicted once its requests finish */
                    break;
                }
                remove_model(s, v);
                made_room = true;
            }
            (void)made_room;
            /* nothing loaded: best effort, as Ollama loads the first model whatever fits */
            if (s->n_loaded == 0 || (s->n_loaded < s->max_loaded && fits(s, need))) break;
        }
        /* wait: a load in progress, or a busy model to be released */
        if (cancelled && cancelled(ud)) {
            st = hl_fail(err, HL_ERR_CANCELLED, "request canceled");
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&s->cv, &s->lock, &ts);
    }
    if (st) {
        pthread_mutex_unlock(&s->lock);
        return st;
    }
    /* load outside the lock (a runner process takes a while); the placeholder holds its
     * place in the budget and makes other requests for it wait */
    sched_model *m = calloc(1, sizeof *m);
    if (!m) st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
    if (!st) {
        m->sname = sm->name;
        store_name_display(&sm->name, m->name, sizeof m->name);
        memcpy(m->digest, sm->digest_hex, sizeof m->digest);
        m->model_path = strdup(sm->model_path);
        m->details = srv_model_details(sm->config);
        m->cfg = *cfg;
        m->predicted_bytes = need;
        m->loading = true;
        m->refs = 1;
        m->keep_alive_ns = keep_alive_ns != SCHED_KEEP_UNSET ? keep_alive_ns
                                                             : sched_default_keep_alive();
        if (!m->model_path || !m->details) st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    if (st) {
        if (m) model_unload(m);
        pthread_mutex_unlock(&s->lock);
        return st;
    }
    s->loaded[s->n_loaded++] = m;
    s->loading = true;
    pthread_mutex_unlock(&s->lock);
    engine *eng = NULL;
    engine_config ocfg = *cfg;
    ocfg.abort = &s->aborting;
    st = engine_open(sm->model_path, &ocfg, &eng, err);
    pthread_mutex_lock(&s->lock);
    s->loading = false;
    if (st) {
        m->loading = false;
        m->eng = NULL;
        remove_model(s, m); /* broadcasts */
        pthread_mutex_unlock(&s->lock);
        return st;
    }
    m->eng = eng;
    engine_get_info(m->eng, &m->info);
    m->loading = false;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
    *out = m;
    *load_ns = hl_time_ns() - t0;
    return HL_OK;
}

void sched_release(sched *s, sched_model *m, int64_t keep_alive_ns) {
    pthread_mutex_lock(&s->lock);
    if (keep_alive_ns != SCHED_KEEP_UNSET) m->keep_alive_ns = keep_alive_ns;
    if (--m->refs == 0) {
        if (m->keep_alive_ns <= 0) m->unload_when_idle = true;
        m->expires_at_ns = expiry_from(wall_ns(), m->keep_alive_ns);
        /* unload here rather than in the reaper, so that the reply (sent after this)
         * never races a /api/ps that still lists the model */
        if (m->unload_when_idle)
            for (int i = 0; i < s->n_loaded; i++)
                if (s->loaded[i] == m) {
                    remove_at(s, i);
                    break;
                }
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
}

bool sched_expire(sched *s, const store_name *name) {
    pthread_mutex_lock(&s->lock);
    sched_model *m = find_locked(s, name);
    if (m) {
        m->unload_when_idle = true;
        m->keep_alive_ns = 0;
        if (m->refs == 0)
            for (int i = 0; i < s->n_loaded; i++)
                if (s->loaded[i] == m) {
                    remove_at(s, i);
                    break;
                }
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
    return m != NULL;
}

json_t *sched_ps(sched *s) {
    json_t *arr = json_array();
    int64_t now = wall_ns();
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->n_loaded;) { /* a crashed runner is not listed as loaded */
        sched_model *d = s->loaded[i];
        if (!d->loading && d->refs == 0 && !engine_alive(d->eng)) {
            remove_at(s, i);
            continue;
        }
        i++;
    }
    /* newest expiry first */
    sched_model *order[SCHED_MAX_SLOTS];
    int n = s->n_loaded;
    for (int i = 0; i < n; i++) order[i] = s->loaded[i];
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && order[j]->expires_at_ns > order[j - 1]->expires_at_ns; j--) {
            sched_model *t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (int i = 0; i < n; i++) {
        sched_model *m = order[i];
        if (m->loading || !engine_alive(m->eng)) continue; /* listed once up, until dead */
        engine_get_info(m->eng, &m->info);
        int64_t exp = m->refs > 0 ? expiry_from(now, m->keep_alive_ns) : m->expires_at_ns;
        if (m->unload_when_idle) exp = now;
        char when[64];
        srv_format_time(exp, when, sizeof when);
        json_array_append_new(
            arr, json_pack("{s:s, s:s, s:I, s:s, s:O, s:s, s:i, s:i}", "name", m->name, "model",
                           m->name, "size", (json_int_t)m->info.mem_bytes, "digest", m->digest,
                           "details", m->details, "expires_at", when, "size_vram", 0,
                           "context_length", m->info.n_ctx));
    }
    pthread_mutex_unlock(&s->lock);
    return json_pack("{s:o}", "models", arr);
}

void sched_gauges(sched *s, metrics_gauges *g) {
    *g = (metrics_gauges){0};
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->n_loaded; i++) {
        sched_model *m = s->loaded[i];
        if (m->loading || !engine_alive(m->eng)) continue;
        engine_info info;
        engine_get_info(m->eng, &info);
        g->loaded++;
        g->kv_ram += info.kv_ram_bytes;
        g->kv_compressed += info.kv_compressed_bytes;
        g->kv_disk += info.kv_disk_bytes;
        g->queued += info.queued > 0 ? (uint64_t)info.queued : 0;
    }
    pthread_mutex_unlock(&s->lock);
}
