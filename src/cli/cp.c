/* cp.c - `hearth cp SOURCE DESTINATION`. */
#include <stdio.h>

#include "cli/cli.h"

int cmd_cp(int argc, char **argv) {
    if (argc != 3) return cli_fail("usage: hearth cp SOURCE DESTINATION");
    json_t *body = json_pack("{s:s, s:s}", "source", argv[1], "destination", argv[2]);
    int rc = cli_call("POST", "/api/copy", body, NULL);
    json_decref(body);
    if (rc) return rc;
    printf("copied '%s' to '%s'\n", argv[1], argv[2]);
    return 0;
}
