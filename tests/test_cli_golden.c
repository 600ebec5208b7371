/* test_cli_golden.c - the golden-runner CLI end to end: `hearth generate --prompt-ids ...
 * --top-logits K` and `hearth embed`, run as $HEARTH_BIN on stories260K, their output
 * parsed and compared with the same computation in this process. */
#include <jansson.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "base/file.h"
#include "model/model.h"
#include "test.h"
#include "tok/tok.h"

static char g_out[262144], g_err[8192];

/* Runs $HEARTH_BIN with args (a shell-quoted string); returns the exit status. */
static int run_bin(const char *args) {
    const char *bin = getenv("HEARTH_BIN");
    char cmd[2048], po[512], pe[512];
    snprintf(po, sizeof po, "%s/out.txt", test_tmpdir());
    snprintf(pe, sizeof pe, "%s/err.txt", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", bin, args, po, pe);
    int st = system(cmd);
    const char *paths[2] = {po, pe};
    char *bufs[2] = {g_out, g_err};
    size_t caps[2] = {sizeof g_out, sizeof g_err};
    for (int i = 0; i < 2; i++) {
        char *b;
        size_t n;
        bufs[i][0] = '\0';
        if (hl_file_read(paths[i], &b, &n, NULL) == HL_OK) {
            snprintf(bufs[i], caps[i], "%s", b);
            free(b);
        }
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#define STORIES_BIN_OR_SKIP(path)                                                         \
    const char *path = test_shared_path("models/stories260K/stories260K.gguf");          \
    if (!getenv("HEARTH_BIN") || !*getenv("HEARTH_BIN"))                                  \
        SKIP("HEARTH_BIN not set (run through make test)");                              \
    if (!path) SKIP("models/stories260K/stories260K.gguf not found")

static int32_t argmax_f(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The JSON lines: prompt positions with the given tokens, then greedy tokens; every top
 * list the K best of the logits this process computes the same way (one batch for the
 * prompt, then one token at a time), equal after the %.9g round trip. */
TEST(cli_generate_top_logits) {
    STORIES_BIN_OR_SKIP(p);
    enum { NP = 4, NG = 6, K = 5 };
    const int32_t prompt[NP] = {1, 403, 407, 261};
    char args[1024];
    snprintf(args, sizeof args, "generate -m %s --prompt-ids 1,403,407,261 -n %d --temp 0 "
             "--top-logits %d -t 1 --kv-type f32", p, NG, K); /* f32 KV: bit-equal to model_eval */
    CHECK_MSG(run_bin(args) == 0, "stderr: %s", g_err);

    hl_err err = {0};
    model *m;
    model_kv *kv;
    model_ctx *c;
    CHECK_OK(model_load(p, NULL, &m, &err), &err);
    const int32_t V = model_get_hparams(m)->n_vocab;
    CHECK_OK(model_kv_create(m, 64, &kv, &err), &err);
    CHECK_OK(model_ctx_create(m, 1, 0, &c, &err), &err);
    float *logits = malloc(sizeof(float) * (size_t)V * (NP + NG));
    CHECK_OK(model_eval(c, kv, prompt, NP, logits, &err), &err);
    int32_t seq[NP + NG];
    memcpy(seq, prompt, sizeof prompt);
    for (int k = 0; k < NG; k++) {
        seq[NP + k] = argmax_f(logits + (size_t)(NP + k - 1) * V, V);
        CHECK_OK(model_eval(c, kv, &seq[NP + k], 1, NULL, &err), &err);
        memcpy(logits + (size_t)(NP + k) * V, model_ctx_logits(c), sizeof(float) * (size_t)V);
    }
    model_ctx_free(c);
    model_kv_free(kv);
    model_free(m);

    char *line = g_out;
    int n_lines = 0;
    bool ok = true;
    char why[512] = "";
    for (int pos = 0; ok && pos < NP + NG; pos++, n_lines++) {
        char *nl = strchr(line, '\n');
        if (!nl) {
            snprintf(why, sizeof why, "only %d lines", n_lines);
            ok = false;
            break;
        }
        *nl = '\0';
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        json_t *top = json_object_get(o, "top");
        const float *row = logits + (size_t)pos * V;
        if (!o || json_integer_value(json_object_get(o, "pos")) != pos ||
            json_integer_value(json_object_get(o, "token")) != seq[pos] ||
            json_array_size(top) != K) {
            snprintf(why, sizeof why, "line %d: %s (want pos %d, token %d, %d pairs)", pos, line,
                     pos, seq[pos], K);
            ok = false;
        }
        for (size_t i = 0; ok && i < K; i++) {
            json_t *pair = json_array_get(top, i);
            json_int_t id = json_integer_value(json_array_get(pair, 0));
            double l = json_number_value(json_array_get(pair, 1));
            /* rank i: as good as every later one, and the logit exactly ours */
            bool rank_ok = id >= 0 && id < V && (i > 0 || id == argmax_f(row, V));
            if (rank_ok && i > 0) {
                double prev = json_number_value(json_array_get(json_array_get(top, i - 1), 1));
                rank_ok = l <= prev;
            }
            if (!rank_ok || (float)l != row[id]) {
                snprintf(why, sizeof why, "line %d pair %zu: [%lld, %.9g], ours %.9g", pos, i,
                         (long long)id, l, id >= 0 && id < V ? (double)row[id] : NAN);
                ok = false;
            }
        }
        json_decref(o);
        line = nl + 1;
    }
    free(logits);
    CHECK_MSG(ok, "%s", why);
    CHECK_MSG(*line == '\0', "extra output: %s", line);
    /* the greedy continuation is stories260K's (llama2.c's run.c: 403 407 261 378 432 383) */
    CHECK_EQ_INT(seq[4], 378);
    CHECK_EQ_INT(seq[5], 432);
}

TEST(cli_golden_bad_input) {
    STORIES_BIN_OR_SKIP(p);
    static const char *bad[] = {"generate -m %s --prompt-ids 1,99999 --top-logits 3",
                                "generate -m %s --prompt-ids 1,,2 --top-logits 3",
                                "generate -m %s --prompt-ids 1,-2 --top-logits 3",
                                "generate -m %s --prompt-ids 1 --top-logits 0",
                                "generate -m %s --prompt-ids 1 --top-logits 100000",
                                "generate -m %s --prompt-ids 1 -p hi --top-logits 3",
                                "embed -m %s --prompt-ids 1,512",
                                "embed -m %s --prompt-ids 1,x",
                                "embed -m %s",
                                "embed -m %s --prompt-ids 1 text"};
    char args[1024];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, bad[i], p);
        int rc = run_bin(args);
        char *nl = strchr(g_err, '\n');
        CHECK_MSG(rc == 1 && nl && nl[1] == '\0' && strncmp(g_err, "hearth ", 7) == 0,
                  "%s: rc %d, stderr \"%s\"", args, rc, g_err);
        CHECK_MSG(g_out[0] == '\0', "%s: stdout \"%s\"", args, g_out);
    }
    CHECK_EQ_INT(run_bin("generate --help"), 0);
    CHECK(strstr(g_out, "--top-logits") && strstr(g_out, "--prompt-ids"));
    CHECK_EQ_INT(run_bin("embed --help"), 0);
    CHECK(strstr(g_out, "Usage:\n  hearth embed "));
}

/* One JSON array of n_embd floats of unit norm, equal to model_embed here, for ids and
 * for text (tokenized with BOS, as the vocabulary says). */
TEST(cli_embed) {
    STORIES_BIN_OR_SKIP(p);
    hl_err err = {0};
    model *m;
    model_ctx *c;
    CHECK_OK(model_load(p, NULL, &m, &err), &err);
    CHECK_OK(model_ctx_create(m, 1, 0, &c, &err), &err);
    const int32_t E = model_get_hparams(m)->n_embd;
    float want[2][512];
    CHECK(E <= 512);
    const int32_t ids[3] = {1, 403, 407};
    CHECK_OK(model_embed(c, ids, 3, true, want[0], &err), &err);
    const char *text = "Once upon a time";
    int32_t tids[64];
    size_t nt = 0;
    CHECK_OK(tok_encode(model_vocab(m), text, strlen(text), true, true, tids, 64, &nt, &err), &err);
    CHECK(nt > 1 && nt <= 64 && tids[0] == 1);
    CHECK_OK(model_embed(c, tids, (int32_t)nt, true, want[1], &err), &err);
    model_ctx_free(c);
    model_free(m);

    char args[1024];
    for (int k = 0; k < 2; k++) {
        if (k == 0) snprintf(args, sizeof args, "embed -m %s --prompt-ids 1,403,407 -t 1", p);
        else snprintf(args, sizeof args, "embed -m %s -t 1 '%s'", p, text);
        CHECK_MSG(run_bin(args) == 0, "stderr: %s", g_err);
        json_error_t je;
        json_t *a = json_loads(g_out, 0, &je);
        CHECK_MSG(json_is_array(a), "not a JSON array: %.200s", g_out);
        size_t n = json_array_size(a);
        double ss = 0;
        bool same = n == (size_t)E;
        for (size_t i = 0; i < n; i++) {
            double x = json_number_value(json_array_get(a, i));
            ss += x * x;
            same = same && (float)x == want[k][i];
        }
        json_decref(a);
        CHECK_EQ_INT(n, E);
        CHECK_NEAR(sqrt(ss), 1.0, 1e-5);
        CHECK_MSG(same, "case %d: the CLI's vector differs from model_embed's", k);
    }
}
