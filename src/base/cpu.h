/*
 * cpu.h - how many threads the compute pool uses by default.
 *
 * hl_cpu_usable() counts the CPUs this process may run on: its affinity mask (a
 * container's cpuset, taskset, numactl), not the machine's online count, which inside a
 * container pinned to 4 of 64 CPUs would start 64 threads fighting over 4.
 *
 * hl_cpu_default_threads() counts the physical cores among those CPUs. Two SMT siblings
 * share one core's vector units, caches and memory bandwidth: a second thread per core
 * makes a memory-bound decode no faster, and every pool run then waits for its slowest
 * thread. llama.cpp and Ollama default to physical cores as well. The topology comes
 * from sysfs (cpuN/topology/core_cpus_list, or thread_siblings_list on older kernels:
 * the SMT siblings of the CPU's core); where it cannot be read, every usable CPU counts
 * as a core. Hybrid CPUs' efficiency cores count as cores.
 *
 * No allocation is exposed; every function is thread-safe.
 */
#ifndef HL_BASE_CPU_H
#define HL_BASE_CPU_H

/* CPUs in the affinity mask (at least 1). */
int hl_cpu_usable(void);

/* Physical cores among the usable CPUs (at least 1). */
int hl_cpu_default_threads(void);

/* The counting behind hl_cpu_default_threads, for tests: distinct sibling sets of
 * cpus[0..n_cpus) under sysfs_cpu_dir (normally "/sys/devices/system/cpu"); n_cpus when
 * any CPU's topology cannot be read. */
int hl_cpu_count_cores(const char *sysfs_cpu_dir, const int *cpus, int n_cpus);

#endif
