/*
 * test_kvstore.c - the prefix cache beyond one process (kv/store.h): hash-chain keys,
 * block records on disk (round trip, corrupt and torn files rejected and deleted, the
 * LRU cap, temp files cleaned), a Redis that is down, and the runner end to end: a
 * prompt's blocks survive a runner restart and are reused with output identical to a
 * cold run, a corrupted block file is recomputed and replaced, and a second runner finds
 * a first one's blocks through one Redis server, and recomputes when Redis is stopped.
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "kv/store.h"
#include "model_synth.h"
#include "net/http_client.h"
#include "redisproc.h"
#include "runner/runner.h"
#include "runner_greedy.h"
#include "test.h"

#define BB 4096

static void fill(uint8_t *d, size_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        d[i] = (uint8_t)((x >> 16) & (i % 7 ? 0x0f : 0xff)); /* compressible, not trivial */
    }
}

static kv_hash key_of(int i) {
    int32_t toks[4] = {i, i + 1, i + 2, i + 3};
    return kv_hash_next(kv_hash_seed("test-model", 10), toks, 4);
}

static void path_of(const char *dir, kv_hash k, char *out, size_t n) {
    char hex[33];
    kv_hash_hex(k, hex);
    snprintf(out, n, "%s/%s.kvb", dir, hex);
}

static int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name), s = strlen(suffix);
        if (l > s && strcmp(de->d_name + l - s, suffix) == 0) n++;
    }
    closedir(d);
    return n;
}

/* The first *.kvb file in dir (path into out); false when none. */
static bool first_file(const char *dir, char *out, size_t n) {
    DIR *d = opendir(dir);
    if (!d) return false;
    struct dirent *de;
    bool found = false;
    while (!found && (de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l > 4 && strcmp(de->d_name + l - 4, ".kvb") == 0) {
            snprintf(out, n, "%s/%s", dir, de->d_name);
            found = true;
        }
    }
    closedir(d);
    return found;
}

static bool flip_byte(const char *path, off_t at) {
    int fd = open(path, O_RDWR);
    if (fd < 0) return false;
    uint8_t b;
    bool ok = pread(fd, &b, 1, at) == 1;
    b ^= 0x5a;
    ok = ok && pwrite(fd, &b, 1, at) == 1;
    close(fd);
    return ok;
}

static kv_store *open_store(const char *dir, size_t max, const char *redis) {
    kv_store_config c = {.dir = dir, .disk_max = max, .redis_url = redis, .ns = "t",
                         .block_bytes = BB, .redis_timeout_ms = 100};
    kv_store *s = NULL;
    hl_err e;
    if (kv_store_open(&c, &s, &e) != HL_OK) {
        fprintf(stderr, "kv_store_open: %s\n", e.msg);
        return NULL;
    }
    return s;
}

TEST(kvstore_hash_chain_depends_on_identity_and_every_token) {
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
    kv_hash s1 = kv_hash_seed("m1", 2), s2 = kv_hash_seed("m2", 2);
    kv_hash x = kv_hash_next(s1, a, 4), y = kv_hash_next(s1, b, 4), z = kv_hash_next(s2, a, 4);
    CHECK(x.lo != y.lo || x.hi != y.hi);
    CHECK(x.lo != z.lo || x.hi != z.hi);
    kv_hash x2 = kv_hash_next(s1, a, 4);
    CHECK(x.lo == x2.lo && x.hi == x2.hi);
    /* the chain: the same block after a different parent is another key */
    kv_hash c1 = kv_hash_next(x, a, 4), c2 = kv_hash_next(y, a, 4);
    CHECK(c1.lo != c2.lo || c1.hi != c2.hi);
    size_t v = 0;
    CHECK(kv_store_parse_size("8G", &v) && v == ((size_t)8 << 30));
    CHECK(kv_store_parse_size("512MiB", &v) && v == ((size_t)512 << 20));
    CHECK(kv_store_parse_size("0", &v) && v == 0);
    CHECK(!kv_store_parse_size("12Q", &v));
    CHECK(!kv_store_parse_size("-1", &v));
}

TEST(kvstore_disk_roundtrip_survives_reopen_and_rejects_corruption) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/kvs-round", test_tmpdir());
    static uint8_t data[BB], back[BB];
    kv_store *s = open_store(dir, 0, NULL);
    CHECK(s != NULL);
    if (!s) return;
    for (int i = 0; i < 3; i++) {
        fill(data, BB, (uint32_t)i);
        CHECK(kv_store_put(s, key_of(i), data));
    }
    kv_store_flush(s);
    CHECK(kv_store_known(s, key_of(0)));
    CHECK(!kv_store_put(s, key_of(0), data)); /* known: not queued again */
    kv_store_stats st = kv_store_get_stats(s);
    CHECK_EQ_INT((int)st.disk_writes, 3);
    CHECK_EQ_INT((int)st.disk_files, 3);
    kv_store_close(s);
    CHECK_EQ_INT(count_files(dir, ".kvb"), 3);

    /* a crashed writer's temp file goes when the directory is indexed again */
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s/.tmp-1-abc", dir);
    FILE *f = fopen(tmp, "w");
    if (f) fclose(f);
    s = open_store(dir, 0, NULL);
    CHECK(s != NULL);
    if (!s) return;
    CHECK(access(tmp, F_OK) != 0);
    CHECK_EQ_INT((int)kv_store_get_stats(s).disk_files, 3);
    fill(data, BB, 1);
    CHECK_EQ_INT(kv_store_get(s, key_of(1), back), KV_SRC_DISK);
    CHECK(memcmp(data, back, BB) == 0);
    kv_hash missing = key_of(99);
    CHECK_EQ_INT(kv_store_get(s, missing, back), KV_SRC_NONE);

    /* a flipped payload byte: rejected, counted, deleted */
    char p[1200];
    path_of(dir, key_of(0), p, sizeof p);
    CHECK(flip_byte(p, 70));
    CHECK_EQ_INT(kv_store_get(s, key_of(0), back), KV_SRC_NONE);
    CHECK(access(p, F_OK) != 0);
    /* a torn file (cut short) */
    path_of(dir, key_of(2), p, sizeof p);
    CHECK(truncate(p, 40) == 0);
    CHECK_EQ_INT(kv_store_get(s, key_of(2), back), KV_SRC_NONE);
    CHECK(access(p, F_OK) != 0);
    /* a valid record under another key's name */
    char p1[1200];
    path_of(dir, key_of(1), p1, sizeof p1);
    path_of(dir, key_of(3), p, sizeof p);
    CHECK(link(p1, p) == 0);
    CHECK_EQ_INT(kv_store_get(s, key_of(3), back), KV_SRC_NONE);
    st = kv_store_get_stats(s);
    CHECK_EQ_INT((int)st.corrupt, 3);
    CHECK_EQ_INT((int)st.disk_hits, 1);
    /* recomputed and written again */
    fill(data, BB, 0);
    CHECK(kv_store_put(s, key_of(0), data));
    kv_store_flush(s);
    CHECK_EQ_INT(kv_store_get(s, key_of(0), back), KV_SRC_DISK);
    CHECK(memcmp(data, back, BB) == 0);
    kv_store_close(s);
}

TEST(kvstore_disk_cap_deletes_least_recently_used) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/kvs-lru", test_tmpdir());
    static uint8_t data[BB], back[BB];
    /* one record's size, to set a cap of about three */
    kv_store *s = open_store(dir, 0, NULL);
    CHECK(s != NULL);
    if (!s) return;
    fill(data, BB, 0);
    kv_store_put(s, key_of(0), data);
    kv_store_flush(s);
    size_t rec = kv_store_get_stats(s).disk_bytes;
    kv_store_close(s);
    CHECK(rec > 64 && rec < BB);
    s = open_store(dir, rec * 3 + rec / 2, NULL);
    CHECK(s != NULL);
    if (!s) return;
    for (int i = 1; i < 3; i++) {
        fill(data, BB, (uint32_t)i);
        kv_store_put(s, key_of(i), data);
        kv_store_flush(s);
    }
    CHECK_EQ_INT(kv_store_get(s, key_of(0), back), KV_SRC_DISK); /* 0 is now the newest */
    for (int i = 3; i < 6; i++) {
        fill(data, BB, (uint32_t)i);
        kv_store_put(s, key_of(i), data);
        kv_store_flush(s);
    }
    kv_store_stats st = kv_store_get_stats(s);
    CHECK(st.disk_bytes <= rec * 3 + rec / 2);
    CHECK(st.disk_evictions >= 2);
    CHECK_EQ_INT((int)st.disk_files, count_files(dir, ".kvb"));
    CHECK_EQ_INT(kv_store_get(s, key_of(1), back), KV_SRC_NONE); /* oldest went first */
    CHECK_EQ_INT(kv_store_get(s, key_of(5), back), KV_SRC_DISK);
    kv_store_close(s);
}

TEST(kvstore_redis_down_is_a_miss_not_an_error) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/kvs-down", test_tmpdir());
    static uint8_t data[BB], back[BB];
    /* port 1 on loopback: nothing listens there */
    kv_store *s = open_store(dir, 0, "redis://127.0.0.1:1");
    CHECK(s != NULL);
    if (!s) return;
    fill(data, BB, 9);
    CHECK(kv_store_put(s, key_of(9), data));
    kv_store_flush(s);
    CHECK_EQ_INT(kv_store_get(s, key_of(9), back), KV_SRC_DISK);
    CHECK_EQ_INT(kv_store_get(s, key_of(10), back), KV_SRC_NONE);
    kv_store_stats st = kv_store_get_stats(s);
    CHECK(st.remote_errors >= 1);
    CHECK_EQ_INT((int)st.remote_writes, 0);
    CHECK(!st.remote_up);
    kv_store_close(s);
    kv_store *bad = NULL;
    kv_store_config c = {.redis_url = "redis://:x", .block_bytes = BB};
    hl_err e;
    CHECK(kv_store_open(&c, &bad, &e) == HL_ERR_INVALID);
    CHECK(strstr(e.msg, "invalid Redis address") != NULL);
}

TEST(kvstore_run_reads_disk_first_then_redis_pipelined) {
    if (!redis_available()) SKIP(REDIS_BIN " not found (apt-get install redis-server)");
    redis_proc rp;
    CHECK_MSG(redis_start(&rp, "run"), "redis-server did not start");
    if (test_failed()) return;
    char da[1024], db[1024];
    snprintf(da, sizeof da, "%s/kvs-run-a", test_tmpdir());
    snprintf(db, sizeof db, "%s/kvs-run-b", test_tmpdir());
    static uint8_t data[6][BB], back[6][BB];
    kv_hash keys[6];
    for (int i = 0; i < 6; i++) {
        keys[i] = key_of(100 + i);
        fill(data[i], BB, (uint32_t)(100 + i));
    }
    kv_store *a = open_store(da, 0, rp.url), *b = open_store(db, 0, rp.url);
    CHECK(a && b);
    if (a && b) {
        for (int i = 0; i < 4; i++) CHECK(kv_store_put(a, keys[i], data[i]));
        kv_store_flush(a);
        CHECK_EQ_INT((int)kv_store_get_stats(a).remote_writes, 4);
        CHECK(kv_store_put(b, keys[0], data[0])); /* b has the first block on its disk */
        kv_store_flush(b);
        void *dst[6];
        kv_source src[6];
        for (int i = 0; i < 6; i++) dst[i] = back[i];
        /* 0 from disk, 1..3 from Redis, 4 missing: the run stops there (5 is never used) */
        CHECK_EQ_INT(kv_store_get_run(b, keys, 6, dst, src), 4);
        CHECK_EQ_INT(src[0], KV_SRC_DISK);
        for (int i = 1; i < 4; i++) CHECK_EQ_INT(src[i], KV_SRC_REMOTE);
        for (int i = 0; i < 4; i++) CHECK(memcmp(back[i], data[i], BB) == 0);
        kv_store_flush(b); /* the remote hits are now on b's disk */
        CHECK_EQ_INT(count_files(db, ".kvb"), 4);
        kv_store_stats st = kv_store_get_stats(b);
        CHECK_EQ_INT((int)st.remote_hits, 3);
        CHECK_EQ_INT((int)st.remote_misses, 1);
    }
    kv_store_close(a);
    kv_store_close(b);
    redis_stop(&rp);
}

/* ---- the runner end to end ---- */

#define V 64
#define PROMPT 100 /* block 16: six full blocks before the last token */

static model *load_synth(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/kvstore.gguf", test_tmpdir());
    synth_cfg c = {.arch = "llama", .n_vocab = V, .n_embd = 32, .n_layer = 2, .n_ff = 48,
                   .n_head = 4, .n_head_kv = 2, .rope_base = 10000, .wtype = HL_TYPE_F32,
                   .seed = 11};
    return synth_load(&c, path);
}

static runner *tier_runner(const model *m, const char *dir, const char *redis) {
    runner_config cfg = {.n_threads = 1, .block_tokens = 16, .prefill_chunk = 32,
                         .kv_budget_bytes = (size_t)64 << 20, .kv_model_id = "sha256-test",
                         .kv_store_dir = dir, .kv_redis = redis};
    runner *r = NULL;
    hl_err e;
    if (runner_create(m, &cfg, &r, &e) != HL_OK) {
        fprintf(stderr, "runner_create: %s\n", e.msg);
        return NULL;
    }
    return r;
}

static void prompt_of(int32_t *p, int n, int seed) {
    uint32_t x = (uint32_t)seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = 3 + (int32_t)((x >> 16) % (V - 3));
    }
}

TEST(kvstore_runner_restart_reuses_disk_blocks_and_recomputes_corrupt_ones) {
    model *m = load_synth();
    CHECK(m != NULL);
    if (!m) return;
    int32_t prompt[PROMPT];
    prompt_of(prompt, PROMPT, 3);
    collect cold, warm;
    runner_stats st;
    /* the reference: no tiers at all */
    runner *r = tier_runner(m, NULL, NULL);
    CHECK(r != NULL);
    CHECK_OK(runner_greedy(r, prompt, PROMPT, 12, &cold, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 0);
    runner_destroy(r);

    char dir[1024];
    snprintf(dir, sizeof dir, "%s/kvs-runner", test_tmpdir());
    r = tier_runner(m, dir, NULL);
    CHECK(r != NULL);
    if (!r) goto out;
    CHECK_OK(runner_greedy(r, prompt, PROMPT, 12, &warm, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 0);
    runner_kv_flush(r);
    runner_cache_stats cs = runner_get_cache_stats(r);
    CHECK(cs.store_on);
    CHECK_EQ_INT((int)cs.store.disk_writes, 6);
    runner_destroy(r);
    CHECK_EQ_INT(count_files(dir, ".kvb"), 6);

    /* a fresh runner (a restart): the trie is empty, the blocks are found by hash */
    r = tier_runner(m, dir, NULL);
    CHECK(r != NULL);
    if (!r) goto out;
    CHECK_OK(runner_greedy(r, prompt, PROMPT, 12, &warm, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 96);
    CHECK_EQ_INT(st.cached_disk, 96);
    CHECK_EQ_INT(warm.n, cold.n);
    CHECK(memcmp(warm.toks, cold.toks, (size_t)cold.n * sizeof(int32_t)) == 0);
    /* the second time the trie has it: RAM */
    CHECK_OK(runner_greedy(r, prompt, PROMPT, 12, &warm, &st), NULL);
    CHECK_EQ_INT(st.cached_disk, 0);
    CHECK(st.cached_tokens >= 96);
    CHECK(memcmp(warm.toks, cold.toks, (size_t)cold.n * sizeof(int32_t)) == 0);
    cs = runner_get_cache_stats(r);
    CHECK_EQ_INT((int)cs.cached_disk, 96);
    CHECK(cs.cached_ram >= 96);
    runner_destroy(r);

    /* bit rot in one file: detected, recomputed from there, the file written again */
    char p[1200];
    CHECK(first_file(dir, p, sizeof p));
    struct stat before;
    CHECK(stat(p, &before) == 0);
    CHECK(flip_byte(p, 100));
    r = tier_runner(m, dir, NULL);
    CHECK(r != NULL);
    if (!r) goto out;
    CHECK_OK(runner_greedy(r, prompt, PROMPT, 12, &warm, &st), NULL);
    CHECK(st.cached_disk < 96);
    CHECK(memcmp(warm.toks, cold.toks, (size_t)cold.n * sizeof(int32_t)) == 0);
    runner_kv_flush(r);
    cs = runner_get_cache_stats(r);
    CHECK_EQ_INT((int)cs.store.corrupt, 1);
    CHECK(cs.store.disk_writes >= 1);
    runner_destroy(r);
    CHECK_EQ_INT(count_files(dir, ".kvb"), 6);
    /* the replacement is whole: a restart uses all six blocks again */
    r = tier_runner(m, dir, NULL);
    CHECK(r != NULL);
    if (!r) goto out;
    CHECK_OK(runner_greedy(r, prompt, PROMPT, 12, &warm, &st), NULL);
    CHECK_EQ_INT(st.cached_disk, 96);
    CHECK(memcmp(warm.toks, cold.toks, (size_t)cold.n * sizeof(int32_t)) == 0);
    runner_destroy(r);
out:
    model_free(m);
}

TEST(kvstore_runner_keeps_generated_blocks_for_the_next_turn) {
    model *m = load_synth();
    CHECK(m != NULL);
    if (!m) return;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/kvs-turns", test_tmpdir());
    int32_t turn[PROMPT + 20 + 5];
    prompt_of(turn, PROMPT, 4);
    collect out, cold, warm;
    runner_stats st;
    runner *r = tier_runner(m, dir, NULL);
    CHECK(r != NULL);
    if (!r) goto out;
    CHECK_OK(runner_greedy(r, turn, PROMPT, 20, &out, &st), NULL);
    CHECK_EQ_INT(out.n, 20);
    runner_destroy(r); /* drains the writes */
    /* the next turn: the reply, then the user's next message */
    memcpy(turn + PROMPT, out.toks, 20 * sizeof(int32_t));
    prompt_of(turn + PROMPT + 20, 5, 40);
    const int n = PROMPT + 20 + 5;
    r = tier_runner(m, NULL, NULL);
    CHECK(r != NULL);
    if (!r) goto out;
    CHECK_OK(runner_greedy(r, turn, n, 8, &cold, &st), NULL);
    runner_destroy(r);
    r = tier_runner(m, dir, NULL); /* after a restart */
    CHECK(r != NULL);
    if (!r) goto out;
    CHECK_OK(runner_greedy(r, turn, n, 8, &warm, &st), NULL);
    /* 119 positions were computed (100 + 19 generated): 7 full blocks, the 7th holding
     * the reply's first tokens */
    CHECK_EQ_INT(st.cached_disk, 112);
    CHECK_EQ_INT(warm.n, cold.n);
    CHECK(memcmp(warm.toks, cold.toks, (size_t)cold.n * sizeof(int32_t)) == 0);
    runner_destroy(r);
out:
    model_free(m);
}

TEST(kvstore_runner_serves_without_tiers_when_the_directory_cannot_be_made) {
    model *m = load_synth();
    CHECK(m != NULL);
    if (!m) return;
    char file[1024], dir[1100];
    snprintf(file, sizeof file, "%s/kvs-not-a-dir", test_tmpdir());
    FILE *f = fopen(file, "w");
    if (f) fclose(f);
    snprintf(dir, sizeof dir, "%s/sub", file);
    runner *r = tier_runner(m, dir, NULL);
    CHECK(r != NULL);
    if (r) {
        CHECK(!runner_get_cache_stats(r).store_on);
        int32_t prompt[PROMPT];
        prompt_of(prompt, PROMPT, 8);
        collect got;
        runner_stats st;
        CHECK_OK(runner_greedy(r, prompt, PROMPT, 4, &got, &st), NULL);
        CHECK_EQ_INT(got.n, 4);
        runner_destroy(r);
    }
    model_free(m);
}

TEST(kvstore_runners_share_blocks_through_redis_and_survive_its_loss) {
    if (!redis_available()) SKIP(REDIS_BIN " not found (apt-get install redis-server)");
    redis_proc rp;
    CHECK_MSG(redis_start(&rp, "runner"), "redis-server did not start");
    model *m = load_synth();
    CHECK(m != NULL);
    if (!m) {
        redis_stop(&rp);
        return;
    }
    int32_t prompt[PROMPT];
    prompt_of(prompt, PROMPT, 5);
    collect cold, got;
    runner_stats st;
    char da[1024], db[1024], dc[1024];
    snprintf(da, sizeof da, "%s/kvs-a", test_tmpdir());
    snprintf(db, sizeof db, "%s/kvs-b", test_tmpdir());
    snprintf(dc, sizeof dc, "%s/kvs-c", test_tmpdir());
    runner *a = tier_runner(m, da, rp.url);
    CHECK(a != NULL);
    if (!a) goto out;
    CHECK_OK(runner_greedy(a, prompt, PROMPT, 12, &cold, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 0);
    runner_kv_flush(a);
    CHECK_EQ_INT((int)runner_get_cache_stats(a).store.remote_writes, 6);
    CHECK_EQ_INT((int)redis_count_kv_keys(&rp), 6);
    runner_destroy(a);

    /* another server (own directory, own trie): its first request is a remote hit */
    runner *b = tier_runner(m, db, rp.url);
    CHECK(b != NULL);
    if (!b) goto out;
    CHECK_OK(runner_greedy(b, prompt, PROMPT, 12, &got, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 96);
    CHECK_EQ_INT(st.cached_remote, 96);
    CHECK(memcmp(got.toks, cold.toks, (size_t)cold.n * sizeof(int32_t)) == 0);
    runner_kv_flush(b); /* remote hits are kept on its disk too */
    CHECK_EQ_INT(count_files(db, ".kvb"), 6);
    runner_destroy(b);

    /* Redis hangs (stopped, not gone: every call runs into its timeout): a new server
     * recomputes, no request fails */
    char dd[1024];
    snprintf(dd, sizeof dd, "%s/kvs-d", test_tmpdir());
    kill(rp.pid, SIGSTOP);
    runner *d = tier_runner(m, dd, rp.url);
    CHECK(d != NULL);
    if (d) {
        CHECK_OK(runner_greedy(d, prompt, PROMPT, 12, &got, &st), NULL);
        CHECK_EQ_INT(st.cached_tokens, 0);
        CHECK(memcmp(got.toks, cold.toks, (size_t)cold.n * sizeof(int32_t)) == 0);
        runner_kv_flush(d);
        CHECK(runner_get_cache_stats(d).store.remote_errors >= 1);
        runner_destroy(d);
    }
    kill(rp.pid, SIGCONT);

    /* Redis goes away: a third server recomputes, no request fails */
    redis_stop(&rp);
    runner *c = tier_runner(m, dc, rp.url);
    CHECK(c != NULL);
    if (!c) goto out;
    CHECK_OK(runner_greedy(c, prompt, PROMPT, 12, &got, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 0);
    CHECK(memcmp(got.toks, cold.toks, (size_t)cold.n * sizeof(int32_t)) == 0);
    int32_t other[PROMPT];
    prompt_of(other, PROMPT, 6);
    CHECK_OK(runner_greedy(c, other, PROMPT, 4, &got, &st), NULL);
    runner_kv_flush(c);
    CHECK(runner_get_cache_stats(c).store.remote_errors >= 1);
    runner_destroy(c);
out:
    redis_stop(&rp);
    model_free(m);
}

/* ---- `hearth serve` end to end ---- */

#include "srvproc.h"

static const char *stories(void) { return test_shared_path("models/stories260K/stories260K.gguf"); }

/* about 150 tokens of raw prompt: four full blocks and more */
#define LONG_PROMPT                                                                             \
    "Once upon a time there was a little dog named Max. Max liked to run in the park with his " \
    "friend Lily. One day they found a big red ball under a tree. Lily said, let us play with "  \
    "the ball. Max was very happy and wagged his tail. They played all day until the sun went "  \
    "down. Then Lily took Max home and gave him a bowl of warm milk. Max slept next to the fire " \
    "and dreamed of the ball. The next morning"

/* /metrics' cached prompt tokens of model s from one source ("ram", "disk", "remote");
 * -1 when the sample is missing. */
static long long cached_from(const srv_proc *p, const char *source) {
    char *resp = NULL, want[128];
    int status = 0;
    long long v = -1;
    if (net_http_request(&p->host, "GET", "/metrics", NULL, 0, &status, &resp, NULL, NULL) != HL_OK)
        return -1;
    snprintf(want, sizeof want, "hearth_prompt_cached_tokens_total{model=\"s:latest\",source=\"%s\"} ",
             source);
    const char *at = status == 200 && resp ? strstr(resp, want) : NULL;
    if (at) v = strtoll(at + strlen(want), NULL, 10);
    free(resp);
    return v;
}

typedef struct gen_out {
    char text[2048];
    long long cached, prompt;
} gen_out;

static bool gen(const srv_proc *p, const char *prompt, gen_out *o) {
    char body[4096];
    snprintf(body, sizeof body,
             "{\"model\":\"s\",\"prompt\":\"%s\",\"raw\":true,\"stream\":false,"
             "\"options\":{\"temperature\":0,\"num_predict\":12}}",
             prompt);
    json_t *j = NULL;
    int code = sp_req(p, "POST", "/api/generate", body, &j);
    bool ok = code == 200 && j;
    if (ok) {
        const char *t = json_string_value(json_object_get(j, "response"));
        snprintf(o->text, sizeof o->text, "%s", t ? t : "");
        o->cached = (long long)json_integer_value(json_object_get(j, "prompt_cached_count"));
        o->prompt = (long long)json_integer_value(json_object_get(j, "prompt_eval_count"));
    } else {
        fprintf(stderr, "generate: HTTP %d\n", code);
    }
    json_decref(j);
    return ok;
}

/* Waits (up to 10 s) until the directory holds `want` block files. */
static bool wait_files(const char *dir, int want) {
    for (int i = 0; i < 200; i++) {
        if (count_files(dir, ".kvb") == want) return true;
        sp_sleep_ms(50);
    }
    return false;
}

static bool read_all(const char *path, char **buf, size_t *len) {
    return hl_file_read(path, buf, len, NULL) == HL_OK;
}

TEST(kvstore_serve_restart_is_a_cache_hit_and_a_corrupt_block_is_recomputed) {
    if (!stories()) SKIP("models/stories260K/stories260K.gguf not found");
    gen_out cold = {0}, warm = {0};
    char dir[1200] = "";
    int n_blocks = 0;
    {
        srv_proc p;
        int rc = sp_spawn(&p, "kvrestart", NULL);
        if (rc == 1) SKIP("HEARTH_BIN not set (run through make test)");
        CHECK_MSG(rc == 0, "server did not start");
        CHECK(sp_create_model(&p, "s", stories(), ""));
        CHECK(gen(&p, LONG_PROMPT, &cold));
        CHECK_EQ_INT(cold.cached, 0);
        n_blocks = (int)((cold.prompt - 1) / 32);
        CHECK(n_blocks >= 4);
        CHECK(sp_kv_dir(&p, NULL, dir, sizeof dir));
        CHECK_MSG(wait_files(dir, n_blocks), "%d block files in %s", count_files(dir, ".kvb"), dir);
        if (test_failed()) sp_dump_log(&p);
        CHECK_EQ_INT(sp_stop(&p), 0);
    }
    if (test_failed()) return;
    {   /* a restart: a fresh trie, the blocks come from disk */
        srv_proc p;
        CHECK_MSG(sp_spawn(&p, "kvrestart", NULL) == 0, "server did not restart");
        CHECK(gen(&p, LONG_PROMPT, &warm));
        CHECK_EQ_INT(warm.cached, n_blocks * 32);
        CHECK_STR(warm.text, cold.text);
        /* the server log says where the cached tokens came from */
        char *log = NULL, want[128];
        size_t log_len = 0;
        snprintf(want, sizeof want, "cached %d (ram 0, disk %d, remote 0)", n_blocks * 32,
                 n_blocks * 32);
        CHECK(read_all(p.log, &log, &log_len));
        CHECK_MSG(log && strstr(log, want), "no \"%s\" in the server log", want);
        free(log);
        /* and so does /metrics */
        CHECK_EQ_INT((int)cached_from(&p, "disk"), n_blocks * 32);
        CHECK_EQ_INT((int)cached_from(&p, "ram"), 0);
        CHECK_EQ_INT((int)cached_from(&p, "remote"), 0);
        if (test_failed()) sp_dump_log(&p);
        CHECK_EQ_INT(sp_stop(&p), 0);
    }
    /* damage one block file: the next server detects it, recomputes, writes it again */
    char victim[1400], *orig = NULL, *now = NULL;
    size_t orig_len = 0, now_len = 0;
    CHECK(first_file(dir, victim, sizeof victim));
    CHECK(read_all(victim, &orig, &orig_len));
    CHECK(flip_byte(victim, (off_t)orig_len - 10));
    {
        srv_proc p;
        CHECK_MSG(sp_spawn(&p, "kvrestart", NULL) == 0, "server did not restart");
        CHECK(gen(&p, LONG_PROMPT, &warm));
        CHECK(warm.cached < n_blocks * 32);
        CHECK_STR(warm.text, cold.text);
        CHECK(wait_files(dir, n_blocks));
        for (int i = 0; i < 100; i++) { /* rewritten behind the response */
            free(now);
            now = NULL;
            if (read_all(victim, &now, &now_len) && now_len == orig_len &&
                memcmp(now, orig, orig_len) == 0)
                break;
            sp_sleep_ms(50);
        }
        CHECK(now && now_len == orig_len && memcmp(now, orig, orig_len) == 0);
        /* deleting the model deletes its blocks */
        CHECK_EQ_INT(sp_req(&p, "DELETE", "/api/delete", "{\"model\":\"s\"}", NULL), 200);
        CHECK(access(dir, F_OK) != 0);
        if (test_failed()) sp_dump_log(&p);
        CHECK_EQ_INT(sp_stop(&p), 0);
    }
    free(orig);
    free(now);
}

static bool wait_keys(const redis_proc *r, long want) {
    for (int i = 0; i < 200; i++) {
        if (redis_count_kv_keys(r) == want) return true;
        sp_sleep_ms(50);
    }
    return false;
}

TEST(kvstore_two_servers_share_a_prefix_through_redis) {
    if (!stories()) SKIP("models/stories260K/stories260K.gguf not found");
    if (!getenv("HEARTH_BIN")) SKIP("HEARTH_BIN not set (run through make test)");
    if (!redis_available()) SKIP(REDIS_BIN " not found (apt-get install redis-server)");
    redis_proc rp;
    CHECK_MSG(redis_start(&rp, "serve"), "redis-server did not start");
    if (test_failed()) return;
    srv_proc a, b;
    CHECK_MSG(redis_spawn_servers(&rp, "kvredis-a", "kvredis-b", &a, &b), "servers did not start");
    gen_out ga = {0}, gb = {0};
    if (!test_failed()) {
        CHECK(sp_create_model(&a, "s", stories(), ""));
        CHECK(sp_create_model(&b, "s", stories(), ""));
        CHECK(gen(&a, LONG_PROMPT, &ga));
        CHECK_EQ_INT(ga.cached, 0);
        long n_blocks = (long)((ga.prompt - 1) / 32);
        CHECK_MSG(wait_keys(&rp, n_blocks), "%ld keys in Redis", redis_count_kv_keys(&rp));
        /* B never saw this prompt: its first request is served from Redis */
        CHECK(gen(&b, LONG_PROMPT, &gb));
        CHECK_EQ_INT(gb.cached, n_blocks * 32);
        CHECK_STR(gb.text, ga.text);
        char *log = NULL, want[128];
        size_t log_len = 0;
        snprintf(want, sizeof want, "(ram 0, disk 0, remote %ld)", n_blocks * 32);
        CHECK(read_all(b.log, &log, &log_len));
        CHECK_MSG(log && strstr(log, want), "no \"%s\" in server B's log", want);
        free(log);
        CHECK_EQ_INT((int)cached_from(&b, "remote"), (int)(n_blocks * 32));
        CHECK_EQ_INT((int)cached_from(&b, "disk"), 0);

        /* Redis goes away mid-test: both keep answering, recomputing */
        redis_stop(&rp);
        const char *other = "A little bird sat on a branch and sang a song about the sea and "
                            "the sky and the green hills far away, and all the animals came to "
                            "listen to the song of the little bird in the tall old tree";
        gen_out oa = {0}, ob = {0};
        CHECK(gen(&b, other, &ob));
        CHECK(gen(&a, other, &oa));
        CHECK(oa.cached < 32); /* at most the BOS token it shares with the first prompt */
        CHECK_STR(oa.text, ob.text);
        CHECK(gen(&a, LONG_PROMPT, &ga)); /* still served from its own RAM */
        CHECK_STR(ga.text, gb.text);
    }
    if (test_failed()) {
        sp_dump_log(&a);
        sp_dump_log(&b);
    }
    CHECK_EQ_INT(sp_stop(&a), 0);
    CHECK_EQ_INT(sp_stop(&b), 0);
    redis_stop(&rp);
}
