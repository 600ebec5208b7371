/*
 * main.c - the hearth command line: dispatches subcommands; `hearth --help`,
 * `hearth help [COMMAND]` and `hearth -v|--version` (Ollama's "version is" line: the
 * server's version when one answers, then a warning with the client's when they differ).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "net/http_client.h"
#include "server/server.h"

static void usage(FILE *out) {
    fprintf(out,
            "Large language model runner\n"
            "\n"
            "Usage:\n"
            "  hearth [flags]\n"
            "  hearth [command]\n"
            "\n"
            "Available Commands:\n"
            "  serve       Start hearth\n"
            "  create      Create a model from a Modelfile (-q TYPE quantizes it)\n"
            "  show        Show information for a model\n"
            "  run         Run a model (one-shot prompt or interactive chat; pulls it if missing)\n"
            "  stop        Stop a running model\n"
            "  pull        Pull a model from a registry\n"
            "  push        Push a model to a registry\n"
            "  list        List models\n"
            "  ps          List running models\n"
            "  cp          Copy a model\n"
            "  rm          Remove a model\n"
            "  generate    Generate text from a GGUF file, without the server\n"
            "  embed       Print a text's embedding from a GGUF file, without the server\n"
            "  quantize    Convert a GGUF file's weights to another type (Q8_0, Q4_K_M, ...)\n"
            "  help        Help about any command\n"
            "\n"
            "Flags:\n"
            "  -h, --help      help for hearth\n"
            "  -v, --version   Show version information\n"
            "\n"
            "Use \"hearth [command] --help\" for more information about a command.\n");
}

static int version(void) {
    net_host host;
    hl_err err;
    int status = 0;
    char *out = NULL;
    size_t out_len = 0;
    json_t *resp = NULL;
    /* no server is no error here: Ollama says so and prints the client's version */
    if (net_host_from_env(&host, &err) == HL_OK &&
        net_http_request(&host, "GET", "/api/version", NULL, 0, &status, &out, &out_len, &err) ==
            HL_OK &&
        status == 200)
        resp = json_loadb(out, out_len, 0, NULL);
    free(out);
    const char *sv = json_string_value(json_object_get(resp, "version"));
    if (!sv) printf("Warning: could not connect to a running hearth instance\n");
    else printf("hearth version is %s\n", sv);
    if (!sv || strcmp(sv, HEARTH_VERSION) != 0)
        printf("Warning: client version is %s\n", HEARTH_VERSION);
    json_decref(resp);
    return 0;
}

int main(int argc, char **argv) {
    char *help_args[] = {NULL, NULL, (char *)"--help", NULL}; /* `hearth help CMD` */
    if (argc < 2) { /* as Ollama (cobra's root command): the help, and success */
        usage(stdout);
        return 0;
    }
    const char *a = argv[1];
    if (!strcmp(a, "-v") || !strcmp(a, "--version") || !strcmp(a, "version")) return version();
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(a, "help")) {
        if (argc < 3) {
            usage(stdout);
            return 0;
        }
        if (!cli_usage_of(argv[2])) {
            fprintf(stderr, "Unknown help topic [\"%s\"]\n", argv[2]);
            usage(stderr);
            return 2;
        }
        /* the command's own --help, so both always agree */
        help_args[0] = argv[0];
        help_args[1] = argv[2];
        argc = 3;
        argv = help_args;
        a = argv[1];
    }
    if (!strcmp(a, "generate")) return cli_generate(argc - 1, argv + 1);
    if (!strcmp(a, "embed")) return cli_embed(argc - 1, argv + 1);
    if (!strcmp(a, "quantize")) return cli_quantize(argc - 1, argv + 1);
    int rc;
    if (cli_dispatch(argc, argv, &rc)) return rc;
    fprintf(stderr, "Error: unknown command \"%s\" for \"hearth\"\n", a);
    usage(stderr);
    return 2;
}
