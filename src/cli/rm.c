/* rm.c - `hearth rm MODEL...`. */
#include <stdio.h>

#include "cli/cli.h"

int cmd_rm(int argc, char **argv) {
    if (argc < 2) return cli_fail("usage: hearth rm MODEL [MODEL...]");
    for (int i = 1; i < argc; i++) {
        json_t *body = json_pack("{s:s}", "model", argv[i]);
        int rc = cli_call("DELETE", "/api/delete", body, NULL);
        json_decref(body);
        if (rc) return rc;
        printf("deleted '%s'\n", argv[i]);
    }
    return 0;
}
