/*
 * ep_parallel's own test: loops split as TVM's generated lambdas split them (part task_id of num_task,
 * contiguous), checked element by element; a library that synchronises inside its loop (loaded from
 * test_parallel_sync.so, as a model library would be); loops started inside a part and from several
 * threads at once; an error in one part; the thread count honoured. Prints "ok" and exits 0, else names
 * the failed check and exits 1.
 *
 *   cc -std=c11 -rdynamic test_parallel.c ep_parallel.c -ldl -lpthread -o test_parallel
 *   ./test_parallel ./test_parallel_sync.so
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ep_parallel.h"

typedef struct {
  void* sync_handle;
  int32_t num_task;
} env_t;

/* As a model library has it: the launcher's context symbol, no barrier (so loops here are split finely). */
void* __TVMBackendParallelLaunch = (void*)ep_parallel_launch;

typedef struct {
  int n;
  atomic_int* hits;
  atomic_int parts;
  atomic_int fail_part; /* a part that returns an error (-1: none) */
  pthread_t threads[64];
  atomic_int nthreads;
  int nested;
} job_t;

static void note_thread(job_t* job) {
  pthread_t me = pthread_self();
  int i, n = atomic_load(&job->nthreads);
  for (i = 0; i < n && i < 64; ++i) {
    if (pthread_equal(job->threads[i], me)) return;
  }
  i = atomic_fetch_add(&job->nthreads, 1);
  if (i < 64) job->threads[i] = me;
}

static int inner(int task, env_t* env, void* data) {
  job_t* job = (job_t*)data;
  (void)task;
  (void)env;
  atomic_fetch_add(&job->parts, 1000); /* ran, and alone: num_task 1 */
  return env->num_task == 1 ? 0 : -7;
}

static int lambda(int task, env_t* env, void* data) {
  job_t* job = (job_t*)data;
  int step = (job->n + env->num_task - 1) / env->num_task;
  int begin = task * step, end = begin + step < job->n ? begin + step : job->n, i;
  note_thread(job);
  atomic_fetch_add(&job->parts, 1);
  for (i = begin; i < end; ++i) atomic_fetch_add(&job->hits[i], 1);
  if (job->nested && task == 0) {
    int r = ep_parallel_launch((void*)inner, job, 0);
    if (r != 0) return r;
  }
  {
    /* the part asked for, or the last where the pool split the loop into fewer (inline on a busy machine) */
    int fail = atomic_load(&job->fail_part);
    if (fail >= env->num_task) fail = env->num_task - 1;
    return task == fail ? -1 : 0;
  }
}

static int check(const char* what, int ok) {
  if (!ok) {
    printf("FAILED: %s\n", what);
    exit(1);
  }
  return ok;
}

static void run_job(int n, int nested, int fail_part, int* result, job_t* job) {
  int i;
  memset(job, 0, sizeof(*job));
  job->n = n;
  job->nested = nested;
  atomic_store(&job->fail_part, fail_part);
  job->hits = calloc((size_t)(n > 0 ? n : 1), sizeof(atomic_int));
  *result = ep_parallel_launch((void*)lambda, job, 0);
  for (i = 0; i < n; ++i) {
    if (atomic_load(&job->hits[i]) != 1) {
      printf("FAILED: element %d of %d computed %d times\n", i, n, atomic_load(&job->hits[i]));
      exit(1);
    }
  }
  free(job->hits);
}

static void* app_thread(void* arg) {
  int k, r;
  job_t job;
  (void)arg;
  for (k = 0; k < 200; ++k) {
    run_job(1000 + k, 0, -1, &r, &job);
    check("a loop from one of several threads", r == 0);
  }
  return NULL;
}

int main(int argc, char** argv) {
  int sizes[] = {1, 2, 7, 64, 1000, 100003};
  int counts[] = {1, 2, 3, 8};
  int s, t, r;
  job_t job;

  if (argc > 2 && strcmp(argv[1], "--busy") == 0) { /* loops for argv[2] ms: how many threads it ends on */
    struct timespec start, now;
    int n = 200000;
    clock_gettime(CLOCK_MONOTONIC, &start);
    ep_parallel_set_threads(0);
    do {
      run_job(n, 0, -1, &r, &job);
      check("a loop under load", r == 0);
      clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 < atol(argv[2]));
    printf("{\"threads\": %d, \"threads_in_use\": %d}\n", ep_parallel_threads(), ep_parallel_threads_in_use());
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "--device") == 0) { /* what the pool makes of this (or a fake) CPU tree */
    printf("{\"default_threads\": %d, \"pinned_cpus\": %d}\n", ep_parallel_default_threads(),
           ep_parallel_pinned_cpus());
    return 0;
  }

  for (t = 0; t < 4; ++t) {
    check("set threads", ep_parallel_set_threads(counts[t]) == counts[t]);
    for (s = 0; s < 6; ++s) {
      int k;
      for (k = 0; k < 50; ++k) {
        run_job(sizes[s], 0, -1, &r, &job);
        check("a loop returns 0", r == 0);
        check("at most the threads asked for", atomic_load(&job.nthreads) <= counts[t]);
      }
    }
  }
  ep_parallel_set_threads(3);
  run_job(1000, 0, -1, &r, &job);
  {
    /* the pool leaves cores that other processes take (a test run beside others): it may run this loop
       on fewer threads, or inline on one; on each thread it runs EP_PARTS_PER_THREAD parts */
    int in_use = ep_parallel_threads_in_use();
    check("more parts than threads where the library has no barrier",
          in_use <= 1 ? atomic_load(&job.parts) == 1 : atomic_load(&job.parts) == in_use * 4);
  }
  run_job(1000, 1, -1, &r, &job);
  check("a loop inside a part runs inline, once", r == 0 && atomic_load(&job.parts) % 1000 > 0 &&
                                                  atomic_load(&job.parts) / 1000 == 1);
  run_job(1000, 0, 2, &r, &job);
  check("an error in one part is the loop's", r == -1);

  {
    pthread_t apps[3];
    int i;
    for (i = 0; i < 3; ++i) check("start a thread", pthread_create(&apps[i], NULL, app_thread, NULL) == 0);
    for (i = 0; i < 3; ++i) pthread_join(apps[i], NULL);
  }

  if (argc > 1) { /* a library that synchronises inside its loops: one part per thread, all at once */
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    int (*two_phases)(int n, int rounds);
    check("load the synchronising library", lib != NULL);
    two_phases = (int (*)(int, int))dlsym(lib, "two_phases");
    check("find two_phases", two_phases != NULL);
    for (t = 1; t <= 4; ++t) {
      ep_parallel_set_threads(t);
      check("barriers keep every part in step", two_phases(4096, 20) == 0);
    }
  }
  printf("ok\n");
  return 0;
}
