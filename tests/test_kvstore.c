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
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv/store.h"
#include "model_synth.h"
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

/* ---- the runner end to end ---- */

#define V 64
#define PROMPT 100 /* block 16: six full blocks before the last token */

static model *load_synth(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/kvstore.gguf", test_tmpdir());
    synth_cfg c = {.arch = "llama", .n_vocab = V, .n_embd = 32, .n_layer = 2, .n_ff = 48,
                   .n_head = 4, .n_head_kv = 2, .rope_base = 10000, .wtype = HL_TYPE_F32,
                   .seed = 11};
    synth_model *s = synth_build(&c, path);
    if (!s) return NULL;
    synth_free(s);
    model *m = NULL;
    if (model_load(path, NULL, &m, NULL) != HL_OK) return NULL;
    return m;
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
