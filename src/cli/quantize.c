/*
 * quantize.c - `hearth quantize IN.gguf OUT.gguf TYPE [-t THREADS]`: converts a model's
 * weights (F32/F16/BF16, or already quantized) to TYPE, a weight type or one of
 * llama.cpp's mixes (src/quant/quantize.h has the rules). Errors: one line on stderr,
 * exit status 1; usage errors exit 2.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "quant/quantize.h"

static void quantize_usage(FILE *out) {
    fputs(cli_usage_of("quantize"), out);
    fprintf(out, "  %s\n", quant_ftype_names());
}

int cli_quantize(int argc, char **argv) {
    const char *pos[3];
    int n_pos = 0;
    long n_threads = 0;
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                         {"threads", required_argument, NULL, 't'},
                                         {NULL, 0, NULL, 0}};
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "-:ht:", opts, NULL)) != -1) {
        if (c == 'h') {
            quantize_usage(stdout);
            return 0;
        }
        if (c == 't') {
            char *end = NULL;
            n_threads = strtol(optarg, &end, 10);
            if (!*optarg || *end || n_threads < 0 || n_threads > 512) {
                fprintf(stderr, "hearth quantize: -t needs a thread count (0..512)\n");
                return 2;
            }
        } else if (c == 1) {
            if (n_pos == 3) {
                fprintf(stderr, "hearth quantize: unexpected argument '%s'\n", optarg);
                quantize_usage(stderr);
                return 2;
            }
            pos[n_pos++] = optarg;
        } else if (c == ':') {
            fprintf(stderr, "hearth quantize: -t needs a thread count (0..512)\n");
            return 2;
        } else {
            fprintf(stderr, "hearth quantize: unknown option '%s'\n", argv[optind - 1]);
            quantize_usage(stderr);
            return 2;
        }
    }
    if (n_pos != 3) {
        fprintf(stderr, "hearth quantize: usage: hearth quantize IN.gguf OUT.gguf TYPE [-t THREADS]\n"
                        "  TYPE: %s\n", quant_ftype_names());
        return 2;
    }
    quant_ftype ftype;
    if (!quant_ftype_parse(pos[2], &ftype)) {
        fprintf(stderr, "hearth quantize: unknown type '%s' (one of: %s)\n", pos[2],
                quant_ftype_names());
        return 2;
    }
    if (strcmp(pos[0], pos[1]) == 0) {
        fprintf(stderr, "hearth quantize: output would overwrite the input '%s'\n", pos[0]);
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    quant_stats st;
    hl_err err = {0};
    if (quant_model_file(pos[0], pos[1], ftype, (int)n_threads, &st, &err) != HL_OK) {
        fprintf(stderr, "hearth quantize: %s\n", err.msg);
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    fprintf(stderr,
            "hearth quantize: %s -> %s (%s): %" PRId64 " tensors, %" PRId64 " converted, %" PRId64
            " copied; %.1f MiB -> %.1f MiB in %.1f s\n",
            pos[0], pos[1], quant_ftype_name(ftype), st.n_tensors, st.n_converted, st.n_copied,
            (double)st.bytes_in / 1048576.0, (double)st.bytes_out / 1048576.0, secs);
    return 0;
}
