/*
 * fuzz_modelfile.c - libFuzzer target for the Modelfile parser, model-name parsing and
 * host parsing: any bytes must give HL_OK or a clean error, never a crash or leak.
 *   build-fuzz/fuzz/fuzz_modelfile -max_total_time=60
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/host.h"
#include "store/modelfile.h"
#include "store/name.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    modelfile mf;
    hl_err err;
    if (modelfile_parse((const char *)data, size, &mf, &err) == HL_OK) {
        json_t *req = json_object();
        modelfile_to_create_request(&mf, req, &err);
        json_decref(req);
        modelfile_free(&mf);
    }
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    store_name n;
    if (store_name_parse(s, &n, NULL) == HL_OK) {
        char buf[1024];
        store_name_display(&n, buf, sizeof buf);
    }
    net_host h;
    net_host_parse(s, &h, NULL);
    free(s);
    return 0;
}
