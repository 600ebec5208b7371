/* create.c - `hearth create NAME [-f Modelfile] [-q TYPE]`: parses the Modelfile here,
 * uploads a FROM file as a blob (POST /api/blobs/<digest>, skipped when the server has it),
 * then streams /api/create progress. -q/--quantize TYPE is /api/create's "quantize": the
 * server converts the weights (src/quant) as the model is created. Progress (cli_progress):
 * on a terminal, bars on stderr for hashing the file ("gathering model components"), for
 * copying it ("copying file sha256:...") and for any server step with a total; otherwise
 * plain lines on stdout ("copying file sha256:... 50%", then each server status). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "cli/cli.h"
#include "net/http_client.h"
#include "store/modelfile.h"
#include "store/sha256.h"

/* Progress rows: bars on a terminal (stderr), else the plain lines on stdout. */
static cli_progress *g_prog;

/* Ends the live rows before an error line, so that no redraw moves over it. */
static void prog_stop(void) {
    cli_progress_end(g_prog);
    g_prog = NULL;
}
#define CREATE_FAIL(...) (prog_stop(), cli_fail(__VA_ARGS__))
#define CREATE_CONN(msg) (prog_stop(), cli_connect_error(msg))

static int hash_file(const char *path, char digest[80], uint64_t *size) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return CREATE_FAIL("%s: %s", path, strerror(errno));
    struct stat sb;
    uint64_t file_size = fstat(fd, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    bool tty = isatty(STDERR_FILENO);
    const char *status = "gathering model components";
    cli_progress_set(g_prog, NULL, status, tty ? file_size : 0, 0);
    char *buf = malloc(1 << 20);
    if (!buf) {
        close(fd);
        return CREATE_FAIL("out of memory");
    }
    sha256_ctx c;
    if (!sha256_init(&c)) {
        free(buf);
        close(fd);
        return CREATE_FAIL("out of memory");
    }
    *size = 0;
    ssize_t n;
    while ((n = read(fd, buf, 1 << 20)) > 0) {
        sha256_update(&c, buf, (size_t)n);
        *size += (uint64_t)n;
        if (tty) cli_progress_set(g_prog, NULL, status, file_size, *size);
    }
    free(buf);
    close(fd);
    if (n < 0) {
        sha256_discard(&c);
        return CREATE_FAIL("%s: %s", path, strerror(errno));
    }
    strcpy(digest, "sha256:");
    sha256_final_hex(&c, digest + 7);
    return 0;
}

static int upload_blob(const net_host *host, const char *path, const char *digest, uint64_t size) {
    char url[128];
    snprintf(url, sizeof url, "/api/blobs/%s", digest);
    int status;
    char *resp;
    hl_err err;
    if (net_http_request(host, "HEAD", url, NULL, 0, &status, &resp, NULL, &err) != HL_OK)
        return CREATE_CONN(err.msg);
    free(resp);
    if (status == 200) return 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return CREATE_FAIL("%s: %s", path, strerror(errno));
    net_http *h;
    if (net_http_open(host, "POST", url, "application/octet-stream", (int64_t)size, &h, &err) != HL_OK) {
        close(fd);
        return CREATE_CONN(err.msg);
    }
    char *buf = malloc(1 << 20);
    uint64_t sent = 0;
    char line[128];
    snprintf(line, sizeof line, "copying file %s", digest);
    hl_status st = buf ? HL_OK : hl_fail(&err, HL_ERR_NOMEM, "out of memory");
    while (st == HL_OK) {
        ssize_t n = read(fd, buf, 1 << 20);
        if (n < 0) st = hl_fail(&err, HL_ERR_IO, "%s: %s", path, strerror(errno));
        if (n <= 0) break;
        st = net_http_send(h, buf, (size_t)n, &err);
        sent += (uint64_t)n;
        if (st == HL_OK) cli_progress_set(g_prog, digest, line, size ? size : 1, size ? sent : 1);
    }
    free(buf);
    close(fd);
    char *body = NULL;
    size_t len;
    if (st == HL_OK) st = net_http_finish(h, &err);
    if (st == HL_OK) st = net_http_read_all(h, 1 << 20, &body, &len, &err);
    int code = st == HL_OK ? net_http_status(h) : 0;
    net_http_close(h);
    if (st != HL_OK) {
        free(body);
        return CREATE_CONN(err.msg);
    }
    int rc = 0;
    if (code >= 400) {
        json_t *j = json_loads(body, 0, NULL);
        const char *msg = json_string_value(json_object_get(j, "error"));
        rc = CREATE_FAIL("%s", msg ? msg : body);
        json_decref(j);
    }
    free(body);
    return rc;
}

static bool looks_like_path(const char *v) {
    size_t n = strlen(v);
    return v[0] == '/' || v[0] == '.' || v[0] == '~' || strchr(v, '/') != NULL ||
           (n > 5 && strcmp(v + n - 5, ".gguf") == 0);
}

/* Streams /api/create, printing each status. */
static int run_create(const net_host *host, json_t *req) {
    char *text = json_dumps(req, JSON_COMPACT);
    if (!text) return CREATE_FAIL("out of memory");
    net_http *h;
    hl_err err;
    hl_status st = net_http_open(host, "POST", "/api/create", "application/json",
                                 (int64_t)strlen(text), &h, &err);
    if (st != HL_OK) {
        free(text);
        return CREATE_CONN(err.msg);
    }
    st = net_http_send(h, text, strlen(text), &err);
    free(text);
    if (st == HL_OK) st = net_http_finish(h, &err);
    int rc = 0;
    bool success = false;
    char last[256] = "";
    while (st == HL_OK) {
        char *line;
        size_t len;
        st = net_http_read_line(h, &line, &len, &err);
        if (st != HL_OK || !line) break;
        if (len == 0) continue;
        json_t *j = json_loadb(line, len, 0, NULL);
        const char *e = json_string_value(json_object_get(j, "error"));
        const char *s = json_string_value(json_object_get(j, "status"));
        if (e) {
            rc = CREATE_FAIL("%s", e);
        } else if (s) {
            const char *digest = json_string_value(json_object_get(j, "digest"));
            uint64_t total = (uint64_t)json_integer_value(json_object_get(j, "total"));
            uint64_t completed = (uint64_t)json_integer_value(json_object_get(j, "completed"));
            if (isatty(STDERR_FILENO)) {
                cli_progress_set(g_prog, digest && total ? digest : NULL, s, digest ? total : 0, completed);
            } else if (strcmp(s, last) != 0) { /* a plain line per step, not per update */
                printf("%s\n", s);
                fflush(stdout);
                snprintf(last, sizeof last, "%s", s);
            }
            if (strcmp(s, "success") == 0) success = true;
        }
        json_decref(j);
        if (rc) break;
    }
    net_http_close(h);
    if (st != HL_OK) return CREATE_CONN(err.msg);
    if (!rc && !success) rc = CREATE_FAIL("the server ended the create stream without success");
    return rc;
}

int cmd_create(int argc, char **argv) {
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                         {"file", required_argument, NULL, 'f'},
                                         {"quantize", required_argument, NULL, 'q'},
                                         {NULL, 0, NULL, 0}};
    const char *file = NULL, *quantize = NULL;
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":hf:q:", opts, NULL)) != -1) {
        if (c == 'h') return cli_help(cli_usage_of("create"));
        if (c == 'f') file = optarg;
        else if (c == 'q') quantize = optarg;
        else return cli_flag_error(c, argv);
    }
    if (argc - optind != 1) return cli_fail("usage: hearth create MODEL [-f Modelfile] [-q TYPE]");
    const char *name = argv[optind];
    bool explicit_file = file != NULL;
    if (!file) file = "Modelfile";
    char *text;
    size_t len;
    hl_err err;
    if (hl_file_read(file, &text, &len, &err) != HL_OK)
        return explicit_file ? cli_fail("specified Modelfile wasn't found: %s", file)
                             : cli_fail("no Modelfile found in the current directory (use -f)");
    modelfile mf;
    hl_status st = modelfile_parse(text, len, &mf, &err);
    free(text);
    if (st != HL_OK) return cli_fail("%s: %s", file, err.msg);
    json_t *req = json_pack("{s:s}", "model", name);
    st = modelfile_to_create_request(&mf, req, &err);
    modelfile_free(&mf);
    if (st != HL_OK) {
        json_decref(req);
        return cli_fail("%s: %s", file, err.msg);
    }
    if (quantize && *quantize) json_object_set_new(req, "quantize", json_string(quantize));
    net_host host;
    if (!cli_host(&host)) {
        json_decref(req);
        return 1;
    }
    /* FROM: a local file is uploaded; otherwise it names a model (or a blob digest). */
    const char *from = json_string_value(json_object_get(req, "from"));
    char path[4096] = "";
    if (from && from[0] == '~') {
        const char *home = getenv("HOME");
        snprintf(path, sizeof path, "%s%s", home ? home : "", from + 1);
    } else if (from && from[0] == '/') {
        snprintf(path, sizeof path, "%s", from);
    } else if (from) {
        char *dup = strdup(file);
        snprintf(path, sizeof path, "%s/%s", dup ? dirname(dup) : ".", from);
        free(dup);
    }
    struct stat sb;
    int rc = 0;
    bool tty = isatty(STDERR_FILENO);
    g_prog = cli_progress_new(tty ? stderr : stdout, tty, true);
    if (!g_prog) {
        json_decref(req);
        return cli_fail("out of memory");
    }
    if (from && stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) {
            rc = CREATE_FAIL("FROM %s is a directory: hearth imports GGUF files only", from);
        } else {
            char digest[80];
            uint64_t size = 0;
            rc = hash_file(path, digest, &size);
            if (!rc) rc = upload_blob(&host, path, digest, size);
            if (!rc) {
                const char *base = strrchr(path, '/');
                json_object_set_new(req, "files", json_pack("{s:s}", base ? base + 1 : path, digest));
                json_object_del(req, "from");
            }
        }
    } else if (from && looks_like_path(from)) {
        rc = CREATE_FAIL("FROM file not found: %s", path);
    }
    if (!rc) rc = run_create(&host, req);
    prog_stop();
    json_decref(req);
    return rc;
}
