/* ps.c - `hearth ps`: NAME ID SIZE PROCESSOR CONTEXT UNTIL. */
#include <getopt.h>
#include <stdio.h>
#include <time.h>

#include "cli/cli.h"

static void running_cells(json_t *m, char **cells) {
    snprintf(cells[0], CLI_CELL, "100%% CPU");
    snprintf(cells[1], CLI_CELL, "%lld",
             (long long)json_integer_value(json_object_get(m, "context_length")));
    double t;
    if (cli_parse_time(json_string_value(json_object_get(m, "expires_at")), &t)) {
        double left = t - (double)time(NULL);
        char d[64];
        cli_human_duration(left, d, sizeof d);
        if (left > 20.0 * 365 * 86400) snprintf(cells[2], CLI_CELL, "Forever");
        else if (left < 0) snprintf(cells[2], CLI_CELL, "Stopping...");
        else snprintf(cells[2], CLI_CELL, "%s from now", d);
    } else {
        snprintf(cells[2], CLI_CELL, "-");
    }
}

int cmd_ps(int argc, char **argv) {
    int rc = cli_no_flags(argc, argv, "ps");
    if (rc >= 0) return rc;
    if (argc - optind > 1) return cli_fail("usage: hearth ps [PREFIX]");
    const char *prefix = optind < argc ? argv[optind] : NULL;
    json_t *resp;
    if (cli_call("GET", "/api/ps", NULL, &resp)) return 1;
    static const char *header[] = {"NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"};
    rc = cli_print_models(json_object_get(resp, "models"), prefix, header,
                              6, running_cells);
    json_decref(resp);
    return rc;
}
