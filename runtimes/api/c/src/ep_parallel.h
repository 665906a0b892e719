/*
 * edgepack's parallel runtime for the parallel loops of TVM kernels (part of the C API; no TVM headers).
 *
 * TVM's generated code runs a parallel loop by calling the function its library's
 * __TVMBackendParallelLaunch points to with a lambda that computes the part (task_id of num_task) of
 * the loop. TVM's own pool gives each of its threads one fixed part and waits for all: a worker the
 * OS parks (a phone's other apps, a busy core) stalls every kernel by a scheduler time slice. This
 * pool hands out more parts than threads, to whichever thread is free, the calling thread included;
 * its workers spin a bounded time for the next loop, then sleep. A library that synchronises inside a
 * parallel loop (__TVMBackendParallelBarrier) gets exactly one part per thread, every part running at
 * once, as TVM's barrier needs.
 *
 * ep_parallel_install() points every model library loaded afterwards at this pool (through tvm-ffi's
 * context symbols); the C API calls it before it opens a model.
 */
#ifndef EDGEPACK_EP_PARALLEL_H_
#define EDGEPACK_EP_PARALLEL_H_

#ifdef __cplusplus
extern "C" {
#endif

/* The signature of __TVMBackendParallelLaunch's target (TVMBackendParallelLaunch). */
int ep_parallel_launch(void* lambda, void* cdata, int num_task);
/* The signature of __TVMBackendParallelBarrier's target (TVMBackendParallelBarrier). */
int ep_parallel_barrier(int task_id, void* penv);

/* Threads of the parallel loops, the calling thread included (<= 0: the default: $TVM_NUM_THREADS,
   else the device's big cores). Waits for a loop in flight; workers start at the first loop. */
int ep_parallel_set_threads(int num_threads);
/* The threads a parallel loop may use (what ep_parallel_set_threads set, or the default). */
int ep_parallel_threads(void);
/* The threads loops use now: fewer than ep_parallel_threads() while other processes hold cores
   (the pool looks at /proc/stat every 50 ms; where it cannot, all of them). */
int ep_parallel_threads_in_use(void);
/* The default thread count: $TVM_NUM_THREADS, else the physical cores of the fastest kind this
   process may run on (a big.LITTLE phone or board: its big cores). */
int ep_parallel_default_threads(void);
/* Parallel loops this pool has run (those run inline included): a program's proof that it is in use. */
unsigned long ep_parallel_loops(void);
/* How many CPUs the workers are pinned to (the big cores of a big.LITTLE device), 0 if not pinned. */
int ep_parallel_pinned_cpus(void);

/* Register the pool with tvm-ffi (register(name, pointer), i.e. TVMFFIEnvModRegisterContextSymbol) so
   that libraries loaded afterwards use it. 0 on success. */
int ep_parallel_install(int (*register_symbol)(const char* name, void* symbol));

#ifdef __cplusplus
}
#endif

#endif /* EDGEPACK_EP_PARALLEL_H_ */
