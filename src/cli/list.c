/* list.c - `hearth list [PREFIX]`: NAME ID SIZE MODIFIED. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

int cmd_list(int argc, char **argv) {
    json_t *resp;
    if (cli_call("GET", "/api/tags", NULL, &resp)) return 1;
    json_t *models = json_object_get(resp, "models");
    size_t n = json_array_size(models), kept = 0;
    char ***rows = calloc(n ? n : 1, sizeof *rows);
    char *cells = calloc(n ? n : 1, 4 * 128);
    char **ptrs = calloc(n ? n : 1, 4 * sizeof *ptrs);
    if (!rows || !cells || !ptrs) {
        free(rows), free(cells), free(ptrs);
        json_decref(resp);
        return cli_fail("out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(models, i);
        const char *name = json_string_value(json_object_get(m, "name"));
        if (!name || (argc > 1 && strncmp(name, argv[1], strlen(argv[1])) != 0)) continue;
        char **row = ptrs + 4 * kept;
        for (int c = 0; c < 4; c++) row[c] = cells + (4 * kept + (size_t)c) * 128;
        snprintf(row[0], 128, "%s", name);
        const char *digest = json_string_value(json_object_get(m, "digest"));
        snprintf(row[1], 128, "%.12s", digest ? digest : "");
        cli_human_size((uint64_t)json_integer_value(json_object_get(m, "size")), row[2], 128);
        double t;
        if (cli_parse_time(json_string_value(json_object_get(m, "modified_at")), &t)) {
            char d[64];
            cli_human_duration((double)time(NULL) - t, d, sizeof d);
            snprintf(row[3], 128, "%s ago", d);
        } else {
            snprintf(row[3], 128, "-");
        }
        rows[kept++] = row;
    }
    static const char *header[] = {"NAME", "ID", "SIZE", "MODIFIED"};
    cli_print_table(header, 4, rows, kept);
    free(rows), free(cells), free(ptrs);
    json_decref(resp);
    return 0;
}
