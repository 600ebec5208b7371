/*
 * test_arch_hybrid_http.c - issue 13's must-show through the HTTP API on models with a
 * recurrent state (the golden GGUFs carry the stories260K tokenizer; a Go chat template is
 * given at create): conversation A (system prompt S + a question), then B (S + another
 * question) on the same server is a prefix-cache hit for S (the chat handler asks for a
 * snapshot where S ends: usage.prompt_tokens_details.cached_tokens > 0) and replies
 * exactly as a cold server does; D, which diverges from A inside A's question (a span
 * with no snapshot of its own), restores the nearest earlier snapshot (cached below the
 * divergence point) and replies exactly as a cold server does too.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srvproc.h"
#include "test.h"

#define SYS "You are a helpful storyteller who tells short, kind stories about animals."
#define Q_A "Tell me a story about a little cat and a big dog in the park."
#define Q_B "What did the bird sing in the morning?"
#define Q_D "Tell me a story about a little cat and a red fox in the snow."

typedef struct reply {
    char text[2048];
    long long cached, prompt_tokens, completion_tokens;
} reply;

static const char *g_case;         /* the golden case served */
static reply g_warm_a, g_warm_b, g_warm_d, g_cold;
static const char *g_cold_question;

static bool setup(const srv_proc *p) {
    char rel[128];
    snprintf(rel, sizeof rel, "testdata/arch/%s.gguf", g_case);
    const char *gguf = test_shared_path(rel);
    return gguf && sp_create_model(p, "h", gguf,
                                   "\"template\":\"{{ range .Messages }}<|{{ .Role }}|>"
                                   "{{ .Content }}\\n{{ end }}<|assistant|>\"");
}

/* One greedy chat turn: system S and `question`. */
static bool chat(const srv_proc *p, const char *question, reply *out) {
    json_t *body = json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:s}], s:i, s:i}", "model", "h",
                             "messages", "role", "system", "content", SYS, "role", "user",
                             "content", question, "temperature", 0, "max_tokens", 12);
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    json_t *resp = NULL;
    int st = sp_req(p, "POST", "/v1/chat/completions", text, &resp);
    free(text);
    bool ok = st == 200 && resp;
    if (ok) {
        json_t *usage = json_object_get(resp, "usage");
        const char *content = json_string_value(json_object_get(
            json_object_get(json_array_get(json_object_get(resp, "choices"), 0), "message"),
            "content"));
        snprintf(out->text, sizeof out->text, "%s", content ? content : "");
        out->cached = json_integer_value(
            json_object_get(json_object_get(usage, "prompt_tokens_details"), "cached_tokens"));
        out->prompt_tokens = json_integer_value(json_object_get(usage, "prompt_tokens"));
        out->completion_tokens = json_integer_value(json_object_get(usage, "completion_tokens"));
        ok = content != NULL && out->completion_tokens > 0;
    }
    if (!ok) fprintf(stderr, "    chat: HTTP %d\n", st);
    json_decref(resp);
    return ok;
}

static void warm_body(srv_proc *p) {
    CHECK(chat(p, Q_A, &g_warm_a));
    CHECK_EQ_INT(g_warm_a.cached, 0);
    CHECK(chat(p, Q_B, &g_warm_b));
    CHECK(chat(p, Q_D, &g_warm_d));
}

static void cold_body(srv_proc *p) {
    CHECK(chat(p, g_cold_question, &g_cold));
    CHECK_EQ_INT(g_cold.cached, 0);
}

static void shared_system_prompt(const char *case_name) {
    char rel[128];
    snprintf(rel, sizeof rel, "testdata/arch/%s.gguf", case_name);
    if (!test_shared_path(rel)) SKIP("testdata/arch golden GGUF not found (HEARTH_SHARED)");
    g_case = case_name;
    SP_WITH_SERVER("hybrid-warm", NULL, setup, warm_body);
    fprintf(stderr, "    %s: A %lld prompt tokens; B cached %lld of %lld; D cached %lld of %lld\n",
            case_name, g_warm_a.prompt_tokens, g_warm_b.cached, g_warm_b.prompt_tokens,
            g_warm_d.cached, g_warm_d.prompt_tokens);
    /* B: S restored from its snapshot, not recomputed; at most the common prefix */
    CHECK_MSG(g_warm_b.cached > 0, "B was not a cache hit for the system prompt");
    CHECK(g_warm_b.cached < g_warm_b.prompt_tokens - 10);
    /* D: the deepest snapshot on A's path below the divergence (B's branch point, past S),
     * never A's own at its end - 4 */
    CHECK(g_warm_d.cached >= g_warm_b.cached);
    CHECK(g_warm_d.cached < g_warm_a.prompt_tokens - 4 - 10);
    g_cold_question = Q_B;
    SP_WITH_SERVER("hybrid-cold-b", NULL, setup, cold_body);
    CHECK_EQ_INT(g_cold.completion_tokens, g_warm_b.completion_tokens);
    CHECK_STR(g_cold.text, g_warm_b.text);
    g_cold_question = Q_D;
    SP_WITH_SERVER("hybrid-cold-d", NULL, setup, cold_body);
    CHECK_EQ_INT(g_cold.completion_tokens, g_warm_d.completion_tokens);
    CHECK_STR(g_cold.text, g_warm_d.text);
}

TEST(arch_hybrid_http_qwen35_shared_system_prompt) { shared_system_prompt("qwen35"); }
TEST(arch_hybrid_http_mamba2_shared_system_prompt) { shared_system_prompt("mamba2"); }
/* a hybrid with experts, and a KV-only MoE whose windowed layers keep their own slot */
TEST(arch_hybrid_http_qwen35moe_shared_system_prompt) { shared_system_prompt("qwen35moe"); }
TEST(arch_hybrid_http_gptoss_shared_system_prompt) { shared_system_prompt("gpt-oss"); }

/* ---- issue 18 on a model with a recurrent state: snapshots in the disk tier ----
 * A's prompt leaves snapshot records (state + the KV block holding the offset) under the
 * model's kvcache/<blob>/state/; after a restart B (same system prompt) restores the one
 * at the system prompt's end from disk: a cache hit with the output of a cold server.
 * Damaging every record makes the next server reject them (recompute, cached 0, same
 * output) and write them again. */

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

static const char *g_sub = "state"; /* the records' subdirectory: state/ or window/ */

/* Record files in dir; with `damage`, flips a byte near the end of each. */
static int records(const char *dir, bool damage) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    char path[1600];
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l <= 4 || strcmp(de->d_name + l - 4, ".kvb") != 0) continue;
        n++;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        int fd = damage ? open(path, O_RDWR) : -1;
        if (fd >= 0) {
            off_t end = lseek(fd, 0, SEEK_END);
            unsigned char b = 0;
            if (end > 10 && pread(fd, &b, 1, end - 10) == 1) {
                b ^= 0x5a;
                if (pwrite(fd, &b, 1, end - 10) != 1) n = -1000;
            }
            close(fd);
        }
    }
    closedir(d);
    return n;
}

static char g_sdir[1400];
static int g_n_records;
static reply g_r;

static void restart_first(srv_proc *p) {
    CHECK(chat(p, Q_A, &g_r));
    CHECK_EQ_INT(g_r.cached, 0);
    CHECK(sp_kv_dir(p, g_sub, g_sdir, sizeof g_sdir));
}

static void restart_again(srv_proc *p) { CHECK(chat(p, Q_B, &g_r)); }

/* Waits (up to 10 s) for at least `want` records: they are written behind the reply. */
static bool wait_records(int want) {
    for (int i = 0; i < 200; i++) {
        if (records(g_sdir, false) >= want) return true;
        usleep(50 * 1000);
    }
    return false;
}

static void snapshot_restart(const char *case_name, const char *sub) {
    char rel[128];
    g_sub = sub;
    snprintf(rel, sizeof rel, "testdata/arch/%s.gguf", case_name);
    if (!test_shared_path(rel)) SKIP("testdata/arch golden GGUF not found (HEARTH_SHARED)");
    g_case = case_name;
    char tag[64];
    snprintf(tag, sizeof tag, "hybrid-restart-%s", case_name);
    SP_WITH_SERVER(tag, NULL, setup, restart_first); /* stopping drains the writer */
    if (test_failed()) return;
    g_n_records = records(g_sdir, false);
    /* the system prompt's end and A's end - 4 at least (window: A's full blocks) */
    CHECK_MSG(g_n_records >= 2, "%d snapshot records in %s", g_n_records, g_sdir);
    /* a restart: the trie is empty, B's system prompt comes from the disk tier */
    SP_WITH_SERVER(tag, NULL, NULL, restart_again);
    reply warm = g_r;
    g_cold_question = Q_B;
    SP_WITH_SERVER("hybrid-restart-cold", NULL, setup, cold_body);
    fprintf(stderr, "    %s: %d records; after the restart B cached %lld of %lld\n", case_name,
            g_n_records, warm.cached, warm.prompt_tokens);
    CHECK_MSG(warm.cached > 0, "B after a restart was not a cache hit");
    CHECK(warm.cached < warm.prompt_tokens - 10);
    CHECK_EQ_INT(warm.completion_tokens, g_cold.completion_tokens);
    CHECK_STR(warm.text, g_cold.text);
    /* damaged records: rejected (deleted), recomputed, written again */
    int n = records(g_sdir, true);
    CHECK_EQ_INT(n, records(g_sdir, false));
    SP_WITH_SERVER(tag, NULL, NULL, restart_again);
    CHECK_EQ_INT(g_r.cached, 0);
    CHECK_STR(g_r.text, g_cold.text);
    CHECK(wait_records(n));
    /* and the rewritten records are good: one more restart hits again (B's own end - 4
     * is on disk now too) */
    SP_WITH_SERVER(tag, NULL, NULL, restart_again);
    CHECK(g_r.cached >= warm.cached && g_r.cached < g_r.prompt_tokens);
    CHECK_STR(g_r.text, g_cold.text);
}

TEST(arch_hybrid_http_qwen35_snapshot_survives_restart) { snapshot_restart("qwen35", "state"); }
TEST(arch_hybrid_http_mamba2_snapshot_survives_restart) { snapshot_restart("mamba2", "state"); }
/* sliding-window layers: their blocks in window/, restored at a block boundary */
TEST(arch_hybrid_http_gptoss_window_blocks_survive_restart) {
    snapshot_restart("gpt-oss", "window");
}

/* Two servers, one Redis: B's first conversation over the system prompt A computed
 * restores A's snapshot at the system prompt's end (and the blocks below it) from Redis,
 * with a cold server's output; with Redis gone both keep answering. */

#include "redisproc.h"

static void snapshot_redis(const char *case_name) {
    char rel[128];
    snprintf(rel, sizeof rel, "testdata/arch/%s.gguf", case_name);
    if (!test_shared_path(rel)) SKIP("testdata/arch golden GGUF not found (HEARTH_SHARED)");
    if (!getenv("HEARTH_BIN")) SKIP("HEARTH_BIN not set (run through make test)");
    if (!redis_available()) SKIP(REDIS_BIN " not found (apt-get install redis-server)");
    g_case = case_name;
    g_cold_question = Q_B;
    SP_WITH_SERVER("hybrid-redis-cold", NULL, setup, cold_body);
    if (test_failed()) return;
    redis_proc rp;
    CHECK_MSG(redis_start(&rp, "hybrid"), "redis-server did not start");
    if (test_failed()) return;
    srv_proc a, b;
    CHECK_MSG(redis_spawn_servers(&rp, "hybrid-redis-a", "hybrid-redis-b", &a, &b), "servers did not start");
    reply ra_ = {0}, rb_ = {0}, rd = {0};
    if (!test_failed()) {
        CHECK(setup(&a) && setup(&b));
        CHECK(chat(&a, Q_A, &ra_));
        CHECK_EQ_INT(ra_.cached, 0);
        /* written behind the reply: wait until the count settles */
        long keys = -1;
        for (int i = 0; i < 100; i++) {
            usleep(100 * 1000);
            long k = redis_count_kv_keys(&rp);
            if (k > 0 && k == keys) break;
            keys = k;
        }
        CHECK_MSG(keys >= 2, "%ld keys in Redis", keys);
        CHECK(chat(&b, Q_B, &rb_));
        fprintf(stderr, "    %s: %ld keys; B on the second server cached %lld of %lld\n",
                case_name, keys, rb_.cached, rb_.prompt_tokens);
        CHECK_MSG(rb_.cached > 0, "B on the second server was not a cache hit");
        CHECK_STR(rb_.text, g_cold.text);
        redis_stop(&rp);
        CHECK(chat(&b, Q_D, &rd)); /* Redis down: recomputed, no failed request */
        CHECK(chat(&a, Q_D, &ra_));
        CHECK_STR(rd.text, ra_.text);
    }
    if (test_failed()) {
        sp_dump_log(&a);
        sp_dump_log(&b);
    }
    CHECK_EQ_INT(sp_stop(&a), 0);
    CHECK_EQ_INT(sp_stop(&b), 0);
    redis_stop(&rp);
}

TEST(arch_hybrid_http_qwen35_snapshot_shared_through_redis) { snapshot_redis("qwen35"); }
