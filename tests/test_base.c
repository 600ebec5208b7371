#include "test.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/cpu.h"
#include "base/file.h"
#include "base/pool.h"
#include "base/status.h"
#include "base/strmap.h"
#include "base/utf8.h"

TEST(base_err_fail_and_prefix) {
    hl_err err;
    hl_err_clear(&err);
    CHECK_EQ_INT(hl_fail(&err, HL_ERR_FORMAT, "bad %s", "magic"), HL_ERR_FORMAT);
    CHECK_EQ_INT(err.code, HL_ERR_FORMAT);
    hl_err_prefix(&err, "model.gguf");
    CHECK_STR(err.msg, "model.gguf: bad magic");
    CHECK_EQ_INT(hl_fail(NULL, HL_ERR_IO, "ignored"), HL_ERR_IO);
}

TEST(base_strmap_put_get_grow) {
    hl_strmap *m = hl_strmap_create(4);
    CHECK(m);
    char key[32];
    for (int i = 0; i < 5000; i++) {
        int n = snprintf(key, sizeof key, "k%d", i);
        CHECK_OK(hl_strmap_put(m, key, (size_t)n, i * 3), (hl_err *)NULL);
    }
    CHECK_EQ_INT(hl_strmap_count(m), 5000);
    for (int i = 0; i < 5000; i++) {
        int n = snprintf(key, sizeof key, "k%d", i);
        int64_t v = -1;
        CHECK(hl_strmap_get(m, key, (size_t)n, &v));
        CHECK_EQ_INT(v, i * 3);
    }
    CHECK(!hl_strmap_get(m, "nope", 4, NULL));
    /* keys with NUL bytes and empty keys are distinct keys */
    CHECK_OK(hl_strmap_put(m, "a\0b", 3, 7), (hl_err *)NULL);
    CHECK_OK(hl_strmap_put(m, "", 0, 8), (hl_err *)NULL);
    int64_t v = 0;
    CHECK(hl_strmap_get(m, "a\0b", 3, &v) && v == 7);
    CHECK(!hl_strmap_get(m, "a", 1, &v));
    CHECK(hl_strmap_get(m, "", 0, &v) && v == 8);
    hl_strmap_destroy(m);
}

typedef struct pool_ctx {
    int hits[64];
    long sum[64];
} pool_ctx;

static void pool_work(void *ctx, int ith, int nth) {
    pool_ctx *c = ctx;
    c->hits[ith]++;
    for (int i = ith; i < 1000; i += nth) c->sum[ith] += i;
}

TEST(base_pool_runs_every_worker) {
    hl_pool *p = NULL;
    hl_err err;
    CHECK_OK(hl_pool_create(4, &p, &err), &err);
    CHECK_EQ_INT(hl_pool_n_threads(p), 4);
    for (int round = 0; round < 200; round++) {
        pool_ctx c;
        memset(&c, 0, sizeof c);
        hl_pool_run(p, pool_work, &c);
        long total = 0;
        for (int i = 0; i < 4; i++) {
            CHECK_EQ_INT(c.hits[i], 1);
            total += c.sum[i];
        }
        CHECK_EQ_INT(total, 999 * 1000 / 2);
    }
    hl_pool_destroy(p);
    pool_ctx c;
    memset(&c, 0, sizeof c);
    hl_pool_run(NULL, pool_work, &c);
    CHECK_EQ_INT(c.sum[0], 999 * 1000 / 2);
}

TEST(base_file_read_write_and_missing) {
    char path[512];
    snprintf(path, sizeof path, "%s/x.bin", test_tmpdir());
    hl_err err;
    CHECK_OK(hl_file_write(path, "hello", 5, &err), &err);
    char *buf = NULL;
    size_t len = 0;
    CHECK_OK(hl_file_read(path, &buf, &len, &err), &err);
    CHECK_EQ_INT(len, 5);
    CHECK_STR(buf, "hello");
    free(buf);
    CHECK_EQ_INT(hl_file_read("/nonexistent/x", &buf, &len, &err), HL_ERR_IO);
    CHECK(strstr(err.msg, "/nonexistent/x") != NULL);
    hl_map m;
    CHECK_OK(hl_map_open(path, &m, &err), &err);
    CHECK_EQ_INT(m.size, 5);
    CHECK(memcmp(m.data, "hello", 5) == 0);
    hl_map_close(&m);
    /* read in instead of mapped: the same bytes, page aligned; the same errors */
    CHECK_OK(hl_map_read(path, &m, &err), &err);
    CHECK_EQ_INT(m.size, 5);
    CHECK(memcmp(m.data, "hello", 5) == 0);
    CHECK(((uintptr_t)m.data & 4095) == 0);
    hl_map_close(&m);
    CHECK(m.data == NULL && m.size == 0);
    CHECK_EQ_INT(hl_map_read("/nonexistent/x", &m, &err), HL_ERR_IO);
    CHECK(strstr(err.msg, "/nonexistent/x") != NULL);
    CHECK_EQ_INT(hl_map_read(test_tmpdir(), &m, &err), HL_ERR_IO); /* a directory */
    CHECK(strstr(err.msg, "not a regular file") != NULL);
    /* an empty file and a file larger than one read chunk (64 MiB) */
    CHECK_OK(hl_file_write(path, "", 0, &err), &err);
    CHECK_OK(hl_map_read(path, &m, &err), &err);
    CHECK(m.data == NULL && m.size == 0);
    const size_t big = ((size_t)64 << 20) + 4099;
    uint8_t *data = malloc(big);
    CHECK(data != NULL);
    for (size_t i = 0; i < big; i++) data[i] = (uint8_t)(i * 2654435761u >> 24);
    CHECK_OK(hl_file_write(path, data, big, &err), &err);
    CHECK_OK(hl_map_read(path, &m, &err), &err);
    CHECK_EQ_INT(m.size, big);
    CHECK(memcmp(m.data, data, big) == 0);
    CHECK(((uintptr_t)m.data & ((2u << 20) - 1)) == 0); /* room for huge pages */
    const uint8_t *was = m.data;
    hl_map_close(&m);
    /* all of it unmapped, the page holding the last byte too */
    unsigned char resident[1];
    CHECK(mincore((void *)was, 4096, resident) != 0 && errno == ENOMEM);
    CHECK(mincore((void *)((uintptr_t)(was + big - 1) & ~(uintptr_t)4095), 4096, resident) != 0 &&
          errno == ENOMEM);
    free(data);
    unlink(path);
}

TEST(base_file_reads_gzip) {
    const char *p = test_shared_path("models/hf-tokenizers/llama3/tokenizer.json.gz");
    if (!p) SKIP("../shared/models/hf-tokenizers/llama3/tokenizer.json.gz not found");
    char *buf = NULL;
    size_t len = 0;
    hl_err err;
    CHECK_OK(hl_file_read(p, &buf, &len, &err), &err);
    CHECK(len > 1000000);
    CHECK(buf[0] == '{');
    free(buf);
}

/* ---- pool stress: spin and sleep paths, the boundary between them, teardown ---- */

typedef struct stress_ctx {
    int n;           /* plain ints: the pool's hand-off must order them */
    int seen[16];
    unsigned round;
    unsigned stamp[16];
} stress_ctx;

static void stress_work(void *ctx, int ith, int nth) {
    stress_ctx *c = ctx;
    c->seen[ith]++;
    c->stamp[ith] = c->round; /* reads the caller's write from before the run */
    if (nth != c->n) c->seen[ith] += 1000;
}

static bool stress_rounds(hl_pool *p, int n_threads, int rounds, int max_sleep_us) {
    stress_ctx c;
    memset(&c, 0, sizeof c);
    c.n = n_threads;
    uint32_t rng = 12345;
    for (int r = 0; r < rounds; r++) {
        c.round = (unsigned)r + 1;
        hl_pool_run(p, stress_work, &c);
        for (int i = 0; i < n_threads; i++)
            if (c.seen[i] != r + 1 || c.stamp[i] != (unsigned)r + 1) return false;
        if (max_sleep_us > 0) {
            rng = rng * 1103515245u + 12345u;
            const unsigned us = (rng >> 16) % (unsigned)max_sleep_us;
            if (us > 0) usleep(us);
        }
    }
    return true;
}

static void set_spin(const char *us) {
    if (us)
        setenv("HEARTH_POOL_SPIN_US", us, 1);
    else
        unsetenv("HEARTH_POOL_SPIN_US");
}

TEST(base_pool_stress_spin_and_sleep) {
    /* spin 0: every wait sleeps; default: back-to-back runs stay in the spin; 50 us with
     * random gaps up to 150 us: waits end on either side of the budget */
    const char *spins[] = {"0", NULL, "50"};
    const int gaps[] = {0, 0, 150};
    const int rounds[] = {3000, 20000, 1500};
    for (int k = 0; k < 3; k++) {
        set_spin(spins[k]);
        for (int nt = 2; nt <= 5; nt += 3) {
            hl_pool *p = NULL;
            hl_err err;
            CHECK_OK(hl_pool_create(nt, &p, &err), &err);
            CHECK_MSG(stress_rounds(p, nt, rounds[k], gaps[k]), "spin %s, %d threads",
                      spins[k] ? spins[k] : "default", nt);
            hl_pool_destroy(p);
        }
    }
    set_spin(NULL);
}

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Bursts: runs inside hl_pool_burst_begin/end are correct with any mix of gaps, and once
 * a burst ends the workers go back to sleep even with a spin budget of 0 (an idle pool
 * costs no CPU: 300 ms of idling burn far less than 300 ms per worker). */
TEST(base_pool_burst_spins_then_sleeps) {
    set_spin("0");
    for (int nt = 2; nt <= 4; nt += 2) {
        hl_pool *p = NULL;
        hl_err err;
        CHECK_OK(hl_pool_create(nt, &p, &err), &err);
        for (int b = 0; b < 40; b++) {
            hl_pool_burst_begin(p);
            CHECK_MSG(stress_rounds(p, nt, 200, b % 4 == 3 ? 100 : 0), "burst %d, %d threads", b,
                      nt);
            hl_pool_burst_end(p);
            if (b % 8 == 0) usleep(2000);
        }
        const double c0 = cpu_seconds();
        usleep(300 * 1000);
        const double idle = cpu_seconds() - c0;
        CHECK_MSG(idle < 0.1, "%d threads: %.3f s of CPU while idle after a burst", nt, idle);
        /* and they still wake up for the next run */
        CHECK(stress_rounds(p, nt, 50, 0));
        hl_pool_destroy(p);
    }
    hl_pool_burst_begin(NULL);
    hl_pool_burst_end(NULL);
    set_spin(NULL);
}

/* run_any: whichever threads enter claim the items from a counter; every item is done
 * exactly once, the caller always enters, and runs mix with plain hl_pool_run ones
 * (a worker late for a run_any must still do its share of the next static run). */
typedef struct any_ctx {
    _Atomic int next;
    int n_items;
    int done[257];
    int entered[16];
} any_ctx;

static void any_work(void *ctx, int ith, int nth) {
    any_ctx *c = ctx;
    if (ith < 0 || ith >= nth || nth > 16) return;
    c->entered[ith]++;
    for (int i; (i = atomic_fetch_add(&c->next, 1)) < c->n_items;) c->done[i]++;
}

TEST(base_pool_run_any_claims_all_work) {
    const char *spins[] = {"0", NULL};
    for (int k = 0; k < 2; k++) {
        set_spin(spins[k]);
        for (int nt = 2; nt <= 5; nt += 3) {
            hl_pool *p = NULL;
            hl_err err;
            CHECK_OK(hl_pool_create(nt, &p, &err), &err);
            static any_ctx c;
            bool ok = true;
            for (int r = 0; r < 2000 && ok; r++) {
                memset(&c, 0, sizeof c);
                c.n_items = 1 + r % 257;
                hl_pool_run_any(p, any_work, &c);
                ok = c.entered[0] == 1;
                for (int i = 0; i < c.n_items; i++) ok = ok && c.done[i] == 1;
                for (int i = 1; i < nt; i++) ok = ok && c.entered[i] <= 1;
                if (r % 3 == 0) ok = ok && stress_rounds(p, nt, 1, 0);
            }
            CHECK_MSG(ok, "spin %s, %d threads", spins[k] ? spins[k] : "default", nt);
            hl_pool_destroy(p);
        }
    }
    set_spin(NULL);
    any_ctx one;
    memset(&one, 0, sizeof one);
    one.n_items = 7;
    hl_pool_run_any(NULL, any_work, &one);
    CHECK(one.entered[0] == 1 && one.done[6] == 1);
}

TEST(base_pool_create_destroy_churn) {
    /* tear down right after creation (workers may not have started waiting yet), after
     * one run (workers spinning), and after they went to sleep */
    set_spin("20");
    for (int i = 0; i < 60; i++) {
        hl_pool *p = NULL;
        hl_err err;
        CHECK_OK(hl_pool_create(2 + i % 3, &p, &err), &err);
        if (i % 3 >= 1) CHECK(stress_rounds(p, 2 + i % 3, 3, 0));
        if (i % 3 == 2) usleep(200);
        hl_pool_destroy(p);
    }
    set_spin(NULL);
}

typedef struct caller_arg {
    hl_pool *pool;
    int n;
    bool ok;
} caller_arg;

static void *caller_thread(void *arg) {
    caller_arg *a = arg;
    a->ok = stress_rounds(a->pool, a->n, 500, 0);
    return NULL;
}

TEST(base_pool_caller_may_change_between_runs) {
    hl_pool *p = NULL;
    hl_err err;
    CHECK_OK(hl_pool_create(3, &p, &err), &err);
    for (int k = 0; k < 4; k++) { /* one caller at a time, each on a new thread */
        caller_arg a = {p, 3, false};
        pthread_t t;
        CHECK(pthread_create(&t, NULL, caller_thread, &a) == 0);
        pthread_join(t, NULL);
        CHECK(a.ok);
    }
    hl_pool_destroy(p);
}

TEST(base_utf8_valid_and_put) {
    CHECK(hl_utf8_valid("", 0));
    CHECK(hl_utf8_valid("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", 10));
    CHECK_EQ_INT((int)hl_utf8_valid_len("\xF0\x9F\x98\x80", 4), 4);
    CHECK_EQ_INT((int)hl_utf8_valid_len("\xF0\x9F\x98", 3), 0);         /* cut short */
    CHECK_EQ_INT((int)hl_utf8_valid_len("\xC0\x80", 2), 0);              /* overlong */
    CHECK_EQ_INT((int)hl_utf8_valid_len("\xE0\x80\x80", 3), 0);          /* overlong */
    CHECK_EQ_INT((int)hl_utf8_valid_len("\xED\xA0\x80", 3), 0);          /* surrogate */
    CHECK_EQ_INT((int)hl_utf8_valid_len("\xF4\x90\x80\x80", 4), 0);      /* > U+10FFFF */
    CHECK_EQ_INT((int)hl_utf8_valid_len("\xF4\x8F\xBF\xBF", 4), 4);      /* U+10FFFF */
    CHECK_EQ_INT((int)hl_utf8_valid_len("\x80", 1), 0);
    CHECK_EQ_INT((int)hl_utf8_first_invalid("ab\xC3\xA9\xFF", 5), 4);
    CHECK_EQ_INT(hl_utf8_seq_len(0xF5), 0);
    CHECK_EQ_INT(hl_utf8_seq_len(0xE1), 3);
    char out[4];
    const uint32_t cps[] = {0x41, 0xE9, 0x20AC, 0xFFFD, 0x1F600, 0x10FFFF};
    for (size_t i = 0; i < sizeof cps / sizeof cps[0]; i++) {
        size_t n = hl_utf8_put(cps[i], out);
        CHECK_EQ_INT((int)n, cps[i] < 0x80 ? 1 : cps[i] < 0x800 ? 2 : cps[i] < 0x10000 ? 3 : 4);
        CHECK_EQ_INT((int)hl_utf8_valid_len(out, n), (int)n);
    }
}

/* Writes DIR/cpuN/topology/NAME with the text `siblings` (NULL: no topology dir). */
static void fake_cpu(const char *dir, int cpu, const char *name, const char *siblings) {
    char path[512];
    snprintf(path, sizeof path, "%s/cpu%d", dir, cpu);
    mkdir(path, 0755);
    if (!siblings) return;
    snprintf(path, sizeof path, "%s/cpu%d/topology", dir, cpu);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/cpu%d/topology/%s", dir, cpu, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%s\n", siblings);
        fclose(f);
    }
}

/* SMT siblings count once; cores whose core_id repeats in another cluster are still
 * distinct cores (their sibling sets differ); only the listed (usable) CPUs count; the
 * old file name works; a CPU without topology makes every CPU count. */
TEST(base_cpu_counts_physical_cores) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/sysfs-cpu", test_tmpdir());
    CHECK_EQ_INT(mkdir(dir, 0755), 0);
    /* cores {0,2} and {1,3} with two threads each; cpu4 and cpu5 single-threaded cores
     * (say a second cluster); cpu6 lists its siblings under the old name; cpu7 has no
     * topology */
    static const char *const sib[] = {"0,2", "1,3", "0,2", "1,3", "4", "5"};
    for (int c = 0; c < 6; c++) fake_cpu(dir, c, "core_cpus_list", sib[c]);
    fake_cpu(dir, 6, "thread_siblings_list", "6");
    fake_cpu(dir, 7, NULL, NULL);
    const int all[] = {0, 1, 2, 3, 4, 5};
    CHECK_EQ_INT(hl_cpu_count_cores(dir, all, 6), 4);
    const int siblings[] = {0, 2}; /* taskset to one core's two threads */
    CHECK_EQ_INT(hl_cpu_count_cores(dir, siblings, 2), 1);
    const int old_name[] = {0, 2, 6};
    CHECK_EQ_INT(hl_cpu_count_cores(dir, old_name, 3), 2);
    const int unknown[] = {0, 2, 7};
    CHECK_EQ_INT(hl_cpu_count_cores(dir, unknown, 3), 3);
    const int missing[] = {0, 42};
    CHECK_EQ_INT(hl_cpu_count_cores(dir, missing, 2), 2);
    CHECK_EQ_INT(hl_cpu_count_cores(dir, all, 0), 1);
    /* the live machine: at least one core, never more than the usable CPUs */
    const int usable = hl_cpu_usable(), cores = hl_cpu_default_threads();
    CHECK(usable >= 1);
    CHECK(cores >= 1 && cores <= usable);
}

/* A pool created with n <= 0 gets the default thread count. */
TEST(base_pool_default_threads_are_physical_cores) {
    hl_pool *p = NULL;
    hl_err err;
    CHECK_OK(hl_pool_create(0, &p, &err), &err);
    CHECK_EQ_INT(hl_pool_n_threads(p), hl_cpu_default_threads());
    hl_pool_destroy(p);
}
