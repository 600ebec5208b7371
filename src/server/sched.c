/* sched.c - the loaded-model manager (sched.h). */
#define _GNU_SOURCE
#include "server/sched.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "server/internal.h"
#include "server/options.h"

#define SCHED_MAX_LOADED 1

struct sched {
    pthread_mutex_t lock;
    pthread_cond_t cv; /* refs dropped, a model unloaded, or the reaper has work */
    sched_model *loaded[SCHED_MAX_LOADED];
    int n_loaded;
    int n_switching; /* requests waiting for another model to be swapped in */
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
            if (m->refs == 0 && (m->unload_when_idle || m->expires_at_ns <= now)) {
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

hl_status sched_create(sched **out, hl_err *err) {
    sched *s = calloc(1, sizeof *s);
    if (!s) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
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

void sched_destroy(sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
    if (s->reaper_started) pthread_join(s->reaper, NULL);
    while (s->n_loaded > 0) remove_at(s, s->n_loaded - 1);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static bool same_cfg(const engine_config *a, const engine_config *b) {
    return a->num_ctx == b->num_ctx && a->num_batch == b->num_batch &&
           a->n_threads == b->n_threads;
}

static bool reusable_cfg(const sched_model *m, const store_model *sm, const engine_config *cfg) {
    return !m->unload_when_idle && same_cfg(&m->cfg, cfg) && strcmp(m->model_path, sm->model_path) == 0;
}

static sched_model *find_locked(sched *s, const store_name *n) {
    for (int i = 0; i < s->n_loaded; i++)
        if (store_name_equal(&s->loaded[i]->sname, n)) return s->loaded[i];
    return NULL;
}

hl_status sched_acquire(sched *s, const store_model *sm, const engine_config *cfg,
                        int64_t keep_alive_ns, bool (*cancelled)(void *), void *ud,
                        sched_model **out, uint64_t *load_ns, hl_err *err) {
    uint64_t t0 = hl_time_ns();
    if (!sm->model_path)
        return hl_fail(err, HL_ERR_INVALID, "model \"%s\" has no model file", sm->name.model);
    pthread_mutex_lock(&s->lock);
    bool switching = false; /* this request is counted in n_switching */
    hl_status st = HL_OK;
    for (;;) {
        if (s->stopping) {
            st = hl_fail(err, HL_ERR_CANCELLED, "server shutting down");
            break;
        }
        sched_model *m = find_locked(s, &sm->name);
        bool resident = m && reusable_cfg(m, sm, cfg);
        /* fairness: while a request waits to swap another model in, new users of the
         * resident one wait too, so that it drains */
        if (resident && (switching || s->n_switching == 0)) {
            if (switching) s->n_switching--;
            m->refs++;
            if (keep_alive_ns != SCHED_KEEP_UNSET) m->keep_alive_ns = keep_alive_ns;
            pthread_mutex_unlock(&s->lock);
            *out = m;
            *load_ns = hl_time_ns() - t0;
            return HL_OK;
        }
        if (!resident) {
            /* make room: unload idle models that are in the way */
            for (int i = 0; i < s->n_loaded;) {
                sched_model *o = s->loaded[i];
                bool in_way = o == m || s->n_loaded >= SCHED_MAX_LOADED;
                if (in_way && o->refs == 0) {
                    remove_at(s, i);
                    continue;
                }
                i++;
            }
            if (s->n_loaded < SCHED_MAX_LOADED && !find_locked(s, &sm->name)) break;
            if (!switching) s->n_switching++;
            switching = true;
        }
        /* wait for a busy model to be released */
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
    if (switching) s->n_switching--;
    if (st) {
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->lock);
        return st;
    }
    /* load (under the lock: one load at a time; the weights are mmapped, so it is quick) */
    sched_model *m = calloc(1, sizeof *m);
    if (!m) st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
    if (!st) {
        m->sname = sm->name;
        store_name_display(&sm->name, m->name, sizeof m->name);
        memcpy(m->digest, sm->digest_hex, sizeof m->digest);
        m->model_path = strdup(sm->model_path);
        m->details = srv_model_details(sm->config);
        m->cfg = *cfg;
        if (!m->model_path || !m->details) st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    if (!st) st = engine_open(sm->model_path, cfg, &m->eng, err);
    if (st) {
        if (m) {
            m->eng = NULL;
            model_unload(m);
        }
        pthread_mutex_unlock(&s->lock);
        return st;
    }
    engine_get_info(m->eng, &m->info);
    m->refs = 1;
    m->keep_alive_ns = keep_alive_ns != SCHED_KEEP_UNSET ? keep_alive_ns
                                                         : sched_default_keep_alive();
    s->loaded[s->n_loaded++] = m;
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
    /* newest expiry first; with one model there is nothing to sort yet */
    sched_model *order[SCHED_MAX_LOADED];
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
