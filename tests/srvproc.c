/* srvproc.c - see srvproc.h. */
#define _GNU_SOURCE
#include "srvproc.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "net/http_client.h"
#include "store/sha256.h"
#include "test.h"

void sp_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int sp_spawn(srv_proc *p, const char *tag, const char *const *env) {
    memset(p, 0, sizeof *p);
    const char *bin = getenv("HEARTH_BIN");
    if (!bin || access(bin, X_OK) != 0) return 1;
    snprintf(p->models, sizeof p->models, "%s/models-%s", test_tmpdir(), tag);
    snprintf(p->log, sizeof p->log, "%s/serve-%s.log", test_tmpdir(), tag);
    unlink(p->log); /* a restart under the same tag must not read the last run's port */
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(p->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        setenv("HEARTH_HOST", "127.0.0.1:0", 1);
        setenv("HEARTH_MODELS", p->models, 1);
        const char *clear[] = {"HEARTH_KEEP_ALIVE", "OLLAMA_KEEP_ALIVE", "HEARTH_CONTEXT_LENGTH",
                               "OLLAMA_CONTEXT_LENGTH", "HEARTH_MAX_LOADED_MODELS",
                               "OLLAMA_MAX_LOADED_MODELS", "HEARTH_MAX_MEMORY",
                               "HEARTH_NUM_PARALLEL", "HEARTH_MAX_QUEUE", "HEARTH_RUNNER",
                               "OLLAMA_NUM_PARALLEL", "OLLAMA_MAX_QUEUE", "HEARTH_DEBUG",
                               "OLLAMA_DEBUG"};
        for (size_t i = 0; i < sizeof clear / sizeof clear[0]; i++) unsetenv(clear[i]);
        for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
        execl(bin, bin, "serve", (char *)NULL);
        _exit(127);
    }
    p->pid = pid;
    for (int i = 0; i < 200; i++) {
        char *text;
        size_t len;
        if (hl_file_read(p->log, &text, &len, NULL) == HL_OK) {
            const char *m = strstr(text, "Listening on 127.0.0.1:");
            if (m) p->port = atoi(m + strlen("Listening on 127.0.0.1:"));
            free(text);
            if (p->port > 0) break;
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            p->pid = 0;
            return -1;
        }
        sp_sleep_ms(50);
    }
    if (p->port <= 0) return -1;
    net_host_parse("127.0.0.1", &p->host, NULL);
    p->host.port = p->port;
    return 0;
}

int sp_stop(srv_proc *p) {
    if (p->pid <= 0) return -1;
    kill(p->pid, SIGTERM);
    int status = 0;
    for (int i = 0; i < 200; i++) {
        if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
            p->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        sp_sleep_ms(50);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &status, 0);
    p->pid = 0;
    return -2;
}

void sp_dump_log(const srv_proc *p) {
    char *text;
    size_t len;
    if (hl_file_read(p->log, &text, &len, NULL) == HL_OK) {
        fprintf(stderr, "    server log (tail):\n%s\n", len > 4000 ? text + len - 4000 : text);
        free(text);
    }
}

hl_status sp_start_in_process(server_config *cfg, hl_server **srv, srv_proc *p, hl_err *err) {
    memset(p, 0, sizeof *p);
    snprintf(p->models, sizeof p->models, "%s/models", test_tmpdir());
    cfg->models_dir = p->models;
    net_host_parse("127.0.0.1:0", &cfg->bind, NULL);
    hl_status st = server_start(cfg, srv, err);
    if (st != HL_OK) return st;
    p->port = server_port(*srv);
    net_host_parse("127.0.0.1", &p->host, NULL);
    p->host.port = p->port;
    return HL_OK;
}

int sp_req(const srv_proc *p, const char *method, const char *path, const char *body,
           json_t **out) {
    if (out) *out = NULL;
    char *resp = NULL;
    int status = -1;
    hl_err err;
    if (net_http_request(&p->host, method, path, body, body ? strlen(body) : 0, &status, &resp,
                         NULL, &err) != HL_OK) {
        fprintf(stderr, "    request %s %s: %s\n", method, path, err.msg);
        return -1;
    }
    if (out && resp) *out = json_loads(resp, 0, NULL);
    free(resp);
    return status;
}

int sp_upload_file(const srv_proc *p, const char *path, char digest[80]) {
    char *data;
    size_t len;
    if (hl_file_read(path, &data, &len, NULL) != HL_OK) return -1;
    strcpy(digest, "sha256:");
    sha256_hex(data, len, digest + 7);
    char url[128];
    snprintf(url, sizeof url, "/api/blobs/%s", digest);
    int status = -1;
    char *resp = NULL;
    net_http_request(&p->host, "HEAD", url, NULL, 0, &status, &resp, NULL, NULL);
    free(resp);
    resp = NULL;
    if (status != 200) net_http_request(&p->host, "POST", url, data, len, &status, &resp, NULL, NULL);
    free(resp);
    free(data);
    return status;
}

bool sp_create_model(const srv_proc *p, const char *name, const char *gguf, const char *extra) {
    char digest[80];
    int status = sp_upload_file(p, gguf, digest);
    if (status != 200 && status != 201) return false;
    char body[4096];
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"files\":{\"m.gguf\":\"%s\"},\"stream\":false%s%s}", name,
             digest, *extra ? "," : "", extra);
    return sp_req(p, "POST", "/api/create", body, NULL) == 200;
}

int sp_ps_count(const srv_proc *p) {
    json_t *j;
    if (sp_req(p, "GET", "/api/ps", NULL, &j) != 200) return -1;
    int n = (int)json_array_size(json_object_get(j, "models"));
    json_decref(j);
    return n;
}

bool sp_ps_has(const srv_proc *p, const char *name) {
    json_t *j;
    if (sp_req(p, "GET", "/api/ps", NULL, &j) != 200) return false;
    bool found = false;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(j, "models"), i, m) {
        const char *n = json_string_value(json_object_get(m, "name"));
        if (n && strcmp(n, name) == 0) found = true;
    }
    json_decref(j);
    return found;
}

static void read_into(const char *path, char *buf, size_t cap) {
    char *text;
    size_t len;
    buf[0] = '\0';
    if (hl_file_read(path, &text, &len, NULL) == HL_OK) {
        snprintf(buf, cap, "%s", text);
        free(text);
    }
}

int sp_run_cli(int port, const char *stdin_text, const char *const *args, char *out,
               size_t out_cap, char *err, size_t err_cap) {
    const char *bin = getenv("HEARTH_BIN");
    const char *argv[16];
    int n = 0;
    argv[n++] = bin;
    for (int i = 0; args[i] && n < 15; i++) argv[n++] = args[i];
    argv[n] = NULL;
    char out_path[1100], err_path[1100], in_path[1100];
    snprintf(out_path, sizeof out_path, "%s/cli.out", test_tmpdir());
    snprintf(err_path, sizeof err_path, "%s/cli.err", test_tmpdir());
    snprintf(in_path, sizeof in_path, "%s/cli.in", test_tmpdir());
    if (stdin_text) {
        FILE *f = fopen(in_path, "w");
        if (f) {
            fputs(stdin_text, f);
            fclose(f);
        }
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        if (stdin_text) dup2(open(in_path, O_RDONLY), 0);
        dup2(open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
        dup2(open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
        char hostv[64];
        snprintf(hostv, sizeof hostv, "127.0.0.1:%d", port);
        setenv("HEARTH_HOST", hostv, 1);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    read_into(out_path, out, out_cap);
    read_into(err_path, err, err_cap);
    return pid > 0 && WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

int sp_children(pid_t pid, pid_t *out, int cap) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        char *end;
        long child = strtol(e->d_name, &end, 10);
        if (*end || child <= 0) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", child);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t got = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[got] = '\0';
        const char *rp = strrchr(buf, ')'); /* the name may hold spaces */
        char state;
        long ppid;
        if (rp && sscanf(rp + 1, " %c %ld", &state, &ppid) == 2 && ppid == pid && state != 'Z')
            out[n++] = (pid_t)child;
    }
    closedir(d);
    return n;
}

long sp_rss(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/statm", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    long size = 0, res = 0;
    if (fscanf(f, "%ld %ld", &size, &res) != 2) res = 0;
    fclose(f);
    return res * sysconf(_SC_PAGESIZE);
}

bool sp_node_available(void) {
    const char *path = getenv("PATH");
    if (!path) return false;
    char *copy = strdup(path);
    if (!copy) return false;
    bool found = false;
    for (char *save = NULL, *dir = strtok_r(copy, ":", &save); dir && !found;
         dir = strtok_r(NULL, ":", &save)) {
        char full[4096];
        snprintf(full, sizeof full, "%s/node", dir);
        found = access(full, X_OK) == 0;
    }
    free(copy);
    return found;
}

bool sp_run_node(const srv_proc *p, const char *script, const char *arg1, const char *arg2,
                 char **output) {
    char url[64], log[1100];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", p->port);
    snprintf(log, sizeof log, "%s/node.log", test_tmpdir());
    if (output) *output = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        setenv("HEARTH_URL", url, 1);
        execlp("node", "node", script, arg1, arg2, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    bool done = false;
    for (int i = 0; i < 1200 && !done; i++) { /* 60 s */
        if (waitpid(pid, &status, WNOHANG) == pid) done = true;
        else sp_sleep_ms(50);
    }
    if (!done) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    size_t len;
    if (output && hl_file_read(log, output, &len, NULL) != HL_OK) *output = NULL;
    return done && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}
