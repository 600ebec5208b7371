/* readprobe.c - see readprobe.h. */
#include "readprobe.h"

#include <stdlib.h>
#include <sys/mman.h>

/* perf: compiled for baseline x86-64, gcc lowers these vectors to SSE2 with the
 * accumulators on the stack: on a Xeon that read 12 GB/s where AVX2 loads read 20-26 and
 * AVX-512 loads 27-28, and on a Zen 3 VM 23-27 where AVX2 read 32-38 (a probe slower
 * than the matmuls put decode at 113-128% of its "bound"). Hence one loop per width.
 * Two streams: on a Zen 5 VM whose bus swung between 30 and 75 GB/s, two streams per
 * thread read as fast as one when the bus was fast and 8-15% faster when it was slow
 * (alternated passes, medians 41 against 36 GB/s, 63 against 56), where decode had come
 * out at 104-115% of a one-stream bound. */
typedef uint64_t v4u64 __attribute__((vector_size(32), aligned(1)));
typedef uint64_t v8u64 __attribute__((vector_size(64), aligned(1)));

/* streams 1: front to back; 2: the two halves side by side, two vectors of each per step */
#define READ_LOOP(VT)                                                                        \
    do {                                                                                     \
        const VT *v = buf;                                                                   \
        const size_t n = bytes / 256 * 256 / sizeof(VT);                                     \
        VT a = {0}, b = {0}, c = {0}, d = {0};                                               \
        if (streams == 2) {                                                                  \
            const VT *w = v + n / 2;                                                         \
            for (size_t i = 0; i + 2 <= n / 2; i += 2) {                                     \
                a += v[i];                                                                   \
                b += v[i + 1];                                                               \
                c += w[i];                                                                   \
                d += w[i + 1];                                                               \
            }                                                                                \
        } else {                                                                             \
            for (size_t i = 0; i + 4 <= n; i += 4) {                                         \
                a += v[i];                                                                   \
                b += v[i + 1];                                                               \
                c += v[i + 2];                                                               \
                d += v[i + 3];                                                               \
            }                                                                                \
        }                                                                                    \
        const VT e = a + b + c + d;                                                          \
        uint64_t s = 0;                                                                      \
        for (size_t k = 0; k < sizeof(VT) / sizeof(uint64_t); k++) s += e[k];                \
        return s;                                                                            \
    } while (0)

static uint64_t read_generic(const void *buf, size_t bytes, int streams) { READ_LOOP(v4u64); }

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) static uint64_t read_avx512(const void *buf, size_t bytes,
                                                                 int streams) {
    READ_LOOP(v8u64);
}
__attribute__((target("avx2"))) static uint64_t read_avx2(const void *buf, size_t bytes,
                                                             int streams) {
    READ_LOOP(v4u64);
}
#endif

typedef uint64_t (*read_fn)(const void *buf, size_t bytes, int streams);

/* The widest loop this CPU runs, and its name. */
static read_fn read_pick(const char **name) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        *name = "avx512";
        return read_avx512;
    }
    if (__builtin_cpu_supports("avx2")) {
        *name = "avx2";
        return read_avx2;
    }
#endif
    *name = "generic";
    return read_generic;
}

const char *bench_read_variant(void) {
    const char *name;
    read_pick(&name);
    return name;
}

uint64_t bench_read(const void *buf, size_t bytes, int streams) {
    const char *name;
    return read_pick(&name)(buf, bytes, streams);
}

void *bench_stream_alloc(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    void *p = aligned_alloc(huge, (bytes + huge - 1) / huge * huge);
    if (p) madvise(p, bytes, MADV_HUGEPAGE); /* a hint: ignored where THP is off */
    return p;
}
