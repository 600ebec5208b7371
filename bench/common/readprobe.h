/*
 * readprobe.h - the benchmarks' plain streaming read: the ceiling a decode's weight
 * stream is held against (bench_model's bandwidth probe, bench_dot_stream's "read").
 *
 * bench_read() loads every byte of [buf, buf + bytes) (rounded down to 256 bytes) in the
 * widest vectors the CPU has, as one stream front to back (streams 1) or as its two
 * halves read side by side (streams 2), and returns a sum the caller keeps (so the loads
 * stay). A bound is the best of both: which reads faster depends on the machine and on
 * the moment (readprobe.c);
 * bench_read_variant() names those vectors ("avx512", "avx2", "generic"). No alignment
 * is required; nothing is allocated.
 * bench_stream_alloc() allocates a buffer to stream (free() it) in memory like the
 * model's weights: 2 MiB aligned, transparent huge pages requested (hl_map_read), so the
 * bound and the weights pay the same TLB misses.
 */
#ifndef HL_BENCH_READPROBE_H
#define HL_BENCH_READPROBE_H

#include <stddef.h>
#include <stdint.h>

uint64_t bench_read(const void *buf, size_t bytes, int streams);
const char *bench_read_variant(void);
void *bench_stream_alloc(size_t bytes);

#endif
