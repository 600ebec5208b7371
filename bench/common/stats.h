/*
 * stats.h - the benchmarks' summary statistics.
 *
 * bench_median() returns the median of v[0..n) (the mean of the middle two for even n; 0
 * for n <= 0; NAN if the copy cannot be allocated) and leaves v as it was: it sorts a copy. An earlier median that sorted its
 * input in place made a batched A/B read its per-step times out of order after the
 * median had been taken (bench/README, 2026-12-07). Not for hot paths: it allocates.
 */
#ifndef HL_BENCH_STATS_H
#define HL_BENCH_STATS_H

double bench_median(const double *v, int n);

#endif
