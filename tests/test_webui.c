/* test_webui.c - the chat page at / (server/webui.c, web/): content types, gzip, ETag
 * revalidation, same-origin API calls, the cached-token count the page shows, and the
 * page itself driven in headless Chromium by Playwright (tests/npm/webui.mjs; skipped
 * without /usr/bin/chromium or tests/npm/node_modules/playwright-core). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <libgen.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "srvproc.h"
#include "test.h"

/* ---------------- raw HTTP (binary bodies, our own headers) ---------------- */

typedef struct raw_resp {
    int status;
    char head[4096]; /* status line and headers */
    unsigned char *body;
    size_t body_len;
} raw_resp;

static void raw_free(raw_resp *r) {
    free(r->body);
    r->body = NULL;
}

/* Sends `METHOD path` with extra header lines (each ending in \r\n) and Connection:
 * close, and reads the whole reply. */
static bool raw_get(int port, const char *method, const char *path, const char *headers,
                    raw_resp *out) {
    memset(out, 0, sizeof *out);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return false;
    }
    char req[4096];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\n%sConnection: close\r\n\r\n", method, path,
                     headers);
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        return false;
    }
    size_t cap = 1 << 16, len = 0;
    unsigned char *buf = malloc(cap);
    ssize_t got;
    while (buf && (got = recv(fd, buf + len, cap - len, 0)) > 0) {
        len += (size_t)got;
        if (len == cap) {
            unsigned char *nb = realloc(buf, cap *= 2);
            if (!nb) break;
            buf = nb;
        }
    }
    close(fd);
    if (!buf) return false;
    unsigned char *sep = memmem(buf, len, "\r\n\r\n", 4);
    if (!sep) {
        free(buf);
        return false;
    }
    size_t hl = (size_t)(sep - buf);
    snprintf(out->head, sizeof out->head, "%.*s", (int)hl, (char *)buf);
    out->status = atoi(out->head + 9);
    out->body_len = len - hl - 4;
    out->body = malloc(out->body_len + 1);
    if (out->body) {
        memcpy(out->body, sep + 4, out->body_len);
        out->body[out->body_len] = '\0';
    }
    free(buf);
    return out->body != NULL;
}

/* The value of header `name` (case-insensitive) in r->head, copied into val. */
static bool header(const raw_resp *r, const char *name, char *val, size_t cap) {
    size_t n = strlen(name);
    for (const char *l = strstr(r->head, "\r\n"); l; l = strstr(l + 2, "\r\n")) {
        const char *s = l + 2;
        if (strncasecmp(s, name, n) == 0 && s[n] == ':') {
            s += n + 1;
            while (*s == ' ') s++;
            size_t len = strcspn(s, "\r");
            snprintf(val, cap, "%.*s", (int)len, s);
            return true;
        }
    }
    return false;
}

static unsigned char *gunzip(const unsigned char *data, size_t len, size_t *out_len) {
    size_t cap = 1 << 20;
    unsigned char *out = malloc(cap);
    z_stream z = {0};
    if (!out || inflateInit2(&z, 15 + 16) != Z_OK) {
        free(out);
        return NULL;
    }
    z.next_in = (Bytef *)data;
    z.avail_in = (uInt)len;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    int rc = inflate(&z, Z_FINISH);
    *out_len = z.total_out;
    inflateEnd(&z);
    if (rc != Z_STREAM_END) {
        free(out);
        return NULL;
    }
    return out;
}

/* ---------------- the page and its assets ---------------- */

static void page_and_assets(srv_proc *p) {
    raw_resp plain, gz, nm, r;
    char v[512], etag[128] = "";
    const char *html = "Host: 127.0.0.1\r\nAccept: text/html,application/xhtml+xml,*/*;q=0.8\r\n";

    CHECK(raw_get(p->port, "GET", "/", html, &plain));
    CHECK_EQ_INT(plain.status, 200);
    CHECK(header(&plain, "Content-Type", v, sizeof v));
    CHECK_STR(v, "text/html; charset=utf-8");
    CHECK(!header(&plain, "Content-Encoding", v, sizeof v));
    CHECK(header(&plain, "ETag", etag, sizeof etag) && etag[0] == '"');
    CHECK(header(&plain, "Cache-Control", v, sizeof v));
    CHECK_STR(v, "no-cache");
    CHECK(header(&plain, "Content-Security-Policy", v, sizeof v));
    CHECK(plain.body && strstr((char *)plain.body, "<!doctype html>") != NULL);
    CHECK(plain.body && strstr((char *)plain.body, "/webui/app.js") != NULL);

    /* gzip when accepted; it inflates to the same bytes */
    char h2[512];
    snprintf(h2, sizeof h2, "%sAccept-Encoding: gzip, deflate, br\r\n", html);
    CHECK(raw_get(p->port, "GET", "/", h2, &gz));
    CHECK_EQ_INT(gz.status, 200);
    CHECK(header(&gz, "Content-Encoding", v, sizeof v));
    CHECK_STR(v, "gzip");
    CHECK(header(&gz, "Vary", v, sizeof v) && strstr(v, "Accept-Encoding"));
    CHECK(gz.body_len < plain.body_len);
    size_t ul = 0;
    unsigned char *u = gz.body ? gunzip(gz.body, gz.body_len, &ul) : NULL;
    CHECK(u != NULL);
    CHECK(u && ul == plain.body_len && memcmp(u, plain.body, ul) == 0);
    free(u);
    /* q=0 refuses gzip */
    snprintf(h2, sizeof h2, "%sAccept-Encoding: gzip;q=0\r\n", html);
    CHECK(raw_get(p->port, "GET", "/", h2, &r));
    CHECK(!header(&r, "Content-Encoding", v, sizeof v));
    raw_free(&r);

    /* revalidation: the same tag is 304 without a body; another tag gets the page */
    snprintf(h2, sizeof h2, "%sIf-None-Match: W/\"x\", %s\r\n", html, etag);
    CHECK(raw_get(p->port, "GET", "/", h2, &nm));
    CHECK_EQ_INT(nm.status, 304);
    CHECK_EQ_INT((long long)nm.body_len, 0);
    CHECK(header(&nm, "ETag", v, sizeof v));
    CHECK_STR(v, etag);
    snprintf(h2, sizeof h2, "%sIf-None-Match: \"0000\"\r\n", html);
    CHECK(raw_get(p->port, "GET", "/", h2, &r));
    CHECK_EQ_INT(r.status, 200);
    raw_free(&r);

    /* Ollama's clients (no text/html in Accept) still get its heartbeat text */
    CHECK(raw_get(p->port, "GET", "/", "Host: 127.0.0.1\r\nAccept: */*\r\n", &r));
    CHECK_EQ_INT(r.status, 200);
    CHECK_STR((char *)r.body, "Ollama is running");
    raw_free(&r);

    /* the assets, with their types; unknown names and index.html under /webui/ are 404 */
    static const struct { const char *path, *type; } assets[] = {
        {"/webui/app.js", "text/javascript; charset=utf-8"},
        {"/webui/app.css", "text/css; charset=utf-8"},
    };
    for (size_t i = 0; i < sizeof assets / sizeof assets[0]; i++) {
        CHECK(raw_get(p->port, "GET", assets[i].path, "Host: 127.0.0.1\r\n", &r));
        CHECK_EQ_INT(r.status, 200);
        CHECK(header(&r, "Content-Type", v, sizeof v));
        CHECK_STR(v, assets[i].type);
        CHECK(header(&r, "X-Content-Type-Options", v, sizeof v));
        CHECK(r.body_len > 100);
        raw_free(&r);
    }
    CHECK(raw_get(p->port, "GET", "/webui/nope.js", "Host: 127.0.0.1\r\n", &r));
    CHECK_EQ_INT(r.status, 404);
    raw_free(&r);
    CHECK(raw_get(p->port, "GET", "/webui/index.html", "Host: 127.0.0.1\r\n", &r));
    CHECK_EQ_INT(r.status, 404);
    raw_free(&r);
    CHECK(raw_get(p->port, "POST", "/webui/app.js", "Host: 127.0.0.1\r\nContent-Length: 0\r\n", &r));
    CHECK_EQ_INT(r.status, 405);
    raw_free(&r);

    /* same origin: the page loaded from a LAN address calls the API from that origin */
    char hdr[512];
    snprintf(hdr, sizeof hdr, "Host: 192.168.1.5:%d\r\nOrigin: http://192.168.1.5:%d\r\n", p->port,
             p->port);
    CHECK(raw_get(p->port, "GET", "/api/tags", hdr, &r));
    CHECK_EQ_INT(r.status, 200);
    CHECK(header(&r, "Access-Control-Allow-Origin", v, sizeof v));
    raw_free(&r);
    /* ...but another origin is still refused, as is a public name claiming to be itself */
    snprintf(hdr, sizeof hdr, "Host: 192.168.1.5:%d\r\nOrigin: http://192.168.1.6:%d\r\n", p->port,
             p->port);
    CHECK(raw_get(p->port, "GET", "/api/tags", hdr, &r));
    CHECK_EQ_INT(r.status, 403);
    raw_free(&r);
    CHECK(raw_get(p->port, "GET", "/api/tags",
                  "Host: evil.example\r\nOrigin: http://evil.example\r\n", &r));
    CHECK_EQ_INT(r.status, 403);
    raw_free(&r);

    raw_free(&plain);
    raw_free(&gz);
    raw_free(&nm);
}

TEST(webui_page_assets_gzip_etag) { SP_WITH_SERVER("webui", NULL, NULL, page_and_assets); }

/* ---------------- what the page shows: prompt tokens served from the cache ---------------- */

static const char *stories(void) { return test_shared_path("models/stories260K/stories260K.gguf"); }

static bool make_a(const srv_proc *p) { return sp_create_model(p, "a", stories(), ""); }

static void cached_count(srv_proc *p) {
    const char *body = "{\"model\":\"a\",\"stream\":false,\"messages\":[{\"role\":\"user\","
                       "\"content\":\"Once upon a time there was a little dog\"}],"
                       "\"options\":{\"num_predict\":3,\"temperature\":0}}";
    json_t *j1 = NULL, *j2 = NULL;
    CHECK_EQ_INT(sp_req(p, "POST", "/api/chat", body, &j1), 200);
    CHECK_EQ_INT(sp_req(p, "POST", "/api/chat", body, &j2), 200);
    json_t *c1 = json_object_get(j1, "prompt_cached_count"), *c2 = json_object_get(j2, "prompt_cached_count");
    CHECK(json_is_integer(c1) && json_is_integer(c2));
    long long prompt = (long long)json_integer_value(json_object_get(j2, "prompt_eval_count"));
    CHECK_EQ_INT((long long)json_integer_value(c1), 0);
    /* the same prompt again: all but the last token come from the prefix cache */
    CHECK_MSG(json_integer_value(c2) > 0 && json_integer_value(c2) < prompt, "cached %lld of %lld",
              (long long)json_integer_value(c2), prompt);
    json_decref(j1);
    json_decref(j2);
}

TEST(webui_chat_reports_cached_prompt_tokens) {
    if (!stories()) SKIP("models/stories260K/stories260K.gguf not found");
    SP_WITH_SERVER("webui-cache", NULL, make_a, cached_count);
}

/* ---------------- the page in a browser ---------------- */

static void browser(srv_proc *p) {
    /* screenshots next to the binary under test: build/webui-screenshots/ */
    char shots[1024];
    const char *bin = getenv("HEARTH_BIN");
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", bin ? bin : "build/hearth");
    snprintf(shots, sizeof shots, "%s/webui-screenshots", dirname(tmp));
    if (mkdir(shots, 0755) != 0 && errno != EEXIST) CHECK_MSG(false, "mkdir %s", shots);
    setenv("WEBUI_SCREENSHOTS", shots, 1);
    char *text = NULL;
    bool ok = sp_run_node(p, "tests/npm/webui.mjs", "a", stories(), &text);
    CHECK_MSG(ok, "webui.mjs: %s", text ? text : "(no output)");
    free(text);
    unsetenv("WEBUI_SCREENSHOTS");
}

TEST(webui_browser_chat_stop_switch_reload) {
    if (!stories()) SKIP("models/stories260K/stories260K.gguf not found");
    if (!sp_node_available()) SKIP("node is not installed (the browser test needs Node.js)");
    if (access("/usr/bin/chromium", X_OK) != 0)
        SKIP("/usr/bin/chromium is missing: apt-get install chromium (.ci/run does)");
    if (access("tests/npm/node_modules/playwright-core/package.json", R_OK) != 0)
        SKIP("tests/npm/node_modules/playwright-core is missing: run `npm ci` in tests/npm "
             "(.ci/run does)");
    /* slow tokens, so a reply streams visibly and a long one is still running at Stop;
     * one slot, so a generation that Stop failed to cancel would hold up the next one */
    static const char *const env[] = {"HEARTH_RUNNER_TEST_TOKEN_DELAY_MS=20",
                                      "HEARTH_NUM_PARALLEL=1", NULL};
    SP_WITH_SERVER("webui-browser", env, make_a, browser);
}
