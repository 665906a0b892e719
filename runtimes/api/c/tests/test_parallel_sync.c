/*
 * For test_parallel.c: a shared library that, like a model library whose kernels synchronise inside a
 * parallel loop, has both context symbols; two_phases() runs loops whose parts write their share of a
 * buffer, wait at the barrier, then read what the other parts wrote.
 *
 *   cc -std=c11 -shared -fPIC test_parallel_sync.c -o test_parallel_sync.so
 */
#include <stdint.h>
#include <stdlib.h>

typedef struct {
  void* sync_handle;
  int32_t num_task;
} env_t;

int ep_parallel_launch(void* lambda, void* cdata, int num_task);
int ep_parallel_barrier(int task_id, void* penv);

void* __TVMBackendParallelLaunch = (void*)ep_parallel_launch;
void* __TVMBackendParallelBarrier = (void*)ep_parallel_barrier;

typedef struct {
  int n, round;
  int* a;
  int* b;
  int wrong;
} data_t;

static int phases(int task, env_t* env, void* cdata) {
  data_t* d = (data_t*)cdata;
  int step = (d->n + env->num_task - 1) / env->num_task;
  int begin = task * step, end = begin + step < d->n ? begin + step : d->n, i;
  for (i = begin; i < end; ++i) d->a[i] = i * 3 + d->round;
  ep_parallel_barrier(task, env); /* every part has written a before any reads it */
  for (i = begin; i < end; ++i) d->b[i] = d->a[(i + step) % d->n];
  ep_parallel_barrier(task, env);
  for (i = begin; i < end; ++i) {
    if (d->b[i] != ((i + step) % d->n) * 3 + d->round) d->wrong = 1;
  }
  return 0;
}

int two_phases(int n, int rounds) {
  data_t d;
  int r, status = 0;
  d.n = n;
  d.a = calloc((size_t)n, sizeof(int));
  d.b = calloc((size_t)n, sizeof(int));
  d.wrong = 0;
  for (r = 0; r < rounds && status == 0; ++r) {
    d.round = r;
    status = ep_parallel_launch((void*)phases, &d, 0);
  }
  free(d.a);
  free(d.b);
  return status != 0 ? status : d.wrong;
}
