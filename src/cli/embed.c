/*
 * embed.c - `hearth embed`: one text's (or token list's) embedding, as a JSON array.
 *
 *   hearth embed -m FILE.gguf [--prompt-ids 1,2,3 | TEXT] [-t THREADS] [--mmap]
 *
 * The tokens (TEXT tokenized with the model's vocabulary and its special tokens, e.g.
 * BERT's [CLS] ... [SEP]; or the ids as given) go through model_embed(): the final hidden
 * states pooled as the GGUF declares (mean when it declares nothing), L2-normalised.
 * stdout gets one line, the n_embd floats as a JSON array (%.9g, so they round-trip).
 * Any error is one line on stderr and exit status 1.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "model/model.h"
#include "tok/tok.h"

static int embed_fail(const char *msg) {
    fprintf(stderr, "hearth embed: %s\n", msg);
    return 1;
}

int cli_embed(int argc, char **argv) {
    const char *model_path = NULL, *ids_arg = NULL, *text = NULL;
    long n_threads = 0;
    bool use_mmap = false;
    enum { O_PROMPT_IDS = 256, O_MMAP };
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                         {"model", required_argument, NULL, 'm'},
                                         {"prompt-ids", required_argument, NULL, O_PROMPT_IDS},
                                         {"mmap", no_argument, NULL, O_MMAP},
                                         {NULL, 0, NULL, 0}};
    optind = 0;
    opterr = 0;
    int opt;
    /* "-" leading: TEXT arguments come back in order as 1 ("-" alone is text too) */
    while ((opt = getopt_long(argc, argv, "-:hm:t:", opts, NULL)) != -1) {
        switch (opt) {
        case 'h': return cli_help(cli_usage_of("embed"));
        case O_MMAP: use_mmap = true; break;
        case 'm': model_path = optarg; break;
        case O_PROMPT_IDS: ids_arg = optarg; break;
        case 't': {
            char *end;
            errno = 0;
            n_threads = strtol(optarg, &end, 10);
            if (errno || end == optarg || *end || n_threads < 1 || n_threads > 512) {
                fprintf(stderr, "hearth embed: invalid value '%s' for -t\n", optarg);
                return 1;
            }
            break;
        }
        case 1:
            if (text) return embed_fail("give one TEXT argument (quote it if it has spaces)");
            text = optarg;
            break;
        case ':':
            fprintf(stderr, "hearth embed: %s needs a value (see --help)\n", argv[optind - 1]);
            return 1;
        default:
            fprintf(stderr, "hearth embed: unknown option '%s' (see --help)\n", argv[optind - 1]);
            return 1;
        }
    }
    if (!model_path) return embed_fail("-m MODEL is required (see --help)");
    if (!!ids_arg == !!text) return embed_fail("give either --prompt-ids or TEXT (see --help)");

    hl_err err = {0};
    model *m = NULL;
    model_ctx *c = NULL;
    int32_t *ids = NULL;
    float *vec = NULL;
    size_t n = 0;
    int rc = 1;
    const model_load_opts lo = {.use_mmap = use_mmap};
    if (model_load_ex(model_path, NULL, &lo, &m, &err)) goto fail;
    const model_hparams *hp = model_get_hparams(m);
    if (ids_arg) {
        char why[128];
        if (!cli_parse_ids(ids_arg, &ids, &n, why, sizeof why)) {
            hl_fail(&err, HL_ERR_INVALID, "invalid --prompt-ids '%s': %s", ids_arg, why);
            goto fail;
        }
        for (size_t i = 0; i < n; i++)
            if (ids[i] >= hp->n_vocab) {
                hl_fail(&err, HL_ERR_INVALID,
                        "--prompt-ids: token id %d is outside the vocabulary (%d tokens)", ids[i],
                        hp->n_vocab);
                goto fail;
            }
    } else {
        const tok_vocab *vocab = model_vocab(m);
        if (!vocab) {
            hl_fail(&err, HL_ERR_INVALID, "the model has no tokenizer (use --prompt-ids)");
            goto fail;
        }
        if (cli_tokenize(vocab, text, &ids, &n, &err)) goto fail;
    }
    if (hp->n_ctx_train > 0 && (long)n > hp->n_ctx_train) {
        hl_fail(&err, HL_ERR_KV_FULL, "the input has %zu tokens but the model's context only %d",
                n, hp->n_ctx_train);
        goto fail;
    }
    vec = malloc((size_t)hp->n_embd * sizeof *vec);
    if (!vec) {
        hl_fail(&err, HL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (model_ctx_create(m, (int)n_threads, 0, &c, &err)) goto fail;
    if (model_embed(c, ids, (int32_t)n, true, vec, &err)) goto fail;
    putchar('[');
    for (int32_t i = 0; i < hp->n_embd; i++) {
        if (isfinite(vec[i])) printf("%s%.9g", i ? ", " : "", (double)vec[i]);
        else printf("%snull", i ? ", " : "");
    }
    printf("]\n");
    rc = 0;
fail:
    if (rc) fprintf(stderr, "hearth embed: %s\n", err.msg);
    free(vec);
    free(ids);
    model_ctx_free(c);
    model_free(m);
    return rc;
}
