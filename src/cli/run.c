/*
 * run.c - `hearth run MODEL [PROMPT...]` and `hearth stop MODEL` (spec 7, 7.1).
 *
 * run: checks the model exists (/api/show) and pulls it when it does not (pull.c). With a prompt argument, or when stdin is not
 * a terminal (its text goes before the prompt), it answers once through /api/generate,
 * streaming the response to stdout. On a terminal it loads the model (an empty
 * /api/generate, a spinner on stderr meanwhile) and starts a REPL on libedit (line editing,
 * Up/Down through the history, Ctrl-R search; history in ~/.hearth/history, one line per
 * entry, not saved with HEARTH_NOHISTORY / OLLAMA_NOHISTORY or after /set nohistory): each
 * turn sends the whole conversation to /api/chat. REPL commands: /bye /exit, /clear,
 * /list, /load MODEL, /save NAME (a new model from this one with the session's system,
 * parameters and conversation as its messages), /set parameter NAME VALUE,
 * /set system TEXT, /set verbose|quiet, /set format json, /set noformat, /set think,
 * /set nothink, /set history|nohistory, /show info|license|modelfile|parameters|system|
 * template, /? /help [set|show|shortcuts]; `"""` starts and ends a multi-line message;
 * Ctrl-D exits; Ctrl-C stops a response.
 * Flags (getopt_long): --keepalive D, --verbose (Ollama's timing lines, cli_fmt.h),
 * --format json, --think[=false|low|medium|high], --hidethinking, --insecure (for that
 * pull); --nowordwrap and --truncate are accepted and ignored.
 *
 * stop: /api/generate with keep_alive 0 and no prompt.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <editline/readline.h>

#include "cli/cli.h"
#include "cli/cli_fmt.h"
#include "net/http_client.h"
#include "store/modelfile.h"

typedef struct run_state {
    const char *model;
    const char *keepalive;
    bool verbose;
    const char *format;
    json_t *think; /* NULL: unset */
    bool hide_thinking;
    json_t *options;  /* /set parameter */
    json_t *messages; /* the conversation */
    char *system;     /* /set system */
    char *model_owned; /* model after /load */
} run_state;

static volatile sig_atomic_t g_interrupted;
static bool g_edit;           /* stdin is a terminal: lines come from libedit */
static char g_hist_path[4096]; /* "" : history is not saved */
static bool g_hist_save = true; /* /set history | nohistory */

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static void catch_sigint(bool on) {
    struct sigaction sa = {0};
    sa.sa_handler = on ? on_sigint : SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a blocking read returns EINTR */
    sigaction(SIGINT, &sa, NULL);
}

typedef bool (*chunk_fn)(void *ud, json_t *chunk); /* false stops reading */

/* POSTs body and feeds each NDJSON line to fn. Returns 0, or 1 after printing an error. */
static int stream_call(const char *path, json_t *body, chunk_fn fn, void *ud) {
    net_host host;
    if (!cli_host(&host)) return 1;
    char *text = json_dumps(body, JSON_COMPACT);
    if (!text) return cli_fail("out of memory");
    net_http *h = NULL;
    hl_err err;
    size_t len = strlen(text);
    hl_status st = net_http_open(&host, "POST", path, "application/json", (int64_t)len, &h, &err);
    if (!st) st = net_http_send(h, text, len, &err);
    if (!st) st = net_http_finish(h, &err);
    free(text);
    if (st) {
        net_http_close(h);
        return cli_connect_error(err.msg);
    }
    int status = net_http_status(h), rc = 0;
    for (;;) {
        char *line;
        size_t n;
        st = net_http_read_line(h, &line, &n, &err);
        if (st) {
            if (!g_interrupted) rc = cli_fail("%s", err.msg);
            break;
        }
        if (!line) break;
        if (n == 0) continue;
        json_t *j = json_loadb(line, n, 0, NULL);
        const char *emsg = json_string_value(json_object_get(j, "error"));
        if (emsg || status >= 400) {
            rc = emsg ? cli_fail("%s", emsg) : cli_fail("%d: %.*s", status, (int)n, line);
            json_decref(j);
            break;
        }
        bool more = j ? fn(ud, j) : true;
        json_decref(j);
        if (!more || g_interrupted) break;
    }
    net_http_close(h);
    return rc;
}

typedef struct print_ctx {
    run_state *rs;
    bool chat;
    bool in_thinking;
    char last_char;
    char *reply; /* the assistant's content (chat) */
    size_t reply_len;
    json_t *final;
    cli_spinner *spin; /* until the first output */
} print_ctx;

static void print_ctx_append(print_ctx *p, const char *s) {
    size_t n = strlen(s);
    char *r = realloc(p->reply, p->reply_len + n + 1);
    if (!r) return;
    memcpy(r + p->reply_len, s, n + 1);
    p->reply = r;
    p->reply_len += n;
}

static void out_text(print_ctx *p, const char *s) {
    if (!*s) return;
    cli_spinner_stop(p->spin);
    p->spin = NULL;
    fputs(s, stdout);
    p->last_char = s[strlen(s) - 1];
    fflush(stdout);
}

static bool print_chunk(void *ud, json_t *chunk) {
    print_ctx *p = ud;
    json_t *holder = p->chat ? json_object_get(chunk, "message") : chunk;
    const char *thinking = json_string_value(json_object_get(holder, "thinking"));
    const char *content = json_string_value(json_object_get(holder, p->chat ? "content" : "response"));
    if (thinking && *thinking && !p->rs->hide_thinking) {
        if (!p->in_thinking) {
            out_text(p, "Thinking...\n");
            p->in_thinking = true;
        }
        out_text(p, thinking);
    }
    if (content && *content) {
        if (p->in_thinking) {
            out_text(p, "\n...done thinking.\n\n");
            p->in_thinking = false;
        }
        out_text(p, content);
        if (p->chat) print_ctx_append(p, content);
    }
    json_t *calls = json_object_get(holder, "tool_calls");
    if (json_array_size(calls) > 0) {
        char *t = json_dumps(calls, JSON_COMPACT);
        if (t) out_text(p, t);
        free(t);
    }
    if (json_is_true(json_object_get(chunk, "done"))) {
        json_decref(p->final);
        p->final = json_incref(chunk);
    }
    return true;
}

static void print_stats(const json_t *f) {
    if (!f) return;
    cli_metrics m = {
        .total_ns = json_integer_value(json_object_get(f, "total_duration")),
        .load_ns = json_integer_value(json_object_get(f, "load_duration")),
        .prompt_eval_count = json_integer_value(json_object_get(f, "prompt_eval_count")),
        .prompt_eval_ns = json_integer_value(json_object_get(f, "prompt_eval_duration")),
        .eval_count = json_integer_value(json_object_get(f, "eval_count")),
        .eval_ns = json_integer_value(json_object_get(f, "eval_duration")),
    };
    cli_print_metrics(stderr, &m);
}

static json_t *base_request(const run_state *rs) {
    json_t *b = json_pack("{s:s}", "model", rs->model);
    if (rs->keepalive) json_object_set_new(b, "keep_alive", json_string(rs->keepalive));
    if (rs->format) json_object_set_new(b, "format", json_string(rs->format));
    if (rs->think) json_object_set(b, "think", rs->think);
    if (json_object_size(rs->options) > 0) json_object_set(b, "options", rs->options);
    return b;
}

static bool ignore_chunk(void *ud, json_t *chunk) {
    (void)ud, (void)chunk;
    return true;
}

static int load_model(const run_state *rs) {
    json_t *b = json_pack("{s:s}", "model", rs->model);
    if (rs->keepalive) json_object_set_new(b, "keep_alive", json_string(rs->keepalive));
    cli_spinner *spin = cli_spinner_start(NULL);
    int rc = stream_call("/api/generate", b, ignore_chunk, NULL);
    cli_spinner_stop(spin);
    json_decref(b);
    return rc;
}

static int one_shot(run_state *rs, const char *prompt) {
    json_t *b = base_request(rs);
    json_object_set_new(b, "prompt", json_string(prompt));
    print_ctx p = {.rs = rs, .spin = cli_spinner_start(NULL)};
    int rc = stream_call("/api/generate", b, print_chunk, &p);
    cli_spinner_stop(p.spin);
    json_decref(b);
    if (p.in_thinking) out_text(&p, "\n...done thinking.\n\n");
    if (!rc || p.last_char) {
        fputs("\n", stdout);
        if (p.last_char && p.last_char != '\n') fputs("\n", stdout);
    }
    fflush(stdout);
    if (!rc && rs->verbose) print_stats(p.final);
    json_decref(p.final);
    free(p.reply);
    return rc;
}

/* ---- the REPL ---- */

static void repl_help(const char *topic) {
    if (topic && !strcmp(topic, "set")) {
        printf("Available Commands:\n"
               "  /set parameter ...     Set a parameter\n"
               "  /set system <string>   Set system message\n"
               "  /set verbose           Show LLM stats\n"
               "  /set quiet             Disable LLM stats\n"
               "  /set format json       Enable JSON mode\n"
               "  /set noformat          Disable formatting\n"
               "  /set think             Enable thinking\n"
               "  /set nothink           Disable thinking\n\n");
        return;
    }
    if (topic && !strcmp(topic, "show")) {
        printf("Available Commands:\n"
               "  /show info         Show details for this model\n"
               "  /show license      Show model license\n"
               "  /show modelfile    Show Modelfile for this model\n"
               "  /show parameters   Show parameters for this model\n"
               "  /show system       Show system message\n"
               "  /show template     Show prompt template\n\n");
        return;
    }
    if (topic && !strcmp(topic, "shortcuts")) {
        printf("Available keyboard shortcuts:\n"
               "  Ctrl + a            Move to the beginning of the line (Home)\n"
               "  Ctrl + e            Move to the end of the line (End)\n"
               "  Ctrl + r            Search the history backwards\n"
               "  Up, Down            Recall earlier messages and commands\n"
               "  Ctrl + k            Delete the sentence after the cursor\n"
               "  Ctrl + u            Delete the sentence before the cursor\n"
               "  Ctrl + w            Delete the word before the cursor\n\n"
               "  Ctrl + l            Clear the screen\n"
               "  Ctrl + c            Stop the model from responding\n"
               "  Ctrl + d            Exit hearth (/bye)\n\n");
        return;
    }
    printf("Available Commands:\n"
           "  /set            Set session variables\n"
           "  /show           Show model information\n"
           "  /load <model>   Load a session or model\n"
           "  /save <model>   Save your current session\n"
           "  /list           List models\n"
           "  /clear          Clear session context\n"
           "  /bye            Exit\n"
           "  /?, /help       Help for a command\n"
           "  /? shortcuts    Help for keyboard shortcuts\n\n"
           "Use \"\"\" to begin a multi-line message.\n\n");
}

/* /load MODEL: the conversation starts over with that model (Ollama's behaviour); a
 * model that does not exist keeps the current one. */
static void repl_load(run_state *rs, const char *name) {
    printf("Loading model '%s'\n", name);
    fflush(stdout);
    json_t *show = json_pack("{s:s}", "model", name);
    char *text = json_dumps(show, JSON_COMPACT);
    json_decref(show);
    net_host host;
    hl_err err;
    int status = 0;
    char *out = NULL;
    bool found = text && net_host_from_env(&host, &err) == HL_OK &&
                 net_http_request(&host, "POST", "/api/show", text, strlen(text), &status, &out,
                                  NULL, &err) == HL_OK &&
                 status == 200;
    free(text);
    free(out);
    if (!found) {
        printf("Couldn't find model '%s'\n", name);
        return;
    }
    char *owned = strdup(name);
    if (!owned) return;
    const char *prev = rs->model;
    rs->model = owned;
    if (load_model(rs) != 0) {
        rs->model = prev;
        free(owned);
        return;
    }
    free(rs->model_owned);
    rs->model_owned = owned;
    json_array_clear(rs->messages);
    if (rs->system)
        json_array_append_new(rs->messages,
                              json_pack("{s:s, s:s}", "role", "system", "content", rs->system));
}

/* /save NAME: a new model from the current one with this session's system message,
 * parameters and conversation (its MESSAGE lines), as Ollama's NewCreateRequest. */
static void repl_save(run_state *rs, const char *name) {
    json_t *req = json_pack("{s:s, s:s}", "model", name, "from", rs->model);
    if (rs->system) json_object_set_new(req, "system", json_string(rs->system));
    if (json_object_size(rs->options) > 0) json_object_set(req, "parameters", rs->options);
    if (json_array_size(rs->messages) > 0) json_object_set(req, "messages", rs->messages);
    json_object_set_new(req, "stream", json_false());
    net_host host;
    hl_err err;
    int status = 0;
    char *out = NULL;
    size_t out_len = 0;
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!text || net_host_from_env(&host, &err) != HL_OK ||
        net_http_request(&host, "POST", "/api/create", text, strlen(text), &status, &out,
                         &out_len, &err) != HL_OK) {
        printf("error: %s\n", text ? err.msg : "out of memory");
        free(text);
        return;
    }
    free(text);
    json_t *j = json_loadb(out, out_len, 0, NULL);
    const char *emsg = json_string_value(json_object_get(j, "error"));
    if (status >= 400 || emsg) {
        if (emsg && strstr(emsg, "invalid model name"))
            printf("error: The model name '%s' is invalid\n", name);
        else
            printf("error: %s\n", emsg ? emsg : "request failed");
    } else {
        printf("Created new model '%s'\n", name);
    }
    json_decref(j);
    free(out);
}

static void set_system(run_state *rs, const char *text) {
    free(rs->system);
    rs->system = strdup(text);
    /* replaces a trailing system message, else appends one */
    size_t n = json_array_size(rs->messages);
    json_t *last = n ? json_array_get(rs->messages, n - 1) : NULL;
    const char *role = json_string_value(json_object_get(last, "role"));
    json_t *m = json_pack("{s:s, s:s}", "role", "system", "content", text);
    if (role && !strcmp(role, "system")) json_array_set_new(rs->messages, n - 1, m);
    else json_array_append_new(rs->messages, m);
    printf("Set system message.\n");
}

static void repl_set(run_state *rs, char *args) {
    char *sp = strchr(args, ' ');
    char *rest = sp ? sp + 1 : (char *)"";
    if (sp) *sp = '\0';
    while (*rest == ' ') rest++;
    if (!strcmp(args, "parameter")) {
        char *name = rest, *val = strchr(rest, ' ');
        if (!*name || !val) {
            printf("Usage:\n  /set parameter <name> <value>\n");
            return;
        }
        *val++ = '\0';
        while (*val == ' ') val++;
        json_t *typed = NULL;
        hl_err err;
        if (modelfile_param_value(name, val, &typed, &err) != HL_OK) {
            printf("Couldn't set parameter: %s\n", err.msg);
            return;
        }
        if (typed) {
            if (!strcmp(name, "stop")) {
                json_t *arr = json_object_get(rs->options, "stop");
                if (!json_is_array(arr)) {
                    arr = json_array();
                    json_object_set_new(rs->options, "stop", arr);
                }
                json_array_append_new(arr, typed);
            } else {
                json_object_set_new(rs->options, name, typed);
            }
        }
        printf("Set parameter '%s' to '%s'\n", name, val);
    } else if (!strcmp(args, "system")) {
        set_system(rs, rest);
    } else if (!strcmp(args, "verbose")) {
        rs->verbose = true;
        printf("Set 'verbose' mode.\n");
    } else if (!strcmp(args, "quiet")) {
        rs->verbose = false;
        printf("Set 'quiet' mode.\n");
    } else if (!strcmp(args, "format")) {
        if (strcmp(rest, "json") != 0) {
            printf("Invalid or missing format. For 'json' mode use '/set format json'\n");
            return;
        }
        rs->format = "json";
        printf("Set format to 'json' mode.\n");
    } else if (!strcmp(args, "noformat")) {
        rs->format = NULL;
        printf("Disabled format.\n");
    } else if (!strcmp(args, "think")) {
        json_decref(rs->think);
        rs->think = *rest ? json_string(rest) : json_true();
        printf("Set 'think' mode.\n");
    } else if (!strcmp(args, "nothink")) {
        json_decref(rs->think);
        rs->think = json_false();
        printf("Set 'nothink' mode.\n");
    } else if (!strcmp(args, "history") || !strcmp(args, "nohistory")) {
        g_hist_save = !strcmp(args, "history");
        printf("Set '%s' mode.\n", args);
    } else if (!strcmp(args, "wordwrap") || !strcmp(args, "nowordwrap")) {
        printf("Set '%s' mode.\n", args);
    } else {
        printf("Unknown command '/set %s'. Type /? for help\n", args);
    }
}

static void repl_show(run_state *rs, const char *what) {
    char *argv[3] = {(char *)"show", (char *)rs->model, NULL};
    if (!strcmp(what, "info")) {
        cmd_show(2, argv);
    } else if (!strcmp(what, "license") || !strcmp(what, "modelfile") ||
               !strcmp(what, "template") || !strcmp(what, "parameters")) {
        char flag[32];
        snprintf(flag, sizeof flag, "--%s", what);
        argv[2] = flag;
        cmd_show(3, argv);
        if (!strcmp(what, "parameters") && json_object_size(rs->options) > 0) {
            printf("User defined parameters:\n");
            const char *k;
            json_t *v;
            json_object_foreach(rs->options, k, v) {
                char *t = json_dumps(v, JSON_ENCODE_ANY);
                printf("%-30s %s\n", k, t ? t : "");
                free(t);
            }
        }
    } else if (!strcmp(what, "system")) {
        if (rs->system) printf("%s\n", rs->system);
        else {
            argv[2] = (char *)"--system";
            cmd_show(3, argv);
        }
    } else {
        printf("Unknown command '/show %s'. Type /? for help\n", what);
    }
}

/* ---- line editing (libedit) and history ---- */


/* History lives in ~/.hearth/history, one line per entry as Ollama's ~/.ollama/history
 * (plain text, appended as lines are entered; the newest 1000 are kept); HEARTH_NOHISTORY
 * or OLLAMA_NOHISTORY keeps it in memory only. */
#define HISTORY_MAX 1000

static void history_open(void) {
    g_edit = true;
    rl_readline_name = "hearth";
    using_history();
    stifle_history(HISTORY_MAX);
    const char *no = getenv("HEARTH_NOHISTORY");
    if (!no || !*no) no = getenv("OLLAMA_NOHISTORY");
    const char *home = getenv("HOME");
    if ((no && *no) || !home || !*home) return;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/.hearth", home);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return;
    snprintf(g_hist_path, sizeof g_hist_path, "%s/history", dir);
    FILE *f = fopen(g_hist_path, "r");
    if (!f) return; /* absent the first time */
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int count = 0;
    while ((n = getline(&line, &cap, f)) >= 0) {
        if (n > 0 && line[n - 1] == '\n') line[--n] = '\0';
        if (n > 0) {
            add_history(line);
            count++;
        }
    }
    free(line);
    fclose(f);
    if (count <= HISTORY_MAX) return;
    /* trim the file to what the history keeps */
    f = fopen(g_hist_path, "w");
    if (!f) return;
    for (int i = 0; i < history_length; i++) {
        HIST_ENTRY *e = history_get(history_base + i);
        if (e && e->line) fprintf(f, "%s\n", e->line);
    }
    fclose(f);
}

static void history_add(const char *line) {
    if (!*line) return;
    add_history(line);
    if (!g_hist_save || !g_hist_path[0]) return;
    FILE *f = fopen(g_hist_path, "a");
    if (!f) return;
    fprintf(f, "%s\n", line);
    fclose(f);
}

static char *read_line(const char *prompt, bool *eof) {
    if (g_edit) {
        for (;;) {
            g_interrupted = 0;
            char *line = readline(prompt);
            if (line) {
                history_add(line);
                return line;
            }
            if (!g_interrupted) {
                *eof = true;
                return NULL;
            }
            printf("\nUse Ctrl + d or /bye to exit.\n");
            fflush(stdout);
        }
    }
    fputs(prompt, stdout);
    fflush(stdout);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    for (;;) {
        errno = 0;
        g_interrupted = 0;
        n = getline(&line, &cap, stdin);
        if (n >= 0) break;
        if (errno == EINTR) {
            clearerr(stdin);
            printf("\nUse Ctrl + d or /bye to exit.\n%s", prompt);
            fflush(stdout);
            continue;
        }
        free(line);
        *eof = true;
        return NULL;
    }
    if (n > 0 && line[n - 1] == '\n') line[--n] = '\0';
    if (n > 0 && line[n - 1] == '\r') line[--n] = '\0';
    return line;
}

/* Reads one message; handles the triple-quote multi-line form. */
static char *read_message(bool *eof) {
    char *line = read_line(">>> ", eof);
    if (!line) return NULL;
    if (strncmp(line, "\"\"\"", 3) != 0) return line;
    /* multi-line: until a line ending in """ */
    char *msg = strdup(line + 3);
    free(line);
    if (!msg) return NULL;
    size_t ml = strlen(msg);
    if (ml >= 3 && !strcmp(msg + ml - 3, "\"\"\"")) {
        msg[ml - 3] = '\0';
        return msg;
    }
    for (;;) {
        char *next = read_line("... ", eof);
        if (!next) return msg;
        size_t nl = strlen(next);
        bool end = nl >= 3 && !strcmp(next + nl - 3, "\"\"\"");
        if (end) next[nl - 3] = '\0';
        size_t cur = strlen(msg);
        char *grown = realloc(msg, cur + strlen(next) + 2);
        if (!grown) {
            free(next);
            return msg;
        }
        msg = grown;
        if (cur || !end || *next) {
            if (cur) strcat(msg, "\n");
            strcat(msg, next);
        }
        free(next);
        if (end) return msg;
    }
}

static void chat_turn(run_state *rs, const char *text) {
    json_array_append_new(rs->messages, json_pack("{s:s, s:s}", "role", "user", "content", text));
    json_t *b = base_request(rs);
    json_object_set(b, "messages", rs->messages);
    print_ctx p = {.rs = rs, .chat = true, .spin = cli_spinner_start(NULL)};
    g_interrupted = 0;
    catch_sigint(true);
    int rc = stream_call("/api/chat", b, print_chunk, &p);
    cli_spinner_stop(p.spin);
    catch_sigint(true);
    json_decref(b);
    if (p.in_thinking) out_text(&p, "\n...done thinking.\n");
    if (p.last_char) fputs(p.last_char == '\n' ? "\n" : "\n\n", stdout);
    fflush(stdout);
    if (!rc && !g_interrupted) {
        json_array_append_new(rs->messages, json_pack("{s:s, s:s}", "role", "assistant", "content",
                                                      p.reply ? p.reply : ""));
        if (rs->verbose) print_stats(p.final);
    } else {
        json_array_remove(rs->messages, json_array_size(rs->messages) - 1);
    }
    g_interrupted = 0;
    json_decref(p.final);
    free(p.reply);
}

static int repl(run_state *rs) {
    if (load_model(rs)) return 1;
    history_open();
    catch_sigint(true);
    for (;;) {
        bool eof = false;
        char *msg = read_message(&eof);
        if (!msg) {
            if (eof) {
                printf("\n");
                break;
            }
            continue;
        }
        char *t = msg;
        while (*t == ' ') t++;
        if (!strcmp(t, "/bye") || !strcmp(t, "/exit")) {
            free(msg);
            break;
        }
        if (!*t) {
        } else if (!strcmp(t, "/clear")) {
            json_array_clear(rs->messages);
            if (rs->system)
                json_array_append_new(rs->messages, json_pack("{s:s, s:s}", "role", "system",
                                                              "content", rs->system));
            printf("Cleared session context\n");
        } else if (!strcmp(t, "/list")) {
            char *argv[2] = {(char *)"list", NULL};
            cmd_list(1, argv);
        } else if ((!strncmp(t, "/load", 5) || !strncmp(t, "/save", 5)) && (t[5] == ' ' || !t[5])) {
            char name[512] = "", extra[8] = "";
            int n = sscanf(t + 5, "%511s %7s", name, extra);
            if (n != 1)
                printf("Usage:\n  %.5s <modelname>\n", t);
            else if (t[1] == 'l')
                repl_load(rs, name);
            else
                repl_save(rs, name);
        } else if (!strncmp(t, "/set", 4) && (t[4] == ' ' || !t[4])) {
            char *args = t + 4;
            while (*args == ' ') args++;
            if (!*args) repl_help("set");
            else repl_set(rs, args);
        } else if (!strncmp(t, "/show", 5) && (t[5] == ' ' || !t[5])) {
            char *args = t + 5;
            while (*args == ' ') args++;
            if (!*args) repl_help("show");
            else repl_show(rs, args);
        } else if (!strncmp(t, "/?", 2) || !strncmp(t, "/help", 5)) {
            char *args = strchr(t, ' ');
            while (args && *args == ' ') args++;
            repl_help(args && *args ? args : NULL);
        } else if (t[0] == '/' && !strchr(t, ' ')) {
            printf("Unknown command '%s'. Type /? for help\n", t);
        } else {
            chat_turn(rs, msg);
        }
        free(msg);
    }
    catch_sigint(false);
    return 0;
}

static char *read_all_stdin(void) {
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (len + 1 >= cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) break;
            buf = b;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, stdin);
        if (n == 0) break;
        len += n;
    }
    buf[len] = '\0';
    return buf;
}

/* Whether /api/show answers 404 (any other failure is reported by the real call). */
static bool model_missing(json_t *show) {
    net_host host;
    hl_err err;
    if (net_host_from_env(&host, &err) != HL_OK) return false;
    char *text = json_dumps(show, JSON_COMPACT);
    if (!text) return false;
    int status = 0;
    char *out = NULL;
    hl_status st = net_http_request(&host, "POST", "/api/show", text, strlen(text), &status, &out,
                                    NULL, &err);
    free(text);
    free(out);
    return st == HL_OK && status == 404;
}

int cmd_run(int argc, char **argv) {
    run_state rs = {0};
    char *prompt = NULL;
    size_t plen = 0;
    int rc = 0;
    bool insecure = false;
    static const struct option opts[] = {
        {"help", no_argument, NULL, 'h'},          {"verbose", no_argument, NULL, 'V'},
        {"hidethinking", no_argument, NULL, 'H'},  {"insecure", no_argument, NULL, 'I'},
        {"nowordwrap", no_argument, NULL, 'W'},    {"truncate", no_argument, NULL, 'R'},
        {"keepalive", required_argument, NULL, 'K'}, {"format", required_argument, NULL, 'F'},
        {"think", optional_argument, NULL, 'T'},   {NULL, 0, NULL, 0}};
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'h': rc = cli_help(cli_usage_of("run")); goto done;
        case 'V': rs.verbose = true; break;
        case 'H': rs.hide_thinking = true; break;
        case 'I': insecure = true; break;
        case 'W': case 'R': break; /* output is not wrapped; --truncate is the server's default */
        case 'K': rs.keepalive = optarg; break;
        case 'F': rs.format = optarg; break;
        case 'T': {
            const char *v = optarg ? optarg : "true";
            json_decref(rs.think);
            if (!strcmp(v, "true")) rs.think = json_true();
            else if (!strcmp(v, "false")) rs.think = json_false();
            else rs.think = json_string(v);
            break;
        }
        default: rc = cli_flag_error(c, argv); goto done;
        }
    }
    for (int i = optind; i < argc; i++) {
        const char *a = argv[i];
        if (!rs.model) {
            rs.model = a;
            continue;
        }
        size_t n = strlen(a);
        char *p = realloc(prompt, plen + n + 2);
        if (!p) {
            rc = cli_fail("out of memory");
            goto done;
        }
        prompt = p;
        if (plen) prompt[plen++] = ' ';
        memcpy(prompt + plen, a, n + 1);
        plen += n;
    }
    if (!rs.model) {
        rc = cli_fail("usage: hearth run MODEL [PROMPT]");
        goto done;
    }
    rs.options = json_object();
    rs.messages = json_array();
    json_t *show = json_pack("{s:s}", "model", rs.model), *info = NULL;
    if (model_missing(show) && (rc = cli_transfer("/api/pull", rs.model, insecure)) != 0) {
        json_decref(show);
        goto done;
    }
    rc = cli_call("POST", "/api/show", show, &info);
    json_decref(show);
    if (rc) goto done;
    /* the model's MESSAGE history is printed at start */
    json_t *hist = json_object_get(info, "messages");
    bool interactive = !prompt && isatty(STDIN_FILENO);
    if (!interactive) {
        if (!isatty(STDIN_FILENO)) {
            char *in = read_all_stdin();
            if (in && *in) {
                size_t il = strlen(in);
                char *joined = malloc(il + plen + 2);
                if (joined) {
                    memcpy(joined, in, il);
                    joined[il] = '\0';
                    if (plen) {
                        joined[il] = ' ';
                        memcpy(joined + il + 1, prompt, plen + 1);
                    }
                    free(prompt);
                    prompt = joined;
                    plen = strlen(prompt);
                }
            }
            free(in);
        }
        rc = one_shot(&rs, prompt ? prompt : "");
    } else {
        size_t i;
        json_t *m;
        json_array_foreach(hist, i, m) {
            const char *role = json_string_value(json_object_get(m, "role"));
            const char *content = json_string_value(json_object_get(m, "content"));
            if (!role || !content) continue;
            if (!strcmp(role, "user")) printf(">>> %s\n", content);
            else if (!strcmp(role, "assistant")) printf("%s\n\n", content);
        }
        rc = repl(&rs);
    }
    json_decref(info);
done:
    free(prompt);
    free(rs.system);
    free(rs.model_owned);
    json_decref(rs.think);
    json_decref(rs.options);
    json_decref(rs.messages);
    return rc;
}

int cmd_stop(int argc, char **argv) {
    int prc = cli_no_flags(argc, argv, "stop");
    if (prc >= 0) return prc;
    if (argc - optind != 1) return cli_fail("usage: hearth stop MODEL");
    argv += optind - 1; /* argv[1]: the model */
    json_t *b = json_pack("{s:s, s:i, s:b}", "model", argv[1], "keep_alive", 0, "stream", 0);
    net_host host;
    if (!cli_host(&host)) {
        json_decref(b);
        return 1;
    }
    char *text = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    if (!text) return cli_fail("out of memory");
    int status = 0;
    char *out = NULL;
    size_t out_len = 0;
    hl_err err;
    hl_status st = net_http_request(&host, "POST", "/api/generate", text, strlen(text), &status,
                                    &out, &out_len, &err);
    free(text);
    if (st) return cli_connect_error(err.msg);
    int rc = 0;
    if (status >= 400) {
        json_t *j = json_loadb(out, out_len, 0, NULL);
        const char *msg = json_string_value(json_object_get(j, "error"));
        if (msg && strstr(msg, "not found")) rc = cli_fail("couldn't find model \"%s\" to stop", argv[1]);
        else rc = cli_fail("%s", msg ? msg : "request failed");
        json_decref(j);
    }
    free(out);
    return rc;
}
