/*
 * cpu.c - usable CPUs from the affinity mask, physical cores from sysfs (see cpu.h).
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_* */
#include "base/cpu.h"

#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The usable CPU ids into cpus (up to cap); returns how many. Falls back to 0..n-1 of
 * the online count when the mask cannot be read. */
static int usable_cpus(int *cpus, int cap) {
    cpu_set_t set;
    CPU_ZERO(&set);
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        for (int c = 0; c < CPU_SETSIZE && n < cap; c++)
            if (CPU_ISSET(c, &set)) cpus[n++] = c;
    }
    if (n == 0) {
        const long online = sysconf(_SC_NPROCESSORS_ONLN);
        for (long c = 0; c < online && n < cap; c++) cpus[n++] = (int)c;
    }
    if (n == 0) cpus[n++] = 0;
    return n;
}

int hl_cpu_usable(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? (int)online : 1;
}

/* The CPU's SMT siblings (itself included) as sysfs lists them, e.g. "0,64" or "2-3";
 * false when missing. core_cpus_list is the current name, thread_siblings_list the old
 * one; both name the same set. */
static bool read_siblings(const char *dir, int cpu, char *buf, size_t cap) {
    static const char *const names[2] = {"core_cpus_list", "thread_siblings_list"};
    for (int k = 0; k < 2; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/cpu%d/topology/%s", dir, cpu, names[k]);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        const bool ok = fgets(buf, (int)cap, f) != NULL && buf[0] >= '0' && buf[0] <= '9';
        fclose(f);
        if (ok) {
            buf[strcspn(buf, "\n")] = '\0';
            return true;
        }
    }
    return false;
}

/* Distinct sibling sets = physical cores. A set is compared as sysfs prints it, which is
 * the same text for every CPU of one core. Unlike (package, core_id) pairs this also
 * holds where core ids repeat across clusters or dies of one package. */
int hl_cpu_count_cores(const char *sysfs_cpu_dir, const int *cpus, int n_cpus) {
    if (n_cpus <= 0) return 1;
    enum { SET_MAX = 64 };
    char(*sets)[SET_MAX] = malloc((size_t)n_cpus * SET_MAX);
    if (!sets) return n_cpus;
    int n_cores = 0;
    for (int i = 0; i < n_cpus; i++) {
        char cur[SET_MAX];
        if (!read_siblings(sysfs_cpu_dir, cpus[i], cur, sizeof cur)) { /* no topology */
            n_cores = n_cpus;
            break;
        }
        int seen = 0;
        for (int k = 0; k < n_cores && !seen; k++) seen = strcmp(sets[k], cur) == 0;
        if (!seen) memcpy(sets[n_cores++], cur, SET_MAX);
    }
    free(sets);
    return n_cores > 0 ? n_cores : 1;
}

int hl_cpu_default_threads(void) {
    int cpus[CPU_SETSIZE];
    const int n = usable_cpus(cpus, CPU_SETSIZE);
    return hl_cpu_count_cores("/sys/devices/system/cpu", cpus, n);
}
