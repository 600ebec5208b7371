/*
 * bench_kvtier.c - time to first token for a 2,000-token prefix served from each tier of
 * the prefix cache (kv/store.h) against a cold prefill, on the synthetic llama of
 * bench_prefix (6 layers, 512 embedding, Q8_0, f16 KV, blocks of 32 tokens).
 *
 *   cold   a fresh prompt: prefill of every token (its blocks are then written behind)
 *   RAM    the same prompt again on the same runner (the prefix trie)
 *   disk   a new runner over the same block directory (a restart)
 *   Redis  a new runner with an empty directory and the shared tier (another server)
 *
 * Each is the median of --runs runs, each with its own prompt (2,000 tokens + 40).
 * Redis: --redis redis://host:port, else $HEARTH_KV_REDIS, else Debian's redis-server is
 * started on a free loopback port for the run (skipped when absent).
 *
 *   build/bench/bench_kvtier [--threads 2] [--runs 3] [--redis URL]
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "common/stats.h"
#include "common/synth.h"
#include "runner/runner.h"

enum { N_VOCAB = 1024, PREFIX = 2000, SUFFIX = 40, N_GEN = 4, MAX_RUNS = 9 };

typedef struct ttft {
    uint64_t first;
    int n;
} ttft;

static bool on_event(void *user, const runner_event *ev) {
    ttft *t = user;
    if (ev->kind == RUNNER_EV_TOKEN && t->n++ == 0) t->first = hl_time_ns();
    return true;
}

static int g_threads = 2;

static runner *make_runner(const model *m, const char *dir, const char *redis) {
    runner_config cfg = {.n_threads = g_threads, .block_tokens = 32,
                         .kv_budget_bytes = (size_t)1 << 30, .kv_model_id = "sha256-bench",
                         .kv_store_dir = dir, .kv_redis = redis};
    runner *r = NULL;
    hl_err err;
    if (runner_create(m, &cfg, &r, &err)) {
        fprintf(stderr, "runner: %s\n", err.msg);
        exit(1);
    }
    return r;
}

/* TTFT in ms; *cached gets the cached-token split. */
static double request(runner *r, const int32_t *toks, int n, runner_stats *st) {
    ttft t = {0};
    runner_request req = {.tokens = toks, .n_tokens = n, .num_predict = N_GEN,
                          .emit = on_event, .user = &t};
    hl_err err;
    uint64_t t0 = hl_time_ns();
    if (runner_generate(r, &req, st, &err)) {
        fprintf(stderr, "generate: %s\n", err.msg);
        exit(1);
    }
    return t.n ? (double)(t.first - t0) / 1e6 : -1;
}

static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char p[4096];
    while ((de = readdir(d)))
        if (de->d_name[0] != '.' || strncmp(de->d_name, ".tmp-", 5) == 0) {
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}


/* ---- a redis-server of our own ---- */

static pid_t g_redis = -1;

static bool redis_ping(int port) {
    struct timeval tv = {0, 200000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    bool ok = false;
    if (c && !c->err) {
        redisReply *r = redisCommand(c, "PING");
        ok = r && r->type == REDIS_REPLY_STATUS;
        if (r) freeReplyObject(r);
    }
    if (c) redisFree(c);
    return ok;
}

static bool start_redis(char *url, size_t n) {
    if (access("/usr/bin/redis-server", X_OK) != 0) return false;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    if (port <= 0) return false;
    char sport[16];
    snprintf(sport, sizeof sport, "%d", port);
    g_redis = fork();
    if (g_redis == 0) {
        if (!freopen("/dev/null", "w", stdout)) _exit(126);
        if (chdir("/tmp") != 0) _exit(126);
        execl("/usr/bin/redis-server", "redis-server", "--port", sport, "--bind", "127.0.0.1",
              "--save", "", "--appendonly", "no", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100 && g_redis > 0; i++) {
        if (redis_ping(port)) {
            snprintf(url, n, "redis://127.0.0.1:%d", port);
            return true;
        }
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
    return false;
}

int main(int argc, char **argv) {
    int runs = 3;
    const char *redis = getenv("HEARTH_KV_REDIS");
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--threads") == 0) g_threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--runs") == 0) runs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--redis") == 0) redis = argv[i + 1];
    }
    if (runs < 1) runs = 1;
    if (runs > MAX_RUNS) runs = MAX_RUNS;
    char own_url[64];
    if ((!redis || !*redis) && start_redis(own_url, sizeof own_url)) redis = own_url;
    if (redis && !*redis) redis = NULL;

    const bench_llama shape = {.n_vocab = N_VOCAB, .n_embd = 512, .n_layer = 6, .n_ff = 1408,
                               .n_head = 8, .n_head_kv = 4, .n_ctx = 4096};
    model *m = bench_synth_llama(&shape);
    if (!m) return 1;
    char base[256];
    snprintf(base, sizeof base, "/tmp/hearth-bench-kvtier-%ld", (long)getpid());
    char dir_a[300], dir_b[300];
    snprintf(dir_a, sizeof dir_a, "%s-a", base);
    snprintf(dir_b, sizeof dir_b, "%s-b", base);

    printf("model: llama 6 layers, embd 512, 8/4 heads, ff 1408, Q8_0, f16 KV; %d threads; "
           "prompt %d + %d tokens; blocks of 32; median of %d\n",
           g_threads, PREFIX, SUFFIX, runs);
    printf("redis: %s\n", redis ? redis : "none (redis-server not found)");
    double t_cold[MAX_RUNS], t_ram[MAX_RUNS], t_disk[MAX_RUNS], t_redis[MAX_RUNS];
    int32_t toks[PREFIX + SUFFIX];
    runner_stats st = {0}, st_disk = {0}, st_redis = {0};
    size_t disk_bytes = 0;
    for (int k = 0; k < runs; k++) {
        for (int i = 0; i < PREFIX + SUFFIX; i++)
            toks[i] = 3 + (int32_t)((bench_frand() + 1.0f) * 0.5f * (N_VOCAB - 4));
        rm_dir(dir_a);
        rm_dir(dir_b);
        runner *r = make_runner(m, dir_a, redis);
        t_cold[k] = request(r, toks, PREFIX + SUFFIX, &st);
        /* the same prefix, another question: what a returning conversation sends */
        toks[PREFIX + SUFFIX - 1] = 3 + (toks[PREFIX + SUFFIX - 1] - 2) % (N_VOCAB - 4);
        t_ram[k] = request(r, toks, PREFIX + SUFFIX, &st);
        runner_kv_flush(r);
        disk_bytes = runner_get_cache_stats(r).store.disk_bytes;
        runner_destroy(r);

        r = make_runner(m, dir_a, NULL); /* a restart */
        t_disk[k] = request(r, toks, PREFIX + SUFFIX, &st_disk);
        runner_destroy(r);

        t_redis[k] = -1;
        if (redis) { /* another server: nothing on its disk */
            r = make_runner(m, dir_b, redis);
            t_redis[k] = request(r, toks, PREFIX + SUFFIX, &st_redis);
            runner_destroy(r);
        }
    }
    double cold = bench_median(t_cold, runs);
    printf("cold prefill          TTFT %8.1f ms\n", cold);
    double ram = bench_median(t_ram, runs);
    printf("RAM (prefix trie)     TTFT %8.1f ms  %6.1fx\n", ram, cold / ram);
    double disk = bench_median(t_disk, runs);
    printf("disk (after restart)  TTFT %8.1f ms  %6.1fx  (cached %d from disk; %.1f MiB of "
           "block files, %.1f KiB per block)\n",
           disk, cold / disk, st_disk.cached_disk, disk_bytes / 1048576.0,
           disk_bytes / 1024.0 / (PREFIX / 32));
    if (redis) {
        double rd = bench_median(t_redis, runs);
        printf("Redis (other server)  TTFT %8.1f ms  %6.1fx  (cached %d from Redis)\n", rd,
               cold / rd, st_redis.cached_remote);
    }
    rm_dir(dir_a);
    rm_dir(dir_b);
    model_free(m);
    if (g_redis > 0) {
        kill(g_redis, SIGKILL);
        waitpid(g_redis, NULL, 0);
    }
    return 0;
}
