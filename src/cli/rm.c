/* rm.c - `hearth rm MODEL...`. */
#include <getopt.h>
#include <stdio.h>

#include "cli/cli.h"

int cmd_rm(int argc, char **argv) {
    int rc = cli_no_flags(argc, argv, "rm");
    if (rc >= 0) return rc;
    if (optind >= argc) return cli_fail("usage: hearth rm MODEL [MODEL...]");
    for (int i = optind; i < argc; i++) {
        json_t *body = json_pack("{s:s}", "model", argv[i]);
        rc = cli_call("DELETE", "/api/delete", body, NULL);
        json_decref(body);
        if (rc) return rc;
        printf("deleted '%s'\n", argv[i]);
    }
    return 0;
}
