/*
 * edgepack's parallel runtime for TVM kernels: see ep_parallel.h for what it is for.
 *
 * A parallel loop is split into `threads * EP_PARTS_PER_THREAD` parts (the lambda TVM generated
 * computes part i of n itself). Each thread owns a block of consecutive parts, the caller block 0, so
 * that on a quiet machine a thread works on the same data in every kernel as with TVM's own pool;
 * a thread that has finished its block takes parts from the others' (from their front, through one
 * atomic counter per block). A parked worker's block is done by the rest; a kernel waits at most for
 * the part a thread was running when it was parked.
 *
 * Workers spin for EP_SPIN_NS after a loop for the next one (models run kernel after kernel), then
 * sleep on a condition variable. The caller, its parts done, spins for the others, then yields its core
 * (under load the thread it waits for may need it). One loop runs at a time: a loop started while
 * another thread's loop is in flight, or from inside a part, runs whole on its own thread.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ep_parallel.h"

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define EP_MAX_THREADS 256
#define EP_PARTS_PER_THREAD 4
#define EP_SPIN_NS 200000L   /* a worker's spin for the next loop before it sleeps */
#define EP_WAIT_SPIN_NS 20000L /* the caller's spin for the last parts before it yields */
#define EP_CACHE 16            /* libraries remembered: whether they synchronise inside a loop */
#define EP_CLOSED (1 << 28)    /* a block with no part left (a counter may overshoot it a little) */
/* Every EP_LOAD_NS the pool looks at how much of the CPUs other processes took (/proc/stat less this
   process's own time): with a core held by another app, a worker there would share it, and every kernel
   would wait for the part it was running when parked; the pool then uses only the cores left (the
   workers it does not use sleep); before the first interval, from the threads running now. Where
   /proc/stat cannot be read (Android apps), it uses every thread. */
#define EP_LOAD_NS 50000000L
#define EP_LOAD_LOOKS 4 /* looks at the threads running now before the pool gives up a core on them */
#define EP_GLANCE_NS 2000000L /* how often the threads running are looked at before the first interval */
#define EP_OTHERS_MARGIN 0.3 /* cores others must take beyond whole ones before one more is given up */

typedef struct {
  void* sync_handle;
  int32_t num_task;
} ep_group_env; /* TVMParallelGroupEnv */

typedef int (*ep_lambda)(int task_id, ep_group_env* penv, void* cdata);

typedef struct {
  _Alignas(64) atomic_int next; /* the next part of this block to run (may overshoot the block) */
} ep_block;

static struct {
  pthread_mutex_t config;  /* threads, workers, big cores */
  pthread_mutex_t launch;  /* one loop at a time */
  pthread_mutex_t sleep;   /* workers waiting for a loop */
  pthread_cond_t wake;
  atomic_uint published;   /* the latest loop's number: workers wait for it to change */
  atomic_int sleepers;
  atomic_int stop;
  atomic_ulong loops;      /* parallel loops run on this pool (inline ones included) */
  int threads;             /* threads a loop uses (0: not configured yet) */
  int workers;             /* worker threads started */
  pthread_t tid[EP_MAX_THREADS];
  cpu_set_t big;           /* the CPUs workers are pinned to */
  int pinned;              /* CPUs in `big` if workers are pinned, else 0 */
  int cpus;                /* CPUs this process may run on */
  int configured;          /* big cores read, blocks closed */
  atomic_int want;         /* threads loops use now: <= threads, fewer while other processes hold cores */
  pthread_cond_t idle;     /* workers beyond `want` wait here */
  long load_at;            /* when the load was last looked at (launch lock held) */
  long glance_at;          /* when the threads running were last looked at */
  int load_intervals;      /* intervals of CPU times the load was measured over */
  double load_busy, load_self; /* CPU seconds then: all processes (/proc/stat), this one */

  /* the loop in flight: written by its caller before it opens the blocks, read by a thread only after
     it has taken a part (so a worker that wakes late never reads a half-written loop) */
  ep_lambda fn;
  void* cdata;
  ep_group_env env;
  atomic_int blocks;       /* blocks of parts (the threads of the loop) */
  atomic_int per_block;    /* parts per block */
  _Alignas(64) atomic_int done;
  atomic_int failed;
  atomic_uint barrier;
  ep_block block[EP_MAX_THREADS];

  struct { void* base; int syncs; } cache[EP_CACHE];
  int cached;
} pool = {
  .config = PTHREAD_MUTEX_INITIALIZER,
  .launch = PTHREAD_MUTEX_INITIALIZER,
  .sleep = PTHREAD_MUTEX_INITIALIZER,
  .wake = PTHREAD_COND_INITIALIZER,
  .idle = PTHREAD_COND_INITIALIZER,
};

static __thread int ep_in_part;          /* a loop started inside a part runs inline */
static __thread unsigned ep_barrier_seen; /* barriers this part has passed */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield");
#endif
}

static long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------------------
 * the device: thread count and big cores */

static long read_long(const char* path) {
  FILE* f = fopen(path, "r");
  long v = -1;
  if (f != NULL) {
    if (fscanf(f, "%ld", &v) != 1) v = -1;
    fclose(f);
  }
  return v;
}

/* Where the kernel describes the CPUs ($EDGEPACK_SYSFS_CPU: a copy of that tree, for tests). */
static const char* sysfs_cpu(void) {
  const char* root = getenv("EDGEPACK_SYSFS_CPU");
  return root != NULL && root[0] != '\0' ? root : "/sys/devices/system/cpu";
}

/* The physical cores of the fastest kind among the CPUs this process may use; `big` gets those CPUs
   (hyper-threads of a core included). Returns the number of cores, and whether some allowed CPUs are
   slower (then workers are pinned to the big ones). */
static int big_cores(cpu_set_t* big, int* heterogeneous) {
  cpu_set_t allowed;
  long max_freq = -1, freq[CPU_SETSIZE];
  int cpu, cores = 0, count = 0;
  long seen[CPU_SETSIZE];
  CPU_ZERO(big);
  *heterogeneous = 0;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? (int)online : 1;
  }
  for (cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    char path[512];
    freq[cpu] = -1;
    if (!CPU_ISSET(cpu, &allowed)) continue;
    snprintf(path, sizeof(path), "%s/cpu%d/cpufreq/cpuinfo_max_freq", sysfs_cpu(), cpu);
    freq[cpu] = read_long(path);
    if (freq[cpu] > max_freq) max_freq = freq[cpu];
  }
  for (cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    char path[512];
    long package, core, id;
    int i, known = 0;
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (freq[cpu] != max_freq) {
      *heterogeneous = 1;
      continue;
    }
    CPU_SET(cpu, big);
    snprintf(path, sizeof(path), "%s/cpu%d/topology/physical_package_id", sysfs_cpu(), cpu);
    package = read_long(path);
    snprintf(path, sizeof(path), "%s/cpu%d/topology/core_id", sysfs_cpu(), cpu);
    core = read_long(path);
    id = (package < 0 || core < 0) ? -1 - cpu : package * 65536 + core;
    for (i = 0; i < count; ++i) known |= seen[i] == id;
    if (!known) {
      seen[count++] = id;
      ++cores;
    }
  }
  return cores > 0 ? cores : 1;
}

int ep_parallel_default_threads(void) {
  const char* env = getenv("TVM_NUM_THREADS");
  cpu_set_t big;
  int heterogeneous;
  if (env != NULL && atoi(env) > 0) return atoi(env) < EP_MAX_THREADS ? atoi(env) : EP_MAX_THREADS;
  return big_cores(&big, &heterogeneous);
}

/* ---------------------------------------------------------------------------------------------
 * running parts */

/* Run parts of the loop in flight, this thread's block first, then the others'. A part is taken from
   a block's counter; only the loop in flight opens counters (the others stay closed), so a part taken is
   one of its parts, and the loop's fields are read after that. */
static void run_parts(int slot) {
  int b;
  for (b = 0;; ++b) {
    int blocks = atomic_load_explicit(&pool.blocks, memory_order_relaxed);
    int block = blocks > 0 ? (slot + b) % blocks : 0;
    if (slot >= blocks || b >= blocks) return;
    for (;;) {
      int i = atomic_fetch_add_explicit(&pool.block[block].next, 1, memory_order_acquire);
      int per = atomic_load_explicit(&pool.per_block, memory_order_relaxed);
      int r, expected = 0;
      if (i >= per) break;
      ep_in_part = 1;
      ep_barrier_seen = 0;
      r = pool.fn(block * per + i, &pool.env, pool.cdata);
      ep_in_part = 0;
      if (r != 0) atomic_compare_exchange_strong(&pool.failed, &expected, r);
      atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
    }
  }
}

static void pin_to_big_cores(void) {
  if (pool.pinned > 0) sched_setaffinity(0, sizeof(pool.big), &pool.big); /* 0: this thread */
}

static void* worker_main(void* arg) {
  int slot = (int)(intptr_t)arg; /* worker i runs block i + 1; the caller runs block 0 */
  unsigned seen = atomic_load(&pool.published);
  pin_to_big_cores();
  for (;;) {
    unsigned now;
    if (slot >= atomic_load(&pool.want)) { /* not in use (fewer threads asked, or cores taken): sleep */
      pthread_mutex_lock(&pool.sleep);
      while (slot >= atomic_load(&pool.want) && !atomic_load(&pool.stop)) pthread_cond_wait(&pool.idle, &pool.sleep);
      pthread_mutex_unlock(&pool.sleep);
      /* `seen` stays: a loop published while it woke is run (its open parts taken; a finished one has none) */
    }
    now = atomic_load(&pool.published);
    if (now == seen) {
      long until = now_ns() + EP_SPIN_NS;
      int spins = 0;
      while ((now = atomic_load(&pool.published)) == seen && !atomic_load(&pool.stop)) {
        cpu_relax();
        if (++spins % 64 == 0 && now_ns() > until) {
          pthread_mutex_lock(&pool.sleep);
          atomic_fetch_add(&pool.sleepers, 1);
          while ((now = atomic_load(&pool.published)) == seen && !atomic_load(&pool.stop)) {
            pthread_cond_wait(&pool.wake, &pool.sleep);
          }
          atomic_fetch_sub(&pool.sleepers, 1);
          pthread_mutex_unlock(&pool.sleep);
          break;
        }
      }
    }
    if (atomic_load(&pool.stop)) return NULL;
    seen = now;
    run_parts(slot);
  }
}

/* The big cores, and every block closed (config lock held, before any worker starts). */
static void configure_device(void) {
  int heterogeneous, b;
  if (pool.configured) return;
  big_cores(&pool.big, &heterogeneous);
  pool.pinned = heterogeneous ? CPU_COUNT(&pool.big) : 0;
  {
    cpu_set_t allowed;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    pool.cpus = sched_getaffinity(0, sizeof(allowed), &allowed) == 0 ? CPU_COUNT(&allowed)
                                                                      : (online > 0 ? (int)online : 1);
  }
  for (b = 0; b < EP_MAX_THREADS; ++b) atomic_store(&pool.block[b].next, EP_CLOSED);
  pool.configured = 1;
}

/* Start workers up to threads - 1 (config lock held). Fewer start if the system refuses threads. */
static void start_workers(int threads) {
  while (pool.workers < threads - 1 && pool.workers < EP_MAX_THREADS - 1) {
    if (pthread_create(&pool.tid[pool.workers], NULL, worker_main, (void*)(intptr_t)(pool.workers + 1)) != 0) {
      break;
    }
    ++pool.workers;
  }
}

static int configured_threads(void) {
  int threads;
  pthread_mutex_lock(&pool.config);
  if (pool.threads == 0) {
    configure_device();
    pool.threads = ep_parallel_default_threads();
  }
  start_workers(pool.threads);
  threads = pool.threads < pool.workers + 1 ? pool.threads : pool.workers + 1;
  pthread_mutex_unlock(&pool.config);
  return threads;
}

/* Whether `name` is defined in the object loaded at `base`, looked up through `handle`. */
static int defined_in(void* handle, const char* name, void* base) {
  Dl_info where;
  void* symbol = dlsym(handle, name);
  return symbol != NULL && dladdr(symbol, &where) != 0 && where.dli_fbase == base;
}

/* Whether the library the lambda belongs to may synchronise inside a parallel loop (it has a
   __TVMBackendParallelBarrier); 1 where that cannot be told (a program that does not export its
   symbols). Remembered per library (launch lock held). */
static int may_synchronise(void* lambda) {
  Dl_info info;
  void* handle;
  int i, syncs = 1;
  if (dladdr(lambda, &info) == 0 || info.dli_fbase == NULL) return 1;
  for (i = 0; i < pool.cached; ++i) {
    if (pool.cache[i].base == info.dli_fbase) return pool.cache[i].syncs;
  }
  handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == NULL) handle = dlopen(NULL, RTLD_LAZY); /* the program itself */
  if (handle != NULL) {
    if (defined_in(handle, "__TVMBackendParallelLaunch", info.dli_fbase)) {
      syncs = defined_in(handle, "__TVMBackendParallelBarrier", info.dli_fbase);
    }
    dlclose(handle);
  }
  if (pool.cached < EP_CACHE) {
    pool.cache[pool.cached].base = info.dli_fbase;
    pool.cache[pool.cached].syncs = syncs;
    ++pool.cached;
  }
  return syncs;
}

static int run_inline(ep_lambda fn, void* cdata) {
  static __thread atomic_uint barrier;
  ep_group_env env;
  int r, outer = ep_in_part;
  unsigned seen = ep_barrier_seen;
  atomic_store(&barrier, 0);
  env.sync_handle = &barrier;
  env.num_task = 1;
  ep_in_part = 1;
  ep_barrier_seen = 0;
  r = fn(0, &env, cdata);
  ep_in_part = outer;
  ep_barrier_seen = seen;
  return r;
}

/* CPU seconds all processes have used (/proc/stat's first line: user to steal), < 0 if unreadable. */
static double busy_seconds(void) {
  unsigned long long v[8] = {0};
  long hz = sysconf(_SC_CLK_TCK);
  FILE* f = fopen("/proc/stat", "r");
  int n = 0;
  if (f == NULL) return -1;
  n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
             &v[7]);
  fclose(f);
  if (n < 8 || hz <= 0) return -1;
  return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)hz; /* not idle (3), iowait (4) */
}

/* Threads of other processes running now: /proc/stat's procs_running less this process's running threads
   (the look at the first loop, before an interval of CPU times exists: a model run once or a few times
   after start under load would otherwise be split across a busy core for its first EP_LOAD_NS); < 0 if
   it cannot be read. */
static int others_running(void) {
  char line[256], path[64];
  int running = -1, own = 0;
  DIR* tasks;
  struct dirent* task;
  FILE* f = fopen("/proc/stat", "r");
  if (f == NULL) return -1;
  while (fgets(line, sizeof line, f) != NULL) {
    if (sscanf(line, "procs_running %d", &running) == 1) break;
  }
  fclose(f);
  tasks = running < 0 ? NULL : opendir("/proc/self/task");
  if (tasks == NULL) return -1;
  while ((task = readdir(tasks)) != NULL) {
    const char* state;
    if (task->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "/proc/self/task/%.20s/stat", task->d_name);
    f = fopen(path, "r");
    if (f == NULL) continue;
    if (fgets(line, sizeof line, f) != NULL && (state = strrchr(line, ')')) != NULL && state[1] == ' ' &&
        state[2] == 'R') {
      ++own;
    }
    fclose(f);
  }
  closedir(tasks);
  return running > own ? running - own : 0;
}

/* The fewest others_running() of `first` (a look already taken, > 0) and more looks 50 us apart, up to
   EP_LOAD_LOOKS in all: another app's busy thread is running at every look, a short-lived task (or one of
   this process's threads between running and sleeping as the pool starts, read at two moments) at few (on
   a quiet machine, one look in ten saw one more). */
static int others_running_steadily(int first) {
  struct timespec pause = {0, 50000};
  int look, seen, fewest = first;
  for (look = 1; look < EP_LOAD_LOOKS && fewest > 0; ++look) {
    nanosleep(&pause, NULL);
    seen = others_running();
    if (seen < 0) return fewest;
    if (seen < fewest) fewest = seen;
  }
  return fewest;
}

static double own_seconds(void) {
  struct rusage use;
  if (getrusage(RUSAGE_SELF, &use) != 0) return -1;
  return (double)use.ru_utime.tv_sec + use.ru_utime.tv_usec / 1e6 + use.ru_stime.tv_sec + use.ru_stime.tv_usec / 1e6;
}

/* `threads`, or fewer where other processes hold `taken` of this process's CPUs (at least one). */
static int threads_available(int threads, int taken) {
  int free = pool.cpus - taken;
  return free >= threads ? threads : (free > 1 ? free : 1);
}

/* Threads for the next loops from the threads running now (before an interval of CPU times exists): one
   look that finds none of other processes gives every thread back; a core is given up only where several
   looks agree (``others_running_steadily``). */
static int glance(int threads, int want) {
  int taken = others_running();
  if (taken < 0) return want;
  if (taken > 0 && want == threads) taken = others_running_steadily(taken);
  return taken < 0 ? want : threads_available(threads, taken);
}

/* Threads for the next loops: `threads`, less the cores other processes took since the last look
   (launch lock held; at most every EP_LOAD_NS; until the first such interval has passed, a glance at the
   threads running now every EP_GLANCE_NS). */
static int threads_to_use(int threads, long now) {
  double busy, self, others;
  int taken, want = atomic_load(&pool.want);
  if (want < 1 || want > threads) want = threads;
  if (now - pool.load_at < EP_LOAD_NS) {
    if (pool.load_intervals == 0 && now - pool.glance_at >= EP_GLANCE_NS) {
      pool.glance_at = now;
      want = glance(threads, want);
    }
    return want;
  }
  busy = busy_seconds();
  self = own_seconds();
  if (busy >= 0 && self >= 0 && pool.load_at > 0) {
    others = ((busy - pool.load_busy) - (self - pool.load_self)) / ((double)(now - pool.load_at) / 1e9);
    taken = others > EP_OTHERS_MARGIN ? (int)(others + 1.0 - EP_OTHERS_MARGIN) : 0;
    want = threads_available(threads, taken);
    ++pool.load_intervals;
  } else if (busy < 0) {
    want = threads;
  } else {
    pool.glance_at = now;
    want = glance(threads, want);
  }
  pool.load_at = now;
  pool.load_busy = busy;
  pool.load_self = self;
  return want;
}

int ep_parallel_launch(void* lambda, void* cdata, int num_task) {
  ep_lambda fn = (ep_lambda)lambda;
  int threads, per, b, r, use;
  unsigned number;
  long until, started = now_ns();
  atomic_fetch_add_explicit(&pool.loops, 1, memory_order_relaxed);
  if (ep_in_part) return run_inline(fn, cdata);
  threads = configured_threads();
  if (threads <= 1 || pthread_mutex_trylock(&pool.launch) != 0) return run_inline(fn, cdata);
  use = threads_to_use(threads, started);
  if (use != atomic_load(&pool.want)) {
    int more = use > atomic_load(&pool.want);
    atomic_store(&pool.want, use);
    if (more) {
      pthread_mutex_lock(&pool.sleep);
      pthread_cond_broadcast(&pool.idle);
      pthread_mutex_unlock(&pool.sleep);
    }
  }
  if (num_task <= 0 && use < threads) threads = use;
  if (threads <= 1) {
    pthread_mutex_unlock(&pool.launch);
    return run_inline(fn, cdata);
  }
  if (num_task > 0 && num_task < threads) threads = num_task;
  per = (num_task > 0 || may_synchronise(lambda)) ? 1 : EP_PARTS_PER_THREAD;
  pool.fn = fn;
  pool.cdata = cdata;
  atomic_store(&pool.blocks, threads);
  atomic_store(&pool.per_block, per);
  pool.env.num_task = threads * per;
  pool.env.sync_handle = (void*)&pool.barrier;
  atomic_store(&pool.barrier, 0);
  atomic_store(&pool.failed, 0);
  atomic_store(&pool.done, 0);
  for (b = 0; b < threads; ++b) atomic_store_explicit(&pool.block[b].next, 0, memory_order_release);
  number = atomic_fetch_add(&pool.published, 1) + 1;
  (void)number;
  if (atomic_load(&pool.sleepers) > 0) {
    pthread_mutex_lock(&pool.sleep);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.sleep);
  }
  run_parts(0);
  until = now_ns() + EP_WAIT_SPIN_NS;
  while (atomic_load_explicit(&pool.done, memory_order_acquire) < threads * per) {
    if (now_ns() < until) {
      cpu_relax();
    } else {
      sched_yield();
    }
  }
  r = atomic_load(&pool.failed);
  for (b = 0; b < threads; ++b) atomic_store(&pool.block[b].next, EP_CLOSED); /* a late worker finds none */
  pthread_mutex_unlock(&pool.launch);
  return r;
}

int ep_parallel_barrier(int task_id, void* penv) {
  ep_group_env* env = (ep_group_env*)penv;
  atomic_uint* count = (atomic_uint*)env->sync_handle;
  unsigned target = (++ep_barrier_seen) * (unsigned)env->num_task;
  long until = now_ns() + EP_WAIT_SPIN_NS;
  (void)task_id;
  atomic_fetch_add_explicit(count, 1, memory_order_acq_rel);
  while (atomic_load_explicit(count, memory_order_acquire) < target) {
    if (now_ns() < until) {
      cpu_relax();
    } else {
      sched_yield();
    }
  }
  return 0;
}

int ep_parallel_set_threads(int num_threads) {
  if (num_threads <= 0) num_threads = ep_parallel_default_threads();
  if (num_threads > EP_MAX_THREADS) num_threads = EP_MAX_THREADS;
  pthread_mutex_lock(&pool.launch); /* no loop in flight while the count changes */
  pthread_mutex_lock(&pool.config);
  configure_device();
  pool.threads = num_threads;
  atomic_store(&pool.want, num_threads); /* every thread again, until the load says otherwise */
  pthread_mutex_lock(&pool.sleep);
  pthread_cond_broadcast(&pool.idle);
  pthread_mutex_unlock(&pool.sleep);
  pthread_mutex_unlock(&pool.config);
  pthread_mutex_unlock(&pool.launch);
  return num_threads;
}

int ep_parallel_threads(void) {
  int threads;
  pthread_mutex_lock(&pool.config);
  threads = pool.threads > 0 ? pool.threads : ep_parallel_default_threads();
  pthread_mutex_unlock(&pool.config);
  return threads;
}

unsigned long ep_parallel_loops(void) { return atomic_load(&pool.loops); }

int ep_parallel_threads_in_use(void) {
  int want = atomic_load(&pool.want);
  return want > 0 ? want : ep_parallel_threads();
}

int ep_parallel_pinned_cpus(void) {
  int pinned;
  configured_threads();
  pthread_mutex_lock(&pool.config);
  pinned = pool.pinned;
  pthread_mutex_unlock(&pool.config);
  return pinned;
}

int ep_parallel_install(int (*register_symbol)(const char* name, void* symbol)) {
  if (register_symbol("__TVMBackendParallelLaunch", (void*)ep_parallel_launch) != 0) return -1;
  return register_symbol("__TVMBackendParallelBarrier", (void*)ep_parallel_barrier);
}
