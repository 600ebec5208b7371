/* list.c - `hearth list [PREFIX]`: NAME ID SIZE MODIFIED. */
#include <getopt.h>
#include <stdio.h>
#include <time.h>

#include "cli/cli.h"

static void modified_cell(json_t *m, char **cells) {
    double t;
    if (cli_parse_time(json_string_value(json_object_get(m, "modified_at")), &t)) {
        char d[64];
        cli_human_duration((double)time(NULL) - t, d, sizeof d);
        snprintf(cells[0], CLI_CELL, "%s ago", d);
    } else {
        snprintf(cells[0], CLI_CELL, "-");
    }
}

int cmd_list(int argc, char **argv) {
    int rc = cli_no_flags(argc, argv, "list");
    if (rc >= 0) return rc;
    if (argc - optind > 1) return cli_fail("usage: hearth list [PREFIX]");
    const char *prefix = optind < argc ? argv[optind] : NULL;
    json_t *resp;
    if (cli_call("GET", "/api/tags", NULL, &resp)) return 1;
    static const char *header[] = {"NAME", "ID", "SIZE", "MODIFIED"};
    rc = cli_print_models(json_object_get(resp, "models"), prefix, header,
                              4, modified_cell);
    json_decref(resp);
    return rc;
}
