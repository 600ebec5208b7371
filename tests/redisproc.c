/*
 * redisproc.c - redis-server for tests (redisproc.h).
 */
#include "redisproc.h"

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "srvproc.h"
#include "test.h"

bool redis_available(void) { return access(REDIS_BIN, X_OK) == 0; }

static redisContext *connect_to(int port) {
    struct timeval tv = {0, 200000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c && (c->err || redisSetTimeout(c, tv) != REDIS_OK)) {
        redisFree(c);
        c = NULL;
    }
    return c;
}

bool redis_start(redis_proc *r, const char *tag) {
    memset(r, 0, sizeof *r);
    r->pid = -1;
    r->port = sp_free_port();
    if (r->port <= 0) return false;
    snprintf(r->url, sizeof r->url, "redis://127.0.0.1:%d", r->port);
    char log[1024], port[16];
    snprintf(log, sizeof log, "%s/redis-%s.log", test_tmpdir(), tag);
    snprintf(port, sizeof port, "%d", r->port);
    fflush(stdout);
    fflush(stderr);
    r->pid = fork();
    if (r->pid == 0) {
        FILE *f = freopen(log, "w", stdout);
        (void)f;
        dup2(STDOUT_FILENO, STDERR_FILENO);
        if (chdir(test_tmpdir()) != 0) _exit(126);
        execl(REDIS_BIN, REDIS_BIN, "--port", port, "--bind", "127.0.0.1", "--save", "",
              "--appendonly", "no", "--daemonize", "no", (char *)NULL);
        _exit(127);
    }
    if (r->pid < 0) return false;
    for (int i = 0; i < 200; i++) {
        redisContext *c = connect_to(r->port);
        if (c) {
            redisReply *rep = redisCommand(c, "PING");
            bool ok = rep && rep->type == REDIS_REPLY_STATUS;
            if (rep) freeReplyObject(rep);
            redisFree(c);
            if (ok) return true;
        }
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
    return false;
}

void redis_stop(redis_proc *r) {
    if (r->pid <= 0) return;
    kill(r->pid, SIGKILL);
    int st;
    waitpid(r->pid, &st, 0);
    r->pid = -1;
}

long redis_count_kv_keys(const redis_proc *r) {
    redisContext *c = connect_to(r->port);
    if (!c) return -1;
    long n = -1;
    redisReply *rep = redisCommand(c, "KEYS hearth:kv:*");
    if (rep && rep->type == REDIS_REPLY_ARRAY) n = (long)rep->elements;
    if (rep) freeReplyObject(rep);
    redisFree(c);
    return n;
}

bool redis_spawn_servers(const redis_proc *r, const char *tag_a, const char *tag_b, srv_proc *a,
                         srv_proc *b) {
    char env_redis[128]; /* read by the children only, after their fork */
    snprintf(env_redis, sizeof env_redis, "HEARTH_KV_REDIS=%s", r->url);
    const char *env[] = {env_redis, NULL};
    int ra = sp_spawn(a, tag_a, env), rb = sp_spawn(b, tag_b, env);
    return ra == 0 && rb == 0;
}
