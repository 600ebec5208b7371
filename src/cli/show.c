/* show.c - `hearth show MODEL [--modelfile|--parameters|--template|--system|--license|-v]`. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static void print_indented(const char *text) {
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        printf("    %.*s\n", (int)n, p);
        if (!nl) break;
        p = nl + 1;
    }
}

static void row(const char *key, const char *value) { printf("    %-20s%s\n", key, value); }

int cmd_show(int argc, char **argv) {
    static const struct option opts[] = {
        {"help", no_argument, NULL, 'h'},       {"verbose", no_argument, NULL, 'v'},
        {"modelfile", no_argument, NULL, 'M'},  {"parameters", no_argument, NULL, 'P'},
        {"template", no_argument, NULL, 'T'},   {"system", no_argument, NULL, 'S'},
        {"license", no_argument, NULL, 'L'},    {NULL, 0, NULL, 0}};
    const char *field = NULL;
    bool verbose = false;
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":hv", opts, NULL)) != -1) {
        switch (c) {
        case 'h': return cli_help(cli_usage_of("show"));
        case 'v': verbose = true; break;
        case 'M': field = "modelfile"; break;
        case 'P': field = "parameters"; break;
        case 'T': field = "template"; break;
        case 'S': field = "system"; break;
        case 'L': field = "license"; break;
        default: return cli_flag_error(c, argv);
        }
    }
    if (argc - optind != 1)
        return cli_fail("usage: hearth show MODEL [--modelfile|--parameters|--template|--system|--license]");
    const char *model = argv[optind];
    json_t *body = json_pack("{s:s, s:b}", "model", model, "verbose", verbose);
    json_t *resp;
    int rc = cli_call("POST", "/api/show", body, &resp);
    json_decref(body);
    if (rc) return rc;
    if (field) {
        const char *v = json_string_value(json_object_get(resp, field));
        if (v) {
            fputs(v, stdout);
            if (*v && v[strlen(v) - 1] != '\n') fputc('\n', stdout);
        } else if (strcmp(field, "modelfile") != 0) {
            printf("No %s was specified for this model.\n", field);
        }
        json_decref(resp);
        return 0;
    }
    json_t *details = json_object_get(resp, "details");
    json_t *info = json_object_get(resp, "model_info");
    const char *arch = json_string_value(json_object_get(info, "general.architecture"));
    printf("  Model\n");
    row("architecture", arch ? arch : json_string_value(json_object_get(details, "family")));
    const char *ps = json_string_value(json_object_get(details, "parameter_size"));
    row("parameters", ps ? ps : "");
    if (arch) {
        char key[256], val[64];
        snprintf(key, sizeof key, "%s.context_length", arch);
        json_t *v = json_object_get(info, key);
        if (json_is_integer(v)) {
            snprintf(val, sizeof val, "%lld", (long long)json_integer_value(v));
            row("context length", val);
        }
        snprintf(key, sizeof key, "%s.embedding_length", arch);
        v = json_object_get(info, key);
        if (json_is_integer(v)) {
            snprintf(val, sizeof val, "%lld", (long long)json_integer_value(v));
            row("embedding length", val);
        }
    }
    const char *q = json_string_value(json_object_get(details, "quantization_level"));
    row("quantization", q ? q : "");
    printf("\n  Capabilities\n");
    size_t i;
    json_t *cap;
    json_array_foreach(json_object_get(resp, "capabilities"), i, cap)
        printf("    %s\n", json_string_value(cap) ? json_string_value(cap) : "");
    const char *params = json_string_value(json_object_get(resp, "parameters"));
    if (params) {
        printf("\n  Parameters\n");
        print_indented(params);
    }
    const char *sys = json_string_value(json_object_get(resp, "system"));
    if (sys) {
        printf("\n  System\n");
        print_indented(sys);
    }
    const char *lic = json_string_value(json_object_get(resp, "license"));
    if (lic) {
        printf("\n  License\n");
        print_indented(lic);
    }
    if (verbose && json_is_object(info)) {
        printf("\n  Metadata\n");
        const char *key;
        json_t *v;
        json_object_foreach(info, key, v) {
            char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            printf("    %-40s%s\n", key, t ? t : "");
            free(t);
        }
    }
    printf("\n");
    json_decref(resp);
    return 0;
}
