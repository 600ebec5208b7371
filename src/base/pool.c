/*
 * pool.c - workers wait on a condition variable for a new generation number; each
 * run bumps the generation, every worker runs its share, and the caller waits
 * until the pending count drops to zero. Simple and correct first; a spinning
 * variant for very short ops can come later behind the same interface.
 */
#define _POSIX_C_SOURCE 200809L
#include "base/pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct hl_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    unsigned long generation;
    int pending;
    int stop;
    hl_pool_fn fn;
    void *ctx;
};

typedef struct worker_arg {
    hl_pool *pool;
    int ith;
} worker_arg;

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    hl_pool *p = wa->pool;
    int ith = wa->ith;
    free(wa);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        hl_pool_fn fn = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);
        fn(ctx, ith, p->n_threads);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

hl_status hl_pool_create(int n_threads, hl_pool **out, hl_err *err) {
    *out = NULL;
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (n_threads > 512) n_threads = 512;
    hl_pool *p = calloc(1, sizeof *p);
    if (!p) return hl_fail(err, HL_ERR_NOMEM, "thread pool: out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        hl_pool_destroy(p);
        return hl_fail(err, HL_ERR_NOMEM, "thread pool: out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) {
            wa->pool = p;
            wa->ith = i;
        }
        if (!wa || pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n_threads = i; /* only join what started */
            hl_pool_destroy(p);
            return hl_fail(err, HL_ERR_NOMEM, "thread pool: cannot start thread %d", i);
        }
    }
    *out = p;
    return HL_OK;
}

void hl_pool_destroy(hl_pool *p) {
    if (!p) return;
    if (p->threads) {
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_cond_broadcast(&p->work_cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
        free(p->threads);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p);
}

int hl_pool_n_threads(const hl_pool *p) { return p ? p->n_threads : 1; }

void hl_pool_run(hl_pool *p, hl_pool_fn fn, void *ctx) {
    if (!p || p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->pending = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n_threads);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
