/* test_server.c - end-to-end tests of `hearth serve` and the CLI: each test starts
 * $HEARTH_BIN serve on a free loopback port (HEARTH_HOST=127.0.0.1:0; the port is read
 * from its "Listening on" log line) with HEARTH_MODELS in the test's temp dir, drives
 * it with the project's own HTTP client, and always stops it at the end. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "net/http_client.h"
#include "store/sha256.h"
#include "store/store.h"
#include "srvproc.h"
#include "test.h"

#define WITH_SERVER(body_fn) SP_WITH_SERVER("server", NULL, NULL, body_fn)

static char *g_resp;

/* One request; returns the HTTP status (-1 on transport error); body in g_resp. */
static int req(const srv_proc *p, const char *method, const char *path, const char *body) {
    free(g_resp);
    g_resp = NULL;
    int status = -1;
    hl_err err;
    if (net_http_request(&p->host, method, path, body, body ? strlen(body) : 0, &status, &g_resp,
                         NULL, &err) != HL_OK) {
        fprintf(stderr, "    request %s %s: %s\n", method, path, err.msg);
        return -1;
    }
    return status;
}

static int req_bytes(const srv_proc *p, const char *method, const char *path, const void *data,
                     size_t len) {
    free(g_resp);
    g_resp = NULL;
    int status = -1;
    if (net_http_request(&p->host, method, path, data, len, &status, &g_resp, NULL, NULL) != HL_OK)
        return -1;
    return status;
}

/* The "error" string of g_resp, or "" */
static const char *resp_error(void) {
    static char buf[1024];
    buf[0] = '\0';
    json_t *j = g_resp ? json_loads(g_resp, 0, NULL) : NULL;
    const char *e = json_string_value(json_object_get(j, "error"));
    if (e) snprintf(buf, sizeof buf, "%s", e);
    json_decref(j);
    return buf;
}

static void digest_of(const void *data, size_t len, char out[80]) {
    strcpy(out, "sha256:");
    sha256_hex(data, len, out + 7);
}

/* ---------------------------------------------------------------------------------- */

static void http_basics(srv_proc *p) {
    CHECK_EQ_INT(req(p, "GET", "/", NULL), 200);
    CHECK_STR(g_resp, "Ollama is running");
    CHECK_EQ_INT(req(p, "HEAD", "/", NULL), 200);
    CHECK_EQ_INT(req(p, "GET", "/api/version", NULL), 200);
    CHECK(strstr(g_resp, "\"version\"") != NULL);
    CHECK_EQ_INT(req(p, "GET", "/api/ps", NULL), 200);
    CHECK_STR(g_resp, "{\"models\":[]}");
    CHECK_EQ_INT(req(p, "GET", "/api/tags", NULL), 200);
    CHECK_STR(g_resp, "{\"models\":[]}");
    CHECK_EQ_INT(req(p, "GET", "/api/nothing", NULL), 404);
    CHECK_STR(g_resp, "404 page not found");
    CHECK_EQ_INT(req(p, "GET", "/api/show", NULL), 405);
    CHECK_EQ_INT(req(p, "POST", "/api/tags", "{}"), 405);
    CHECK_EQ_INT(req(p, "POST", "/api/show", "{\"model\": "), 400);
    CHECK(strlen(resp_error()) > 0);
    CHECK_EQ_INT(req(p, "POST", "/api/show", NULL), 400);
    CHECK_STR(resp_error(), "missing request body");
    CHECK_EQ_INT(req(p, "POST", "/api/show", "[1,2]"), 400);
    CHECK_EQ_INT(req(p, "POST", "/api/show", "{\"model\": 5}"), 400);
    CHECK(strstr(resp_error(), "cannot unmarshal number") != NULL);
    CHECK_EQ_INT(req(p, "POST", "/api/show", "{}"), 400);
    CHECK_STR(resp_error(), "model is required");
    CHECK_EQ_INT(req(p, "POST", "/api/show", "{\"model\":\"nope\"}"), 404);
    CHECK_STR(resp_error(), "model 'nope' not found");
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"nope\"}"), 404);
    CHECK_STR(resp_error(), "model 'nope' not found");
    CHECK_EQ_INT(req(p, "DELETE", "/api/delete", "{\"model\":\"nope\"}"), 404);
    CHECK_STR(resp_error(), "model 'nope' not found");
    CHECK_EQ_INT(req(p, "DELETE", "/api/delete", "{}"), 400);
    CHECK_STR(resp_error(), "model is required");
    CHECK_EQ_INT(req(p, "DELETE", "/api/delete", "{\"model\":\"a/b/c/d\"}"), 400);
    CHECK_STR(resp_error(), "name \"a/b/c/d\" is invalid");
    CHECK_EQ_INT(req(p, "POST", "/api/copy", "{\"source\":\"nope\",\"destination\":\"x\"}"), 404);
    CHECK_STR(resp_error(), "model \"nope\" not found");
    CHECK_EQ_INT(req(p, "POST", "/api/copy", "{\"source\":\"nope\",\"destination\":\"-x\"}"), 400);
    CHECK_STR(resp_error(), "destination \"-x\" is invalid");
    CHECK_EQ_INT(req(p, "POST", "/api/create", "{\"model\":\"m\"}"), 400);
    CHECK_STR(resp_error(), "neither 'from' or 'files' was specified");
    CHECK_EQ_INT(req(p, "POST", "/api/create", "{\"model\":\"bad name\",\"from\":\"x\"}"), 400);
    CHECK_STR(resp_error(), "invalid model name");
    CHECK_EQ_INT(req(p, "POST", "/api/create", "{\"model\":\"m\",\"from\":\"nope\"}"), 404);
    CHECK_STR(resp_error(), "model 'nope' not found");
    CHECK_EQ_INT(req(p, "POST", "/api/create", "{\"model\":\"m\",\"files\":{\"/abs\":\"sha256:00\"}}"), 400);
    CHECK_STR(resp_error(), "file path must be relative");
    CHECK_EQ_INT(req(p, "POST", "/api/create", "{\"model\":\"m\",\"files\":{\"a.gguf\":\"sha256:00\"}}"), 400);
    CHECK_STR(resp_error(), "invalid digest format");
    CHECK_EQ_INT(req(p, "POST", "/api/pull", "{\"model\":\"bad name\"}"), 400);
    CHECK_STR(resp_error(), "invalid model name");
    CHECK_EQ_INT(req(p, "POST", "/api/push", "{}"), 400);
    CHECK_STR(resp_error(), "model is required");
    /* plain http only with insecure (nothing is contacted: it fails first) */
    CHECK_EQ_INT(req(p, "POST", "/api/pull", "{\"model\":\"http://127.0.0.1:1/library/m\",\"stream\":false}"), 500);
    CHECK_STR(resp_error(), "insecure protocol http");

    /* blobs */
    const char *zero = "/api/blobs/sha256:0000000000000000000000000000000000000000000000000000000000000000";
    CHECK_EQ_INT(req(p, "HEAD", zero, NULL), 404);
    CHECK_EQ_INT(req(p, "HEAD", "/api/blobs/sha256:xyz", NULL), 400);
    CHECK_EQ_INT(req(p, "POST", "/api/blobs/md5:abc", "hello"), 400);
    CHECK_STR(resp_error(), "invalid digest format");
    CHECK_EQ_INT(req(p, "POST", zero, "hello"), 400);
    CHECK(strstr(resp_error(), "digest mismatch, expected \"sha256:0000") != NULL);
    CHECK_EQ_INT(req(p, "HEAD", "/api/blobs/sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824", NULL), 404);
    CHECK_EQ_INT(req(p, "POST", "/api/blobs/sha256-2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824", "hello"), 201);
    CHECK_EQ_INT(req(p, "HEAD", "/api/blobs/sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824", NULL), 200);
    CHECK_EQ_INT(req(p, "POST", "/api/blobs/sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824", "hello"), 200);
    /* a blob that is not a GGUF cannot become a model */
    CHECK_EQ_INT(req(p, "POST", "/api/create",
                     "{\"model\":\"m\",\"stream\":false,\"files\":{\"x.gguf\":\"sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824\"}}"),
                 400);
    CHECK(strstr(resp_error(), "supplied file was not in GGUF format") != NULL);

    /* oversized body: refused from its Content-Length, before it is sent */
    net_http *h;
    hl_err err;
    CHECK_OK(net_http_open(&p->host, "POST", "/api/show", "application/json", (int64_t)1 << 40, &h, &err), &err);
    CHECK_OK(net_http_send(h, "{\"model\":", 9, &err), &err);
    CHECK_OK(net_http_finish(h, &err), &err);
    CHECK_EQ_INT(net_http_status(h), 413);
    net_http_close(h);
    /* the server is still fine */
    CHECK_EQ_INT(req(p, "GET", "/api/version", NULL), 200);
}

TEST(server_http_basics_and_errors) { WITH_SERVER(http_basics); }

/* Re-uploading a blob the server has already must read the whole body before it answers:
 * an answer sent mid-upload closes the connection with data unread, and the client's
 * send then meets a reset instead of the reply. */
static void blob_reupload(srv_proc *p) {
    size_t len = (size_t)8 << 20; /* far more than the socket buffers hold */
    unsigned char *data = malloc(len);
    CHECK(data != NULL);
    if (!data) return;
    for (size_t i = 0; i < len; i++) data[i] = (unsigned char)(i * 2654435761u >> 13);
    char digest[80], url[128];
    digest_of(data, len, digest);
    snprintf(url, sizeof url, "/api/blobs/%s", digest);
    CHECK_EQ_INT(req_bytes(p, "POST", url, data, len), 201);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(req_bytes(p, "POST", url, data, len), 200);
    CHECK_EQ_INT(req(p, "HEAD", url, NULL), 200);
    free(data);
    CHECK_EQ_INT(req(p, "GET", "/api/version", NULL), 200);
}

TEST(server_blob_reupload_reads_the_body) { WITH_SERVER(blob_reupload); }

/* ---------------------------------------------------------------------------------- */

static int upload_gguf(const srv_proc *p, char digest[80]) {
    const char *path = test_shared_path("models/stories260K/stories260K.gguf");
    char *data;
    size_t len;
    if (!path || hl_file_read(path, &data, &len, NULL) != HL_OK) return -1;
    digest_of(data, len, digest);
    char url[128];
    snprintf(url, sizeof url, "/api/blobs/%s", digest);
    int st = req_bytes(p, "POST", url, data, len);
    free(data);
    return st;
}

/* Streams a create request; collects the status lines joined with '|'. Returns the
 * HTTP status. */
static int create_stream(const srv_proc *p, const char *body, char *statuses, size_t cap) {
    net_http *h;
    hl_err err;
    statuses[0] = '\0';
    if (net_http_open(&p->host, "POST", "/api/create", "application/json", (int64_t)strlen(body), &h, &err) != HL_OK)
        return -1;
    int code = -1;
    if (net_http_send(h, body, strlen(body), &err) == HL_OK && net_http_finish(h, &err) == HL_OK) {
        code = net_http_status(h);
        char *line;
        size_t len;
        while (net_http_read_line(h, &line, &len, &err) == HL_OK && line) {
            json_t *j = json_loadb(line, len, 0, NULL);
            const char *s = json_string_value(json_object_get(j, "status"));
            const char *e = json_string_value(json_object_get(j, "error"));
            size_t n = strlen(statuses);
            snprintf(statuses + n, cap - n, "%s%s%s", n ? "|" : "", e ? "ERROR " : "", s ? s : e ? e : "?");
            json_decref(j);
        }
    }
    net_http_close(h);
    return code;
}

static void models_api(srv_proc *p) {
    char digest[80];
    int st = upload_gguf(p, digest);
    if (st == -1) SKIP("models/stories260K/stories260K.gguf not found");
    CHECK_EQ_INT(st, 201);
    char url[128];
    snprintf(url, sizeof url, "/api/blobs/%s", digest);
    CHECK_EQ_INT(req(p, "HEAD", url, NULL), 200);

    char body[2048], statuses[4096];
    snprintf(body, sizeof body,
             "{\"model\":\"Story\",\"files\":{\"stories260K.gguf\":\"%s\"},"
             "\"template\":\"{{ .System }} {{ .Prompt }}\",\"system\":\"Be kind.\","
             "\"parameters\":{\"temperature\":0.5,\"top_k\":20,\"stop\":[\"<s>\",\"User:\"]},"
             "\"license\":\"MIT\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", digest);
    CHECK_EQ_INT(create_stream(p, body, statuses, sizeof statuses), 200);
    CHECK_MSG(strncmp(statuses, "parsing GGUF|using existing layer sha256:", 41) == 0, "%s", statuses);
    CHECK_MSG(strstr(statuses, "|creating new layer sha256:") != NULL, "%s", statuses);
    size_t sl = strlen(statuses);
    CHECK_MSG(sl > 24 && strcmp(statuses + sl - 24, "writing manifest|success") == 0, "%s", statuses);

    /* manifest layout on disk */
    char path[2048];
    snprintf(path, sizeof path, "%s/manifests/registry.ollama.ai/library/Story/latest", p->models);
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    snprintf(path, sizeof path, "%s/blobs/sha256-%s", p->models, digest + 7);
    CHECK(stat(path, &sb) == 0);

    CHECK_EQ_INT(req(p, "GET", "/api/tags", NULL), 200);
    json_t *j = json_loads(g_resp, 0, NULL);
    json_t *m0 = json_array_get(json_object_get(j, "models"), 0);
    CHECK_STR(json_string_value(json_object_get(m0, "name")), "Story:latest");
    CHECK_STR(json_string_value(json_object_get(m0, "model")), "Story:latest");
    CHECK_EQ_INT(strlen(json_string_value(json_object_get(m0, "digest"))), 64);
    CHECK(json_integer_value(json_object_get(m0, "size")) > 1000000);
    CHECK(json_string_value(json_object_get(m0, "modified_at")) != NULL);
    json_t *det = json_object_get(m0, "details");
    CHECK_STR(json_string_value(json_object_get(det, "format")), "gguf");
    CHECK_STR(json_string_value(json_object_get(det, "family")), "llama");
    CHECK_STR(json_string_value(json_object_get(det, "quantization_level")), "F32");
    CHECK_STR(json_string_value(json_object_get(det, "parameter_size")), "293K");
    json_decref(j);

    /* show: case-insensitive name, all the parts */
    CHECK_EQ_INT(req(p, "POST", "/api/show", "{\"model\":\"story\"}"), 200);
    j = json_loads(g_resp, 0, NULL);
    CHECK(j != NULL);
    CHECK_STR(json_string_value(json_object_get(j, "template")), "{{ .System }} {{ .Prompt }}");
    CHECK_STR(json_string_value(json_object_get(j, "system")), "Be kind.");
    CHECK_STR(json_string_value(json_object_get(j, "license")), "MIT");
    const char *params = json_string_value(json_object_get(j, "parameters"));
    CHECK(params && strstr(params, "temperature                    0.5") != NULL);
    CHECK(strstr(params, "stop                           \"User:\"") != NULL);
    const char *mf = json_string_value(json_object_get(j, "modelfile"));
    CHECK(mf && strstr(mf, "FROM ") && strstr(mf, "PARAMETER top_k 20") && strstr(mf, "SYSTEM \"\"\"Be kind.\"\"\""));
    json_t *info = json_object_get(j, "model_info");
    CHECK_STR(json_string_value(json_object_get(info, "general.architecture")), "llama");
    CHECK_EQ_INT(json_integer_value(json_object_get(info, "llama.context_length")), 2048);
    CHECK(json_is_array(json_object_get(info, "tokenizer.ggml.tokens")));
    CHECK_EQ_INT(json_array_size(json_object_get(info, "tokenizer.ggml.tokens")), 0);
    CHECK_STR(json_string_value(json_array_get(json_object_get(j, "capabilities"), 0)), "completion");
    CHECK_STR(json_string_value(json_object_get(json_array_get(json_object_get(j, "messages"), 0), "content")), "hi");
    CHECK(json_object_get(j, "modified_at") != NULL);
    CHECK(json_object_get(j, "tensors") == NULL);
    json_decref(j);
    CHECK_EQ_INT(req(p, "POST", "/api/show", "{\"model\":\"story\",\"verbose\":true}"), 200);
    j = json_loads(g_resp, 0, NULL);
    CHECK_EQ_INT(json_array_size(json_object_get(json_object_get(j, "model_info"), "tokenizer.ggml.tokens")), 512);
    CHECK(json_array_size(json_object_get(j, "tensors")) > 0);
    json_decref(j);

    /* create from an existing model, stream:false: inherits, overrides, merges params */
    CHECK_EQ_INT(req(p, "POST", "/api/create",
                     "{\"model\":\"kid\",\"from\":\"story\",\"system\":\"Be brief.\","
                     "\"parameters\":{\"top_k\":5},\"stream\":false}"), 200);
    CHECK_STR(g_resp, "{\"status\":\"success\"}");
    CHECK_EQ_INT(req(p, "POST", "/api/show", "{\"model\":\"kid\"}"), 200);
    j = json_loads(g_resp, 0, NULL);
    CHECK_STR(json_string_value(json_object_get(j, "system")), "Be brief.");
    CHECK_STR(json_string_value(json_object_get(j, "template")), "{{ .System }} {{ .Prompt }}");
    params = json_string_value(json_object_get(j, "parameters"));
    CHECK(params && strstr(params, "top_k                          5") && strstr(params, "temperature"));
    json_decref(j);
    /* a bad parameter is an error before any progress: HTTP 400 */
    CHECK_EQ_INT(req(p, "POST", "/api/create", "{\"model\":\"bad\",\"from\":\"story\",\"parameters\":{\"top_k\":\"x\"}}"), 400);
    CHECK(strstr(resp_error(), "top_k") != NULL);

    /* copy, then delete both: the model blob goes only with the last reference */
    CHECK_EQ_INT(req(p, "POST", "/api/copy", "{\"source\":\"story\",\"destination\":\"me/story2:v1\"}"), 200);
    CHECK_STR(g_resp, "");
    CHECK_EQ_INT(req(p, "GET", "/api/tags", NULL), 200);
    j = json_loads(g_resp, 0, NULL);
    CHECK_EQ_INT(json_array_size(json_object_get(j, "models")), 3);
    json_decref(j);
    CHECK(strstr(g_resp, "\"me/story2:v1\"") != NULL);
    CHECK_EQ_INT(req(p, "DELETE", "/api/delete", "{\"model\":\"STORY\"}"), 200);
    CHECK_EQ_INT(req(p, "POST", "/api/show", "{\"model\":\"story\"}"), 404);
    CHECK_EQ_INT(req(p, "HEAD", url, NULL), 200);
    CHECK_EQ_INT(req(p, "DELETE", "/api/delete", "{\"model\":\"kid\"}"), 200);
    CHECK_EQ_INT(req(p, "DELETE", "/api/delete", "{\"name\":\"me/story2:v1\"}"), 200);
    CHECK_EQ_INT(req(p, "HEAD", url, NULL), 404);
    CHECK_EQ_INT(req(p, "GET", "/api/tags", NULL), 200);
    CHECK_STR(g_resp, "{\"models\":[]}");
}

TEST(server_create_show_tags_copy_delete) { WITH_SERVER(models_api); }

/* ---------------------------------------------------------------------------------- */

typedef struct race_req {
    const srv_proc *p;
    const char *method, *path;
    char body[512];
    int status;
    char error[512];
} race_req;

static void *race_main(void *arg) {
    race_req *q = arg;
    char *resp = NULL;
    q->status = -1;
    q->error[0] = '\0';
    if (net_http_request(&q->p->host, q->method, q->path, q->body, strlen(q->body), &q->status,
                         &resp, NULL, NULL) != HL_OK)
        q->status = -1;
    json_t *j = resp ? json_loads(resp, 0, NULL) : NULL;
    const char *e = json_string_value(json_object_get(j, "error"));
    snprintf(q->error, sizeof q->error, "%s", e ? e : "");
    json_decref(j);
    free(resp);
    return NULL;
}

/* Every manifest in the store names blobs that exist; returns the first that does not. */
static bool store_consistent(const srv_proc *p, char *bad, size_t cap) {
    store *st;
    if (store_open(p->models, &st, NULL) != HL_OK) return false;
    store_entry *e;
    size_t n;
    bool ok = store_list(st, &e, &n, NULL) == HL_OK;
    for (size_t i = 0; ok && i < n; i++) {
        const store_manifest *m = &e[i].manifest;
        if (!store_blob_exists(st, m->config.digest, NULL)) {
            snprintf(bad, cap, "%s: config %s", e[i].name.model, m->config.digest);
            ok = false;
        }
        for (size_t k = 0; ok && k < m->n_layers; k++)
            if (!store_blob_exists(st, m->layers[k].digest, NULL)) {
                snprintf(bad, cap, "%s: layer %s", e[i].name.model, m->layers[k].digest);
                ok = false;
            }
    }
    if (ok) store_list_free(e, n);
    store_close(st);
    return ok;
}

/* Deriving (create from), copying and showing a model while it is deleted: no manifest
 * may point at a pruned blob; each derive succeeds with a usable model or is told the
 * base is gone (404); a copy is 200 or 404, never 500. */
static void derive_delete_race(srv_proc *p) {
    char digest[80], body[512], bad[256] = "";
    CHECK_EQ_INT(upload_gguf(p, digest), 201);
    /* the keeper holds the GGUF blob: each round's own blob is base's system layer */
    snprintf(body, sizeof body, "{\"model\":\"keeper\",\"files\":{\"m.gguf\":\"%s\"},\"stream\":false}",
             digest);
    CHECK_EQ_INT(req(p, "POST", "/api/create", body), 200);
    int derived = 0, refused = 0, copied = 0;
    for (int i = 0; i < 200; i++) {
        snprintf(body, sizeof body,
                 "{\"model\":\"base\",\"files\":{\"m.gguf\":\"%s\"},\"system\":\"round %d\","
                 "\"stream\":false}", digest, i);
        CHECK_EQ_INT(req(p, "POST", "/api/create", body), 200);
        race_req q[3] = {
            {.p = p, .method = "POST", .path = "/api/create",
             .body = "{\"model\":\"d\",\"from\":\"base\",\"stream\":false}"},
            {.p = p, .method = "DELETE", .path = "/api/delete", .body = "{\"model\":\"base\"}"},
            {.p = p, .method = "POST", .path = "/api/copy",
             .body = "{\"source\":\"base\",\"destination\":\"e\"}"},
        };
        pthread_t th[3];
        for (int k = 0; k < 3; k++) pthread_create(&th[k], NULL, race_main, &q[k]);
        for (int k = 0; k < 3; k++) pthread_join(th[k], NULL);
        CHECK_MSG(q[1].status == 200, "round %d: delete %d %s", i, q[1].status, q[1].error);
        CHECK_MSG(q[0].status == 200 || (q[0].status == 404 && strstr(q[0].error, "not found")),
                  "round %d: create from base: %d %s", i, q[0].status, q[0].error);
        CHECK_MSG(q[2].status == 200 || q[2].status == 404, "round %d: copy: %d %s", i,
                  q[2].status, q[2].error);
        CHECK_MSG(store_consistent(p, bad, sizeof bad), "round %d: a manifest points at a "
                  "missing blob (%s)", i, bad);
        if (q[0].status == 200) {
            derived++;
            char want[64];
            snprintf(want, sizeof want, "\"system\":\"round %d\"", i);
            CHECK_EQ_INT(req(p, "POST", "/api/show", "{\"model\":\"d\"}"), 200);
            CHECK_MSG(g_resp && strstr(g_resp, want), "round %d: d is not usable: %s", i,
                      g_resp ? g_resp : "");
            CHECK_EQ_INT(req(p, "DELETE", "/api/delete", "{\"model\":\"d\"}"), 200);
        } else {
            refused++;
            CHECK_EQ_INT(req(p, "POST", "/api/show", "{\"model\":\"d\"}"), 404);
        }
        if (q[2].status == 200) {
            copied++;
            CHECK_EQ_INT(req(p, "DELETE", "/api/delete", "{\"model\":\"e\"}"), 200);
        }
    }
    fprintf(stderr, "    derived %d, refused %d, copied %d of 200\n", derived, refused, copied);
}

TEST(server_derive_delete_race) {
    if (!test_shared_path("models/stories260K/stories260K.gguf"))
        SKIP("models/stories260K/stories260K.gguf not found");
    WITH_SERVER(derive_delete_race);
}

/* ---------------------------------------------------------------------------------- */

static int g_port;

/* Runs `$HEARTH_BIN args...` against the server; stdout/stderr into g_out/g_err. */
static char g_out[65536], g_err[8192];
static int run_cli(const char *first, ...) {
    const char *args[15];
    int n = 0;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && n < 14; a = va_arg(ap, const char *)) args[n++] = a;
    va_end(ap);
    args[n] = NULL;
    return sp_run_cli(g_port, NULL, args, g_out, sizeof g_out, g_err, sizeof g_err);
}

static void cli_flow(srv_proc *p) {
    const char *gguf = test_shared_path("models/stories260K/stories260K.gguf");
    if (!gguf) SKIP("models/stories260K/stories260K.gguf not found");
    g_port = p->port;
    char dir[1100], link_path[1200], mf_path[1200], abs[4096];
    snprintf(dir, sizeof dir, "%s/work", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    CHECK(realpath(gguf, abs) != NULL);
    snprintf(link_path, sizeof link_path, "%s/story.gguf", dir);
    CHECK(symlink(abs, link_path) == 0);
    snprintf(mf_path, sizeof mf_path, "%s/Modelfile", dir);
    const char *mf = "# a tiny story model\n"
                     "FROM ./story.gguf\n"
                     "PARAMETER temperature 0.7\n"
                     "PARAMETER stop \"<|end|>\"\n"
                     "SYSTEM \"\"\"You tell\nshort stories.\"\"\"\n"
                     "TEMPLATE {{ .Prompt }}\n"
                     "LICENSE MIT\n";
    CHECK_OK(hl_file_write(mf_path, mf, strlen(mf), NULL), (hl_err *)NULL);

    CHECK_EQ_INT(run_cli("create", "story", "-f", mf_path, NULL), 0);
    CHECK_MSG(strstr(g_out, "parsing GGUF\n") && strstr(g_out, "success\n"), "%s", g_out);
    CHECK_EQ_INT(run_cli("list", NULL), 0);
    CHECK_MSG(strncmp(g_out, "NAME", 4) == 0 && strstr(g_out, "ID") && strstr(g_out, "SIZE") &&
                  strstr(g_out, "MODIFIED"), "%s", g_out);
    CHECK_MSG(strstr(g_out, "\nstory:latest    ") && strstr(g_out, "1.2 MB") && strstr(g_out, " ago\n"), "%s", g_out);
    CHECK_EQ_INT(run_cli("show", "story", NULL), 0);
    CHECK_MSG(strstr(g_out, "architecture        llama") && strstr(g_out, "completion") &&
                  strstr(g_out, "short stories."), "%s", g_out);
    CHECK_EQ_INT(run_cli("show", "story", "--parameters", NULL), 0);
    CHECK_MSG(strstr(g_out, "temperature                    0.7\n") && strstr(g_out, "\"<|end|>\""), "%s", g_out);
    CHECK_EQ_INT(run_cli("show", "story", "--system", NULL), 0);
    CHECK_STR(g_out, "You tell\nshort stories.\n");
    CHECK_EQ_INT(run_cli("show", "story", "--template", NULL), 0);
    CHECK_STR(g_out, "{{ .Prompt }}\n");
    CHECK_EQ_INT(run_cli("show", "story", "--license", NULL), 0);
    CHECK_STR(g_out, "MIT\n");
    CHECK_EQ_INT(run_cli("show", "story", "--modelfile", NULL), 0);
    CHECK_MSG(strstr(g_out, "\nFROM /") && strstr(g_out, "PARAMETER stop <|end|>"), "%s", g_out);
    /* the generated Modelfile recreates the model */
    char mf2[1200];
    snprintf(mf2, sizeof mf2, "%s/Modelfile2", dir);
    CHECK_OK(hl_file_write(mf2, g_out, strlen(g_out), NULL), (hl_err *)NULL);
    CHECK_EQ_INT(run_cli("create", "story-copy", "-f", mf2, NULL), 0);
    CHECK_MSG(strstr(g_out, "success"), "%s%s", g_out, g_err);

    CHECK_EQ_INT(run_cli("cp", "story", "story2", NULL), 0);
    CHECK_STR(g_out, "copied 'story' to 'story2'\n");
    CHECK_EQ_INT(run_cli("rm", "story2", "story-copy", NULL), 0);
    CHECK_STR(g_out, "deleted 'story2'\ndeleted 'story-copy'\n");
    CHECK_EQ_INT(run_cli("ps", NULL), 0);
    CHECK(strncmp(g_out, "NAME", 4) == 0 && strstr(g_out, "UNTIL"));

    /* errors: one line, exit 1 */
    CHECK_EQ_INT(run_cli("show", "nope", NULL), 1);
    CHECK_STR(g_err, "Error: model 'nope' not found\n");
    CHECK_EQ_INT(run_cli("rm", "nope", NULL), 1);
    CHECK_STR(g_err, "Error: model 'nope' not found\n");
    const char *bad = "FROM ./story.gguf\nPARAMETER temperature warm\n";
    CHECK_OK(hl_file_write(mf2, bad, strlen(bad), NULL), (hl_err *)NULL);
    CHECK_EQ_INT(run_cli("create", "x", "-f", mf2, NULL), 1);
    CHECK_MSG(strncmp(g_err, "Error: ", 7) == 0 && strstr(g_err, "(line 2): invalid float value [warm]"), "%s", g_err);
    const char *missing = "FROM ./absent.gguf\n";
    CHECK_OK(hl_file_write(mf2, missing, strlen(missing), NULL), (hl_err *)NULL);
    CHECK_EQ_INT(run_cli("create", "x", "-f", mf2, NULL), 1);
    CHECK_MSG(strstr(g_err, "FROM file not found"), "%s", g_err);
    CHECK_EQ_INT(run_cli("create", "x", "-f", "/nonexistent/Modelfile", NULL), 1);
    CHECK_MSG(strstr(g_err, "specified Modelfile wasn't found"), "%s", g_err);

    CHECK_EQ_INT(run_cli("rm", "story", NULL), 0);
    CHECK_EQ_INT(run_cli("list", NULL), 0);
    CHECK(strstr(g_out, "story") == NULL);

    /* no server listening */
    g_port = 1;
    CHECK_EQ_INT(run_cli("list", NULL), 1);
    CHECK_STR(g_err, "Error: could not connect to hearth server, run 'hearth serve' to start it\n");
}

TEST(server_cli_end_to_end) { WITH_SERVER(cli_flow); }

/* ---------------------------------------------------------------------------------- */

static int raw_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void abuse(srv_proc *p) {
    /* garbage, truncated bodies and uploads: the connection dies, the server does not */
    const char *msgs[] = {
        "GARBAGE\r\n\r\n",
        "POST /api/show HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":",
        "POST /api/blobs/sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824 "
        "HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nhel",
        "POST /api/create HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "GET /api/tags HTTP/1.1\r\nHost: x\r\n" "X-Long: ",
    };
    for (size_t i = 0; i < sizeof msgs / sizeof msgs[0]; i++) {
        int fd = raw_connect(p->port);
        CHECK(fd >= 0);
        ssize_t w = send(fd, msgs[i], strlen(msgs[i]), MSG_NOSIGNAL);
        CHECK(w > 0);
        sp_sleep_ms(20);
        close(fd);
    }
    sp_sleep_ms(100);
    CHECK_EQ_INT(req(p, "GET", "/api/version", NULL), 200);
    /* the aborted upload left no blob and no temp file */
    char blobs[1100];
    snprintf(blobs, sizeof blobs, "%s/blobs", p->models);
    DIR *d = opendir(blobs);
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    CHECK_EQ_INT(n, 0);
    /* a create stream whose client vanishes does not take the server down */
    for (int i = 0; i < 3; i++) {
        int fd = raw_connect(p->port);
        const char *body = "{\"model\":\"m\",\"from\":\"nope\"}";
        char head[256];
        snprintf(head, sizeof head, "POST /api/create HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                 strlen(body), body);
        ssize_t w = send(fd, head, strlen(head), MSG_NOSIGNAL);
        CHECK(w > 0);
        close(fd);
    }
    sp_sleep_ms(100);
    CHECK_EQ_INT(req(p, "GET", "/", NULL), 200);
}

TEST(server_survives_abusive_clients) { WITH_SERVER(abuse); }

/* Sends a raw request and reads the whole response (the request asks for close). */
static void raw_exchange(int port, const char *request, char *out, size_t cap) {
    out[0] = '\0';
    int fd = raw_connect(port);
    if (fd < 0) return;
    if (send(fd, request, strlen(request), MSG_NOSIGNAL) < 0) {
        close(fd);
        return;
    }
    size_t n = 0;
    ssize_t got;
    while (n + 1 < cap && (got = recv(fd, out + n, cap - 1 - n, 0)) > 0) n += (size_t)got;
    out[n] = '\0';
    close(fd);
}

static void cors(srv_proc *p) {
    char resp[8192];
    raw_exchange(p->port, "GET /api/version HTTP/1.1\r\nHost: localhost\r\nOrigin: http://localhost:3000\r\n"
                          "Connection: close\r\n\r\n", resp, sizeof resp);
    CHECK_MSG(strncmp(resp, "HTTP/1.1 200", 12) == 0, "%s", resp);
    CHECK_MSG(strstr(resp, "Access-Control-Allow-Origin: http://localhost:3000\r\n"), "%s", resp);
    raw_exchange(p->port, "OPTIONS /api/chat HTTP/1.1\r\nHost: localhost\r\nOrigin: vscode-webview://abc\r\n"
                          "Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n", resp, sizeof resp);
    CHECK_MSG(strncmp(resp, "HTTP/1.1 204", 12) == 0, "%s", resp);
    CHECK_MSG(strstr(resp, "Access-Control-Allow-Methods: ") && strstr(resp, "Content-Type"), "%s", resp);
    raw_exchange(p->port, "GET /api/tags HTTP/1.1\r\nHost: localhost\r\nOrigin: http://evil.example\r\n"
                          "Connection: close\r\n\r\n", resp, sizeof resp);
    CHECK_MSG(strncmp(resp, "HTTP/1.1 403", 12) == 0, "%s", resp);
    /* DNS-rebinding guard: a loopback server answers only names of this machine */
    raw_exchange(p->port, "GET /api/tags HTTP/1.1\r\nHost: attacker.example:11434\r\nConnection: close\r\n\r\n",
                 resp, sizeof resp);
    CHECK_MSG(strncmp(resp, "HTTP/1.1 403", 12) == 0, "%s", resp);
    const char *ok_hosts[] = {"127.0.0.1:11434", "localhost", "my.local", "[::1]:80", "192.168.1.9", "x.internal"};
    for (size_t i = 0; i < sizeof ok_hosts / sizeof ok_hosts[0]; i++) {
        char rq[256];
        snprintf(rq, sizeof rq, "GET /api/version HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", ok_hosts[i]);
        raw_exchange(p->port, rq, resp, sizeof resp);
        CHECK_MSG(strncmp(resp, "HTTP/1.1 200", 12) == 0, "Host %s: %s", ok_hosts[i], resp);
    }
    /* no Origin (curl, SDKs): no CORS headers */
    raw_exchange(p->port, "GET /api/version HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", resp, sizeof resp);
    CHECK_MSG(strncmp(resp, "HTTP/1.1 200", 12) == 0 && !strstr(resp, "Access-Control"), "%s", resp);
}

TEST(server_cors_origins_and_host_check) { WITH_SERVER(cors); }

/* ---------------------------------------------------------------------------------- */
/* The streaming machinery in-process: a producer that streams until cancelled. */

#include "server/internal.h"

static atomic_int g_ticks;
static atomic_bool g_saw_cancel;

static void slow_producer(srv_stream *s, void *ctx) {
    (void)ctx;
    for (int i = 0; i < 500 && !srv_stream_cancelled(s); i++) { /* at most ~10 s */
        srv_stream_send(s, json_pack("{s:i}", "tick", i));
        atomic_fetch_add(&g_ticks, 1);
        sp_sleep_ms(20);
    }
    if (srv_stream_cancelled(s)) atomic_store(&g_saw_cancel, true);
}

static void silent_producer(srv_stream *s, void *ctx) {
    (void)ctx; /* sends nothing until cancelled: the disconnect must be noticed anyway */
    for (int i = 0; i < 500 && !srv_stream_cancelled(s); i++) sp_sleep_ms(20);
    if (srv_stream_cancelled(s)) atomic_store(&g_saw_cancel, true);
}

static void failing_producer(srv_stream *s, void *ctx) {
    (void)ctx;
    srv_stream_send(s, json_pack("{s:s}", "status", "one"));
    srv_stream_fail(s, 500, "boom");
}

static void early_failing_producer(srv_stream *s, void *ctx) {
    (void)ctx;
    srv_stream_fail(s, 418, "teapot");
}

static enum MHD_Result route_slow(srv_request *r) { return srv_stream_run(r, true, slow_producer, NULL, NULL); }
static enum MHD_Result route_silent(srv_request *r) { return srv_stream_run(r, true, silent_producer, NULL, NULL); }
static enum MHD_Result route_fail(srv_request *r) { return srv_stream_run(r, true, failing_producer, NULL, NULL); }
static enum MHD_Result route_early(srv_request *r) { return srv_stream_run(r, true, early_failing_producer, NULL, NULL); }
static enum MHD_Result route_fail_nostream(srv_request *r) {
    return srv_stream_run(r, false, failing_producer, NULL, NULL);
}

static const srv_route k_test_routes[] = {
    {"/test/slow", false, "GET", route_slow, false},
    {"/test/silent", false, "GET", route_silent, false},
    {"/test/fail", false, "GET", route_fail, false},
    {"/test/early", false, "GET", route_early, false},
    {"/test/fail-nostream", false, "GET", route_fail_nostream, false},
};

static bool wait_flag(atomic_bool *flag, int ms) {
    for (int i = 0; i < ms / 10 && !atomic_load(flag); i++) sp_sleep_ms(10);
    return atomic_load(flag);
}

TEST(server_stream_cancel_on_disconnect_and_errors) {
    server_config cfg = {.extra_routes = k_test_routes, .n_extra_routes = 5, .quiet = 1};
    hl_server *srv;
    srv_proc p;
    hl_err err;
    CHECK_OK(sp_start_in_process(&cfg, &srv, &p, &err), &err);
    bool ok = true;

    /* read two ticks, hang up: the producer must see the cancel flag */
    net_http *h = NULL;
    char *line;
    size_t len;
    ok = ok && net_http_open(&p.host, "GET", "/test/slow", NULL, -1, &h, &err) == HL_OK;
    ok = ok && net_http_finish(h, &err) == HL_OK && net_http_status(h) == 200;
    ok = ok && strcmp(net_http_content_type(h), "application/x-ndjson") == 0;
    ok = ok && net_http_read_line(h, &line, &len, &err) == HL_OK && line && strcmp(line, "{\"tick\":0}") == 0;
    ok = ok && net_http_read_line(h, &line, &len, &err) == HL_OK && line && strcmp(line, "{\"tick\":1}") == 0;
    net_http_close(h);
    bool cancelled = ok && wait_flag(&g_saw_cancel, 3000);
    int ticks = atomic_load(&g_ticks);

    /* a producer that never writes still learns that its client left */
    atomic_store(&g_saw_cancel, false);
    h = NULL;
    bool silent_ok = net_http_open(&p.host, "GET", "/test/silent", NULL, -1, &h, &err) == HL_OK;
    sp_sleep_ms(100);
    net_http_close(h);
    bool silent_cancelled = silent_ok && wait_flag(&g_saw_cancel, 3000);

    /* errors: after the first chunk -> 200 + an error line; before -> the status */
    int st_fail = req(&p, "GET", "/test/fail", NULL);
    char fail_body[256];
    snprintf(fail_body, sizeof fail_body, "%s", g_resp ? g_resp : "");
    int st_early = req(&p, "GET", "/test/early", NULL);
    char early_body[256];
    snprintf(early_body, sizeof early_body, "%s", g_resp ? g_resp : "");
    int st_nostream = req(&p, "GET", "/test/fail-nostream", NULL);
    char nostream_body[256];
    snprintf(nostream_body, sizeof nostream_body, "%s", g_resp ? g_resp : "");

    server_stop(srv); /* waits for every producer */
    CHECK(ok);
    CHECK(cancelled);
    CHECK_MSG(ticks < 100, "producer kept running after the client left (%d ticks)", ticks);
    CHECK(silent_cancelled);
    CHECK_EQ_INT(st_fail, 200);
    CHECK_STR(fail_body, "{\"status\":\"one\"}\n{\"error\":\"boom\"}\n");
    CHECK_EQ_INT(st_early, 418);
    CHECK_STR(early_body, "{\"error\":\"teapot\"}");
    CHECK_EQ_INT(st_nostream, 500);
    CHECK_STR(nostream_body, "{\"error\":\"boom\"}");
}

/* Sends a raw request head and body_len filler bytes, then reads the whole response
 * (the server closes the connection after it). Returns false on a transport error. */
static bool raw_upload(int port, const char *head, size_t body_len, char *out, size_t cap) {
    out[0] = '\0';
    int fd = raw_connect(port);
    if (fd < 0) return false;
    bool ok = send(fd, head, strlen(head), MSG_NOSIGNAL) == (ssize_t)strlen(head);
    char chunk[65536];
    memset(chunk, 'x', sizeof chunk);
    for (size_t sent = 0; ok && sent < body_len;) {
        size_t n = body_len - sent < sizeof chunk ? body_len - sent : sizeof chunk;
        ssize_t w = send(fd, chunk, n, MSG_NOSIGNAL);
        ok = w > 0;
        if (ok) sent += (size_t)w;
    }
    size_t n = 0;
    ssize_t got = 0;
    while (ok && n + 1 < cap && (got = recv(fd, out + n, cap - 1 - n, 0)) > 0) n += (size_t)got;
    out[n] = '\0';
    close(fd);
    return ok && got >= 0;
}

/* An error answered on the request's headers (bad digest, unknown route, wrong method,
 * too-large body, Host check) still reaches a client that is sending a large body:
 * the server reads and drops the body first, instead of closing with it unread. */
TEST(server_early_errors_reach_uploading_clients) {
    server_config cfg = {.max_body = (size_t)1 << 20, .quiet = 1};
    hl_server *srv;
    srv_proc p;
    hl_err err;
    CHECK_OK(sp_start_in_process(&cfg, &srv, &p, &err), &err);
    size_t len = (size_t)8 << 20; /* far more than the socket buffers hold */
    char *data = malloc(len);
    if (data) memset(data, '{', len);

    int st_digest = data ? req_bytes(&p, "POST", "/api/blobs/sha256:nothex", data, len) : -2;
    char digest_err[256];
    snprintf(digest_err, sizeof digest_err, "%s", resp_error());
    int st_route = data ? req_bytes(&p, "POST", "/api/nothing", data, len) : -2;
    char route_body[256];
    snprintf(route_body, sizeof route_body, "%s", g_resp ? g_resp : "");
    int st_method = data ? req_bytes(&p, "POST", "/api/tags", data, len) : -2;
    char method_body[256];
    snprintf(method_body, sizeof method_body, "%s", g_resp ? g_resp : "");
    int st_large = data ? req_bytes(&p, "POST", "/api/show", data, len) : -2;
    char large_err[256];
    snprintf(large_err, sizeof large_err, "%s", resp_error());
    free(data);

    char host_resp[4096];
    char head[256];
    snprintf(head, sizeof head, "POST /api/show HTTP/1.1\r\nHost: evil.example\r\n"
                                "Connection: close\r\nContent-Length: %zu\r\n\r\n", len);
    bool host_ok = raw_upload(p.port, head, len, host_resp, sizeof host_resp);
    /* a declared size too large to read for nothing: answered at once, then closed */
    char huge_resp[4096];
    bool huge_ok = raw_upload(p.port, "POST /api/show HTTP/1.1\r\nHost: localhost\r\n"
                                      "Content-Length: 1000000000000\r\n\r\n", 1000,
                              huge_resp, sizeof huge_resp);
    /* a client that waits for "100 Continue" gets the error instead and sends nothing */
    char expect_resp[4096];
    bool expect_ok = raw_upload(p.port, "POST /api/nothing HTTP/1.1\r\nHost: localhost\r\n"
                                        "Expect: 100-continue\r\nContent-Length: 1000000\r\n\r\n",
                                0, expect_resp, sizeof expect_resp);
    int st_after = req(&p, "GET", "/api/version", NULL);
    server_stop(srv);

    CHECK_EQ_INT(st_digest, 400);
    CHECK_STR(digest_err, "invalid digest format");
    CHECK_EQ_INT(st_route, 404);
    CHECK_STR(route_body, "404 page not found");
    CHECK_EQ_INT(st_method, 405);
    CHECK_STR(method_body, "405 method not allowed");
    CHECK_EQ_INT(st_large, 413);
    CHECK_STR(large_err, "request body too large (limit 1048576 bytes)");
    CHECK(host_ok);
    CHECK_MSG(strncmp(host_resp, "HTTP/1.1 403", 12) == 0, "%s", host_resp);
    CHECK(huge_ok);
    CHECK_MSG(strncmp(huge_resp, "HTTP/1.1 413", 12) == 0, "%s", huge_resp);
    CHECK_MSG(strstr(huge_resp, "\r\n\r\n{\"error\":\"request body too large"), "%s", huge_resp);
    CHECK(expect_ok);
    CHECK_MSG(strncmp(expect_resp, "HTTP/1.1 404", 12) == 0, "%s", expect_resp);
    CHECK_EQ_INT(st_after, 200);
}

/* One GET on a fresh connection, waiting at most ms for the whole reply: the status, or
 * -1 when the connection was refused, reset or silent. head (cap bytes) gets the reply. */
static int timed_get(int port, const char *path, int ms, char *head, size_t cap) {
    head[0] = '\0';
    int fd = raw_connect(port);
    if (fd < 0) return -1;
    char rq[256];
    snprintf(rq, sizeof rq, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
    size_t n = 0;
    bool ok = send(fd, rq, strlen(rq), MSG_NOSIGNAL) == (ssize_t)strlen(rq);
    while (ok && n + 1 < cap) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, ms) <= 0) break;
        ssize_t got = recv(fd, head + n, cap - 1 - n, 0);
        if (got <= 0) break;
        n += (size_t)got;
    }
    head[n] = '\0';
    close(fd);
    int status = -1;
    return sscanf(head, "HTTP/1.%*d %d", &status) == 1 ? status : -1;
}

/* Slow-loris: more sockets than the connection limit, each holding half a request. A new
 * client is still answered at once (503 + Retry-After past the limit), the idle sockets
 * are closed after HEARTH_CONN_TIMEOUT, and then clients are served again. */
static void idle_flood(srv_proc *p) {
    enum { N = 600 };
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 2 * N + 64) {
        rl.rlim_cur = rl.rlim_max < 2 * N + 64 ? rl.rlim_max : 2 * N + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    static int fds[N];
    int opened = 0;
    const char *half = "POST /api/show HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le";
    for (int i = 0; i < N; i++) {
        fds[i] = raw_connect(p->port);
        if (fds[i] < 0) break;
        opened++;
        if (send(fds[i], half, strlen(half), MSG_NOSIGNAL) < 0) break;
    }
    CHECK_EQ_INT(opened, N);
    char head[2048];
    int status = -1;
    uint64_t t0 = hl_time_ns();
    while (status != 200 && status != 503 && hl_time_ns() - t0 < 2000000000ull)
        status = timed_get(p->port, "/api/version", 300, head, sizeof head);
    CHECK_MSG(status == 200 || status == 503, "a new client got %d within 2 s", status);
    if (status == 503) CHECK(strstr(head, "Retry-After: ") != NULL);
    /* every idle socket is closed by the server (HEARTH_CONN_TIMEOUT=1) */
    int closed = 0;
    t0 = hl_time_ns();
    for (int i = 0; i < opened; i++) {
        for (;;) {
            struct pollfd pf = {.fd = fds[i], .events = POLLIN | POLLRDHUP};
            int left = 5000 - (int)((hl_time_ns() - t0) / 1000000);
            if (left <= 0 || poll(&pf, 1, left) <= 0) break;
            char junk[256];
            if (recv(fds[i], junk, sizeof junk, MSG_DONTWAIT) <= 0) {
                closed++;
                break;
            }
        }
        close(fds[i]);
    }
    CHECK_EQ_INT(closed, opened);
    CHECK_EQ_INT(timed_get(p->port, "/api/version", 2000, head, sizeof head), 200);
}

TEST(server_idle_connections_time_out) {
    const char *env[] = {"HEARTH_CONN_TIMEOUT=1", NULL};
    SP_WITH_SERVER("idle", env, NULL, idle_flood);
}

/* A producer silent for longer than the connection timeout, then answering. */
static void late_producer(srv_stream *s, void *ctx) {
    (void)ctx;
    for (int i = 0; i < 125 && !srv_stream_cancelled(s); i++) sp_sleep_ms(20); /* 2.5 s */
    srv_stream_send(s, json_pack("{s:s}", "status", "late"));
}
static enum MHD_Result route_late(srv_request *r) { return srv_stream_run(r, true, late_producer, NULL, NULL); }
static enum MHD_Result route_late_whole(srv_request *r) {
    return srv_stream_run(r, false, late_producer, NULL, NULL);
}
static const srv_route k_late_routes[] = {
    {"/test/late", false, "GET", route_late, false},
    {"/test/late-whole", false, "GET", route_late_whole, false},
};

/* The connection timeout is for clients that send nothing: a reply that takes longer
 * to produce (a long prefill, a whole non-streamed generation) still arrives. */
TEST(server_conn_timeout_spares_slow_replies) {
    server_config cfg = {.extra_routes = k_late_routes, .n_extra_routes = 2, .quiet = 1};
    hl_server *srv;
    srv_proc p;
    hl_err err;
    setenv("HEARTH_CONN_TIMEOUT", "1", 1);
    hl_status st = sp_start_in_process(&cfg, &srv, &p, &err);
    unsetenv("HEARTH_CONN_TIMEOUT");
    CHECK_OK(st, &err);
    char head[2048];
    int late = timed_get(p.port, "/test/late", 5000, head, sizeof head);
    bool late_body = strstr(head, "{\"status\":\"late\"}") != NULL;
    int whole = timed_get(p.port, "/test/late-whole", 5000, head, sizeof head);
    bool whole_body = strstr(head, "{\"status\":\"late\"}") != NULL;
    server_stop(srv);
    CHECK_EQ_INT(late, 200);
    CHECK(late_body);
    CHECK_EQ_INT(whole, 200);
    CHECK(whole_body);
}

/* An upload that never ends (chunked, past the body limit) is cut: the server stops
 * reading after a bounded amount instead of reading (and dropping) it forever. */
typedef struct endless_arg {
    int fd;
    uint64_t sent;
} endless_arg;

static void *endless_main(void *arg) {
    endless_arg *a = arg;
    static char chunk[65536 + 16];
    int n = snprintf(chunk, sizeof chunk, "10000\r\n");
    memset(chunk + n, ' ', 65536);
    memcpy(chunk + n + 65536, "\r\n", 2);
    size_t len = (size_t)n + 65536 + 2;
    /* 1 GiB at most: far past any limit */
    while (a->sent < ((uint64_t)1 << 30)) {
        ssize_t w = send(a->fd, chunk, len, MSG_NOSIGNAL);
        if (w <= 0) break;
        a->sent += (uint64_t)w;
    }
    shutdown(a->fd, SHUT_WR);
    return NULL;
}

TEST(server_endless_chunked_upload_is_cut) {
    server_config cfg = {.max_body = (size_t)1 << 20, .quiet = 1};
    hl_server *srv;
    srv_proc p;
    hl_err err;
    CHECK_OK(sp_start_in_process(&cfg, &srv, &p, &err), &err);
    endless_arg a = {.fd = raw_connect(p.port)};
    const char *head = "POST /api/show HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                       "Content-Type: application/json\r\n\r\n";
    bool sent_head = a.fd >= 0 && send(a.fd, head, strlen(head), MSG_NOSIGNAL) > 0;
    pthread_t th;
    bool started = sent_head && pthread_create(&th, NULL, endless_main, &a) == 0;
    char resp[4096] = "";
    size_t n = 0;
    while (started && n + 1 < sizeof resp) {
        struct pollfd pf = {.fd = a.fd, .events = POLLIN};
        if (poll(&pf, 1, 20000) <= 0) break;
        ssize_t got = recv(a.fd, resp + n, sizeof resp - 1 - n, 0);
        if (got <= 0) break;
        n += (size_t)got;
    }
    resp[n] = '\0';
    if (started) pthread_join(th, NULL);
    if (a.fd >= 0) close(a.fd);
    /* a chunked body that ends past the limit is read, dropped and answered 413 */
    char fin[4096];
    int fd = raw_connect(p.port);
    bool fin_ok = fd >= 0 && send(fd, head, strlen(head), MSG_NOSIGNAL) > 0;
    static char chunk[65536];
    memset(chunk, ' ', sizeof chunk);
    for (int i = 0; fin_ok && i < 24; i++) { /* 1.5 MiB */
        fin_ok = send(fd, "10000\r\n", 7, MSG_NOSIGNAL) == 7 &&
                 send(fd, chunk, sizeof chunk, MSG_NOSIGNAL) == (ssize_t)sizeof chunk &&
                 send(fd, "\r\n", 2, MSG_NOSIGNAL) == 2;
    }
    fin_ok = fin_ok && send(fd, "0\r\n\r\n", 5, MSG_NOSIGNAL) == 5;
    size_t fn = 0;
    while (fin_ok && fn + 1 < sizeof fin) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 5000) <= 0) break;
        ssize_t got = recv(fd, fin + fn, sizeof fin - 1 - fn, 0);
        if (got <= 0) break;
        fn += (size_t)got;
    }
    fin[fn] = '\0';
    if (fd >= 0) close(fd);
    int alive = timed_get(p.port, "/api/version", 2000, resp + n, sizeof resp - n);
    server_stop(srv);
    CHECK(started);
    /* read and dropped up to the discard limit (128 MiB here), then cut */
    CHECK_MSG(a.sent < ((uint64_t)256 << 20), "the server read %llu bytes of an endless body",
              (unsigned long long)a.sent);
    CHECK_MSG(strncmp(fin, "HTTP/1.1 413", 12) == 0, "%s", fin);
    CHECK_EQ_INT(alive, 200);
}

/* Sends a request head declaring len body bytes, then `part` of them (spaces). */
static int partial_upload(int port, size_t len, size_t part) {
    int fd = raw_connect(port);
    if (fd < 0) return -1;
    char head[256];
    snprintf(head, sizeof head, "POST /api/show HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                                "Content-Length: %zu\r\n\r\n", len);
    static char spaces[65536];
    memset(spaces, ' ', sizeof spaces);
    bool ok = send(fd, head, strlen(head), MSG_NOSIGNAL) > 0;
    for (size_t sent = 0; ok && sent < part;) {
        size_t n = part - sent < sizeof spaces ? part - sent : sizeof spaces;
        ssize_t w = send(fd, spaces, n, MSG_NOSIGNAL);
        ok = w > 0;
        if (ok) sent += (size_t)w;
    }
    if (!ok) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Sends the rest of a partial upload and reads the status. */
static int finish_upload(int fd, size_t rest) {
    static char spaces[65536];
    memset(spaces, ' ', sizeof spaces);
    bool ok = fd >= 0;
    for (size_t sent = 0; ok && sent < rest;) {
        size_t n = rest - sent < sizeof spaces ? rest - sent : sizeof spaces;
        ssize_t w = send(fd, spaces, n, MSG_NOSIGNAL);
        ok = w > 0;
        if (ok) sent += (size_t)w;
    }
    char resp[1024];
    size_t got = 0;
    while (ok && got + 1 < sizeof resp) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 5000) <= 0) break;
        ssize_t k = recv(fd, resp + got, sizeof resp - 1 - got, 0);
        if (k <= 0) break;
        got += (size_t)k;
    }
    resp[got] = '\0';
    if (fd >= 0) close(fd);
    int status = -1;
    return sscanf(resp, "HTTP/1.%*d %d", &status) == 1 ? status : -1;
}

/* The JSON bodies buffered at once are bounded (4 x the body limit): one more large
 * body is answered 503 instead of growing memory; the budget comes back afterwards. */
TEST(server_body_memory_budget) {
    server_config cfg = {.max_body = (size_t)1 << 20, .quiet = 1};
    hl_server *srv;
    srv_proc p;
    hl_err err;
    CHECK_OK(sp_start_in_process(&cfg, &srv, &p, &err), &err);
    const size_t len = 1000000, part = 900000;
    int fds[4], status[4], extra = -1, after = -1;
    for (int i = 0; i < 4; i++) fds[i] = partial_upload(p.port, len, part);
    sp_sleep_ms(300); /* the server has buffered the four */
    int fd5 = partial_upload(p.port, len, part);
    extra = finish_upload(fd5, len - part);
    for (int i = 0; i < 4; i++) status[i] = finish_upload(fds[i], len - part);
    char head[1024];
    after = timed_get(p.port, "/api/version", 2000, head, sizeof head);
    int last = finish_upload(partial_upload(p.port, len, part), len - part);
    server_stop(srv);
    CHECK_EQ_INT(extra, 503);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(status[i], 400); /* spaces: not JSON */
    CHECK_EQ_INT(after, 200);
    CHECK_EQ_INT(last, 400);
}

/* A restarted server removes what no model uses: a blob uploaded but never used and the
 * temp file of an upload cut short; a model's own blobs stay. */
static char g_gc_blob[2048], g_gc_partial[2048], g_gc_model_blob[2048];

static void gc_first(srv_proc *p) {
    char digest[80];
    CHECK_EQ_INT(upload_gguf(p, digest), 201);
    char body[512];
    snprintf(body, sizeof body, "{\"model\":\"kept\",\"files\":{\"m.gguf\":\"%s\"},\"stream\":false}",
             digest);
    CHECK_EQ_INT(req(p, "POST", "/api/create", body), 200);
    snprintf(g_gc_model_blob, sizeof g_gc_model_blob, "%s/blobs/sha256-%s", p->models, digest + 7);
    const char junk[] = "uploaded, never used";
    char jd[80], url[128];
    digest_of(junk, sizeof junk - 1, jd);
    snprintf(url, sizeof url, "/api/blobs/%s", jd);
    CHECK_EQ_INT(req_bytes(p, "POST", url, junk, sizeof junk - 1), 201);
    snprintf(g_gc_blob, sizeof g_gc_blob, "%s/blobs/sha256-%s", p->models, jd + 7);
    snprintf(g_gc_partial, sizeof g_gc_partial, "%s/blobs/.partial-XyZ123", p->models);
    CHECK(hl_file_write(g_gc_partial, "cut", 3, NULL) == HL_OK);
    CHECK(access(g_gc_blob, F_OK) == 0);
}

static void gc_second(srv_proc *p) {
    CHECK(access(g_gc_blob, F_OK) != 0);
    CHECK(access(g_gc_partial, F_OK) != 0);
    CHECK(access(g_gc_model_blob, F_OK) == 0);
    CHECK_EQ_INT(req(p, "POST", "/api/show", "{\"model\":\"kept\"}"), 200);
}

TEST(server_startup_removes_unused_blobs) {
    if (!test_shared_path("models/stories260K/stories260K.gguf"))
        SKIP("models/stories260K/stories260K.gguf not found");
    SP_WITH_SERVER("gc", NULL, NULL, gc_first);
    char log[1200]; /* the next spawn must not read the last one's "Listening on" */
    snprintf(log, sizeof log, "%s/serve-gc.log", test_tmpdir());
    unlink(log);
    SP_WITH_SERVER("gc", NULL, NULL, gc_second);
}

/* Without HEARTH_MODELS, an Ollama store nearby (OLLAMA_MODELS, or ~/.ollama/models) is
 * named in serve's log with how to use it; hearth still uses its own store. */
TEST(server_logs_the_store_when_an_ollama_store_exists) {
    static char home[1200], ollama[1200], home_env[1300], ollama_env[1300];
    snprintf(home, sizeof home, "%s/home", test_tmpdir());
    snprintf(ollama, sizeof ollama, "%s/.ollama/models", home);
    snprintf(home_env, sizeof home_env, "HOME=%s", home);
    snprintf(ollama_env, sizeof ollama_env, "OLLAMA_MODELS=%s", ollama);
    const char *with_env[] = {home_env, ollama_env, "HEARTH_MODELS=", NULL};
    srv_proc p;
    int rc = sp_spawn(&p, "ollama-env", with_env);
    if (rc == 1) SKIP("HEARTH_BIN not set (run through make test)");
    sp_stop(&p);
    CHECK_EQ_INT(rc, 0);
    char *log = NULL;
    size_t len;
    CHECK(hl_file_read(p.log, &log, &len, NULL) == HL_OK);
    char want[4096];
    snprintf(want, sizeof want, "models: using hearth's store %s/.hearth/models (HEARTH_MODELS is unset); "
             "an Ollama store is at %s: set HEARTH_MODELS=%s to use it", home, ollama, ollama);
    bool found = strstr(log, want) != NULL;
    free(log);
    CHECK_MSG(found, "no store line in %s", p.log);
    struct stat sb;
    char own[1300];
    snprintf(own, sizeof own, "%s/.hearth/models/blobs", home);
    CHECK(stat(own, &sb) == 0 && S_ISDIR(sb.st_mode));

    /* ~/.ollama/models existing is enough; HEARTH_MODELS set: no line */
    CHECK(mkdir(home, 0755) == 0 || errno == EEXIST);
    snprintf(own, sizeof own, "%s/.ollama", home);
    CHECK(mkdir(own, 0755) == 0 || errno == EEXIST);
    CHECK(mkdir(ollama, 0755) == 0 || errno == EEXIST);
    const char *home_only[] = {home_env, "OLLAMA_MODELS=", "HEARTH_MODELS=", NULL};
    CHECK_EQ_INT(sp_spawn(&p, "ollama-dir", home_only), 0);
    sp_stop(&p);
    CHECK(hl_file_read(p.log, &log, &len, NULL) == HL_OK);
    found = strstr(log, want) != NULL;
    free(log);
    CHECK_MSG(found, "no store line in %s", p.log);
    const char *explicit_env[] = {home_env, ollama_env, NULL};
    CHECK_EQ_INT(sp_spawn(&p, "hearth-models", explicit_env), 0);
    sp_stop(&p);
    CHECK(hl_file_read(p.log, &log, &len, NULL) == HL_OK);
    found = strstr(log, "models:") != NULL;
    free(log);
    CHECK(!found);
}
