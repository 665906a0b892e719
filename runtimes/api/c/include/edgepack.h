/*
 * edgepack.h - run a model compiled by edgepack, from C, with no Python on the device.
 *
 * A model is a TVM Relax VM executable, either
 *   - a shared library (model.so) loaded at run time:   ep_model_open(), ep_model_open_memory()
 *   - a static "system library" (libmodel.a) linked into the program:  ep_model_open_system_lib()
 * plus its tensor metadata (names, dtypes, shapes; see "Metadata" below).
 * The program links the TVM runtime: libtvm_runtime + libtvm_ffi (shared, or static archives
 * wrapped in -Wl,--whole-archive ... -Wl,--no-whole-archive).
 *
 * Conventions
 *   - Every function returns an ep_status; EP_OK (0) is success. On failure a readable message
 *     is available from ep_last_error() in the same thread. No function aborts the process
 *     or throws.
 *   - Indices are 0-based. Shapes are row-major (C order) and dense.
 *
 * Ownership
 *   - ep_model_open*() returns a model the caller owns; release it with ep_model_close(&model),
 *     which also sets the caller's pointer to NULL, so later calls on it fail with
 *     EP_ERR_INVALID_ARGUMENT instead of touching freed memory.
 *   - Strings and ep_tensor_info returned by the library belong to the model and stay valid
 *     until ep_model_close().
 *   - ep_model_set_input() does NOT copy a buffer that is EP_ALIGNMENT-byte aligned: the model
 *     reads the caller's memory during ep_model_run(), so it must stay valid and unchanged until
 *     the run returns (or until the input is set again / the model is closed). A buffer that is
 *     not aligned is copied into memory owned by the model. ep_alloc() gives aligned memory.
 *   - Output pointers from ep_model_get_output() point into memory owned by the model; they stay
 *     valid until the next ep_model_run() or ep_model_close() of that model.
 *
 * Thread safety
 *   - One model handle must be used by one thread at a time (serialise calls yourself).
 *   - Different model handles may be used concurrently from different threads.
 *   - ep_last_error() is per thread.
 *   - The models' parallel kernels run on one pool of worker threads per process (edgepack's,
 *     src/ep_parallel.c): ep_set_num_threads() threads, the calling thread included, else
 *     TVM_NUM_THREADS, else the device's big cores (on a big.LITTLE phone or board the workers
 *     are pinned to them). Each kernel is split into more parts than threads and a thread that is
 *     free takes the next part, so a core busy with another app slows a kernel by its share, not
 *     by a scheduler time slice. Workers spin briefly between kernels, then sleep. A kernel started
 *     while another thread's kernel holds the pool runs on its own thread. EDGEPACK_PARALLEL=tvm
 *     (set before the first model is opened) keeps TVM's own pool instead.
 *
 * Metadata
 *   The compiled library does not record dtypes and shapes, so edgepack writes them as text:
 *       edgepack-model-meta 1
 *       input  <name> <dtype> <d0,d1,...>
 *       output <name> <dtype> <d0,d1,...>
 *   one line per tensor, in the order of the model's parameters / results. <name> is
 *   percent-encoded (%XX for '%', white space and bytes outside 0x21..0x7E); <dtype> is one of
 *   float32 float16 bfloat16 float64 int8 int16 int32 int64 uint8 uint16 uint32 uint64 bool
 *   float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu;
 *   the shape of a 0-d tensor is "-". An output dimension the model decides at run time (NonZero,
 *   Unique, NonMaxSuppression ...) is "?": ep_model_output_info() reports it as -1 (byte_size 0)
 *   before the first run and the extent the last run produced after it, and the output's byte size
 *   is the produced one (ep_model_output_shape() gives the whole produced shape). Empty lines and
 *   lines starting with '#' are ignored.
 *
 * Dynamic input dimensions (metadata version 2, EP_API_VERSION 2)
 *   A model compiled for a range of input sizes (edgepack compile ... --dim W=32..1280:8) has
 *       edgepack-model-meta 2
 *       dim    <dname> <min> <max> <step>
 *       input  x float32 1,3,48,<dname>
 *       output y float32 1,?,...
 *   one "dim" line per dynamic dimension, before the inputs and outputs; <dname> is an identifier
 *   ([A-Za-z_][A-Za-z0-9_]*), 1 <= min <= max, step >= 1 and max - min is a multiple of step. An
 *   input dimension naming it takes any value v with min <= v <= max and (v - min) % step == 0
 *   (W = 32, 40, ... 1280 above). The same name may appear in several inputs (or twice in one);
 *   every use must then have the same value in a run. Output dimensions that depend on it are "?".
 *   Version 1 text (no dynamic dimensions) is read as before. For such an input:
 *     - ep_model_input_info() reports shape[i] = -1 for a dynamic dimension and byte_size = the
 *       dense size with every dynamic dimension at its max (enough to allocate a buffer once);
 *     - ep_model_input_dim() gives the name and range of each dimension;
 *     - set it with ep_model_set_input_typed() and the data's actual shape (ep_model_set_input(),
 *       which states only a byte size, refuses it with EP_ERR_SHAPE);
 *     - read the outputs' produced shapes with ep_model_output_shape().
 *   The metadata is looked up, in this order: the explicit argument of ep_model_open*(); a
 *   function "edgepack_meta" embedded in the model library by edgepack; for ep_model_open() the
 *   file next to the library with its extension replaced by ".meta" (model.so -> model.meta).
 */
#ifndef EDGEPACK_H_
#define EDGEPACK_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define EP_API
#else
#define EP_API __attribute__((visibility("default")))
#endif

/** Version of this API; bumped when a signature changes. */
#define EP_API_VERSION 2 /* 2: dynamic input dimensions (ep_model_input_dim, ep_model_output_shape) */

/** Maximum tensor rank supported by the API. */
#define EP_MAX_NDIM 8

/** Input buffers aligned to this many bytes are used in place (no copy). */
#define EP_ALIGNMENT 64

/** Result of every call. */
typedef enum {
  EP_OK = 0,
  EP_ERR_INVALID_ARGUMENT = 1, /**< NULL handle or pointer, closed model, bad argument value */
  EP_ERR_NOT_FOUND = 2,        /**< model or metadata file missing; unknown tensor name */
  EP_ERR_LOAD = 3,             /**< library cannot be loaded: wrong architecture, not a model */
  EP_ERR_METADATA = 4,         /**< metadata missing, malformed, or not matching the model */
  EP_ERR_INDEX = 5,            /**< input/output index out of range */
  EP_ERR_SHAPE = 6,            /**< shape or byte size does not match the model */
  EP_ERR_DTYPE = 7,            /**< dtype does not match the model */
  EP_ERR_STATE = 8,            /**< call not valid now (e.g. run before all inputs are set) */
  EP_ERR_RUNTIME = 9,          /**< the TVM runtime reported an error */
  EP_ERR_NO_MEMORY = 10,       /**< allocation failed */
  EP_ERR_IO = 11               /**< reading or writing a file failed */
} ep_status;

/** Element type of a tensor. */
typedef enum {
  EP_DTYPE_UNKNOWN = 0,
  EP_DTYPE_FLOAT32 = 1,
  EP_DTYPE_FLOAT16 = 2,
  EP_DTYPE_BFLOAT16 = 3,
  EP_DTYPE_FLOAT64 = 4,
  EP_DTYPE_INT8 = 5,
  EP_DTYPE_INT16 = 6,
  EP_DTYPE_INT32 = 7,
  EP_DTYPE_INT64 = 8,
  EP_DTYPE_UINT8 = 9,
  EP_DTYPE_UINT16 = 10,
  EP_DTYPE_UINT32 = 11,
  EP_DTYPE_UINT64 = 12,
  EP_DTYPE_BOOL = 13,
  /* 8-bit floats (one byte each, raw bits; names and encodings as in ml_dtypes / ONNX) */
  EP_DTYPE_FLOAT8_E4M3FN = 14,
  EP_DTYPE_FLOAT8_E4M3FNUZ = 15,
  EP_DTYPE_FLOAT8_E5M2 = 16,
  EP_DTYPE_FLOAT8_E5M2FNUZ = 17,
  EP_DTYPE_FLOAT8_E8M0FNU = 18
} ep_dtype;

/** Description of one model input or output (from the metadata). */
typedef struct {
  const char* name;            /**< tensor name, owned by the model */
  ep_dtype dtype;              /**< element type */
  int32_t ndim;                /**< rank, 0..EP_MAX_NDIM */
  int64_t shape[EP_MAX_NDIM];  /**< extents; entries past ndim are 0; -1: a dynamic input
                                    dimension (ep_model_input_dim) or an output's '?' before a run */
  size_t byte_size;            /**< dense size in bytes; an input with dynamic dimensions: the size
                                    with each at its max (the largest buffer it takes) */
} ep_tensor_info;

/**
 * The values one input dimension takes (ep_model_input_dim): min, min + step, ... max.
 * A static dimension: name "" and min = max = its extent, step 1.
 */
typedef struct {
  const char* name; /**< the dynamic dimension's name from the metadata ("W"), owned by the model */
  int64_t min;
  int64_t max;
  int64_t step;
} ep_dim_range;

/** Opaque model handle. */
typedef struct ep_model ep_model;

/* ---- errors and helpers ------------------------------------------------------------------ */

/** Message of the last failed call in this thread ("" if none). Valid until the next call. */
EP_API const char* ep_last_error(void);
/** Constant name of a status, e.g. "EP_ERR_SHAPE". */
EP_API const char* ep_status_name(ep_status status);
/** Name of a dtype as used in the metadata ("float32"), "unknown" otherwise. */
EP_API const char* ep_dtype_name(ep_dtype dtype);
/** Dtype from its metadata name; EP_DTYPE_UNKNOWN if not recognised. */
EP_API ep_dtype ep_dtype_from_name(const char* name);
/** Size of one element in bytes (bool: 1); 0 for EP_DTYPE_UNKNOWN. */
EP_API size_t ep_dtype_size(ep_dtype dtype);
/** Allocate size bytes aligned to EP_ALIGNMENT (NULL on failure); release with ep_free(). */
EP_API void* ep_alloc(size_t size);
/** Release memory from ep_alloc(); NULL is ignored. */
EP_API void ep_free(void* ptr);

/* ---- opening and closing ----------------------------------------------------------------- */

/**
 * Load a model shared library (e.g. "model.so").
 * The library must be an ordinary TVM export, not one built as a system library (those register
 * themselves process-wide when loaded; edgepack builds system libraries only as static archives).
 * @param lib_path   path of the library compiled for this machine
 * @param meta_path  metadata file, or NULL to use the embedded metadata or "<lib_path without
 *                   extension>.meta"
 * @param out_model  receives the model on success, NULL on failure
 * Errors: EP_ERR_NOT_FOUND (file missing), EP_ERR_LOAD (wrong architecture, not a TVM model),
 *         EP_ERR_METADATA.
 */
EP_API ep_status ep_model_open(const char* lib_path, const char* meta_path, ep_model** out_model);

/**
 * Load a model shared library from memory (the bytes of model.so). The bytes are copied (to an
 * in-memory file, or a temporary file where memfd_create is unavailable) and can be freed after
 * the call.
 * @param meta_text  metadata text, or NULL to use the metadata embedded in the library
 */
EP_API ep_status ep_model_open_memory(const void* lib_data, size_t lib_size,
                                      const char* meta_text, ep_model** out_model);

/**
 * Open the model statically linked into this program (an edgepack system-library archive,
 * linked with -Wl,--whole-archive).
 * @param prefix     the model's system-lib symbol prefix; NULL or "" for the default
 * @param meta_text  metadata text, or NULL to use the metadata embedded in the archive
 * Errors: EP_ERR_NOT_FOUND when no model with that prefix is linked in.
 */
EP_API ep_status ep_model_open_system_lib(const char* prefix, const char* meta_text,
                                          ep_model** out_model);

/** Release a model and set *model to NULL. NULL and *model == NULL are accepted (EP_OK). */
EP_API ep_status ep_model_close(ep_model** model);

/* ---- GPU models (OpenCL) ----------------------------------------------------------------- */

/**
 * Load a TVM runtime plug-in into this process, e.g. edgepack's OpenCL runtime
 * (lib/libtvm_opencl.so of a C bundle for mali-g610 / adreno-6xx). Models compiled for an OpenCL
 * GPU need it loaded before they are opened. Loading the same file again is harmless; a plug-in
 * is never unloaded.
 *
 * ep_model_open() does this by itself: when no OpenCL runtime is registered yet it loads
 * $EDGEPACK_OPENCL_PLUGIN if set, else libtvm_opencl.so from the model library's directory (if
 * present). Programs linked statically with libtvm_opencl.a (-Wl,--whole-archive) need nothing.
 * A model that runs OpenCL kernels is then run on OpenCL device 0 (the first GPU of the driver;
 * see runtimes/plugins/opencl/README.md for EDGEPACK_OPENCL_* settings): inputs are copied to the device
 * and outputs back to CPU memory by ep_model_run(), so the rest of this API is unchanged.
 * Vulkan models (vulkan-generic, mali-g610-vulkan) work the same way with edgepack's Vulkan
 * runtime: lib/libtvm_vulkan.so ($EDGEPACK_VULKAN_PLUGIN), which loads lib/libwgpu_native.so from
 * its own directory (see runtimes/plugins/vulkan/README.md); they run on TVM's webgpu device 0.
 * Errors: EP_ERR_LOAD with the dynamic loader's message.
 */
EP_API ep_status ep_load_plugin(const char* path);

/**
 * Register the run-time functions that TVM's Python package or its optional runtime part would
 * provide and that compiled models call: relax.run.nonzero, relax.run.unique (NonZero, Compress,
 * Unique) and tvm.contrib.sort.argsort/sort/topk (TopK, NonMaxSuppression), each unless something
 * registered it already, and edgepack.set_num_threads / edgepack.num_threads; points models loaded
 * afterwards at edgepack's thread pool (see "Thread safety"). ep_model_open*() calls it; a program
 * that loads models through TVM itself (edgepack's RPC server) calls it once before. Safe to call
 * more than once.
 */
EP_API void ep_register_runtime_builtins(void);

/* ---- introspection ----------------------------------------------------------------------- */

EP_API ep_status ep_model_num_inputs(const ep_model* model, int* out_count);
EP_API ep_status ep_model_num_outputs(const ep_model* model, int* out_count);
/** Copy the description of input `index` into *out_info (name stays owned by the model). */
EP_API ep_status ep_model_input_info(const ep_model* model, int index, ep_tensor_info* out_info);
EP_API ep_status ep_model_output_info(const ep_model* model, int index, ep_tensor_info* out_info);
/**
 * The range of dimension `dim` of input `index` (see "Dynamic input dimensions").
 * Errors: EP_ERR_INDEX (index or dim out of range), EP_ERR_INVALID_ARGUMENT (out is NULL).
 */
EP_API ep_status ep_model_input_dim(const ep_model* model, int index, int dim, ep_dim_range* out);
/** Index of the input called `name`; EP_ERR_NOT_FOUND if there is none. */
EP_API ep_status ep_model_find_input(const ep_model* model, const char* name, int* out_index);
EP_API ep_status ep_model_find_output(const ep_model* model, const char* name, int* out_index);

/**
 * How many bytes of the model's memory opening it moved onto huge pages: the whole transparent huge
 * pages (2 MiB on x86-64 and aarch64 with 4 KiB pages) that loading it added to the process (its
 * weights, the VM's buffers), collapsed with madvise(MADV_COLLAPSE), so that each run's pass over
 * the weights takes fewer TLB misses. Memory the process already had and the model reuses (an
 * earlier model's, freed) is left as it is. 0 where the kernel cannot (before Linux 6.1, transparent
 * huge pages set to never, not Linux), for a NULL model, or with EDGEPACK_HUGE_PAGES=0 set.
 */
EP_API size_t ep_model_huge_page_bytes(const ep_model* model);

/**
 * For programs that load model libraries through TVM themselves (edgepack's RPC server): take a mark
 * of the process's memory before loading, and after it move what loading added onto huge pages, as
 * ep_model_open*() does. ep_memory_collapse_since() frees the mark (NULL is accepted) and returns the
 * bytes it moved.
 */
typedef struct ep_memory_mark ep_memory_mark;
EP_API ep_memory_mark* ep_memory_mark_take(void);
EP_API size_t ep_memory_collapse_since(ep_memory_mark* mark);

/* ---- running ----------------------------------------------------------------------------- */

/**
 * Set input `index` from a dense buffer of exactly the input's byte_size bytes, laid out with
 * the dtype and shape of ep_model_input_info(). See "Ownership" for when the buffer is copied.
 * Errors: EP_ERR_INDEX, EP_ERR_SHAPE (byte_size differs; or the input has dynamic dimensions,
 * whose extents a byte size does not tell: use ep_model_set_input_typed()).
 */
EP_API ep_status ep_model_set_input(ep_model* model, int index, const void* data,
                                    size_t byte_size);

/**
 * Like ep_model_set_input() but states what the buffer holds, so that a mismatch is reported
 * precisely: EP_ERR_DTYPE if dtype differs, EP_ERR_SHAPE if ndim/shape differ. A dynamic dimension
 * takes any value in its range (ep_model_input_dim; EP_ERR_SHAPE otherwise, naming the dimension
 * and its range); the buffer then holds the dense product of `shape` elements, and the model runs
 * on that shape. `shape` is copied.
 */
EP_API ep_status ep_model_set_input_typed(ep_model* model, int index, const void* data,
                                          ep_dtype dtype, int32_t ndim, const int64_t* shape);

/**
 * Run the model once. Errors: EP_ERR_STATE if an input was never set, EP_ERR_SHAPE if a dynamic
 * dimension used in several places (inputs) was set to different values, EP_ERR_RUNTIME.
 */
EP_API ep_status ep_model_run(ep_model* model);

/**
 * Use num_threads threads (the calling thread included) for the parallel kernels of the models
 * (num_threads <= 0: the device's big cores). May be called at any time; a kernel in flight
 * finishes first. Also sets TVM_NUM_THREADS and TVM's own pool (see "Thread safety").
 */
EP_API ep_status ep_set_num_threads(int num_threads);

/** Threads the models' parallel kernels use now, the calling thread included. */
EP_API int ep_num_threads(void);

/** Parallel loops run on edgepack's thread pool in this process so far (0 with EDGEPACK_PARALLEL=tvm). */
EP_API unsigned long ep_parallel_loops(void);

/**
 * Borrow output `index` of the last run: *out_data points to *out_byte_size bytes owned by the
 * model (for outputs with '?' dimensions, the size this run produced).
 * Errors: EP_ERR_STATE before the first successful run, EP_ERR_INDEX.
 */
EP_API ep_status ep_model_get_output(const ep_model* model, int index, const void** out_data,
                                     size_t* out_byte_size);

/**
 * The shape output `index` had in the last successful run: *out_ndim and out_shape[0..ndim-1]
 * (out_shape has room for EP_MAX_NDIM entries). For outputs whose size depends on a dynamic input
 * dimension or on the data ('?' in the metadata) this is the only place to learn it.
 * Errors: EP_ERR_STATE before the first successful run, EP_ERR_INDEX, EP_ERR_INVALID_ARGUMENT.
 */
EP_API ep_status ep_model_output_shape(const ep_model* model, int index, int32_t* out_ndim,
                                       int64_t* out_shape);

/** Copy output `index` of the last run into dst (dst_size must be >= its byte_size). */
EP_API ep_status ep_model_copy_output(const ep_model* model, int index, void* dst,
                                      size_t dst_size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EDGEPACK_H_ */
