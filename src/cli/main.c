/*
 * main.c - the hearth command line: dispatches subcommands.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

#define HEARTH_VERSION "0.1.0"

static void usage(FILE *out) {
    fprintf(out,
            "usage: hearth <command> [args]\n"
            "\n"
            "commands:\n"
            "  generate   generate text from a GGUF model\n"
            "  embed      print a text's embedding from a GGUF model\n"
            "  quantize   convert a GGUF model's weights to another type (Q8_0, Q4_K_M, ...)\n"
            "  serve      start the API server (HEARTH_HOST, HEARTH_MODELS)\n"
            "  create     create a model from a Modelfile\n"
            "  show       show information for a model\n"
            "  list       list models\n"
            "  run        run a model (one-shot prompt or interactive chat; pulls it if missing)\n"
            "  pull       pull a model from a registry (--insecure: plain http)\n"
            "  push       push a model to a registry (--insecure: plain http)\n"
            "  stop       unload a running model\n"
            "  ps         list running models\n"
            "  cp         copy a model\n"
            "  rm         remove a model\n"
            "  --version  print the version\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("hearth version %s\n", HEARTH_VERSION);
        return 0;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "generate") == 0) return cli_generate(argc - 1, argv + 1);
    if (strcmp(argv[1], "embed") == 0) return cli_embed(argc - 1, argv + 1);
    if (strcmp(argv[1], "quantize") == 0) return cli_quantize(argc - 1, argv + 1);
    int rc;
    if (cli_dispatch(argc, argv, &rc)) return rc;
    fprintf(stderr, "hearth: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
