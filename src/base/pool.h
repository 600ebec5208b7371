/*
 * pool.h - a persistent thread pool for compute kernels.
 *
 * hl_pool_create(n) starts n-1 worker threads once; the calling thread is worker 0.
 * hl_pool_run(pool, fn, ctx) calls fn(ctx, ith, nth) on every worker (ith in
 * [0, nth)) and returns when all have finished: ggml-style row splitting, no thread
 * creation per op. A NULL pool runs fn(ctx, 0, 1) inline. Only one thread may call
 * hl_pool_run / hl_pool_run_any on a given pool at a time.
 */
#ifndef HL_BASE_POOL_H
#define HL_BASE_POOL_H

#include "base/status.h"

typedef struct hl_pool hl_pool;
typedef void (*hl_pool_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0: hl_cpu_default_threads(), the physical cores this process may use. */
hl_status hl_pool_create(int n_threads, hl_pool **out, hl_err *err);
void hl_pool_destroy(hl_pool *p); /* accepts NULL; joins the workers */
int hl_pool_n_threads(const hl_pool *p); /* 1 for NULL */
void hl_pool_run(hl_pool *p, hl_pool_fn fn, void *ctx);
/* Like hl_pool_run for work that the threads claim dynamically (e.g. chunks from an
 * atomic counter), so that any subset of them completes it: fn(ctx, 0, nth) runs on
 * the caller, and fn(ctx, ith, nth) on each worker that wakes up before the caller has
 * returned from its own call. A worker that is late (descheduled on a busy machine)
 * skips the run instead of holding it up. Returns once every thread that entered fn
 * has left it. */
void hl_pool_run_any(hl_pool *p, hl_pool_fn fn, void *ctx);
/* Marks a burst of back-to-back runs (one forward pass: ~110 runs per decoded token,
 * a few microseconds of caller work between them). Inside a burst, idle workers and
 * the waiting caller keep spinning (yielding the CPU every few microseconds) instead of
 * going to sleep after the spin budget, because a futex wake-up costs more than the
 * gaps it would save. After hl_pool_burst_end() they sleep once the usual budget is
 * spent, so a pool between bursts costs no CPU. Called by the pool's caller thread;
 * bursts do not nest. */
void hl_pool_burst_begin(hl_pool *p); /* accepts NULL */
void hl_pool_burst_end(hl_pool *p);   /* accepts NULL */

#endif
