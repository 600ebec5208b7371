/* cp.c - `hearth cp SOURCE DESTINATION`. */
#include <getopt.h>
#include <stdio.h>

#include "cli/cli.h"

int cmd_cp(int argc, char **argv) {
    int rc = cli_no_flags(argc, argv, "cp");
    if (rc >= 0) return rc;
    if (argc - optind != 2) return cli_fail("usage: hearth cp SOURCE DESTINATION");
    const char *src = argv[optind], *dst = argv[optind + 1];
    json_t *body = json_pack("{s:s, s:s}", "source", src, "destination", dst);
    rc = cli_call("POST", "/api/copy", body, NULL);
    json_decref(body);
    if (rc) return rc;
    printf("copied '%s' to '%s'\n", src, dst);
    return 0;
}
