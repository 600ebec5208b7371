/*
 * cpu.c - usable CPUs from the affinity mask, physical cores from sysfs (see cpu.h).
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_* */
#include "base/cpu.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
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

/* Reads one small non-negative integer file; -1 when missing or malformed. */
static long read_id(const char *dir, int cpu, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/cpu%d/topology/%s", dir, cpu, name);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long v = -1;
    if (fscanf(f, "%ld", &v) != 1 || v < 0) v = -1;
    fclose(f);
    return v;
}

int hl_cpu_count_cores(const char *sysfs_cpu_dir, const int *cpus, int n_cpus) {
    if (n_cpus <= 0) return 1;
    long *pkg = malloc(sizeof *pkg * (size_t)n_cpus);
    long *core = malloc(sizeof *core * (size_t)n_cpus);
    int n_cores = 0;
    for (int i = 0; pkg && core && i < n_cpus; i++) {
        const long p = read_id(sysfs_cpu_dir, cpus[i], "physical_package_id");
        const long c = read_id(sysfs_cpu_dir, cpus[i], "core_id");
        if (p < 0 || c < 0) { /* no topology: count CPUs */
            n_cores = n_cpus;
            break;
        }
        int seen = 0;
        for (int k = 0; k < n_cores && !seen; k++) seen = pkg[k] == p && core[k] == c;
        if (!seen) {
            pkg[n_cores] = p;
            core[n_cores] = c;
            n_cores++;
        }
    }
    if (!pkg || !core) n_cores = n_cpus;
    free(pkg);
    free(core);
    return n_cores > 0 ? n_cores : 1;
}

int hl_cpu_default_threads(void) {
    int cpus[CPU_SETSIZE];
    const int n = usable_cpus(cpus, CPU_SETSIZE);
    return hl_cpu_count_cores("/sys/devices/system/cpu", cpus, n);
}
