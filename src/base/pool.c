/*
 * pool.c - a generation counter hands out work; workers spin on it briefly, then
 * sleep on a condition variable.
 *
 * hl_pool_run publishes fn/ctx, sets pending = n-1 and bumps the atomic generation
 * (release). A worker that sees a new generation (acquire) runs its share and
 * decrements pending; the caller runs share 0, then waits for pending == 0. Both
 * waits spin for up to spin_ns first (HEARTH_POOL_SPIN_US, default 100 us): a decoded
 * token is ~150 back-to-back small ops, and waking a sleeping thread costs more
 * than most of them. After the budget a thread sleeps, so an idle pool costs no CPU.
 *
 * Joining a run: a worker that sees generation g enters it only by a CAS on run_state
 * (g in the high 32 bits, bit 31 = closed, the low bits = threads inside fn), and reads
 * fn/ctx only once inside. hl_pool_run never closes its run (every worker must do its
 * share; pending counts them out). hl_pool_run_any closes the run when the caller's own
 * fn returns, then waits only for the workers inside: a late worker's CAS fails, and it
 * goes back to waiting. The caller cannot publish the next run while a worker is inside,
 * so fn/ctx/any are stable for it.
 *
 * Bursts (hl_pool_burst_begin/end): while p->burst is set, the spin loops ignore their
 * deadline. The spin budget alone cannot serve both cases: on a machine whose CPUs are
 * all pool threads it is 0 (a worker spinning between tokens would take the CPU that
 * the server or another model needs), but within a forward pass the gaps between runs
 * are microseconds and every futex wake-up (tens of microseconds on a VM) leaves a CPU
 * idle for the head of the next matmul. Measured: bench_model decode at Q4_K_M,
 * 2 threads on 2 vCPUs, 47-51 tok/s sleeping vs 50-57 spinning.
 *
 * Lost wake-ups are ruled out Dekker-style with seq_cst atomics: a sleeper raises
 * its `sleeping` count under the mutex and re-checks the condition before waiting;
 * the waker changes the condition, then reads `sleeping`, and if it is non-zero takes
 * the mutex to signal. At least one of the two sees the other's write.
 */
#define _POSIX_C_SOURCE 200809L
#include "base/pool.h"

#include "base/cpu.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

struct hl_pool {
    int n_threads;
    int64_t spin_ns;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* workers sleep here for a new generation */
    pthread_cond_t done_cv; /* the caller sleeps here for pending == 0 */
    atomic_uint generation;
    atomic_int pending;
    atomic_int workers_sleeping;
    atomic_int caller_sleeping;
    atomic_int stop;
    atomic_int burst; /* inside hl_pool_burst_begin/end: spin without a deadline */
    _Atomic uint64_t run_state; /* see "Joining a run" above */
    hl_pool_fn fn; /* written before the generation bump, read after joining */
    void *ctx;
    int any; /* the run is hl_pool_run_any's */
};

#define RUN_CLOSED ((uint64_t)1 << 31)
#define RUN_INSIDE_MASK (RUN_CLOSED - 1)

/* Enters run `gen` unless it is closed or already replaced; true if entered. */
static int join_run(hl_pool *p, unsigned gen) {
    uint64_t s = atomic_load(&p->run_state);
    while ((uint32_t)(s >> 32) == gen && !(s & RUN_CLOSED))
        if (atomic_compare_exchange_weak(&p->run_state, &s, s + 1)) return 1;
    return 0;
}

typedef struct worker_arg {
    hl_pool *pool;
    int ith;
} worker_arg;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spins until the generation differs from seen or the budget runs out; true if it
 * changed. The clock is read every 64 iterations only. */
static int spin_for_generation(hl_pool *p, unsigned seen) {
    if (p->spin_ns == 0 && !atomic_load_explicit(&p->burst, memory_order_relaxed))
        return atomic_load(&p->generation) != seen;
    int64_t deadline = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&p->generation, memory_order_acquire) != seen) return 1;
        cpu_relax();
        if ((i & 63) == 0) {
            sched_yield(); /* lets a thread sharing this core (maybe the caller) run */
            if (atomic_load_explicit(&p->burst, memory_order_relaxed)) continue;
            const int64_t t = now_ns();
            if (!deadline) deadline = t + p->spin_ns;
            else if (t >= deadline) return 0;
        }
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    hl_pool *p = wa->pool;
    const int ith = wa->ith;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        if (!spin_for_generation(p, seen)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->workers_sleeping, 1);
            while (atomic_load(&p->generation) == seen) pthread_cond_wait(&p->work_cv, &p->mu);
            atomic_fetch_sub(&p->workers_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
        }
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (atomic_load(&p->stop)) break;
        if (!join_run(p, seen)) continue; /* a run_any that finished without us */
        const int any = p->any;
        p->fn(p->ctx, ith, p->n_threads);
        const uint64_t left = atomic_fetch_sub(&p->run_state, 1) - 1;
        const int last = any ? (left & RUN_CLOSED) && (left & RUN_INSIDE_MASK) == 0
                             : atomic_fetch_sub(&p->pending, 1) == 1;
        if (last && atomic_load(&p->caller_sleeping)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

static void wake_workers(hl_pool *p) {
    if (atomic_load(&p->workers_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->work_cv);
        pthread_mutex_unlock(&p->mu);
    }
}

hl_status hl_pool_create(int n_threads, hl_pool **out, hl_err *err) {
    *out = NULL;
    if (n_threads <= 0) n_threads = hl_cpu_default_threads(); /* physical cores we may use */
    if (n_threads > 512) n_threads = 512;
    hl_pool *p = calloc(1, sizeof *p);
    if (!p) return hl_fail(err, HL_ERR_NOMEM, "thread pool: out of memory");
    p->n_threads = n_threads;
    p->spin_ns = n_threads >= hl_cpu_usable() ? 0 : 100 * 1000;
    const char *env = getenv("HEARTH_POOL_SPIN_US");
    if (env) {
        const long us = strtol(env, NULL, 10);
        p->spin_ns = us < 0 ? 0 : us > 1000000 ? 1000000000 : (int64_t)us * 1000;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->workers_sleeping, 0);
    atomic_init(&p->caller_sleeping, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->burst, 0);
    atomic_init(&p->run_state, 0);
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
        atomic_store(&p->stop, 1);
        pthread_mutex_lock(&p->mu);
        atomic_fetch_add(&p->generation, 1);
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

/* True once the run is over: all workers out (pending) or, for run_any, nobody inside. */
static int run_done(hl_pool *p) {
    if (p->any) return (atomic_load(&p->run_state) & RUN_INSIDE_MASK) == 0;
    return atomic_load_explicit(&p->pending, memory_order_acquire) == 0;
}

static void run(hl_pool *p, hl_pool_fn fn, void *ctx, int any) {
    if (!p || p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->any = any;
    const unsigned gen = atomic_load(&p->generation) + 1;
    atomic_store(&p->pending, p->n_threads - 1);
    atomic_store(&p->run_state, (uint64_t)gen << 32);
    atomic_fetch_add(&p->generation, 1); /* seq_cst: publishes fn/ctx/any/pending/run_state */
    wake_workers(p);
    fn(ctx, 0, p->n_threads);
    if (any) atomic_fetch_or(&p->run_state, RUN_CLOSED); /* late workers now skip it */
    /* spin, then sleep, until the workers are done */
    int64_t deadline = 0;
    const int spin = p->spin_ns > 0 || atomic_load_explicit(&p->burst, memory_order_relaxed);
    for (unsigned i = 1; !run_done(p); i++) {
        cpu_relax();
        if ((i & 63) != 0 && spin) continue;
        sched_yield();
        if (atomic_load_explicit(&p->burst, memory_order_relaxed)) continue;
        const int64_t t = now_ns();
        if (!deadline && p->spin_ns > 0) {
            deadline = t + p->spin_ns;
        } else if (t >= deadline) {
            pthread_mutex_lock(&p->mu);
            atomic_store(&p->caller_sleeping, 1);
            while (!run_done(p)) pthread_cond_wait(&p->done_cv, &p->mu);
            atomic_store(&p->caller_sleeping, 0);
            pthread_mutex_unlock(&p->mu);
            break;
        }
    }
}

void hl_pool_run(hl_pool *p, hl_pool_fn fn, void *ctx) { run(p, fn, ctx, 0); }

void hl_pool_run_any(hl_pool *p, hl_pool_fn fn, void *ctx) { run(p, fn, ctx, 1); }

void hl_pool_burst_begin(hl_pool *p) {
    if (p && p->n_threads > 1) atomic_store_explicit(&p->burst, 1, memory_order_relaxed);
}

void hl_pool_burst_end(hl_pool *p) {
    if (p && p->n_threads > 1) atomic_store_explicit(&p->burst, 0, memory_order_relaxed);
}
