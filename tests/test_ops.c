/* test_ops.c - operations: the Prometheus exposition (/metrics, a real Prometheus
 * scraping it), /health, and the log format (levels, timestamps, HEARTH_DEBUG). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <regex.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "net/http_client.h"
#include "server/metrics.h"
#include "srvproc.h"
#include "test.h"

/* ---------------- a strict parser of the text format (0.0.4) ---------------- */

#define MAX_LABELS 4
typedef struct sample {
    char name[128];
    int n_labels;
    char key[MAX_LABELS][32], val[MAX_LABELS][256];
    double value;
} sample;

typedef struct expo {
    sample *s;
    size_t n;
    char err[512];
} expo;

static bool expo_fail(expo *e, int line, const char *what, const char *text) {
    snprintf(e->err, sizeof e->err, "line %d: %s: %.200s", line, what, text);
    return false;
}

static bool is_name(const char *s, size_t n) {
    if (!n || !(s[0] == '_' || s[0] == ':' || (s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z')))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!(s[i] == '_' || s[i] == ':' || (s[i] >= 'a' && s[i] <= 'z') ||
              (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9')))
            return false;
    return true;
}

/* The family a sample name belongs to, given the family's TYPE. */
static bool in_family(const char *sname, const char *fam, const char *type) {
    size_t n = strlen(fam);
    if (strcmp(type, "histogram") != 0) return strcmp(sname, fam) == 0;
    return strncmp(sname, fam, n) == 0 &&
           (!strcmp(sname + n, "_bucket") || !strcmp(sname + n, "_sum") || !strcmp(sname + n, "_count"));
}

/* Parses every line; each sample must follow its family's HELP and TYPE, every name
 * start with hearth_, label values use only the format's escapes. */
static bool expo_parse(const char *text, expo *e) {
    memset(e, 0, sizeof *e);
    char fam[128] = "", type[32] = "";
    bool help_seen = false;
    char seen_types[64][128];
    int n_seen = 0;
    int ln = 0;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        if (!nl) return expo_fail(e, ln + 1, "last line without newline", p);
        char line[2048];
        size_t len = (size_t)(nl - p);
        if (len >= sizeof line) return expo_fail(e, ln + 1, "line too long", p);
        memcpy(line, p, len);
        line[len] = '\0';
        p = nl + 1;
        ln++;
        if (!len) return expo_fail(e, ln, "empty line", line);
        if (!strncmp(line, "# HELP ", 7)) {
            char *sp = strchr(line + 7, ' ');
            if (!sp || !is_name(line + 7, (size_t)(sp - line - 7))) return expo_fail(e, ln, "bad HELP", line);
            snprintf(fam, sizeof fam, "%.*s", (int)(sp - line - 7), line + 7);
            if (strncmp(fam, "hearth_", 7) != 0) return expo_fail(e, ln, "name without hearth_", line);
            for (const char *h = sp + 1; *h; h++)
                if (*h == '\\' && h[1] != '\\' && h[1] != 'n') return expo_fail(e, ln, "bad HELP escape", line);
            help_seen = true;
            type[0] = '\0';
            continue;
        }
        if (!strncmp(line, "# TYPE ", 7)) {
            char name[128], t[32];
            if (sscanf(line + 7, "%127s %31s", name, t) != 2 || strcmp(name, fam) != 0 || !help_seen)
                return expo_fail(e, ln, "TYPE not after its HELP", line);
            if (strcmp(t, "counter") && strcmp(t, "gauge") && strcmp(t, "histogram"))
                return expo_fail(e, ln, "unknown type", line);
            for (int i = 0; i < n_seen; i++)
                if (!strcmp(seen_types[i], name)) return expo_fail(e, ln, "family twice", line);
            if (n_seen < 64) snprintf(seen_types[n_seen++], sizeof seen_types[0], "%s", name);
            snprintf(type, sizeof type, "%s", t);
            help_seen = false;
            continue;
        }
        if (line[0] == '#') return expo_fail(e, ln, "unexpected comment", line);
        if (!type[0]) return expo_fail(e, ln, "sample before TYPE", line);
        sample s = {0};
        const char *q = line;
        size_t nn = strcspn(q, "{ ");
        if (!is_name(q, nn) || nn >= sizeof s.name) return expo_fail(e, ln, "bad sample name", line);
        memcpy(s.name, q, nn);
        q += nn;
        if (!in_family(s.name, fam, type)) return expo_fail(e, ln, "sample outside its family", line);
        if (*q == '{') {
            q++;
            while (*q != '}') {
                if (s.n_labels == MAX_LABELS) return expo_fail(e, ln, "too many labels", line);
                size_t kn = strcspn(q, "=");
                if (!is_name(q, kn) || kn >= sizeof s.key[0] || q[kn] != '=' || q[kn + 1] != '"')
                    return expo_fail(e, ln, "bad label", line);
                memcpy(s.key[s.n_labels], q, kn);
                q += kn + 2;
                size_t w = 0;
                while (*q != '"') {
                    if (!*q) return expo_fail(e, ln, "unterminated label value", line);
                    char c = *q++;
                    if (c == '\\') {
                        c = *q++;
                        if (c == 'n') c = '\n';
                        else if (c != '\\' && c != '"') return expo_fail(e, ln, "bad label escape", line);
                    }
                    if (w + 1 >= sizeof s.val[0]) return expo_fail(e, ln, "label too long", line);
                    s.val[s.n_labels][w++] = c;
                }
                q++;
                s.n_labels++;
                if (*q == ',') q++;
                else if (*q != '}') return expo_fail(e, ln, "bad label separator", line);
            }
            q++;
        }
        if (*q != ' ') return expo_fail(e, ln, "no space before the value", line);
        char *end;
        s.value = strtod(q + 1, &end);
        if (end == q + 1 || *end) return expo_fail(e, ln, "bad value", line);
        sample *ns = realloc(e->s, (e->n + 1) * sizeof *ns);
        if (!ns) return expo_fail(e, ln, "out of memory", line);
        e->s = ns;
        e->s[e->n++] = s;
    }
    return true;
}

static const char *label(const sample *s, const char *key) {
    for (int i = 0; i < s->n_labels; i++)
        if (!strcmp(s->key[i], key)) return s->val[i];
    return NULL;
}

/* The value of the sample named name whose labels include k1=v1 (and k2=v2); -1 if none. */
static double expo_get(const expo *e, const char *name, const char *k1, const char *v1,
                       const char *k2, const char *v2) {
    for (size_t i = 0; i < e->n; i++) {
        const sample *s = &e->s[i];
        if (strcmp(s->name, name)) continue;
        if (k1 && (!label(s, k1) || strcmp(label(s, k1), v1))) continue;
        if (k2 && (!label(s, k2) || strcmp(label(s, k2), v2))) continue;
        return s->value;
    }
    return -1;
}

/* Every histogram series (by model): le ascending, counts cumulative, +Inf last and
 * equal to _count; _sum present. */
static bool expo_check_histograms(const expo *e, char *why, size_t cap) {
    for (size_t i = 0; i < e->n; i++) {
        const sample *s = &e->s[i];
        size_t n = strlen(s->name);
        if (n < 7 || strcmp(s->name + n - 7, "_bucket")) continue;
        if (i > 0 && !strcmp(e->s[i - 1].name, s->name) &&
            !strcmp(label(&e->s[i - 1], "model") ?: "", label(s, "model") ?: ""))
            continue; /* not the first bucket of its series */
        char base[128];
        snprintf(base, sizeof base, "%.*s", (int)(n - 7), s->name);
        const char *model = label(s, "model");
        double prev_le = -1, prev = 0;
        size_t j = i;
        bool inf = false;
        for (; j < e->n && !strcmp(e->s[j].name, s->name) &&
               !strcmp(label(&e->s[j], "model") ?: "", model ?: "");
             j++) {
            const char *le = label(&e->s[j], "le");
            if (!le) return snprintf(why, cap, "%s: bucket without le", base), false;
            if (inf) return snprintf(why, cap, "%s: bucket after +Inf", base), false;
            double l = !strcmp(le, "+Inf") ? INFINITY : strtod(le, NULL);
            inf = isinf(l);
            if (l <= prev_le) return snprintf(why, cap, "%s: le not ascending at %s", base, le), false;
            if (e->s[j].value < prev) return snprintf(why, cap, "%s: not cumulative at %s", base, le), false;
            prev_le = l;
            prev = e->s[j].value;
        }
        if (!inf) return snprintf(why, cap, "%s: no +Inf bucket", base), false;
        char nm[160];
        snprintf(nm, sizeof nm, "%s_count", base);
        if (expo_get(e, nm, "model", model, NULL, NULL) != prev)
            return snprintf(why, cap, "%s: _count != +Inf bucket", base), false;
        snprintf(nm, sizeof nm, "%s_sum", base);
        if (expo_get(e, nm, "model", model, NULL, NULL) < 0)
            return snprintf(why, cap, "%s: no _sum", base), false;
    }
    return true;
}

/* ---------------- the format, unit level ---------------- */

TEST(metrics_text_format_every_line_parses) {
    metrics *m;
    CHECK_OK(metrics_create(&m, NULL), NULL);
    static const char gen[] = "/api/generate"; /* routes are long-lived strings */
    for (int i = 0; i < 3; i++) metrics_request(m, gen, 200);
    metrics_request(m, gen, 400);
    metrics_request(m, NULL, 404);
    metrics_request(m, NULL, 0); /* no reply: not counted */
    const char *weird = "we\"ird\\name\nx:latest";
    metrics_model *a = metrics_model_get(m, "a:latest"), *w = metrics_model_get(m, weird);
    CHECK(a && w && metrics_model_get(m, "a:latest") == a);
    metrics_tokens(a, 10, 4, 7);
    metrics_tokens(a, 5, 0, 3);
    metrics_tokens(w, 1, 1, 1);
    metrics_ttft(a, 3000000);          /* 3 ms: the first bucket */
    metrics_ttft(a, 700000000);        /* 0.7 s */
    metrics_ttft(a, 500000000000ULL);  /* 500 s: past every bound, +Inf only */
    for (int i = 0; i < 9; i++) metrics_token_latency(a, 20000000); /* 20 ms */
    metrics_tokens(NULL, 1, 1, 1);     /* NULL series: nothing, no crash */
    metrics_gauges g = {.kv_ram = 1 << 20, .kv_compressed = 4096, .kv_disk = 7, .queued = 2, .loaded = 1};
    char *text;
    size_t len;
    CHECK_OK(metrics_render(m, &g, &text, &len, NULL), NULL);
    CHECK(strlen(text) == len);
    expo e;
    bool ok = expo_parse(text, &e);
    CHECK_MSG(ok, "%s\n%s", e.err, text);
    char why[256] = "";
    CHECK_MSG(expo_check_histograms(&e, why, sizeof why), "%s\n%s", why, text);
    CHECK(expo_get(&e, "hearth_http_requests_total", "route", gen, "status", "200") == 3);
    CHECK(expo_get(&e, "hearth_http_requests_total", "route", gen, "status", "400") == 1);
    CHECK(expo_get(&e, "hearth_http_requests_total", "route", "other", "status", "404") == 1);
    CHECK(expo_get(&e, "hearth_http_requests_total", "status", "0", NULL, NULL) == -1);
    CHECK(expo_get(&e, "hearth_prompt_tokens_total", "model", "a:latest", NULL, NULL) == 15);
    CHECK(expo_get(&e, "hearth_prompt_cached_tokens_total", "model", "a:latest", NULL, NULL) == 4);
    CHECK(expo_get(&e, "hearth_generated_tokens_total", "model", "a:latest", NULL, NULL) == 10);
    /* the label escapes round-trip */
    CHECK(expo_get(&e, "hearth_generated_tokens_total", "model", weird, NULL, NULL) == 1);
    CHECK(expo_get(&e, "hearth_time_to_first_token_seconds_bucket", "model", "a:latest", "le", "0.005") == 1);
    CHECK(expo_get(&e, "hearth_time_to_first_token_seconds_bucket", "model", "a:latest", "le", "1") == 2);
    CHECK(expo_get(&e, "hearth_time_to_first_token_seconds_bucket", "model", "a:latest", "le", "+Inf") == 3);
    CHECK(expo_get(&e, "hearth_time_to_first_token_seconds_count", "model", "a:latest", NULL, NULL) == 3);
    CHECK_NEAR(expo_get(&e, "hearth_time_to_first_token_seconds_sum", "model", "a:latest", NULL, NULL),
               500.703, 1e-6);
    CHECK(expo_get(&e, "hearth_token_latency_seconds_bucket", "model", "a:latest", "le", "0.01") == 0);
    CHECK(expo_get(&e, "hearth_token_latency_seconds_bucket", "model", "a:latest", "le", "0.025") == 9);
    CHECK(expo_get(&e, "hearth_token_latency_seconds_count", "model", weird, NULL, NULL) == 0);
    CHECK(expo_get(&e, "hearth_kv_cache_bytes", "tier", "ram", NULL, NULL) == 1 << 20);
    CHECK(expo_get(&e, "hearth_kv_cache_bytes", "tier", "compressed", NULL, NULL) == 4096);
    CHECK(expo_get(&e, "hearth_kv_cache_bytes", "tier", "disk", NULL, NULL) == 7);
    CHECK(expo_get(&e, "hearth_queue_depth", NULL, NULL, NULL, NULL) == 2);
    CHECK(expo_get(&e, "hearth_loaded_models", NULL, NULL, NULL, NULL) == 1);
    free(e.s);
    free(text);
    /* the parser itself rejects what the format forbids */
    CHECK(!expo_parse("# HELP hearth_x x\n# TYPE hearth_x counter\nhearth_x{a=\"\\t\"} 1\n", &e));
    free(e.s);
    CHECK(!expo_parse("hearth_x 1\n", &e));
    free(e.s);
    CHECK(!expo_parse("# HELP hearth_x x\n# TYPE hearth_x counter\nhearth_y 1\n", &e));
    free(e.s);
    metrics_destroy(m);
    /* no metrics at all: the families are still there, empty */
    CHECK_OK(metrics_render(NULL, NULL, &text, &len, NULL), NULL);
    CHECK_MSG(expo_parse(text, &e), "%s", e.err);
    CHECK(expo_get(&e, "hearth_loaded_models", NULL, NULL, NULL, NULL) == 0);
    free(e.s);
    free(text);
}

TEST(metrics_label_escape_rules) {
    char out[64];
    CHECK_STR(metrics_label_escape("a\"b\\c\nd", out, sizeof out), "a\\\"b\\\\c\\nd");
    CHECK_STR(metrics_label_escape("caf\xc3\xa9 \xff", out, sizeof out), "caf\xc3\xa9 ?");
    CHECK_STR(metrics_label_escape("abcdef", out, 4), "abc");
    CHECK_STR(metrics_label_escape("\"\"", out, 4), "\\\""); /* never half an escape */
}

/* ---------------- the log format ---------------- */

TEST(log_lines_are_leveled_timestamped_and_escaped) {
    char path[1200];
    snprintf(path, sizeof path, "%s/log.txt", test_tmpdir());
    FILE *f = fopen(path, "w+");
    CHECK(f != NULL);
    hl_log_set_output(f);
    hl_log_set_level(HL_LOG_INFO);
    HL_DEBUG("hidden %d", 1);
    HL_INFO("plain");
    HL_WARN("two words");
    HL_LOG_ATTRS(HL_LOG_ERROR, "bad option", "option", "x\n[hearth] forged \"q\" \\", "n", "3");
    hl_log_set_level(HL_LOG_DEBUG);
    HL_DEBUG("shown %d", 2);
    hl_log_set_output(NULL);
    hl_log_set_level(HL_LOG_INFO);
    fclose(f);
    char *text;
    size_t len;
    CHECK_OK(hl_file_read(path, &text, &len, NULL), NULL);
    regex_t re;
    CHECK(regcomp(&re, "^time=[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
                       "level=(DEBUG|INFO|WARN|ERROR) source=test_ops\\.c:[0-9]+ msg=",
                  REG_EXTENDED | REG_NOSUB) == 0);
    int lines = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        CHECK_MSG(regexec(&re, l, 0, NULL, 0) == 0, "line %d: %s", lines, l);
        static const char *const want[] = {
            "level=INFO", "msg=plain", "level=WARN", "msg=\"two words\"", "level=ERROR",
            "msg=\"bad option\" option=\"x\\n[hearth] forged \\\"q\\\" \\\\\" n=3", "level=DEBUG",
            "msg=\"shown 2\""};
        CHECK(lines < 4);
        CHECK_MSG(strstr(l, want[2 * lines]) && strstr(l, want[2 * lines + 1]), "%s", l);
        lines++;
    }
    regfree(&re);
    free(text);
    CHECK_EQ_INT(lines, 4);
    CHECK(hl_log_env_truthy("1") && hl_log_env_truthy("true") && hl_log_env_truthy("2"));
    CHECK(!hl_log_env_truthy("0") && !hl_log_env_truthy("false") && !hl_log_env_truthy(""));
}

/* `hearth serve`'s whole log: every line leveled and timestamped, debug lines only
 * with the debug variable, and none of libmicrohttpd's own warnings. */
static void serve_log(const char *tag, const char *const *env, bool want_debug) {
    srv_proc p;
    int rc = sp_spawn(&p, tag, env);
    if (rc == 1) SKIP("HEARTH_BIN not set (run through make test)");
    CHECK_MSG(rc == 0, "server did not start");
    CHECK_EQ_INT(sp_req(&p, "GET", "/api/version", NULL, NULL), 200);
    CHECK_EQ_INT(sp_req(&p, "GET", "/health", NULL, NULL), 200);
    CHECK_EQ_INT(sp_req(&p, "HEAD", "/health", NULL, NULL), 200);
    CHECK_EQ_INT(sp_stop(&p), 0);
    char *text;
    size_t len;
    CHECK_OK(hl_file_read(p.log, &text, &len, NULL), NULL);
    regex_t re;
    CHECK(regcomp(&re, "^time=[0-9-]{10}T[0-9:]{8}\\.[0-9]{3}Z level=(DEBUG|INFO|WARN|ERROR) "
                       "source=[a-z_]+\\.c:[0-9]+ msg=",
                  REG_EXTENDED | REG_NOSUB) == 0);
    bool debug = false, request = false;
    int n = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save), n++) {
        if (regexec(&re, l, 0, NULL, 0) != 0) {
            test_fail_at(__FILE__, __LINE__, "not a log line: %s", l);
            break;
        }
        debug |= strstr(l, " level=DEBUG ") != NULL;
        request |= strstr(l, "msg=request status=200") && strstr(l, "path=/health");
    }
    regfree(&re);
    CHECK(n >= 3);
    CHECK_MSG(debug == want_debug, "debug lines %s expected", want_debug ? "" : "not");
    CHECK(request);
    free(text);
    CHECK_OK(hl_file_read(p.log, &text, &len, NULL), NULL);
    CHECK_MSG(strstr(text, "MHD_OPTION") == NULL, "%s", text);
    CHECK(!want_debug || strstr(text, "OLLAMA_FLASH_ATTENTION has no effect") != NULL);
    free(text);
}

TEST(log_serve_levels_and_debug_env) {
    const char *plain[] = {"OLLAMA_FLASH_ATTENTION=1", NULL};
    serve_log("plain", plain, false);
    if (test_failed()) return;
    const char *hdebug[] = {"OLLAMA_FLASH_ATTENTION=1", "HEARTH_DEBUG=1", NULL};
    serve_log("hdebug", hdebug, true);
    if (test_failed()) return;
    const char *odebug[] = {"OLLAMA_FLASH_ATTENTION=true", "OLLAMA_DEBUG=1", NULL};
    serve_log("odebug", odebug, true);
}

/* ---------------- /metrics from a live server ---------------- */

static const char *stories(void) { return test_shared_path("models/stories260K/stories260K.gguf"); }

/* What the test's requests added up to, from the responses themselves. */
typedef struct served {
    int generate_ok;
    long prompt, cached, generated;
} served;

/* A few generations (one repeated, so the prefix cache serves part of it), a 404, a 400. */
static bool drive_requests(const srv_proc *p, served *sv) {
    memset(sv, 0, sizeof *sv);
    if (!sp_create_model(p, "s260", stories(), "")) return false;
    const char *bodies[] = {
        "{\"model\":\"s260\",\"prompt\":\"Once upon a time\",\"raw\":true,\"stream\":false,"
        "\"options\":{\"temperature\":0,\"num_predict\":6}}",
        "{\"model\":\"s260\",\"prompt\":\"Once upon a time\",\"raw\":true,\"stream\":false,"
        "\"options\":{\"temperature\":0,\"num_predict\":6}}",
        "{\"model\":\"s260\",\"prompt\":\"The cat sat\",\"raw\":true,\"stream\":false,"
        "\"options\":{\"temperature\":0,\"num_predict\":4}}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        json_t *j = NULL;
        int st = sp_req(p, "POST", "/api/generate", bodies[i], &j);
        if (st != 200 || !j) {
            json_decref(j);
            return false;
        }
        sv->generate_ok++;
        sv->prompt += (long)json_integer_value(json_object_get(j, "prompt_eval_count"));
        sv->cached += (long)json_integer_value(json_object_get(j, "prompt_cached_count"));
        sv->generated += (long)json_integer_value(json_object_get(j, "eval_count"));
        json_decref(j);
    }
    return sp_req(p, "GET", "/no/such/route", NULL, NULL) == 404 &&
           sp_req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"options\":[]}", NULL) == 400;
}

static char *get_text(const net_host *h, const char *path, int *status) {
    char *resp = NULL;
    size_t len;
    if (net_http_request(h, "GET", path, NULL, 0, status, &resp, &len, NULL) != HL_OK) {
        free(resp);
        return NULL;
    }
    return resp;
}

static void metrics_live(srv_proc *p) {
    served sv;
    CHECK(drive_requests(p, &sv));
    CHECK(sv.generated > 0 && sv.cached > 0);
    int status = 0;
    char *text = get_text(&p->host, "/metrics", &status);
    CHECK(text && status == 200);
    expo e;
    bool ok = expo_parse(text, &e);
    CHECK_MSG(ok, "%s\n%s", e.err, text);
    char why[256] = "";
    ok = expo_check_histograms(&e, why, sizeof why);
    if (ok) ok = expo_get(&e, "hearth_http_requests_total", "route", "/api/generate", "status", "200") == 3;
    if (ok) ok = expo_get(&e, "hearth_http_requests_total", "route", "/api/generate", "status", "400") == 1;
    if (ok) ok = expo_get(&e, "hearth_http_requests_total", "route", "other", "status", "404") == 1;
    if (ok) ok = expo_get(&e, "hearth_prompt_tokens_total", "model", "s260:latest", NULL, NULL) == sv.prompt;
    if (ok) ok = expo_get(&e, "hearth_prompt_cached_tokens_total", "model", "s260:latest", NULL, NULL) == sv.cached;
    if (ok) ok = expo_get(&e, "hearth_generated_tokens_total", "model", "s260:latest", NULL, NULL) == sv.generated;
    if (ok) ok = expo_get(&e, "hearth_time_to_first_token_seconds_count", "model", "s260:latest", NULL, NULL) == 3;
    if (ok) ok = expo_get(&e, "hearth_token_latency_seconds_count", "model", "s260:latest", NULL, NULL) ==
                 sv.generated - 3;
    if (ok) ok = expo_get(&e, "hearth_loaded_models", NULL, NULL, NULL, NULL) == 1;
    if (ok) ok = expo_get(&e, "hearth_queue_depth", NULL, NULL, NULL, NULL) == 0;
    if (ok) ok = expo_get(&e, "hearth_kv_cache_bytes", "tier", "ram", NULL, NULL) > 0;
    CHECK_MSG(ok, "%s (served: prompt %ld cached %ld generated %ld)\n%s", why, sv.prompt, sv.cached,
              sv.generated, text);
    free(e.s);
    free(text);
    text = get_text(&p->host, "/health", &status);
    CHECK(text && status == 200 && strstr(text, "\"ok\""));
    free(text);
    /* OLLAMA_NUM_PARALLEL reached the runner (its startup line) */
    size_t len;
    CHECK_OK(hl_file_read(p->log, &text, &len, NULL), NULL);
    CHECK_MSG(strstr(text, "KV cache, 3 parallel)") != NULL, "%s", text);
    /* HEARTH_DEBUG: a debug line per generation */
    CHECK_MSG(strstr(text, "level=DEBUG source=api_infer.c") && strstr(text, "msg=generation model=s260:latest"),
              "%s", text);
    free(text);
}

TEST(metrics_served_counts_requests_and_tokens) {
    if (!stories()) SKIP("stories260K not in the shared data");
    static const char *const env[] = {"OLLAMA_NUM_PARALLEL=3", "HEARTH_DEBUG=1", NULL};
    SP_WITH_SERVER("metrics", env, NULL, metrics_live);
}

/* The queue-depth gauge sees requests waiting for the one batch slot. */
typedef struct slow_req {
    const srv_proc *p;
    int status;
} slow_req;

static void *slow_main(void *arg) {
    slow_req *q = arg;
    q->status = sp_req(q->p, "POST", "/api/generate",
                       "{\"model\":\"s260\",\"prompt\":\"Once\",\"raw\":true,\"stream\":false,"
                       "\"options\":{\"temperature\":0,\"num_predict\":12}}",
                       NULL);
    return NULL;
}

static double scrape_one(const srv_proc *p, const char *name) {
    int status = 0;
    char *text = get_text(&p->host, "/metrics", &status);
    expo e = {0};
    double v = -1;
    if (text && status == 200 && expo_parse(text, &e)) v = expo_get(&e, name, NULL, NULL, NULL, NULL);
    free(e.s);
    free(text);
    return v;
}

static void queue_live(srv_proc *p) {
    CHECK(sp_create_model(p, "s260", stories(), ""));
    /* loaded first, so that the requests below only wait for the slot */
    CHECK_EQ_INT(sp_req(p, "POST", "/api/generate", "{\"model\":\"s260\"}", NULL), 200);
    enum { N = 3 };
    slow_req q[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        q[i] = (slow_req){.p = p};
        CHECK(pthread_create(&th[i], NULL, slow_main, &q[i]) == 0);
    }
    double max_q = 0;
    for (int i = 0; i < 200 && max_q < N - 1; i++) {
        double v = scrape_one(p, "hearth_queue_depth");
        if (v > max_q) max_q = v;
        sp_sleep_ms(20);
    }
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) CHECK_EQ_INT(q[i].status, 200);
    CHECK_MSG(max_q == N - 1, "the most requests seen waiting: %g (want %d)", max_q, N - 1);
    CHECK(scrape_one(p, "hearth_queue_depth") == 0);
}

TEST(metrics_queue_depth_counts_waiting_requests) {
    if (!stories()) SKIP("stories260K not in the shared data");
    static const char *const env[] = {"HEARTH_NUM_PARALLEL=1",
                                      "HEARTH_RUNNER_TEST_TOKEN_DELAY_MS=60", NULL};
    SP_WITH_SERVER("queue", env, NULL, queue_live);
}

/* ---------------- a real Prometheus scrapes hearth ---------------- */

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &l) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* The single value of an instant query, or -1 (no result yet, or Prometheus not up). */
static double prom_query(const net_host *h, const char *query_escaped) {
    char path[1024];
    snprintf(path, sizeof path, "/api/v1/query?query=%s", query_escaped);
    int status = 0;
    char *text = get_text(h, path, &status);
    double v = -1;
    json_t *j = text && status == 200 ? json_loads(text, 0, NULL) : NULL;
    json_t *res = json_object_get(json_object_get(j, "data"), "result");
    if (json_array_size(res) == 1) {
        const char *s = json_string_value(json_array_get(json_object_get(json_array_get(res, 0), "value"), 1));
        if (s) v = strtod(s, NULL);
    }
    json_decref(j);
    free(text);
    return v;
}

static pid_t g_prom;

static void prometheus_scrape(srv_proc *p) {
    served sv;
    CHECK(drive_requests(p, &sv));
    const char *dir = test_tmpdir();
    char cfg[1200], data[1200], log[1200], text[1024];
    snprintf(cfg, sizeof cfg, "%s/prometheus.yml", dir);
    snprintf(data, sizeof data, "%s/prom-data", dir);
    snprintf(log, sizeof log, "%s/prometheus.log", dir);
    snprintf(text, sizeof text,
             "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
             "scrape_configs:\n  - job_name: hearth\n    scrape_interval: 1s\n"
             "    scrape_timeout: 1s\n    static_configs:\n      - targets: ['127.0.0.1:%d']\n",
             p->port);
    CHECK_OK(hl_file_write(cfg, text, strlen(text), NULL), NULL);
    int port = free_port();
    CHECK(port > 0);
    char a_cfg[1300], a_data[1300], a_listen[64];
    snprintf(a_cfg, sizeof a_cfg, "--config.file=%s", cfg);
    snprintf(a_data, sizeof a_data, "--storage.tsdb.path=%s", data);
    snprintf(a_listen, sizeof a_listen, "--web.listen-address=127.0.0.1:%d", port);
    fflush(stdout);
    fflush(stderr);
    g_prom = fork();
    CHECK(g_prom >= 0);
    if (g_prom == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl("/usr/bin/prometheus", "prometheus", a_cfg, a_data, a_listen, "--log.level=warn",
              (char *)NULL);
        _exit(127);
    }
    net_host h;
    net_host_parse("127.0.0.1", &h, NULL);
    h.port = port;
    /* hearth_http_requests_total{route="/api/generate",status="200"} and the tokens */
    const char *q_req = "hearth_http_requests_total%7Broute%3D%22%2Fapi%2Fgenerate%22%2Cstatus%3D%22200%22%7D";
    const char *q_gen = "sum(hearth_generated_tokens_total)";
    const char *q_prompt = "hearth_prompt_tokens_total%7Bmodel%3D%22s260%3Alatest%22%7D";
    double reqs = -1, gen = -1, prompt = -1;
    for (int i = 0; i < 300 && (reqs != 3 || gen != (double)sv.generated || prompt != (double)sv.prompt); i++) {
        sp_sleep_ms(100);
        reqs = prom_query(&h, q_req);
        gen = prom_query(&h, q_gen);
        prompt = prom_query(&h, q_prompt);
    }
    kill(g_prom, SIGTERM);
    int st;
    waitpid(g_prom, &st, 0);
    char *plog = NULL;
    size_t plen;
    hl_file_read(log, &plog, &plen, NULL);
    CHECK_MSG(reqs == 3 && gen == (double)sv.generated && prompt == (double)sv.prompt,
              "Prometheus saw requests %g (want 3), generated %g (want %ld), prompt %g (want %ld)\n%s",
              reqs, gen, sv.generated, prompt, sv.prompt, plog ? plog : "");
    free(plog);
}

TEST(metrics_prometheus_scrapes_hearth) {
    if (access("/usr/bin/prometheus", X_OK) != 0)
        SKIP("/usr/bin/prometheus not installed (apt-get install prometheus)");
    if (!stories()) SKIP("stories260K not in the shared data");
    SP_WITH_SERVER("prom", NULL, NULL, prometheus_scrape);
}
