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
