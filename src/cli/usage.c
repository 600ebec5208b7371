/* usage.c - every command's --help text (Ollama's layout) and the flag-error messages. */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

#define ENV_HOST "      HEARTH_HOST                IP Address for the hearth server (default 127.0.0.1:11434)\n"

static const struct {
    const char *cmd;
    const char *text;
} k_usage[] = {
    {"serve", "Start hearth\n\n"
              "Usage:\n  hearth serve [flags]\n\nAliases:\n  serve, start\n\n"
              "Flags:\n  -h, --help   help for serve\n\n"
              "Environment Variables:\n" ENV_HOST
              "      HEARTH_MODELS              The path to the models directory (default ~/.hearth/models)\n"
              "      HEARTH_KEEP_ALIVE          The duration that models stay loaded in memory (default 5m)\n"
              "      HEARTH_NUM_PARALLEL        Maximum number of parallel requests\n"
              "      HEARTH_ORIGINS             A comma separated list of allowed origins\n"
              "      (each also read as OLLAMA_*)\n"},
    {"create", "Create a model from a Modelfile\n\n"
               "Usage:\n  hearth create MODEL [flags]\n\n"
               "Flags:\n"
               "  -f, --file string       Name of the Modelfile (default \"Modelfile\")\n"
               "  -h, --help              help for create\n"
               "  -q, --quantize string   Quantize model to this level (e.g. q8_0, q4_K_M)\n\n"
               "Environment Variables:\n" ENV_HOST},
    {"show", "Show information for a model\n\n"
             "Usage:\n  hearth show MODEL [flags]\n\n"
             "Flags:\n"
             "  -h, --help         help for show\n"
             "      --license      Show license of a model\n"
             "      --modelfile    Show Modelfile of a model\n"
             "      --parameters   Show parameters of a model\n"
             "      --system       Show system message of a model\n"
             "      --template     Show template of a model\n"
             "  -v, --verbose      Show detailed model information\n\n"
             "Environment Variables:\n" ENV_HOST},
    {"run", "Run a model\n\n"
            "Usage:\n  hearth run MODEL [PROMPT] [flags]\n\n"
            "Flags:\n"
            "      --format string      Response format (e.g. json)\n"
            "  -h, --help               help for run\n"
            "      --hidethinking       Hide thinking output (if provided)\n"
            "      --insecure           Use an insecure registry\n"
            "      --keepalive string   Duration to keep a model loaded (e.g. 5m)\n"
            "      --nowordwrap         Don't wrap words to the next line automatically\n"
            "      --think[=string]     Enable thinking mode: true/false or high/medium/low for\n"
            "                           supported models (default \"true\" when given alone)\n"
            "      --truncate           Accepted for compatibility (ignored)\n"
            "      --verbose            Show timings for response\n\n"
            "Environment Variables:\n" ENV_HOST
            "      HEARTH_NOHISTORY           Do not preserve readline history\n"},
    {"stop", "Stop a running model\n\n"
             "Usage:\n  hearth stop MODEL [flags]\n\n"
             "Flags:\n  -h, --help   help for stop\n\n"
             "Environment Variables:\n" ENV_HOST},
    {"pull", "Pull a model from a registry\n\n"
             "Usage:\n  hearth pull MODEL [flags]\n\n"
             "Flags:\n  -h, --help       help for pull\n"
             "      --insecure   Use an insecure registry\n\n"
             "Environment Variables:\n" ENV_HOST},
    {"push", "Push a model to a registry\n\n"
             "Usage:\n  hearth push MODEL [flags]\n\n"
             "Flags:\n  -h, --help       help for push\n"
             "      --insecure   Use an insecure registry\n\n"
             "Environment Variables:\n" ENV_HOST},
    {"list", "List models\n\n"
             "Usage:\n  hearth list [PREFIX] [flags]\n\nAliases:\n  list, ls\n\n"
             "Flags:\n  -h, --help   help for list\n\n"
             "Environment Variables:\n" ENV_HOST},
    {"ps", "List running models\n\n"
           "Usage:\n  hearth ps [PREFIX] [flags]\n\n"
           "Flags:\n  -h, --help   help for ps\n\n"
           "Environment Variables:\n" ENV_HOST},
    {"cp", "Copy a model\n\n"
           "Usage:\n  hearth cp SOURCE DESTINATION [flags]\n\n"
           "Flags:\n  -h, --help   help for cp\n\n"
           "Environment Variables:\n" ENV_HOST},
    {"rm", "Remove a model\n\n"
           "Usage:\n  hearth rm MODEL [MODEL...] [flags]\n\n"
           "Flags:\n  -h, --help   help for rm\n\n"
           "Environment Variables:\n" ENV_HOST},
    {"generate", "Generate text from a GGUF file, without the server\n\n"
                 "Usage:\n  hearth generate -m MODEL [-p PROMPT | --prompt-ids L] [flags]\n\n"
                 "Flags:\n"
                 "  -m, --model FILE         model: a GGUF, or a llama2.c .bin (then --tokenizer)\n"
                 "      --tokenizer FILE     llama2.c tokenizer (tok512.bin, tokenizer.bin)\n"
                 "  -p, --prompt TEXT        prompt (empty: start from BOS)\n"
                 "      --prompt-ids L       prompt as token ids, comma-separated (no BOS added)\n"
                 "      --top-logits K       print one JSON line per position: {\"pos\", \"token\",\n"
                 "                           \"top\": [[id, logit] x K]} (prompt, then generated)\n"
                 "  -n N                     tokens to generate (default 128)\n"
                 "      --temp T             temperature; 0 is greedy (default 0.8)\n"
                 "      --top-k K            (default 40, 0 = off)\n"
                 "      --top-p P            (default 0.9, 1 = off)\n"
                 "      --min-p P            (default 0 = off)\n"
                 "      --repeat-penalty R   (default 1 = off)\n"
                 "      --repeat-last-n N    penalty window (default 64, 0 = off, -1 = context)\n"
                 "      --seed S             RNG seed (default: from the clock)\n"
                 "  -t N                     threads (default: the physical cores available)\n"
                 "  -c N                     context size (default: the model's, at most 4096)\n"
                 "      --tokens             print token ids instead of text\n"
                 "      --mmap               map the model file instead of reading it\n"
                 "      --kv-type T          KV cache type: f32, f16 or q8_0 (default f16; q8_0\n"
                 "                           needs heads of a multiple of 32, else f16 is used)\n"
                 "  -h, --help               help for generate\n"},
    {"embed", "Print a text's embedding from a GGUF file, without the server\n\n"
              "Usage:\n  hearth embed -m MODEL [--prompt-ids L | TEXT] [flags]\n\n"
              "Flags:\n"
              "  -m, --model FILE     model (GGUF)\n"
              "      --prompt-ids L   the input as token ids, comma-separated (used as given)\n"
              "  -t N                 threads (default: the physical cores available)\n"
              "      --mmap           map the model file instead of reading it into memory\n"
              "  -h, --help           help for embed\n\n"
              "TEXT is tokenized with the model's vocabulary. Prints the pooled, L2-normalised\n"
              "embedding as one JSON array.\n"},
    {"quantize", "Convert a GGUF file's weights to another type\n\n"
                 "Usage:\n  hearth quantize IN.gguf OUT.gguf TYPE [flags]\n\n"
                 "Flags:\n"
                 "  -t, --threads N   threads (default: all CPUs)\n"
                 "  -h, --help        help for quantize\n\n"
                 "TYPE: Q8_0, Q4_K_M, ... (see the list below); Q3_K, Q4_K, Q5_K mean the _M mixes.\n"},
};

const char *cli_usage_of(const char *cmd) {
    if (!strcmp(cmd, "start")) cmd = "serve";
    if (!strcmp(cmd, "ls")) cmd = "list";
    for (size_t i = 0; i < sizeof k_usage / sizeof k_usage[0]; i++)
        if (!strcmp(k_usage[i].cmd, cmd)) return k_usage[i].text;
    return NULL;
}

int cli_help(const char *text) {
    fputs(text, stdout);
    fflush(stdout);
    return 0;
}

int cli_flag_error(int c, char **argv) {
    const char *a = optind > 0 ? argv[optind - 1] : "";
    bool is_long = a[0] == '-' && a[1] == '-';
    if (c == ':') {
        if (is_long) return cli_fail("flag needs an argument: %s", a);
        return cli_fail("flag needs an argument: '%c' in -%c", optopt, optopt);
    }
    if (!is_long && optopt) return cli_fail("unknown shorthand flag: '%c' in %s", optopt, a);
    return cli_fail("unknown flag: %s", a);
}

int cli_no_flags(int argc, char **argv, const char *cmd) {
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (c == 'h') return cli_help(cli_usage_of(cmd));
        return cli_flag_error(c, argv);
    }
    return -1;
}
