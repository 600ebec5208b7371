/*
 * test_quant_model.c - `hearth quantize` logic (src/quant): file-type names, llama.cpp's
 * per-tensor rules for the mixes and row-length fallbacks, metadata copying, and whole
 * models: stories260K to Q8_0 still generates (nearly) the same greedy text; a synthetic
 * 256-wide model to Q4_K_M has the expected per-tensor types and close logits.
 */
#include "test.h"

#include <stdlib.h>
#include <sys/wait.h>

#include "base/file.h"

#include "model/model.h"
#include "model_synth.h"
#include "quant/quantize.h"

TEST(quant_model_ftype_names) {
    quant_ftype f;
    CHECK(quant_ftype_parse("Q4_K_M", &f) && f == QUANT_FTYPE_Q4_K_M);
    CHECK(quant_ftype_parse("q4_k_m", &f) && f == QUANT_FTYPE_Q4_K_M);
    CHECK(quant_ftype_parse("Q4_K", &f) && f == QUANT_FTYPE_Q4_K_M); /* llama.cpp alias */
    CHECK(quant_ftype_parse("q8_0", &f) && f == QUANT_FTYPE_Q8_0);
    CHECK(quant_ftype_parse("BF16", &f) && f == QUANT_FTYPE_BF16);
    CHECK(!quant_ftype_parse("Q4_K_X", &f));
    CHECK(!quant_ftype_parse("", &f));
    /* LLAMA_FTYPE numbering, as general.file_type carries it */
    CHECK_EQ_INT(QUANT_FTYPE_Q8_0, 7);
    CHECK_EQ_INT(QUANT_FTYPE_Q4_K_M, 15);
    CHECK_EQ_INT(QUANT_FTYPE_Q5_K_M, 17);
    CHECK_STR(quant_ftype_name(QUANT_FTYPE_Q5_K_S), "Q5_K_S");
    CHECK_EQ_INT(quant_ftype_base_type(QUANT_FTYPE_Q3_K_L), HL_TYPE_Q3_K);
}

/* A llama-like tensor list for quant_plan: 8 layers, rows of `width`. */
enum { PLAN_LAYERS = 8, PLAN_PER_LAYER = 9, PLAN_N = 3 + PLAN_LAYERS * PLAN_PER_LAYER };
static char g_names[PLAN_N][64];
static quant_tensor_info g_infos[PLAN_N];

static int plan_tensors(int64_t width, int64_t ff_width, bool with_output) {
    int n = 0;
#define ADD(nd, w, ...)                                                                   \
    do {                                                                                  \
        snprintf(g_names[n], sizeof g_names[n], __VA_ARGS__);                             \
        g_infos[n] = (quant_tensor_info){g_names[n], nd, {w, nd > 1 ? 4 : 1, 1, 1},       \
                                         HL_TYPE_F32};                                    \
        n++;                                                                              \
    } while (0)
    ADD(2, width, "token_embd.weight");
    for (int l = 0; l < PLAN_LAYERS; l++) {
        ADD(1, width, "blk.%d.attn_norm.weight", l);
        ADD(2, width, "blk.%d.attn_q.weight", l);
        ADD(2, width, "blk.%d.attn_k.weight", l);
        ADD(2, width, "blk.%d.attn_v.weight", l);
        ADD(2, width, "blk.%d.attn_output.weight", l);
        ADD(1, width, "blk.%d.ffn_norm.weight", l);
        ADD(2, width, "blk.%d.ffn_gate.weight", l);
        ADD(2, width, "blk.%d.ffn_up.weight", l);
        ADD(2, ff_width, "blk.%d.ffn_down.weight", l);
    }
    ADD(1, width, "output_norm.weight");
    if (with_output) ADD(2, width, "output.weight");
#undef ADD
    return n;
}

static hl_type plan_type(const hl_type *types, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(g_infos[i].name, name) == 0) return types[i];
    return (hl_type)-1;
}

TEST(quant_model_plan_q4_K_M) {
    const int n = plan_tensors(256, 512, true);
    hl_type types[PLAN_N];
    quant_plan(QUANT_FTYPE_Q4_K_M, g_infos, n, 8, types);
    CHECK_EQ_INT(plan_type(types, n, "output.weight"), HL_TYPE_Q6_K);
    CHECK_EQ_INT(plan_type(types, n, "token_embd.weight"), HL_TYPE_Q4_K);
    CHECK_EQ_INT(plan_type(types, n, "output_norm.weight"), HL_TYPE_F32);
    /* use_more_bits over 8 layers: the first and last eighth, and every third from 1 */
    const bool more[PLAN_LAYERS] = {true, false, false, true, false, false, true, true};
    char nm[64];
    for (int l = 0; l < PLAN_LAYERS; l++) {
        const hl_type want = more[l] ? HL_TYPE_Q6_K : HL_TYPE_Q4_K;
        snprintf(nm, sizeof nm, "blk.%d.attn_v.weight", l);
        CHECK_MSG(plan_type(types, n, nm) == want, "%s: %s", nm,
                  hl_type_name(plan_type(types, n, nm)));
        snprintf(nm, sizeof nm, "blk.%d.ffn_down.weight", l);
        CHECK_MSG(plan_type(types, n, nm) == want, "%s: %s", nm,
                  hl_type_name(plan_type(types, n, nm)));
        snprintf(nm, sizeof nm, "blk.%d.attn_q.weight", l);
        CHECK_EQ_INT(plan_type(types, n, nm), HL_TYPE_Q4_K);
        snprintf(nm, sizeof nm, "blk.%d.ffn_norm.weight", l);
        CHECK_EQ_INT(plan_type(types, n, nm), HL_TYPE_F32);
    }
    /* Q5_K_M: the same layers get Q6_K, the rest Q5_K */
    quant_plan(QUANT_FTYPE_Q5_K_M, g_infos, n, 8, types);
    CHECK_EQ_INT(plan_type(types, n, "blk.3.attn_v.weight"), HL_TYPE_Q6_K);
    CHECK_EQ_INT(plan_type(types, n, "blk.4.ffn_down.weight"), HL_TYPE_Q5_K);
    CHECK_EQ_INT(plan_type(types, n, "blk.4.ffn_up.weight"), HL_TYPE_Q5_K);
    /* Q4_K_S: first 4 attn_v and first eighth of ffn_down in Q5_K */
    quant_plan(QUANT_FTYPE_Q4_K_S, g_infos, n, 8, types);
    CHECK_EQ_INT(plan_type(types, n, "blk.3.attn_v.weight"), HL_TYPE_Q5_K);
    CHECK_EQ_INT(plan_type(types, n, "blk.4.attn_v.weight"), HL_TYPE_Q4_K);
    CHECK_EQ_INT(plan_type(types, n, "blk.0.ffn_down.weight"), HL_TYPE_Q5_K);
    CHECK_EQ_INT(plan_type(types, n, "blk.1.ffn_down.weight"), HL_TYPE_Q4_K);
    /* Q2_K with GQA 8: attn_v Q4_K, ffn_down and attn_output Q3_K */
    quant_plan(QUANT_FTYPE_Q2_K, g_infos, n, 8, types);
    CHECK_EQ_INT(plan_type(types, n, "blk.5.attn_v.weight"), HL_TYPE_Q4_K);
    CHECK_EQ_INT(plan_type(types, n, "blk.5.ffn_down.weight"), HL_TYPE_Q3_K);
    CHECK_EQ_INT(plan_type(types, n, "blk.5.attn_output.weight"), HL_TYPE_Q3_K);
    CHECK_EQ_INT(plan_type(types, n, "blk.5.attn_q.weight"), HL_TYPE_Q2_K);
    /* Q8_0: output stays Q8_0; F16: no rules at all */
    quant_plan(QUANT_FTYPE_Q8_0, g_infos, n, 8, types);
    CHECK_EQ_INT(plan_type(types, n, "output.weight"), HL_TYPE_Q8_0);
    quant_plan(QUANT_FTYPE_F16, g_infos, n, 8, types);
    CHECK_EQ_INT(plan_type(types, n, "output.weight"), HL_TYPE_F16);
    CHECK_EQ_INT(plan_type(types, n, "blk.0.attn_norm.weight"), HL_TYPE_F32);
    /* Q4_0: output goes to Q6_K as in llama.cpp */
    quant_plan(QUANT_FTYPE_Q4_0, g_infos, n, 8, types);
    CHECK_EQ_INT(plan_type(types, n, "output.weight"), HL_TYPE_Q6_K);
}

TEST(quant_model_plan_fallbacks) {
    /* rows of 96: K-quants do not fit; 172 (stories260K's n_ff): 32-blocks neither */
    const int n = plan_tensors(96, 172, false);
    hl_type types[PLAN_N];
    quant_plan(QUANT_FTYPE_Q4_K_M, g_infos, n, 1, types);
    /* no output.weight: token_embd takes its rule, Q8_0 as its rows are not 256-wide */
    CHECK_EQ_INT(plan_type(types, n, "token_embd.weight"), HL_TYPE_Q8_0);
    CHECK_EQ_INT(plan_type(types, n, "blk.1.attn_q.weight"), HL_TYPE_Q5_0);  /* Q4_K */
    CHECK_EQ_INT(plan_type(types, n, "blk.0.attn_v.weight"), HL_TYPE_Q8_0);  /* Q6_K */
    CHECK_EQ_INT(plan_type(types, n, "blk.1.ffn_down.weight"), HL_TYPE_F16); /* 172 */
    quant_plan(QUANT_FTYPE_Q5_K_S, g_infos, n, 1, types);
    CHECK_EQ_INT(plan_type(types, n, "blk.1.attn_q.weight"), HL_TYPE_Q5_1);
    quant_plan(QUANT_FTYPE_Q3_K_S, g_infos, n, 1, types);
    CHECK_EQ_INT(plan_type(types, n, "blk.1.attn_q.weight"), HL_TYPE_Q4_0);
    quant_plan(QUANT_FTYPE_Q8_0, g_infos, n, 1, types);
    CHECK_EQ_INT(plan_type(types, n, "blk.1.attn_q.weight"), HL_TYPE_Q8_0);
    CHECK_EQ_INT(plan_type(types, n, "blk.1.ffn_down.weight"), HL_TYPE_F16);
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int greedy(model *m, int n, int32_t *out) {
    hl_err err = {0};
    model_kv *kv = NULL;
    model_ctx *c = NULL;
    int got = -1;
    if (model_kv_create(m, 128, &kv, &err) || model_ctx_create(m, 1, 0, &c, &err)) goto done;
    int32_t tok = 1;
    for (got = 0; got < n; got++) {
        if (model_eval(c, kv, &tok, 1, NULL, &err)) break;
        tok = argmax(model_ctx_logits(c), model_get_hparams(m)->n_vocab);
        out[got] = tok;
    }
done:
    if (err.code) fprintf(stderr, "%s\n", err.msg);
    model_ctx_free(c);
    model_kv_free(kv);
    return got;
}

TEST(quant_model_stories260K_q8_0_generates) {
    const char *path = test_shared_path("models/stories260K/stories260K.gguf");
    if (!path) SKIP("models/stories260K/stories260K.gguf not found");
    hl_err err = {0};
    char out_path[512];
    snprintf(out_path, sizeof out_path, "%s/q8.gguf", test_tmpdir());
    quant_stats st;
    CHECK_OK(quant_model_file(path, out_path, QUANT_FTYPE_Q8_0, 2, &st, &err), &err);
    CHECK(st.n_converted > 0 && st.bytes_out < st.bytes_in / 2);
    gguf_file *f;
    CHECK_OK(gguf_open(out_path, &f, &err), &err);
    uint32_t ft = 0;
    CHECK(gguf_get_u32(f, "general.file_type", &ft) && ft == QUANT_FTYPE_Q8_0);
    /* n_ff = 172 is not a multiple of 32: ffn_down falls back to F16 */
    CHECK_EQ_INT(gguf_find_tensor(f, "blk.0.ffn_down.weight")->type, HL_TYPE_F16);
    CHECK_EQ_INT(gguf_find_tensor(f, "blk.0.ffn_up.weight")->type, HL_TYPE_Q8_0);
    CHECK_EQ_INT(gguf_find_tensor(f, "blk.0.attn_norm.weight")->type, HL_TYPE_F32);
    /* the vocabulary (a string array) came through */
    gguf_file *src;
    CHECK_OK(gguf_open(path, &src, &err), &err);
    uint64_t n_src = 0, n_dst = 0;
    CHECK(gguf_get_arr(src, "tokenizer.ggml.tokens", NULL, &n_src));
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", NULL, &n_dst));
    CHECK_EQ_INT(n_src, n_dst);
    CHECK_EQ_INT(gguf_n_kv(f), gguf_n_kv(src) + (gguf_find_key(src, "general.file_type") < 0) +
                                   (gguf_find_key(src, "general.quantization_version") < 0));
    gguf_close(src);
    gguf_close(f);

    model *m32, *m8;
    CHECK_OK(model_load(path, NULL, &m32, &err), &err);
    CHECK_OK(model_load(out_path, NULL, &m8, &err), &err);
    enum { N = 60 };
    int32_t a[N], b[N];
    CHECK_EQ_INT(greedy(m32, N, a), N);
    CHECK_EQ_INT(greedy(m8, N, b), N);
    /* a 260K-parameter model is fragile, but 8-bit weights keep a long common prefix */
    int same = 0;
    while (same < N && a[same] == b[same]) same++;
    CHECK_MSG(same >= 30, "greedy output diverges after %d tokens", same);
    model_free(m32);
    model_free(m8);
}

TEST(quant_model_synthetic_q4_K_M_types_and_logits) {
    char src[512], dst[512];
    snprintf(src, sizeof src, "%s/f32.gguf", test_tmpdir());
    snprintf(dst, sizeof dst, "%s/q4km.gguf", test_tmpdir());
    const synth_cfg cfg = {.arch = "llama", .n_vocab = 256, .n_embd = 256, .n_layer = 8,
                           .n_ff = 256, .n_head = 4, .n_head_kv = 1, .rope_base = 10000.0f,
                           .wtype = HL_TYPE_F32, .seed = 7};
    synth_model *s = synth_build(&cfg, src);
    CHECK(s != NULL);
    hl_err err = {0};
    quant_stats st;
    CHECK_OK(quant_model_file(src, dst, QUANT_FTYPE_Q4_K_M, 2, &st, &err), &err);
    gguf_file *f;
    CHECK_OK(gguf_open(dst, &f, &err), &err);
    uint32_t ft = 0;
    CHECK(gguf_get_u32(f, "general.file_type", &ft) && ft == 15);
    CHECK_EQ_INT(gguf_find_tensor(f, "output.weight")->type, HL_TYPE_Q6_K);
    CHECK_EQ_INT(gguf_find_tensor(f, "token_embd.weight")->type, HL_TYPE_Q4_K);
    CHECK_EQ_INT(gguf_find_tensor(f, "output_norm.weight")->type, HL_TYPE_F32);
    const bool more[8] = {true, false, false, true, false, false, true, true};
    char nm[64];
    for (int l = 0; l < 8; l++) {
        const hl_type want = more[l] ? HL_TYPE_Q6_K : HL_TYPE_Q4_K;
        snprintf(nm, sizeof nm, "blk.%d.attn_v.weight", l);
        CHECK_EQ_INT(gguf_find_tensor(f, nm)->type, want);
        snprintf(nm, sizeof nm, "blk.%d.ffn_down.weight", l);
        CHECK_EQ_INT(gguf_find_tensor(f, nm)->type, want);
        snprintf(nm, sizeof nm, "blk.%d.ffn_gate.weight", l);
        CHECK_EQ_INT(gguf_find_tensor(f, nm)->type, HL_TYPE_Q4_K);
        snprintf(nm, sizeof nm, "blk.%d.attn_k.weight", l);
        CHECK_EQ_INT(gguf_find_tensor(f, nm)->type, HL_TYPE_Q4_K);
    }
    gguf_close(f);
    /* the quantized model runs and its logits follow the f32 reference */
    model *m;
    CHECK_OK(model_load(dst, NULL, &m, &err), &err);
    model_kv *kv;
    model_ctx *c;
    CHECK_OK(model_kv_create(m, 16, &kv, &err), &err);
    CHECK_OK(model_ctx_create(m, 2, 0, &c, &err), &err);
    const int32_t toks[4] = {1, 17, 42, 99};
    static float got[4 * 256], want[4 * 256];
    CHECK_OK(model_eval(c, kv, toks, 4, got, &err), &err);
    synth_ref_forward(s, toks, 4, want);
    double num = 0, den = 0;
    for (int i = 0; i < 4 * 256; i++) {
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    CHECK(den > 0);
    /* random weights through 8 layers: the per-matmul error (~0.07 for Q4_K) compounds;
     * measured 0.17 (Q4_0: 0.19, Q8_0: 0.02). A wrong block layout gives ~1. */
    CHECK_MSG(sqrt(num / den) < 0.25, "relative logit error %.3f", sqrt(num / den));
    model_ctx_free(c);
    model_kv_free(kv);
    model_free(m);
    synth_free(s);
}

TEST(quant_model_errors) {
    hl_err err = {0};
    char p[512];
    snprintf(p, sizeof p, "%s/out.gguf", test_tmpdir());
    CHECK(quant_model_file("/nonexistent/in.gguf", p, QUANT_FTYPE_Q8_0, 1, NULL, &err) != HL_OK);
    CHECK(strstr(err.msg, "nonexistent") != NULL);
    /* not a GGUF */
    char bad[512];
    snprintf(bad, sizeof bad, "%s/bad.gguf", test_tmpdir());
    FILE *fp = fopen(bad, "wb");
    CHECK(fp != NULL);
    fputs("not a gguf file at all", fp);
    fclose(fp);
    CHECK_EQ_INT(quant_model_file(bad, p, QUANT_FTYPE_Q8_0, 1, NULL, &err), HL_ERR_FORMAT);
}

/* `hearth quantize` end to end: success writes a loadable file and a summary line; a bad
 * type and a missing input fail with a message naming them. */
static int run_quantize(const char *args, char *errout, size_t cap) {
    char cmd[2048], pe[512];
    snprintf(pe, sizeof pe, "%s/err.txt", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s quantize %s >/dev/null 2>%s", getenv("HEARTH_BIN"), args, pe);
    const int st = system(cmd);
    char *b;
    size_t n;
    errout[0] = '\0';
    if (hl_file_read(pe, &b, &n, NULL) == HL_OK) {
        snprintf(errout, cap, "%s", b);
        free(b);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(quant_model_cli) {
    const char *bin = getenv("HEARTH_BIN");
    const char *src = test_shared_path("models/stories260K/stories260K.gguf");
    if (!bin || !*bin) SKIP("HEARTH_BIN not set (run via make test)");
    if (!src) SKIP("models/stories260K/stories260K.gguf not found");
    char args[1536], dst[512], errout[2048];
    snprintf(dst, sizeof dst, "%s/q.gguf", test_tmpdir());
    snprintf(args, sizeof args, "%s %s q5_k_m -t 2", src, dst);
    CHECK_EQ_INT(run_quantize(args, errout, sizeof errout), 0);
    CHECK_MSG(strstr(errout, "Q5_K_M") && strstr(errout, "converted"), "stderr: %s", errout);
    gguf_file *f;
    hl_err err = {0};
    CHECK_OK(gguf_open(dst, &f, &err), &err);
    uint32_t ft = 0;
    CHECK(gguf_get_u32(f, "general.file_type", &ft) && ft == QUANT_FTYPE_Q5_K_M);
    /* 64-wide rows: Q5_K falls back to Q5_1 */
    CHECK_EQ_INT(gguf_find_tensor(f, "blk.1.attn_q.weight")->type, HL_TYPE_Q5_1);
    gguf_close(f);
    snprintf(args, sizeof args, "%s %s Q7_X", src, dst);
    CHECK_EQ_INT(run_quantize(args, errout, sizeof errout), 2);
    CHECK_MSG(strstr(errout, "unknown type 'Q7_X'") != NULL, "stderr: %s", errout);
    snprintf(args, sizeof args, "%s/missing.gguf %s Q8_0", test_tmpdir(), dst);
    CHECK_EQ_INT(run_quantize(args, errout, sizeof errout), 1);
    CHECK_MSG(strstr(errout, "missing.gguf") != NULL, "stderr: %s", errout);
    CHECK_EQ_INT(run_quantize("only-one-arg", errout, sizeof errout), 2);
    CHECK(strstr(errout, "usage") != NULL);
}
