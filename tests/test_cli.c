/* test_cli.c - the command line's conventions: every command's --help, -v, Go-formatted
 * durations, `create -q` quantizing through /api/create, and the REPL's line editing and
 * history driven through a pseudo-terminal. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "cli/cli_fmt.h"
#include "gguf/gguf.h"
#include "srvproc.h"
#include "tensor/types.h"
#include "test.h"

/* Go's time.Duration.String() for the same values (go1.22: fmt.Println(time.Duration(n))). */
TEST(cli_go_duration_format) {
    static const struct {
        int64_t ns;
        const char *go;
    } cases[] = {
        {0, "0s"},
        {1, "1ns"},
        {999, "999ns"},
        {1000, "1\xc2\xb5s"},
        {1500, "1.5\xc2\xb5s"},
        {12345, "12.345\xc2\xb5s"},
        {999999, "999.999\xc2\xb5s"},
        {1000000, "1ms"},
        {55275000, "55.275ms"},
        {55270000, "55.27ms"},
        {61145167, "61.145167ms"},
        {999999999, "999.999999ms"},
        {1000000000, "1s"},
        {1234567000, "1.234567s"},
        {7945641583, "7.945641583s"},
        {60000000000, "1m0s"},
        {123500000000, "2m3.5s"},
        {3600000000000, "1h0m0s"},
        {3723000000001, "1h2m3.000000001s"},
        {-55275000, "-55.275ms"},
        {-1, "-1ns"},
        {INT64_MAX, "2562047h47m16.854775807s"},
        {INT64_MIN, "-2562047h47m16.854775808s"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_go_duration(cases[i].ns, buf, sizeof buf);
        CHECK_MSG(strcmp(buf, cases[i].go) == 0, "%lld ns: got \"%s\", Go prints \"%s\"",
                  (long long)cases[i].ns, buf, cases[i].go);
    }
    /* Ollama's Metrics.Summary(): zero values are left out, rates with 2 decimals */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    cli_metrics m = {.total_ns = 1234567000, .load_ns = 55275000, .prompt_eval_count = 26,
                     .prompt_eval_ns = 130000000, .eval_count = 290, .eval_ns = 2500000000};
    cli_print_metrics(f, &m);
    fclose(f);
    CHECK_STR(text, "total duration:       1.234567s\n"
                    "load duration:        55.275ms\n"
                    "prompt eval count:    26 token(s)\n"
                    "prompt eval duration: 130ms\n"
                    "prompt eval rate:     200.00 tokens/s\n"
                    "eval count:           290 token(s)\n"
                    "eval duration:        2.5s\n"
                    "eval rate:            116.00 tokens/s\n");
    free(text);
}

static char g_out[65536], g_err[16384];
static int g_port = 1; /* nothing listens on port 1 */

static int cli(const char *stdin_text, const char *first, ...) {
    const char *args[15];
    int n = 0;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && n < 14; a = va_arg(ap, const char *)) args[n++] = a;
    va_end(ap);
    args[n] = NULL;
    return sp_run_cli(g_port, stdin_text, args, g_out, sizeof g_out, g_err, sizeof g_err);
}

static const char *const k_cmds[] = {"serve", "start",  "create", "show",     "run",   "stop",
                                      "pull",  "push",   "list",   "ls",       "ps",    "cp",
                                      "rm",    "generate", "embed", "quantize"};

/* Every command: --help and -h print its usage to stdout and exit 0, with no server and
 * nothing on stderr; `hearth help CMD` prints the same. */
TEST(cli_help_every_command) {
    if (!getenv("HEARTH_BIN")) SKIP("HEARTH_BIN not set (run through make test)");
    g_port = 1;
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++) {
        const char *cmd = k_cmds[i];
        const char *shown = !strcmp(cmd, "start") ? "serve" : !strcmp(cmd, "ls") ? "list" : cmd;
        char want[64];
        snprintf(want, sizeof want, "Usage:\n  hearth %s ", shown);
        static const char *const flags[] = {"--help", "-h"};
        for (int k = 0; k < 2; k++) {
            int rc = cli(NULL, cmd, flags[k], NULL);
            CHECK_MSG(rc == 0 && strstr(g_out, want) && strstr(g_out, "\nFlags:\n") &&
                          strstr(g_out, "-h, --help") && g_err[0] == '\0',
                      "hearth %s %s: rc %d, stdout \"%.300s\", stderr \"%s\"", cmd, flags[k], rc,
                      g_out, g_err);
        }
        char first[65536];
        snprintf(first, sizeof first, "%s", g_out);
        CHECK_EQ_INT(cli(NULL, "help", cmd, NULL), 0);
        CHECK_MSG(strcmp(g_out, first) == 0, "hearth help %s differs from --help", cmd);
        /* --help wins wherever it stands */
        CHECK_EQ_INT(cli(NULL, cmd, "somemodel", "--help", NULL), 0);
        CHECK_MSG(strstr(g_out, want) != NULL, "hearth %s somemodel --help: %.200s", cmd, g_out);
    }
    CHECK_EQ_INT(cli(NULL, "--help", NULL), 0);
    CHECK(strstr(g_out, "Usage:\n  hearth [flags]\n  hearth [command]\n") && strstr(g_out, "run "));
    CHECK_EQ_INT(cli(NULL, "help", NULL), 0);
    CHECK(strstr(g_out, "Available Commands:") != NULL);
    CHECK_EQ_INT(cli(NULL, NULL), 0); /* no arguments: the help, exit 0, as Ollama */
    CHECK(strstr(g_out, "Usage:\n  hearth [flags]\n") && strstr(g_out, "Available Commands:"));
    CHECK(cli(NULL, "help", "nope", NULL) != 0);
    /* unknown flags and missing values: one line, Ollama's words, exit 1 */
    CHECK_EQ_INT(cli(NULL, "show", "--bogus", "x", NULL), 1);
    CHECK_STR(g_err, "Error: unknown flag: --bogus\n");
    CHECK_EQ_INT(cli(NULL, "run", "x", "--format", NULL), 1);
    CHECK_STR(g_err, "Error: flag needs an argument: --format\n");
    CHECK_EQ_INT(cli(NULL, "list", "-z", NULL), 1);
    CHECK_STR(g_err, "Error: unknown shorthand flag: 'z' in -z\n");
    CHECK_EQ_INT(cli(NULL, "create", "x", "-q", NULL), 1);
    CHECK_STR(g_err, "Error: flag needs an argument: 'q' in -q\n");
    /* -v with no server: the client's version and a warning */
    for (int k = 0; k < 3; k++) {
        CHECK_EQ_INT(cli(NULL, k == 0 ? "-v" : k == 1 ? "--version" : "version", NULL), 0);
        CHECK_MSG(strcmp(g_out, "Warning: could not connect to a running hearth instance\n"
                                "Warning: client version is " HEARTH_VERSION "\n") == 0,
                  "%s", g_out);
    }
}

/* ------------------------------------------------------------------------------------ */

static const char *stories(void) {
    return test_shared_path("models/stories260K/stories260K.gguf");
}

/* With a server: rm --help deletes nothing, -v names the server's version, and
 * `create -q q8_0` stores Q8_0 weights that still run. */
static void with_server(srv_proc *p) {
    g_port = p->port;
    CHECK(sp_create_model(p, "s260", stories(), "\"parameters\":{\"temperature\":0,\"num_predict\":8}"));
    CHECK_EQ_INT(cli(NULL, "rm", "--help", NULL), 0);
    CHECK(strstr(g_out, "Usage:\n  hearth rm ") != NULL);
    CHECK_EQ_INT(cli(NULL, "rm", "s260", "-h", NULL), 0);
    CHECK_EQ_INT(sp_req(p, "POST", "/api/show", "{\"model\":\"s260\"}", NULL), 200);
    CHECK_EQ_INT(cli(NULL, "list", "--help", NULL), 0);
    CHECK(strstr(g_out, "NAME") == NULL);
    CHECK_EQ_INT(cli(NULL, "-v", NULL), 0);
    CHECK_STR(g_out, "hearth version is " HEARTH_VERSION "\n");

    /* --verbose: Ollama's lines, durations as Go prints them; no spinner in a pipe */
    CHECK_EQ_INT(cli(NULL, "run", "s260", "--verbose", "Once", NULL), 0);
    CHECK_MSG(strchr(g_err, '\033') == NULL && strchr(g_err, '\r') == NULL, "%s", g_err);
    static const char *const dur[] = {"total duration:       ", "load duration:        ",
                                      "prompt eval duration: ", "eval duration:        "};
    for (size_t k = 0; k < 4; k++) {
        const char *line = strstr(g_err, dur[k]);
        CHECK_MSG(line != NULL, "no '%s' in %s", dur[k], g_err);
        const char *v = line + strlen(dur[k]);
        char *end;
        double x = strtod(v, &end);
        size_t unit = strcspn(end, "\n");
        /* "55.275ms", "1.2s": a plain-seconds value is >= 1, else a smaller unit is used */
        bool go = x > 0 && unit >= 1 && unit <= 3 &&
                  (!strncmp(end, "ms\n", 3) || !strncmp(end, "\xc2\xb5s\n", 4) ||
                   !strncmp(end, "ns\n", 3) || (!strncmp(end, "s\n", 2) && x >= 1) ||
                   end[0] == 'm' || end[0] == 'h');
        CHECK_MSG(go, "not Go's format: %.*s", (int)(strcspn(line, "\n")), line);
    }
    CHECK(strstr(g_err, "eval rate:            ") && strstr(g_err, " tokens/s\n"));

    /* create -q q8_0 from an F32 GGUF */
    char dir[1100], link_path[1200], mf[1200], abs[4096];
    snprintf(dir, sizeof dir, "%s/q", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    CHECK(realpath(stories(), abs) != NULL);
    snprintf(link_path, sizeof link_path, "%s/story.gguf", dir);
    CHECK(symlink(abs, link_path) == 0);
    snprintf(mf, sizeof mf, "%s/Modelfile", dir);
    const char *text = "FROM ./story.gguf\nPARAMETER temperature 0\nPARAMETER num_predict 8\n";
    CHECK_OK(hl_file_write(mf, text, strlen(text), NULL), (hl_err *)NULL);
    CHECK_EQ_INT(cli(NULL, "create", "s260q", "-f", mf, "-q", "q8_0", NULL), 0);
    CHECK_MSG(strstr(g_out, "quantizing F32 model to Q8_0\n") && strstr(g_out, "success\n"), "%s%s",
              g_out, g_err);
    json_t *show = NULL;
    CHECK_EQ_INT(sp_req(p, "POST", "/api/show", "{\"model\":\"s260q\"}", &show), 200);
    const char *level =
        json_string_value(json_object_get(json_object_get(show, "details"), "quantization_level"));
    CHECK_MSG(level && !strcmp(level, "Q8_0"), "quantization_level %s", level ? level : "(none)");
    json_decref(show);
    /* the stored weights: every matrix whose rows hold whole 32-blocks is Q8_0 */
    json_t *tags = NULL;
    CHECK_EQ_INT(sp_req(p, "GET", "/api/tags", NULL, &tags), 200);
    size_t i;
    json_t *m;
    const char *digest = NULL;
    json_array_foreach(json_object_get(tags, "models"), i, m) {
        const char *n = json_string_value(json_object_get(m, "name"));
        if (n && !strcmp(n, "s260q:latest")) digest = json_string_value(json_object_get(m, "digest"));
    }
    CHECK(digest != NULL);
    char man_path[2048];
    snprintf(man_path, sizeof man_path, "%s/manifests/registry.ollama.ai/library/s260q/latest",
             p->models);
    char *man_text = NULL;
    size_t man_len = 0;
    CHECK_OK(hl_file_read(man_path, &man_text, &man_len, NULL), (hl_err *)NULL);
    json_t *man = json_loadb(man_text, man_len, 0, NULL);
    free(man_text);
    const char *blob = NULL;
    json_array_foreach(json_object_get(man, "layers"), i, m) {
        const char *mt = json_string_value(json_object_get(m, "mediaType"));
        if (mt && !strcmp(mt, "application/vnd.ollama.image.model"))
            blob = json_string_value(json_object_get(m, "digest"));
    }
    CHECK(blob && !strncmp(blob, "sha256:", 7));
    char blob_path[2048];
    snprintf(blob_path, sizeof blob_path, "%s/blobs/sha256-%s", p->models, blob + 7);
    json_decref(tags);
    gguf_file *g = NULL;
    hl_err err = {0};
    CHECK_OK(gguf_open(blob_path, &g, &err), &err);
    json_decref(man);
    int n_q8 = 0, n_bad = 0;
    char bad[256] = "";
    for (int64_t t = 0; t < gguf_n_tensors(g); t++) {
        const gguf_tensor *ti = gguf_tensor_at(g, t);
        if (ti->n_dims < 2) continue;
        if (ti->ne[0] % 32 == 0) {
            if (ti->type == HL_TYPE_Q8_0) n_q8++;
            else {
                n_bad++;
                snprintf(bad, sizeof bad, "%.*s type %u", (int)ti->name.len, ti->name.ptr, ti->type);
            }
        }
    }
    uint32_t ftype = 0;
    CHECK(gguf_get_u32(g, "general.file_type", &ftype) && ftype == 7);
    gguf_close(g);
    CHECK_MSG(n_q8 > 0 && n_bad == 0, "%d Q8_0 matrices, %d not (%s)", n_q8, n_bad, bad);
    /* it runs */
    CHECK_EQ_INT(cli(NULL, "run", "s260q", "Once upon a time", NULL), 0);
    CHECK_MSG(strlen(g_out) > 2, "%s", g_err);
    /* a type the quantizer does not know: a clear error */
    CHECK_EQ_INT(cli(NULL, "create", "s260x", "-f", mf, "--quantize", "q9_9", NULL), 1);
    CHECK_MSG(strstr(g_err, "unsupported quantization type q9_9") != NULL, "%s", g_err);
}

TEST(cli_help_version_rm_and_create_quantize) {
    if (!stories()) SKIP("models/stories260K/stories260K.gguf not found");
    SP_WITH_SERVER("clisrv", NULL, NULL, with_server);
}

/* ------------------------------------------------------------------------------------ */

typedef struct pty_run {
    int master;
    pid_t pid;
    char out[131072];
    size_t len;
} pty_run;

static void pty_drain(pty_run *r, int wait_ms) {
    struct pollfd pfd = {.fd = r->master, .events = POLLIN};
    while (poll(&pfd, 1, wait_ms) > 0) {
        char buf[4096];
        ssize_t n = read(r->master, buf, sizeof buf);
        if (n <= 0) break;
        size_t k = (size_t)n < sizeof r->out - 1 - r->len ? (size_t)n : sizeof r->out - 1 - r->len;
        memcpy(r->out + r->len, buf, k);
        r->len += k;
        r->out[r->len] = '\0';
        wait_ms = 0;
    }
}

/* Reads until needle shows up at or after offset `from` (30 s at most). */
static bool pty_wait(pty_run *r, size_t from, const char *needle) {
    for (int i = 0; i < 600; i++) {
        if (from <= r->len && strstr(r->out + from, needle)) return true;
        pty_drain(r, 50);
    }
    return false;
}

/* Waits for the prompt, then lets the REPL settle: keys typed before libedit has put the
 * terminal in raw mode would be taken by the line discipline (Ctrl-R is its reprint key),
 * which no person typing is fast enough to hit. */
static bool pty_wait_prompt(pty_run *r, size_t from) {
    if (!pty_wait(r, from, ">>> ")) return false;
    sp_sleep_ms(200);
    pty_drain(r, 0);
    return true;
}

static void pty_type(pty_run *r, const char *keys) {
    ssize_t w = write(r->master, keys, strlen(keys));
    (void)w;
}

static int count_user_messages(json_t *msgs, const char *content) {
    int n = 0;
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *c = json_string_value(json_object_get(m, "content"));
        if (role && c && !strcmp(role, "user") && !strcmp(c, content)) n++;
    }
    return n;
}

/* The REPL on a terminal: a line typed, then Up recalls it from history and Enter sends it
 * again; Ctrl-R finds it by a substring; /save keeps the conversation as the new model's
 * messages (so each send is on record); history is saved in ~/.hearth/history. */
static void repl_pty(srv_proc *p) {
    CHECK(sp_create_model(p, "s260", stories(), "\"parameters\":{\"temperature\":0,\"num_predict\":4}"));
    pty_run *r = calloc(1, sizeof *r);
    CHECK(r != NULL);
    char home[1100], hostv[64];
    snprintf(home, sizeof home, "%s/home", test_tmpdir());
    CHECK(mkdir(home, 0755) == 0);
    snprintf(hostv, sizeof hostv, "127.0.0.1:%d", p->port);
    struct winsize ws = {.ws_row = 40, .ws_col = 200};
    fflush(stdout);
    fflush(stderr);
    r->pid = forkpty(&r->master, NULL, NULL, &ws);
    if (r->pid == 0) {
        setenv("HEARTH_HOST", hostv, 1);
        setenv("HOME", home, 1);
        setenv("TERM", "xterm", 1);
        unsetenv("HEARTH_NOHISTORY");
        unsetenv("OLLAMA_NOHISTORY");
        const char *bin = getenv("HEARTH_BIN");
        execl(bin, bin, "run", "s260", (char *)NULL);
        _exit(127);
    }
    CHECK(r->pid > 0);
    bool ok = pty_wait_prompt(r, 0);
    size_t mark = r->len;
    if (ok) pty_type(r, "Once upon a time\r");
    ok = ok && pty_wait(r, mark, "Once upon a time") && pty_wait_prompt(r, mark + 20);
    /* Up: the line comes back from history; Enter sends it */
    mark = r->len;
    if (ok) pty_type(r, "\033[A");
    ok = ok && pty_wait(r, mark, "Once upon a time");
    mark = r->len;
    if (ok) pty_type(r, "\r");
    ok = ok && pty_wait_prompt(r, mark);
    /* Ctrl-R, a piece of it, Enter: sent a third time */
    mark = r->len;
    if (ok) pty_type(r, "\x12");
    pty_drain(r, 200);
    if (ok) pty_type(r, "upon");
    ok = ok && pty_wait(r, mark, "Once upon a time");
    mark = r->len;
    if (ok) pty_type(r, "\r");
    ok = ok && pty_wait_prompt(r, mark);
    mark = r->len;
    if (ok) pty_type(r, "/list\r");
    ok = ok && pty_wait(r, mark, "s260:latest") && pty_wait_prompt(r, mark);
    mark = r->len;
    if (ok) pty_type(r, "/load nope\r");
    ok = ok && pty_wait(r, mark, "Couldn't find model 'nope'") &&
         pty_wait_prompt(r, mark);
    mark = r->len;
    if (ok) pty_type(r, "/save s260-session\r");
    ok = ok && pty_wait(r, mark, "Created new model 's260-session'") && pty_wait_prompt(r, mark);
    if (ok) pty_type(r, "\x04"); /* Ctrl-D: exit */
    int status = -1;
    for (int i = 0; i < 200; i++) {
        pty_drain(r, 50);
        if (waitpid(r->pid, &status, WNOHANG) == r->pid) break;
        status = -1;
    }
    if (status == -1) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, &status, 0);
    }
    close(r->master);
    CHECK_MSG(ok, "the REPL did not go as typed; its terminal showed:\n%s", r->out);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "exit status %d", status);

    json_t *show = NULL;
    CHECK_EQ_INT(sp_req(p, "POST", "/api/show", "{\"model\":\"s260-session\"}", &show), 200);
    json_t *msgs = json_object_get(show, "messages");
    CHECK_MSG(count_user_messages(msgs, "Once upon a time") == 3, "messages: %s",
              json_dumps(msgs, JSON_COMPACT));
    json_decref(show);
    char hist[1200];
    snprintf(hist, sizeof hist, "%s/.hearth/history", home);
    char *h = NULL;
    size_t hl = 0;
    CHECK_OK(hl_file_read(hist, &h, &hl, NULL), (hl_err *)NULL);
    CHECK_MSG(!strncmp(h, "Once upon a time\n", 17) && strstr(h, "\n/list\n"), "history file: %s", h);
    free(h);
    free(r);
}

TEST(cli_repl_history_through_a_pty) {
    if (!stories()) SKIP("models/stories260K/stories260K.gguf not found");
    SP_WITH_SERVER("clipty", NULL, NULL, repl_pty);
}
