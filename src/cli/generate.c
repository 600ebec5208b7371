/*
 * generate.c - `hearth generate`: load a model, tokenize a prompt, stream a continuation.
 *
 *   hearth generate -m FILE.gguf -p TEXT [-n N] [--temp T] [--seed S] [--top-k K]
 *                   [--top-p P] [--min-p P] [-t THREADS] [-c CTX] [--tokens] [--mmap]
 *                   [--kv-type f32|f16|q8_0]
 *   hearth generate -m model.bin --tokenizer tok.bin ...      (llama2.c checkpoints)
 *   hearth generate -m FILE.gguf --prompt-ids 1,2,3 -n N --temp 0 --top-logits K
 *
 * Text goes to stdout as tokens come (flushed per token); timing goes to stderr. Any error
 * is one line on stderr and exit status 1.
 *
 * --top-logits K is the golden runner (compare with llama.cpp's outputs): the prompt is
 * evaluated in one batch keeping every position's logits, and stdout gets one JSON line per
 * position, prompt positions first, then one per generated token:
 *     {"pos": P, "token": ID, "top": [[id, logit], ...]}
 * token is the id at position P (given or generated), top the K best logits computed at P
 * (the distribution of position P + 1), best first, printed to round-trip (%.9g). Each
 * generated token is evaluated too, so its line has its distribution; end-of-generation
 * tokens do not stop the run (as in the goldens). --prompt-ids gives the prompt as token
 * ids (used as they are: no BOS is added).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "cli/cli.h"
#include "kv/layout.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "tok/tok.h"

#define GEN_DEFAULT_PREDICT 128
#define GEN_DEFAULT_CTX 4096

typedef struct gen_opts {
    const char *model_path;
    const char *tokenizer_path;
    const char *prompt;
    const char *prompt_ids; /* --prompt-ids, as given */
    long top_logits;        /* --top-logits K; 0: text output */
    long n_predict;
    long n_threads;
    long n_ctx; /* 0: min(trained context, GEN_DEFAULT_CTX) */
    bool print_tokens;
    bool use_mmap;
    bool seed_set;
    hl_type kv_type; /* of cached keys and values (default f16) */
    sampler_opts sp;
} gen_opts;

static bool parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_float(const char *s, float lo, float hi, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

static bool parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (*s == '-') return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end) return false;
    *out = v;
    return true;
}

/* Returns 0 on success, 1 on a bad argument (message printed), -1 for --help. */
static int parse_args(int argc, char **argv, gen_opts *o) {
    enum { O_TOKENIZER = 256, O_PROMPT_IDS, O_TOP_LOGITS, O_KV_TYPE, O_TEMP, O_TOP_P, O_MIN_P,
           O_TOP_K, O_SEED, O_REPEAT_PENALTY, O_REPEAT_LAST_N, O_TOKENS, O_MMAP };
    static const struct option opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"model", required_argument, NULL, 'm'},
        {"prompt", required_argument, NULL, 'p'},
        {"tokenizer", required_argument, NULL, O_TOKENIZER},
        {"prompt-ids", required_argument, NULL, O_PROMPT_IDS},
        {"top-logits", required_argument, NULL, O_TOP_LOGITS},
        {"kv-type", required_argument, NULL, O_KV_TYPE},
        {"temp", required_argument, NULL, O_TEMP},
        {"top-p", required_argument, NULL, O_TOP_P},
        {"min-p", required_argument, NULL, O_MIN_P},
        {"top-k", required_argument, NULL, O_TOP_K},
        {"seed", required_argument, NULL, O_SEED},
        {"repeat-penalty", required_argument, NULL, O_REPEAT_PENALTY},
        {"repeat-last-n", required_argument, NULL, O_REPEAT_LAST_N},
        {"tokens", no_argument, NULL, O_TOKENS},
        {"mmap", no_argument, NULL, O_MMAP},
        {NULL, 0, NULL, 0}};
    *o = (gen_opts){.n_predict = GEN_DEFAULT_PREDICT, .kv_type = HL_TYPE_F16,
                    .sp = sampler_opts_defaults()};
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":hm:p:n:t:c:", opts, NULL)) != -1) {
        const char *v = optarg;
        long l;
        bool ok = true;
        switch (c) {
        case 'h': return -1;
        case O_TOKENS: o->print_tokens = true; break;
        case O_MMAP: o->use_mmap = true; break;
        case 'm': o->model_path = v; break;
        case O_TOKENIZER: o->tokenizer_path = v; break;
        case 'p': o->prompt = v; break;
        case O_PROMPT_IDS: o->prompt_ids = v; break;
        case O_TOP_LOGITS: ok = parse_long(v, 1, INT32_MAX, &o->top_logits); break;
        case 'n': ok = parse_long(v, 0, 1L << 30, &o->n_predict); break;
        case 't': ok = parse_long(v, 1, 512, &o->n_threads); break;
        case 'c': ok = parse_long(v, 1, 1L << 24, &o->n_ctx); break;
        case O_KV_TYPE: ok = kv_type_parse(v, &o->kv_type); break;
        case O_TEMP: ok = parse_float(v, 0.0f, 100.0f, &o->sp.temperature); break;
        case O_TOP_P: ok = parse_float(v, 0.0f, 1.0f, &o->sp.top_p); break;
        case O_MIN_P: ok = parse_float(v, 0.0f, 1.0f, &o->sp.min_p); break;
        case O_TOP_K:
            ok = parse_long(v, 0, 1L << 30, &l);
            o->sp.top_k = (int32_t)l;
            break;
        case O_SEED: {
            uint64_t seed = 0;
            ok = parse_u64(v, &seed) && seed <= (uint64_t)INT64_MAX;
            o->sp.seed = (int64_t)seed;
            o->seed_set = true;
            break;
        }
        case O_REPEAT_PENALTY: ok = parse_float(v, 0.0f, 100.0f, &o->sp.repeat_penalty); break;
        case O_REPEAT_LAST_N:
            ok = parse_long(v, -1, 1L << 24, &l);
            o->sp.repeat_last_n = (int32_t)l;
            break;
        case ':':
            fprintf(stderr, "hearth generate: %s needs a value (see --help)\n", argv[optind - 1]);
            return 1;
        default:
            fprintf(stderr, "hearth generate: unknown option '%s' (see --help)\n", argv[optind - 1]);
            return 1;
        }
        if (!ok) {
            /* "--temp 5": the flag is the argument before its value; "--temp=5", "-n5": the same */
            const char *flag = optind >= 2 && argv[optind - 1] == v ? argv[optind - 2] : argv[optind - 1];
            fprintf(stderr, "hearth generate: invalid value '%s' for %s\n", v, flag);
            return 1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "hearth generate: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 1;
    }
    if (!o->model_path) {
        fprintf(stderr, "hearth generate: -m MODEL is required (see --help)\n");
        return 1;
    }
    if (o->prompt && o->prompt_ids) {
        fprintf(stderr, "hearth generate: give either -p or --prompt-ids, not both\n");
        return 1;
    }
    if (!o->prompt) o->prompt = "";
    if (!o->seed_set) o->sp.seed = (int64_t)((((uint64_t)time(NULL)) ^ hl_time_ns()) >> 1);
    return 0;
}

typedef struct gen_state {
    model *m;
    model_kv *kv;
    model_ctx *ctx;
    sampler *smp;
    int32_t *prompt;
    char *piece;
} gen_state;

static void gen_free(gen_state *g) {
    sampler_destroy(g->smp);
    model_ctx_free(g->ctx);
    model_kv_free(g->kv);
    model_free(g->m);
    free(g->prompt);
    free(g->piece);
}

static int fail(gen_state *g, const hl_err *err) {
    fprintf(stderr, "hearth generate: %s\n", err->msg);
    gen_free(g);
    return 1;
}

/* qsort order for the top-K list: higher logit first, then lower id. One CLI thread. */
static const float *g_sort_logits;
static int by_logit_desc(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    float la = g_sort_logits[a], lb = g_sort_logits[b];
    if (la != lb) return la > lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* One JSON line: the token at pos and the K best logits computed there. */
static void print_top_line(long pos, int32_t token, const float *logits, int32_t n_vocab,
                           int32_t *order, long k) {
    for (int32_t i = 0; i < n_vocab; i++) order[i] = i;
    g_sort_logits = logits;
    qsort(order, (size_t)n_vocab, sizeof *order, by_logit_desc);
    printf("{\"pos\": %ld, \"token\": %d, \"top\": [", pos, token);
    for (long i = 0; i < k; i++) {
        float l = logits[order[i]];
        if (isfinite(l)) printf("%s[%d, %.9g]", i ? ", " : "", order[i], (double)l);
        else printf("%s[%d, null]", i ? ", " : "", order[i]);
    }
    printf("]}\n");
}

/* The --top-logits run (see the top of this file). Returns 0, or 1 with err set. */
static int gen_top_logits(gen_state *g, const gen_opts *o, size_t n_prompt, hl_err *err) {
    const int32_t V = model_get_hparams(g->m)->n_vocab;
    if ((long)n_prompt + o->n_predict > model_kv_capacity(g->kv)) {
        hl_fail(err, HL_ERR_KV_FULL, "%zu prompt + %ld generated tokens do not fit the context (%d)",
                n_prompt, o->n_predict, model_kv_capacity(g->kv));
        return 1;
    }
    float *all = malloc(n_prompt * (size_t)V * sizeof *all);
    int32_t *order = malloc((size_t)V * sizeof *order);
    if (!all || !order) {
        free(all);
        free(order);
        hl_fail(err, HL_ERR_NOMEM, "out of memory for %zu x %d logits", n_prompt, V);
        return 1;
    }
    int rc = 0;
    if (model_eval(g->ctx, g->kv, g->prompt, (int32_t)n_prompt, all, err)) {
        rc = 1;
        goto out;
    }
    for (size_t i = 0; i < n_prompt; i++)
        print_top_line((long)i, g->prompt[i], all + i * (size_t)V, V, order, o->top_logits);
    const float *logits = all + (n_prompt - 1) * (size_t)V;
    for (long k = 0; k < o->n_predict; k++) {
        sampler_out so;
        const int32_t slot = 0;
        if (sampler_sample(g->smp, &slot, 1, logits, (size_t)V, &so, err) ||
            model_eval(g->ctx, g->kv, &so.token, 1, NULL, err)) {
            rc = 1;
            goto out;
        }
        logits = model_ctx_logits(g->ctx);
        print_top_line((long)n_prompt + k, so.token, logits, V, order, o->top_logits);
        fflush(stdout);
    }
out:
    free(all);
    free(order);
    return rc;
}

int cli_generate(int argc, char **argv) {
    gen_opts o;
    int r = parse_args(argc, argv, &o);
    if (r < 0) {
        return cli_help(cli_usage_of("generate"));
    }
    if (r > 0) return 1;

    gen_state g = {0};
    hl_err err = {0};
    const model_load_opts lo = {.use_mmap = o.use_mmap};
    if (model_load_ex(o.model_path, o.tokenizer_path, &lo, &g.m, &err)) return fail(&g, &err);
    const model_hparams *hp = model_get_hparams(g.m);
    const tok_vocab *vocab = model_vocab(g.m);
    if (!vocab) {
        hl_fail(&err, HL_ERR_INVALID, "the model has no tokenizer");
        return fail(&g, &err);
    }
    size_t n_prompt = 0;
    if (o.prompt_ids) {
        char why[128];
        if (!cli_parse_ids(o.prompt_ids, &g.prompt, &n_prompt, why, sizeof why)) {
            hl_fail(&err, HL_ERR_INVALID, "invalid --prompt-ids '%s': %s", o.prompt_ids, why);
            return fail(&g, &err);
        }
        for (size_t i = 0; i < n_prompt; i++)
            if (g.prompt[i] >= hp->n_vocab) {
                hl_fail(&err, HL_ERR_INVALID,
                        "--prompt-ids: token id %d is outside the vocabulary (%d tokens)",
                        g.prompt[i], hp->n_vocab);
                return fail(&g, &err);
            }
    } else if (cli_tokenize(vocab, o.prompt, &g.prompt, &n_prompt, &err)) {
        return fail(&g, &err);
    }
    if (o.top_logits > hp->n_vocab) {
        hl_fail(&err, HL_ERR_INVALID, "--top-logits %ld is more than the vocabulary (%d tokens)",
                o.top_logits, hp->n_vocab);
        return fail(&g, &err);
    }
    long n_ctx = o.n_ctx ? o.n_ctx
                         : (hp->n_ctx_train < GEN_DEFAULT_CTX ? hp->n_ctx_train : GEN_DEFAULT_CTX);
    if ((long)n_prompt > n_ctx) {
        hl_fail(&err, HL_ERR_KV_FULL, "the prompt has %zu tokens but the context only %ld",
                n_prompt, n_ctx);
        return fail(&g, &err);
    }
    if (model_kv_create_ex(g.m, (int32_t)n_ctx, o.kv_type, o.kv_type, &g.kv, &err)) {
        if (o.kv_type != HL_TYPE_Q8_0) return fail(&g, &err);
        /* q8_0 rows need heads of whole 32-element blocks */
        fprintf(stderr, "hearth generate: q8_0 KV cache not possible (%s): using f16\n", err.msg);
        if (model_kv_create_ex(g.m, (int32_t)n_ctx, HL_TYPE_F16, HL_TYPE_F16, &g.kv, &err))
            return fail(&g, &err);
    }
    if (model_ctx_create(g.m, (int)o.n_threads, 0, &g.ctx, &err)) return fail(&g, &err);
    if (sampler_create(hp->n_vocab, (int32_t)n_ctx, &g.smp, &err)) return fail(&g, &err);
    if (sampler_add(g.smp, 0, &o.sp, g.prompt, n_prompt, &err)) return fail(&g, &err);
    if (o.top_logits) {
        int rc = gen_top_logits(&g, &o, n_prompt, &err);
        if (rc) return fail(&g, &err);
        gen_free(&g);
        return 0;
    }

    /* 64 + the longest piece is always enough for tok_stream_push */
    size_t piece_cap = 64;
    for (int32_t id = 0; id < tok_vocab_n_tokens(vocab); id++) {
        char tmp[8];
        int32_t len = tok_token_to_piece(vocab, id, false, tmp, sizeof tmp);
        if (len > 0 && (size_t)len + 64 > piece_cap) piece_cap = (size_t)len + 64;
    }
    g.piece = malloc(piece_cap);
    if (!g.piece) {
        hl_fail(&err, HL_ERR_NOMEM, "out of memory");
        return fail(&g, &err);
    }
    /* SentencePiece drops the space prefix of the first piece after BOS */
    int32_t bos = tok_vocab_special(vocab, TOK_SPECIAL_BOS);
    tok_stream ts;
    tok_stream_init(&ts, vocab, false, bos >= 0 && g.prompt[n_prompt - 1] == bos);

    uint64_t t0 = hl_time_ns();
    if (model_eval(g.ctx, g.kv, g.prompt, (int32_t)n_prompt, NULL, &err)) return fail(&g, &err);
    uint64_t t1 = hl_time_ns();
    long n_gen = 0;
    bool ctx_full = false;
    for (; n_gen < o.n_predict; n_gen++) {
        sampler_out so;
        const int32_t slot = 0;
        if (sampler_sample(g.smp, &slot, 1, model_ctx_logits(g.ctx), (size_t)hp->n_vocab, &so, &err))
            return fail(&g, &err);
        int32_t id = so.token;
        if (tok_is_eog(vocab, id)) break;
        if (o.print_tokens) {
            printf("%s%d", n_gen ? " " : "", id);
        } else {
            int32_t n = tok_stream_push(&ts, id, g.piece, piece_cap);
            if (n > 0) fwrite(g.piece, 1, (size_t)n, stdout);
        }
        fflush(stdout);
        if (n_gen + 1 == o.n_predict) {
            n_gen++;
            break;
        }
        if (model_kv_len(g.kv) >= model_kv_capacity(g.kv)) {
            ctx_full = true;
            n_gen++;
            break;
        }
        if (model_eval(g.ctx, g.kv, &id, 1, NULL, &err)) return fail(&g, &err);
    }
    uint64_t t2 = hl_time_ns();
    if (!o.print_tokens) {
        int32_t n = tok_stream_flush(&ts, g.piece, piece_cap);
        if (n > 0) fwrite(g.piece, 1, (size_t)n, stdout);
    }
    printf("\n");
    fflush(stdout);
    if (ctx_full) fprintf(stderr, "hearth generate: stopped: the context (%ld) is full\n", n_ctx);
    double tp = (double)(t1 - t0) / 1e9, tg = (double)(t2 - t1) / 1e9;
    fprintf(stderr,
            "prompt: %zu tokens in %.3f s (%.1f tokens/s); generated: %ld tokens in %.3f s (%.1f "
            "tokens/s); %d threads\n",
            n_prompt, tp, tp > 0 ? (double)n_prompt / tp : 0.0, n_gen, tg,
            tg > 0 ? (double)n_gen / tg : 0.0, model_ctx_n_threads(g.ctx));
    gen_free(&g);
    return 0;
}
