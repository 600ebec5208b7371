/*
 * redisproc.h - test helper: Debian's redis-server as a child process on a free loopback
 * port, without persistence (--save '' --appendonly no). Tests skip when the binary is
 * absent (apt-get install redis-server).
 */
#ifndef HL_TESTS_REDISPROC_H
#define HL_TESTS_REDISPROC_H

#include <stdbool.h>
#include <sys/types.h>

#include "srvproc.h"

#define REDIS_BIN "/usr/bin/redis-server"

typedef struct redis_proc {
    pid_t pid;
    int port;
    char url[64]; /* redis://127.0.0.1:<port> */
} redis_proc;

bool redis_available(void);
/* Starts it and waits (up to 10 s) until it answers PING. */
bool redis_start(redis_proc *r, const char *tag);
void redis_stop(redis_proc *r); /* SIGKILL and reap; safe twice */
/* Keys matching "hearth:kv:*" (-1 when Redis does not answer). */
long redis_count_kv_keys(const redis_proc *r);
/* Spawns two `hearth serve` (tags tag_a, tag_b) sharing r as their KV tier
 * (HEARTH_KV_REDIS). True when both started; stop each with sp_stop either way. */
bool redis_spawn_servers(const redis_proc *r, const char *tag_a, const char *tag_b, srv_proc *a,
                         srv_proc *b);

#endif
