/*
 * edgepack.c - the edgepack C API (edgepack.h) over the tvm-ffi C ABI (tvm/ffi/c_api.h).
 *
 * Flow: load the executable module (ffi.Module.load_from_file.so, or ffi.SystemLib) ->
 * its "vm_load_executable" -> VM "vm_initialization"(kDLCPU, 0, kPooled) -> VM "main"(tensors).
 * Every TVM call goes through the C ABI, whose functions return non-zero after catching the
 * C++ exception; the message is taken with TVMFFIErrorMoveFromRaised. Nothing here aborts.
 *
 * Build: any C11 compiler; include paths for edgepack.h, tvm/ffi/c_api.h and dlpack/dlpack.h;
 * link libtvm_runtime and libtvm_ffi (see the bundle's CMakeLists.txt / Makefile).
 */
#if !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1 /* memfd_create, mkstemps */
#endif

#include "edgepack.h"
#include "ep_parallel.h"
#include "ep_program.h"

#include <tvm/ffi/c_api.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#include <sys/syscall.h>
#endif

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define EP_TLS _Thread_local
#else
#define EP_TLS __thread
#endif

#define EP_MODEL_MAGIC 0x4d504445u /* "EDPM" */
#define EP_ERROR_CAPACITY 2048

/* kPooled in tvm/runtime/memory/memory_manager.h: buffers are reused across runs. */
#define EP_TVM_ALLOCATOR_POOLED 2

static EP_TLS char ep_error_buf[EP_ERROR_CAPACITY];

/* ---------------------------------------------------------------------------------------- */
/* errors                                                                                     */

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static ep_status ep_fail(ep_status status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ep_error_buf, sizeof(ep_error_buf), fmt, ap);
  va_end(ap);
  return status;
}

/* Take the error raised by the last failed TVM C call and report it after `context`. */
static ep_status ep_fail_tvm(ep_status status, const char* context) {
  TVMFFIObjectHandle err = NULL;
  TVMFFIErrorMoveFromRaised(&err);
  if (err == NULL) {
    return ep_fail(status, "%s: unknown TVM error", context);
  }
  const TVMFFIErrorCell* cell =
      (const TVMFFIErrorCell*)((const char*)err + sizeof(TVMFFIObject));
  int kind_len = (int)(cell->kind.size > 64 ? 64 : cell->kind.size);
  int msg_len = (int)(cell->message.size > EP_ERROR_CAPACITY ? EP_ERROR_CAPACITY
                                                               : cell->message.size);
  ep_fail(status, "%s: %.*s: %.*s", context, kind_len, cell->kind.data, msg_len,
          cell->message.data);
  TVMFFIObjectDecRef(err);
  return status;
}

const char* ep_last_error(void) { return ep_error_buf; }

const char* ep_status_name(ep_status status) {
  switch (status) {
    case EP_OK: return "EP_OK";
    case EP_ERR_INVALID_ARGUMENT: return "EP_ERR_INVALID_ARGUMENT";
    case EP_ERR_NOT_FOUND: return "EP_ERR_NOT_FOUND";
    case EP_ERR_LOAD: return "EP_ERR_LOAD";
    case EP_ERR_METADATA: return "EP_ERR_METADATA";
    case EP_ERR_INDEX: return "EP_ERR_INDEX";
    case EP_ERR_SHAPE: return "EP_ERR_SHAPE";
    case EP_ERR_DTYPE: return "EP_ERR_DTYPE";
    case EP_ERR_STATE: return "EP_ERR_STATE";
    case EP_ERR_RUNTIME: return "EP_ERR_RUNTIME";
    case EP_ERR_NO_MEMORY: return "EP_ERR_NO_MEMORY";
    case EP_ERR_IO: return "EP_ERR_IO";
  }
  return "EP_ERR_UNKNOWN";
}

/* ---------------------------------------------------------------------------------------- */
/* dtypes                                                                                     */

typedef struct {
  ep_dtype dtype;
  const char* name;
  uint8_t code; /* DLDataTypeCode */
  uint8_t bits;
} ep_dtype_entry;

static const ep_dtype_entry ep_dtypes[] = {
    {EP_DTYPE_FLOAT32, "float32", kDLFloat, 32}, {EP_DTYPE_FLOAT16, "float16", kDLFloat, 16},
    {EP_DTYPE_BFLOAT16, "bfloat16", kDLBfloat, 16}, {EP_DTYPE_FLOAT64, "float64", kDLFloat, 64},
    {EP_DTYPE_INT8, "int8", kDLInt, 8},           {EP_DTYPE_INT16, "int16", kDLInt, 16},
    {EP_DTYPE_INT32, "int32", kDLInt, 32},        {EP_DTYPE_INT64, "int64", kDLInt, 64},
    {EP_DTYPE_UINT8, "uint8", kDLUInt, 8},        {EP_DTYPE_UINT16, "uint16", kDLUInt, 16},
    {EP_DTYPE_UINT32, "uint32", kDLUInt, 32},     {EP_DTYPE_UINT64, "uint64", kDLUInt, 64},
    {EP_DTYPE_BOOL, "bool", kDLBool, 8},
    {EP_DTYPE_FLOAT8_E4M3FN, "float8_e4m3fn", kDLFloat8_e4m3fn, 8},
    {EP_DTYPE_FLOAT8_E4M3FNUZ, "float8_e4m3fnuz", kDLFloat8_e4m3fnuz, 8},
    {EP_DTYPE_FLOAT8_E5M2, "float8_e5m2", kDLFloat8_e5m2, 8},
    {EP_DTYPE_FLOAT8_E5M2FNUZ, "float8_e5m2fnuz", kDLFloat8_e5m2fnuz, 8},
    {EP_DTYPE_FLOAT8_E8M0FNU, "float8_e8m0fnu", kDLFloat8_e8m0fnu, 8},
};
#define EP_NUM_DTYPES (sizeof(ep_dtypes) / sizeof(ep_dtypes[0]))

static const ep_dtype_entry* ep_dtype_lookup(ep_dtype dtype) {
  size_t i;
  for (i = 0; i < EP_NUM_DTYPES; ++i) {
    if (ep_dtypes[i].dtype == dtype) return &ep_dtypes[i];
  }
  return NULL;
}

const char* ep_dtype_name(ep_dtype dtype) {
  const ep_dtype_entry* e = ep_dtype_lookup(dtype);
  return e ? e->name : "unknown";
}

ep_dtype ep_dtype_from_name(const char* name) {
  size_t i;
  if (name == NULL) return EP_DTYPE_UNKNOWN;
  for (i = 0; i < EP_NUM_DTYPES; ++i) {
    if (strcmp(ep_dtypes[i].name, name) == 0) return ep_dtypes[i].dtype;
  }
  return EP_DTYPE_UNKNOWN;
}

size_t ep_dtype_size(ep_dtype dtype) {
  const ep_dtype_entry* e = ep_dtype_lookup(dtype);
  return e ? (size_t)(e->bits / 8) : 0;
}

static ep_dtype ep_dtype_from_dl(DLDataType t) {
  size_t i;
  if (t.lanes != 1) return EP_DTYPE_UNKNOWN;
  if (t.code == kDLUInt && t.bits == 1) return EP_DTYPE_BOOL;
  for (i = 0; i < EP_NUM_DTYPES; ++i) {
    if (ep_dtypes[i].code == t.code && ep_dtypes[i].bits == t.bits) return ep_dtypes[i].dtype;
  }
  return EP_DTYPE_UNKNOWN;
}

void* ep_alloc(size_t size) {
  void* ptr = NULL;
  if (posix_memalign(&ptr, EP_ALIGNMENT, size == 0 ? 1 : size) != 0) return NULL;
  return ptr;
}

void ep_free(void* ptr) { free(ptr); }

/* ---------------------------------------------------------------------------------------- */
/* the model                                                                                  */

typedef struct {
  TVMFFIObjectHandle tensor; /* Tensor passed to main: views the user buffer or `copy` */
  void* copy;                /* aligned copy of an unaligned user buffer */
  size_t copy_size;
  int32_t ndim;              /* the shape the input was last set with (its own copy) */
  int64_t shape[EP_MAX_NDIM];
} ep_input_slot;

/* Dynamic input dimensions (metadata version 2): "dim <name> <min> <max> <step>". */
#define EP_MAX_DIMS 32

typedef struct {
  char* name; /* heap string owned by the model */
  int64_t min, max, step;
} ep_dim_def;

/* Per input: which dynamic dimension each axis is (index into ep_model.dims), -1 if static. */
typedef struct {
  int ref[EP_MAX_NDIM];
} ep_input_dims;

struct ep_model {
  uint32_t magic;
  TVMFFIObjectHandle exec; /* relax.VMExecutable module */
  TVMFFIObjectHandle vm;   /* relax.VirtualMachine module */
  TVMFFIObjectHandle main; /* the VM function "main" */
  int num_inputs;
  int num_outputs;
  ep_tensor_info* inputs; /* names are heap strings owned by the model */
  ep_tensor_info* outputs;
  ep_input_dims* input_dims; /* parallel to inputs */
  int num_dims;
  ep_dim_def dims[EP_MAX_DIMS];
  ep_input_slot* slots;
  TVMFFIObjectHandle* out_tensors; /* outputs of the last successful run (owned refs) */
  int has_run;
  int device_type; /* where the VM runs: kDLCPU, or kDLOpenCL / kDLWebGPU for GPU models */
  int device_id;
  size_t huge_page_bytes; /* what opening it moved onto huge pages (ep_collapse_new_memory) */
};

static int ep_model_valid(const ep_model* m) { return m != NULL && m->magic == EP_MODEL_MAGIC; }

#define EP_CHECK_MODEL(m)                                                                   \
  do {                                                                                      \
    if (!ep_model_valid(m))                                                                 \
      return ep_fail(EP_ERR_INVALID_ARGUMENT, "%s: model is NULL, closed or not a model",   \
                     __func__);                                                             \
  } while (0)

/* ---------------------------------------------------------------------------------------- */
/* small tvm-ffi helpers                                                                      */

static TVMFFIAny ep_any_none(void) {
  TVMFFIAny a;
  memset(&a, 0, sizeof(a));
  a.type_index = kTVMFFINone;
  return a;
}

static TVMFFIAny ep_any_int(int64_t v) {
  TVMFFIAny a = ep_any_none();
  a.type_index = kTVMFFIInt;
  a.v_int64 = v;
  return a;
}

static TVMFFIAny ep_any_bool(int v) {
  TVMFFIAny a = ep_any_none();
  a.type_index = kTVMFFIBool;
  a.v_int64 = v ? 1 : 0;
  return a;
}

static TVMFFIAny ep_any_str(const char* s) {
  TVMFFIAny a = ep_any_none();
  a.type_index = kTVMFFIRawStr;
  a.v_c_str = s;
  return a;
}

static TVMFFIAny ep_any_obj(TVMFFIObjectHandle h) {
  TVMFFIAny a = ep_any_none();
  a.type_index = ((TVMFFIObject*)h)->type_index;
  a.v_obj = (TVMFFIObject*)h;
  return a;
}

static void ep_any_release(TVMFFIAny* a) {
  if (a->type_index >= kTVMFFIStaticObjectBegin && a->v_obj != NULL) {
    TVMFFIObjectDecRef(a->v_obj);
  }
  *a = ep_any_none();
}

static void ep_release(TVMFFIObjectHandle* h) {
  if (*h != NULL) {
    TVMFFIObjectDecRef(*h);
    *h = NULL;
  }
}

/* Call a function; *result receives an owned value. Returns the TVM status (0 = ok). */
static int ep_call(TVMFFIObjectHandle f, TVMFFIAny* args, int32_t nargs, TVMFFIAny* result) {
  *result = ep_any_none();
  return TVMFFIFunctionCall(f, args, nargs, result);
}

/* Look up a global function; *out is NULL (with an error message) if it does not exist. */
static ep_status ep_get_global(const char* name, TVMFFIObjectHandle* out) {
  TVMFFIByteArray bytes;
  bytes.data = name;
  bytes.size = strlen(name);
  *out = NULL;
  if (TVMFFIFunctionGetGlobal(&bytes, out) != 0) return ep_fail_tvm(EP_ERR_RUNTIME, name);
  if (*out == NULL) {
    return ep_fail(EP_ERR_LOAD,
                   "TVM function %s is not registered: is libtvm_runtime linked in (static "
                   "archives need -Wl,--whole-archive)?",
                   name);
  }
  return EP_OK;
}

/* Call global function `name`; result owned by the caller. */
static ep_status ep_call_global(const char* name, TVMFFIAny* args, int32_t nargs,
                                TVMFFIAny* result, ep_status fail_status) {
  TVMFFIObjectHandle f = NULL;
  ep_status st = ep_get_global(name, &f);
  int rc;
  if (st != EP_OK) return st;
  rc = ep_call(f, args, nargs, result);
  ep_release(&f);
  if (rc != 0) return ep_fail_tvm(fail_status, name);
  return EP_OK;
}

/* Function `name` of module `mod` (searching its imports too); *out NULL if absent. */
static ep_status ep_module_function(TVMFFIObjectHandle mod, const char* name, int query_imports,
                                    TVMFFIObjectHandle* out) {
  TVMFFIAny args[3];
  TVMFFIAny res;
  ep_status st;
  args[0] = ep_any_obj(mod);
  args[1] = ep_any_str(name);
  args[2] = ep_any_bool(query_imports);
  *out = NULL;
  st = ep_call_global("ffi.ModuleGetFunction", args, 3, &res, EP_ERR_RUNTIME);
  if (st != EP_OK) return st;
  if (res.type_index == kTVMFFIFunction) {
    *out = res.v_obj;
    return EP_OK;
  }
  ep_any_release(&res);
  return EP_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* metadata                                                                                   */

static int ep_hex(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Percent-decode token [s, s+n) into a new heap string; NULL if malformed/out of memory. */
static char* ep_decode_name(const char* s, size_t n) {
  char* out = (char*)malloc(n + 1);
  size_t i, j = 0;
  if (out == NULL) return NULL;
  for (i = 0; i < n; ++i) {
    if (s[i] == '%') {
      int hi, lo;
      if (i + 2 >= n) {
        free(out);
        return NULL;
      }
      hi = ep_hex((unsigned char)s[i + 1]);
      lo = ep_hex((unsigned char)s[i + 2]);
      if (hi < 0 || lo < 0) {
        free(out);
        return NULL;
      }
      out[j++] = (char)(hi * 16 + lo);
      i += 2;
    } else {
      out[j++] = s[i];
    }
  }
  out[j] = '\0';
  return out;
}

static void ep_free_infos(ep_tensor_info* infos, int n) {
  int i;
  if (infos == NULL) return;
  for (i = 0; i < n; ++i) free((void*)infos[i].name);
  free(infos);
}

static int ep_is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* Next whitespace-separated token of the line [*p, end). */
static int ep_next_token(const char** p, const char* end, const char** tok, size_t* len) {
  const char* s = *p;
  while (s < end && ep_is_space(*s)) ++s;
  if (s >= end) return 0;
  *tok = s;
  while (s < end && !ep_is_space(*s)) ++s;
  *len = (size_t)(s - *tok);
  *p = s;
  return 1;
}

/* Dense size of a produced tensor (outputs with '?' dimensions vary from run to run). */
static size_t ep_produced_size(const DLTensor* t) {
  size_t n = (size_t)((t->dtype.bits * t->dtype.lanes + 7) / 8);
  int d;
  for (d = 0; d < t->ndim; ++d) n *= (size_t)t->shape[d];
  return n;
}

static int ep_is_dynamic(const ep_tensor_info* info) {
  int i;
  for (i = 0; i < info->ndim; ++i) {
    if (info->shape[i] < 0) return 1;
  }
  return 0;
}

static int ep_is_ident_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static int ep_is_ident_char(char c) { return ep_is_ident_start(c) || (c >= '0' && c <= '9'); }

/* Index of the dynamic dimension called [name, name+n) in m->dims, -1 if none. */
static int ep_find_dim(const ep_model* m, const char* name, size_t n) {
  int i;
  for (i = 0; i < m->num_dims; ++i) {
    if (strlen(m->dims[i].name) == n && strncmp(m->dims[i].name, name, n) == 0) return i;
  }
  return -1;
}

/*
 * Parse a shape token. refs (inputs of a version-2 text; NULL otherwise) receives, per axis, the
 * index of the dynamic dimension the axis names (its extent in info->shape is -1), else -1.
 */
static ep_status ep_parse_shape(const ep_model* m, const char* tok, size_t len,
                                ep_tensor_info* info, int* refs, int lineno) {
  size_t i = 0;
  int d;
  info->ndim = 0;
  for (d = 0; d < EP_MAX_NDIM; ++d) {
    if (refs != NULL) refs[d] = -1;
  }
  if (len == 1 && tok[0] == '-') return EP_OK;
  while (i < len) {
    int64_t v = 0;
    size_t start = i;
    int ref = -1;
    if (ep_is_ident_start(tok[i])) { /* a dynamic input dimension declared by a "dim" line */
      while (i < len && ep_is_ident_char(tok[i])) ++i;
      if (refs == NULL) {
        return ep_fail(EP_ERR_METADATA,
                       "metadata line %d: dimension '%.*s' is a name; only inputs of version-2 "
                       "metadata name dynamic dimensions (outputs use '?')",
                       lineno, (int)(i - start), tok + start);
      }
      ref = ep_find_dim(m, tok + start, i - start);
      if (ref < 0) {
        return ep_fail(EP_ERR_METADATA,
                       "metadata line %d: dimension '%.*s' is not declared by a 'dim' line", lineno,
                       (int)(i - start), tok + start);
      }
      v = -1;
    } else if (tok[i] == '?') { /* decided by the model at run time (outputs only; see edgepack.h) */
      v = -1;
      ++i;
    }
    while (v >= 0 && i < len && tok[i] >= '0' && tok[i] <= '9') {
      if (v > (INT64_MAX - 9) / 10) {
        return ep_fail(EP_ERR_METADATA, "metadata line %d: dimension too large", lineno);
      }
      v = v * 10 + (tok[i] - '0');
      ++i;
    }
    if (i == start) {
      return ep_fail(EP_ERR_METADATA,
                     "metadata line %d: shape '%.*s' is not a comma-separated list of "
                     "non-negative integers and '?'",
                     lineno, (int)len, tok);
    }
    if (info->ndim >= EP_MAX_NDIM) {
      return ep_fail(EP_ERR_METADATA, "metadata line %d: more than %d dimensions", lineno,
                     EP_MAX_NDIM);
    }
    if (refs != NULL) refs[info->ndim] = ref;
    info->shape[info->ndim++] = v;
    if (i < len) {
      if (tok[i] != ',' || i + 1 == len) {
        return ep_fail(EP_ERR_METADATA, "metadata line %d: malformed shape '%.*s'", lineno,
                       (int)len, tok);
      }
      ++i;
    }
  }
  return EP_OK;
}

/* byte_size of a parsed tensor; an input's dynamic dimensions (refs) count at their maximum. */
static ep_status ep_info_finish(const ep_model* m, ep_tensor_info* info, const int* refs,
                                int lineno) {
  size_t bytes = ep_dtype_size(info->dtype);
  int i;
  for (i = 0; i < info->ndim; ++i) {
    int64_t extent = info->shape[i];
    if (extent < 0 && refs != NULL && refs[i] >= 0) extent = m->dims[refs[i]].max;
    if (extent < 0) { /* a dynamic output: its size is known after a run */
      info->byte_size = 0;
      return EP_OK;
    }
    if ((uint64_t)extent > (uint64_t)((size_t)-1) ||
        (extent != 0 && bytes > (size_t)-1 / (size_t)extent)) {
      return ep_fail(EP_ERR_METADATA, "metadata line %d: tensor too large", lineno);
    }
    bytes *= (size_t)extent;
  }
  info->byte_size = bytes;
  return EP_OK;
}

/* A non-negative decimal integer token; 0 if it is not one (or overflows). */
static int ep_parse_int64(const char* tok, size_t len, int64_t* out) {
  size_t i;
  int64_t v = 0;
  if (len == 0) return 0;
  for (i = 0; i < len; ++i) {
    if (tok[i] < '0' || tok[i] > '9' || v > (INT64_MAX - 9) / 10) return 0;
    v = v * 10 + (tok[i] - '0');
  }
  *out = v;
  return 1;
}

/* "dim <name> <min> <max> <step>" (cur: the rest of the line after "dim"). */
static ep_status ep_parse_dim(ep_model* m, const char* cur, const char* end, int lineno) {
  const char* name;
  const char* tok;
  size_t name_len, len, i;
  int64_t v[3];
  ep_dim_def* d;
  if (m->num_dims >= EP_MAX_DIMS) {
    return ep_fail(EP_ERR_METADATA, "metadata line %d: more than %d dynamic dimensions", lineno,
                   EP_MAX_DIMS);
  }
  if (!ep_next_token(&cur, end, &name, &name_len)) {
    return ep_fail(EP_ERR_METADATA, "metadata line %d: missing dimension name", lineno);
  }
  for (i = 0; i < name_len; ++i) {
    if (i == 0 ? !ep_is_ident_start(name[i]) : !ep_is_ident_char(name[i])) {
      return ep_fail(EP_ERR_METADATA,
                     "metadata line %d: dimension name '%.*s' is not an identifier "
                     "([A-Za-z_][A-Za-z0-9_]*)",
                     lineno, (int)name_len, name);
    }
  }
  if (ep_find_dim(m, name, name_len) >= 0) {
    return ep_fail(EP_ERR_METADATA, "metadata line %d: dimension '%.*s' is declared twice", lineno,
                   (int)name_len, name);
  }
  for (i = 0; i < 3; ++i) {
    if (!ep_next_token(&cur, end, &tok, &len) || !ep_parse_int64(tok, len, &v[i])) {
      return ep_fail(EP_ERR_METADATA,
                     "metadata line %d: expected 'dim %.*s <min> <max> <step>' with non-negative "
                     "integers",
                     lineno, (int)name_len, name);
    }
  }
  if (ep_next_token(&cur, end, &tok, &len)) {
    return ep_fail(EP_ERR_METADATA, "metadata line %d: unexpected '%.*s'", lineno, (int)len, tok);
  }
  if (v[0] < 1 || v[1] < v[0] || v[2] < 1 || (v[1] - v[0]) % v[2] != 0) {
    return ep_fail(EP_ERR_METADATA,
                   "metadata line %d: bad range for dimension %.*s: min %lld, max %lld, step %lld "
                   "(needs 1 <= min <= max, step >= 1, max - min a multiple of step)",
                   lineno, (int)name_len, name, (long long)v[0], (long long)v[1],
                   (long long)v[2]);
  }
  d = &m->dims[m->num_dims];
  d->name = (char*)malloc(name_len + 1);
  if (d->name == NULL) return ep_fail(EP_ERR_NO_MEMORY, "out of memory reading metadata");
  memcpy(d->name, name, name_len);
  d->name[name_len] = '\0';
  d->min = v[0];
  d->max = v[1];
  d->step = v[2];
  ++m->num_dims;
  return EP_OK;
}

static ep_status ep_parse_meta(ep_model* m, const char* text) {
  const char* p = text;
  int lineno = 0;
  int version = 0; /* 0 until the header is read */
  int cap_in = 0, cap_out = 0;
  while (*p != '\0') {
    const char* line = p;
    const char* end = strchr(p, '\n');
    const char* cur;
    const char* tok;
    size_t len;
    ep_tensor_info info;
    ep_input_dims refs;
    int is_input, i;
    ep_status st;
    if (end == NULL) end = p + strlen(p);
    p = (*end == '\n') ? end + 1 : end;
    ++lineno;
    cur = line;
    if (!ep_next_token(&cur, end, &tok, &len) || tok[0] == '#') continue;
    if (version == 0) {
      const char* ver;
      size_t ver_len;
      if (len != 19 || strncmp(tok, "edgepack-model-meta", 19) != 0) {
        return ep_fail(EP_ERR_METADATA,
                       "metadata line %d: expected the header 'edgepack-model-meta 1' (or 2)",
                       lineno);
      }
      if (!ep_next_token(&cur, end, &ver, &ver_len) || ver_len != 1 ||
          (ver[0] != '1' && ver[0] != '2')) {
        return ep_fail(EP_ERR_METADATA,
                       "metadata line %d: unsupported metadata version (this runtime reads 1 and 2)",
                       lineno);
      }
      version = ver[0] - '0';
      continue;
    }
    if (len == 3 && strncmp(tok, "dim", 3) == 0) {
      if (version < 2) {
        return ep_fail(EP_ERR_METADATA,
                       "metadata line %d: 'dim' lines need the header 'edgepack-model-meta 2'",
                       lineno);
      }
      if (m->num_inputs > 0 || m->num_outputs > 0) {
        return ep_fail(EP_ERR_METADATA,
                       "metadata line %d: 'dim' lines must come before the inputs and outputs",
                       lineno);
      }
      st = ep_parse_dim(m, cur, end, lineno);
      if (st != EP_OK) return st;
      continue;
    }
    if (len == 5 && strncmp(tok, "input", 5) == 0) {
      is_input = 1;
    } else if (len == 6 && strncmp(tok, "output", 6) == 0) {
      is_input = 0;
    } else {
      return ep_fail(EP_ERR_METADATA,
                     "metadata line %d: expected 'input', 'output' or 'dim', got '%.*s'", lineno,
                     (int)len, tok);
    }
    memset(&info, 0, sizeof(info));
    for (i = 0; i < EP_MAX_NDIM; ++i) refs.ref[i] = -1;
    if (!ep_next_token(&cur, end, &tok, &len)) {
      return ep_fail(EP_ERR_METADATA, "metadata line %d: missing tensor name", lineno);
    }
    info.name = ep_decode_name(tok, len);
    if (info.name == NULL) {
      return ep_fail(EP_ERR_METADATA, "metadata line %d: malformed name '%.*s'", lineno, (int)len,
                     tok);
    }
    st = EP_OK;
    if (!ep_next_token(&cur, end, &tok, &len)) {
      st = ep_fail(EP_ERR_METADATA, "metadata line %d: missing dtype", lineno);
    } else {
      char dtype_name[32];
      size_t n = len < sizeof(dtype_name) - 1 ? len : sizeof(dtype_name) - 1;
      memcpy(dtype_name, tok, n);
      dtype_name[n] = '\0';
      info.dtype = ep_dtype_from_name(dtype_name);
      if (info.dtype == EP_DTYPE_UNKNOWN) {
        st = ep_fail(EP_ERR_METADATA, "metadata line %d: unknown dtype '%s'", lineno, dtype_name);
      } else if (!ep_next_token(&cur, end, &tok, &len)) {
        st = ep_fail(EP_ERR_METADATA, "metadata line %d: missing shape", lineno);
      } else {
        int* named = (is_input && version >= 2) ? refs.ref : NULL;
        st = ep_parse_shape(m, tok, len, &info, named, lineno);
        if (st == EP_OK) st = ep_info_finish(m, &info, named, lineno);
        if (st == EP_OK && ep_next_token(&cur, end, &tok, &len)) {
          st = ep_fail(EP_ERR_METADATA, "metadata line %d: unexpected '%.*s'", lineno, (int)len,
                       tok);
        }
      }
    }
    for (i = 0; st == EP_OK && is_input && i < info.ndim; ++i) {
      if (info.shape[i] < 0 && refs.ref[i] < 0) {
        st = ep_fail(EP_ERR_METADATA, "metadata line %d: input '%s' has a dimension decided at "
                     "run time ('?'); inputs need static shapes or a named dimension declared by "
                     "a 'dim' line", lineno, info.name);
      }
    }
    if (st == EP_OK) {
      ep_tensor_info** arr = is_input ? &m->inputs : &m->outputs;
      int* count = is_input ? &m->num_inputs : &m->num_outputs;
      int* cap = is_input ? &cap_in : &cap_out;
      if (*count == *cap) {
        int new_cap = *cap == 0 ? 4 : *cap * 2;
        ep_tensor_info* grown =
            (ep_tensor_info*)realloc(*arr, (size_t)new_cap * sizeof(ep_tensor_info));
        if (grown != NULL) *arr = grown;
        if (grown != NULL && is_input) {
          ep_input_dims* grown_dims = (ep_input_dims*)realloc(
              m->input_dims, (size_t)new_cap * sizeof(ep_input_dims));
          if (grown_dims != NULL) m->input_dims = grown_dims;
          if (grown_dims == NULL) grown = NULL;
        }
        if (grown == NULL) {
          st = ep_fail(EP_ERR_NO_MEMORY, "out of memory reading metadata");
        } else {
          *cap = new_cap;
        }
      }
      if (st == EP_OK) {
        if (is_input) m->input_dims[*count] = refs;
        (*arr)[(*count)++] = info;
      }
    }
    if (st != EP_OK) {
      free((void*)info.name);
      return st;
    }
  }
  if (version == 0) {
    return ep_fail(EP_ERR_METADATA, "metadata is empty (expected 'edgepack-model-meta 1' or 2)");
  }
  if (m->num_outputs == 0) {
    return ep_fail(EP_ERR_METADATA, "metadata lists no outputs");
  }
  return EP_OK;
}

static ep_status ep_read_file(const char* path, char** out_text) {
  FILE* f = fopen(path, "rb");
  long size;
  char* buf;
  *out_text = NULL;
  if (f == NULL) {
    return ep_fail(errno == ENOENT ? EP_ERR_NOT_FOUND : EP_ERR_IO, "cannot open %s: %s", path,
                   strerror(errno));
  }
  if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return ep_fail(EP_ERR_IO, "cannot read %s", path);
  }
  buf = (char*)malloc((size_t)size + 1);
  if (buf == NULL) {
    fclose(f);
    return ep_fail(EP_ERR_NO_MEMORY, "out of memory reading %s", path);
  }
  if (size > 0 && fread(buf, 1, (size_t)size, f) != (size_t)size) {
    free(buf);
    fclose(f);
    return ep_fail(EP_ERR_IO, "cannot read %s", path);
  }
  fclose(f);
  buf[size] = '\0';
  *out_text = buf;
  return EP_OK;
}

/* "<dir>/<stem>.meta" for "<dir>/<stem>.<ext>" (or "<path>.meta" without extension). */
static char* ep_sidecar_path(const char* lib_path) {
  const char* slash = strrchr(lib_path, '/');
  const char* dot = strrchr(lib_path, '.');
  size_t stem_len = (dot != NULL && (slash == NULL || dot > slash + 1)) ? (size_t)(dot - lib_path)
                                                                        : strlen(lib_path);
  char* out = (char*)malloc(stem_len + 6);
  if (out == NULL) return NULL;
  memcpy(out, lib_path, stem_len);
  memcpy(out + stem_len, ".meta", 6);
  return out;
}

/* Metadata embedded by edgepack: a library function "edgepack_meta" returning the text. */
static ep_status ep_embedded_meta(TVMFFIObjectHandle exec, const char** out_text) {
  TVMFFIObjectHandle f = NULL;
  TVMFFIAny res;
  ep_status st = ep_module_function(exec, "edgepack_meta", 1, &f);
  *out_text = NULL;
  if (st != EP_OK || f == NULL) return st;
  if (ep_call(f, NULL, 0, &res) != 0) {
    ep_release(&f);
    return ep_fail_tvm(EP_ERR_METADATA, "edgepack_meta");
  }
  ep_release(&f);
  if (res.type_index == kTVMFFIOpaquePtr) {
    *out_text = (const char*)res.v_ptr; /* static storage in the model library */
    return EP_OK;
  }
  ep_any_release(&res);
  return ep_fail(EP_ERR_METADATA, "edgepack_meta of the model returned an unexpected value");
}

/* ---------------------------------------------------------------------------------------- */
/* open / close                                                                               */

/* ---- GPU models: edgepack's runtime plug-ins (runtimes/plugins/opencl, runtimes/plugins/vulkan) -------- */

/* One GPU runtime plug-in: its file, the variable that overrides where it is, the module loader
 * it registers (present = loaded), the function that says whether a model needs it, and the TVM
 * device type such models run on. */
typedef struct {
  const char* file;
  const char* env;
  const char* loader;
  const char* uses;
  int device_type;
  const char* what;
} ep_plugin_info;

static const ep_plugin_info ep_plugins[] = {
    {"libtvm_opencl.so", "EDGEPACK_OPENCL_PLUGIN", "ffi.Module.load_from_bytes.opencl",
     "edgepack.opencl.uses_opencl", kDLOpenCL, "an OpenCL GPU"},
    /* TVM's webgpu device: WGSL shaders run by wgpu-native (on Vulkan) */
    {"libtvm_vulkan.so", "EDGEPACK_VULKAN_PLUGIN", "ffi.Module.load_from_bytes.webgpu",
     "edgepack.vulkan.uses_webgpu", kDLWebGPU, "a Vulkan GPU (WGSL on wgpu-native)"},
};
#define EP_NUM_PLUGINS ((int)(sizeof(ep_plugins) / sizeof(ep_plugins[0])))

ep_status ep_load_plugin(const char* path) {
  void* handle;
  if (path == NULL || path[0] == '\0') {
    return ep_fail(EP_ERR_INVALID_ARGUMENT, "ep_load_plugin: path is NULL or empty");
  }
  /* RTLD_GLOBAL: the plug-in's static initialisers register its functions with tvm-ffi */
  handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (handle == NULL) {
    const char* why = dlerror();
    return ep_fail(EP_ERR_LOAD, "cannot load the plug-in %s: %s", path, why ? why : "unknown error");
  }
  return EP_OK; /* never dlclose()d: TVM keeps pointers to what it registered */
}

static int ep_global_exists(const char* name) {
  TVMFFIObjectHandle f = NULL;
  TVMFFIByteArray bytes;
  bytes.data = name;
  bytes.size = strlen(name);
  if (TVMFFIFunctionGetGlobal(&bytes, &f) != 0) {
    TVMFFIObjectHandle err = NULL;
    TVMFFIErrorMoveFromRaised(&err);
    if (err != NULL) TVMFFIObjectDecRef(err);
    return 0;
  }
  if (f == NULL) return 0;
  ep_release(&f);
  return 1;
}

/* Load one plug-in if it is not registered yet: from its environment variable, else from the
 * model's directory (a C bundle keeps lib/model.so next to lib/libtvm_opencl.so or
 * lib/libtvm_vulkan.so). Not found is fine: CPU models need none. */
static ep_status ep_autoload_plugin(const ep_plugin_info* plugin, const char* model_path) {
  const char* env = getenv(plugin->env);
  const char* slash;
  char* candidate;
  size_t dir_len;
  ep_status st = EP_OK;
  if (ep_global_exists(plugin->loader)) return EP_OK;
  if (env != NULL && env[0] != '\0') return ep_load_plugin(env);
  if (model_path == NULL) return EP_OK;
  slash = strrchr(model_path, '/');
  dir_len = slash == NULL ? 0 : (size_t)(slash - model_path) + 1;
  candidate = (char*)malloc(dir_len + strlen(plugin->file) + 3);
  if (candidate == NULL) return ep_fail(EP_ERR_NO_MEMORY, "out of memory");
  if (dir_len == 0) {
    strcpy(candidate, "./");
  } else {
    memcpy(candidate, model_path, dir_len);
    candidate[dir_len] = '\0';
  }
  strcat(candidate, plugin->file);
  if (access(candidate, R_OK) == 0) st = ep_load_plugin(candidate);
  free(candidate);
  return st;
}

/* Before opening a model file: make the GPU runtimes available if they are not yet. */
/* tvm-ffi (c_env_api.h, not shipped in the bundle's include/): a pointer every library loaded afterwards
   gets for one of its context symbols. */
extern int TVMFFIEnvModRegisterContextSymbol(const char* name, void* symbol);

/* Models' parallel loops on edgepack's pool (ep_parallel.c) rather than TVM's: it hands parts out to
   whichever thread is free, so a busy core does not stall every kernel. Done once, before the first
   model is loaded (libraries take the pointers when they load). EDGEPACK_PARALLEL=tvm keeps TVM's. */
static void ep_install_parallel(void) {
  static volatile int done = 0;
  const char* choice = getenv("EDGEPACK_PARALLEL");
  if (done) return;
  done = 1;
  if (choice != NULL && strcmp(choice, "tvm") == 0) return;
  ep_parallel_install(TVMFFIEnvModRegisterContextSymbol);
}

static ep_status ep_autoload_plugins(const char* model_path) {
  ep_install_parallel(); /* every open path passes here before it loads the model */
  int i;
  for (i = 0; i < EP_NUM_PLUGINS; ++i) {
    ep_status st = ep_autoload_plugin(&ep_plugins[i], model_path);
    if (st != EP_OK) return st;
  }
  return EP_OK;
}

/* After a failed load: say what is missing when the model needs a GPU runtime. */
static ep_status ep_explain_missing_plugin(ep_status st) {
  int i;
  for (i = 0; st != EP_OK && i < EP_NUM_PLUGINS; ++i) {
    const ep_plugin_info* p = &ep_plugins[i];
    if (strstr(ep_error_buf, p->loader) != NULL) {
      size_t n = strlen(ep_error_buf);
      snprintf(ep_error_buf + n, sizeof(ep_error_buf) - n,
               " -- this model runs on %s: put edgepack's runtime (%s) next to the model library, "
               "set %s, or call ep_load_plugin()",
               p->what, p->file, p->env);
      break;
    }
  }
  return st;
}

/* Which device the executable runs on (asks each loaded plug-in; none says yes: the CPU). */
static ep_status ep_pick_device(ep_model* m) {
  TVMFFIAny args[1];
  TVMFFIAny res;
  ep_status st;
  int i;
  m->device_type = kDLCPU;
  m->device_id = 0;
  for (i = 0; i < EP_NUM_PLUGINS; ++i) {
    if (!ep_global_exists(ep_plugins[i].uses)) continue;
    args[0] = ep_any_obj(m->exec);
    st = ep_call_global(ep_plugins[i].uses, args, 1, &res, EP_ERR_LOAD);
    if (st != EP_OK) return st;
    if (res.type_index == kTVMFFIBool && res.v_int64 != 0) m->device_type = ep_plugins[i].device_type;
    ep_any_release(&res);
    if (m->device_type != kDLCPU) break;
  }
  return EP_OK;
}

/* A copy of tensor `h` on (device_type, device_id); *out owned by the caller. */
static ep_status ep_copy_tensor_to(TVMFFIObjectHandle h, int device_type, int device_id,
                                   TVMFFIObjectHandle* out) {
  TVMFFIAny args[3];
  TVMFFIAny res;
  ep_status st;
  args[0] = ep_any_obj(h);
  args[1] = ep_any_int(device_type);
  args[2] = ep_any_int(device_id);
  *out = NULL;
  st = ep_call_global("vm.builtin.to_device", args, 3, &res, EP_ERR_RUNTIME);
  if (st != EP_OK) return st;
  if (res.type_index != kTVMFFITensor) {
    ep_any_release(&res);
    return ep_fail(EP_ERR_RUNTIME, "copying a tensor between devices returned no tensor");
  }
  *out = res.v_obj;
  return EP_OK;
}

static void ep_model_destroy(ep_model* m) {
  int i;
  if (m == NULL) return;
  if (m->out_tensors != NULL) {
    for (i = 0; i < m->num_outputs; ++i) ep_release(&m->out_tensors[i]);
    free(m->out_tensors);
  }
  if (m->slots != NULL) {
    for (i = 0; i < m->num_inputs; ++i) {
      ep_release(&m->slots[i].tensor);
      ep_free(m->slots[i].copy);
    }
    free(m->slots);
  }
  ep_release(&m->main);
  ep_release(&m->vm);
  ep_release(&m->exec);
  ep_free_infos(m->inputs, m->num_inputs);
  ep_free_infos(m->outputs, m->num_outputs);
  free(m->input_dims);
  for (i = 0; i < m->num_dims; ++i) free(m->dims[i].name);
  m->magic = 0;
  free(m);
}

static ep_status ep_check_arity(ep_model* m) {
  TVMFFIObjectHandle f = NULL;
  TVMFFIAny args[1];
  TVMFFIAny res;
  ep_status st = ep_module_function(m->vm, "get_function_arity", 0, &f);
  if (st != EP_OK || f == NULL) return st; /* older runtimes: skip the check */
  args[0] = ep_any_str("main");
  if (ep_call(f, args, 1, &res) != 0) {
    ep_release(&f);
    return ep_fail_tvm(EP_ERR_LOAD, "the model has no function 'main'");
  }
  ep_release(&f);
  if (res.type_index == kTVMFFIInt && res.v_int64 != m->num_inputs) {
    return ep_fail(EP_ERR_METADATA,
                   "metadata lists %d inputs but the model's main function takes %lld",
                   m->num_inputs, (long long)res.v_int64);
  }
  ep_any_release(&res);
  return EP_OK;
}

/*
 * Finish opening: m->exec holds the executable module. meta_text (may be NULL) and
 * sidecar (may be NULL) are the metadata sources after the embedded one.
 */
/* ---------------------------------------------------------------------------------------- */
/* run-time builtins TVM's Python package provides                                           */
/*
 * TVM lowers the Relax operators whose output shape depends on the data (nonzero, unique) to
 * calls of global functions that its Python package registers with NumPy ("relax.run.nonzero",
 * "relax.run.unique"). A device has no Python, so models with NonZero, Compress or Unique fail
 * there in vm_initialization; the C API registers C versions of them (once per process, unless
 * something else already did), with NumPy's semantics as TVM calls them. The same for the sort
 * kernels of TVM's optional runtime "contrib" part (argsort for NMS, topk for TopK), which the
 * device runtimes do not have.
 */

typedef struct {
  DLManagedTensor managed; /* must stay first: the deleter frees the whole struct and its data */
  int64_t shape[EP_MAX_NDIM];
} ep_owned_tensor;

static void ep_owned_tensor_deleter(DLManagedTensor* self) {
  free(self->dl_tensor.data);
  free(self);
}

/* A new zeroed CPU tensor; NULL (with the TVM error raised) on failure. */
static TVMFFIObjectHandle ep_new_tensor(DLDataType dtype, int ndim, const int64_t* shape,
                                        void** data) {
  ep_owned_tensor* t = (ep_owned_tensor*)calloc(1, sizeof(ep_owned_tensor));
  TVMFFIObjectHandle out = NULL;
  size_t n = 1;
  int i;
  for (i = 0; i < ndim; ++i) n *= (size_t)shape[i];
  if (t != NULL) t->managed.dl_tensor.data = calloc(n ? n : 1, (size_t)(dtype.bits / 8));
  if (t == NULL || t->managed.dl_tensor.data == NULL) {
    if (t != NULL) free(t);
    TVMFFIErrorSetRaisedFromCStr("MemoryError", "edgepack: out of memory in a run-time builtin");
    return NULL;
  }
  for (i = 0; i < ndim; ++i) t->shape[i] = shape[i];
  t->managed.dl_tensor.device.device_type = kDLCPU;
  t->managed.dl_tensor.ndim = ndim;
  t->managed.dl_tensor.dtype = dtype;
  t->managed.dl_tensor.shape = t->shape;
  t->managed.deleter = ep_owned_tensor_deleter;
  *data = t->managed.dl_tensor.data;
  if (TVMFFITensorFromDLPack(&t->managed, 0, 0, &out) != 0) {
    ep_owned_tensor_deleter(&t->managed);
    return NULL;
  }
  return out;
}

static const DLTensor* ep_arg_tensor(const TVMFFIAny* args, int32_t num_args, int i) {
  if (i >= num_args) return NULL;
  if (args[i].type_index == kTVMFFIDLTensorPtr) return (const DLTensor*)args[i].v_ptr;
  if (args[i].type_index == kTVMFFITensor) {
    return (const DLTensor*)((const char*)args[i].v_obj + sizeof(TVMFFIObject));
  }
  return NULL;
}

static int ep_builtin_fail(const char* message) {
  TVMFFIErrorSetRaisedFromCStr("ValueError", message);
  return -1;
}

static size_t ep_numel(const DLTensor* t) {
  size_t n = 1;
  int i;
  for (i = 0; i < t->ndim; ++i) n *= (size_t)t->shape[i];
  return n;
}

static int ep_compact(const DLTensor* t) {
  int64_t expect = 1;
  int d;
  if (t->strides == NULL) return 1;
  for (d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] != 1 && t->strides[d] != expect) return 0;
    expect *= t->shape[d];
  }
  return 1;
}

static double ep_half(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  float f;
  if (exp == 0) {
    f = (float)man * (1.0f / 16777216.0f); /* subnormal: man * 2^-24 */
    return sign ? -f : f;
  }
  bits = sign | (exp == 31 ? 0x7f800000u : (exp + 112u) << 23) | (man << 13);
  memcpy(&f, &bits, sizeof(f));
  return f;
}

/* Element i of a compact tensor as a number: *kind 0 signed, 1 unsigned, 2 float. */
static void ep_element(const DLTensor* t, size_t i, int* kind, int64_t* s, uint64_t* u,
                       double* f) {
  const char* p = (const char*)t->data + t->byte_offset + i * (size_t)(t->dtype.bits / 8);
  *kind = 1;
  *s = 0;
  *u = 0;
  *f = 0;
  if (t->dtype.code == kDLInt) {
    *kind = 0;
    switch (t->dtype.bits) {
      case 8: *s = *(const int8_t*)p; break;
      case 16: *s = *(const int16_t*)p; break;
      case 32: *s = *(const int32_t*)p; break;
      default: *s = *(const int64_t*)p; break;
    }
  } else if (t->dtype.code == kDLFloat && t->dtype.bits >= 16) {
    *kind = 2;
    if (t->dtype.bits == 16) {
      *f = ep_half(*(const uint16_t*)p);
    } else if (t->dtype.bits == 32) {
      *f = *(const float*)p;
    } else {
      *f = *(const double*)p;
    }
  } else if (t->dtype.code == kDLBfloat) {
    uint32_t bits = (uint32_t)(*(const uint16_t*)p) << 16;
    float v;
    memcpy(&v, &bits, sizeof(v));
    *kind = 2;
    *f = v;
  } else { /* unsigned, bool, 8-bit floats (by their bits) */
    switch (t->dtype.bits) {
      case 16: *u = *(const uint16_t*)p; break;
      case 32: *u = *(const uint32_t*)p; break;
      case 64: *u = *(const uint64_t*)p; break;
      default: *u = *(const uint8_t*)p; break;
    }
  }
}

/* NumPy's order: numbers ascending, NaN after everything and equal to NaN. */
static int ep_element_cmp(const DLTensor* t, size_t a, size_t b) {
  int kind;
  int64_t sa, sb;
  uint64_t ua, ub;
  double fa, fb;
  ep_element(t, a, &kind, &sa, &ua, &fa);
  ep_element(t, b, &kind, &sb, &ub, &fb);
  if (kind == 0) return (sa > sb) - (sa < sb);
  if (kind == 1) return (ua > ub) - (ua < ub);
  if (fa != fa || fb != fb) return (fa != fa) - (fb != fb);
  return (fa > fb) - (fa < fb);
}

static int ep_run_nonzero(void* self, const TVMFFIAny* args, int32_t num_args,
                          TVMFFIAny* result) {
  const DLTensor* x = ep_arg_tensor(args, num_args, 0);
  size_t n, i, count = 0, j = 0;
  int64_t shape[2];
  int64_t* out;
  DLDataType i64 = {kDLInt, 64, 1};
  TVMFFIObjectHandle h;
  (void)self;
  if (x == NULL || !ep_compact(x)) return ep_builtin_fail("relax.run.nonzero expects a dense tensor");
  n = ep_numel(x);
  for (i = 0; i < n; ++i) {
    int kind;
    int64_t s;
    uint64_t u;
    double f;
    ep_element(x, i, &kind, &s, &u, &f);
    count += kind == 0 ? s != 0 : kind == 1 ? u != 0 : f != 0.0;
  }
  shape[0] = x->ndim > 0 ? x->ndim : 1; /* np.atleast_1d(x).nonzero() */
  shape[1] = (int64_t)count;
  h = ep_new_tensor(i64, 2, shape, (void**)&out);
  if (h == NULL) return -1;
  for (i = 0; i < n; ++i) {
    int kind, d;
    int64_t s;
    uint64_t u;
    double f;
    size_t rest = i;
    ep_element(x, i, &kind, &s, &u, &f);
    if (!(kind == 0 ? s != 0 : kind == 1 ? u != 0 : f != 0.0)) continue;
    for (d = (int)shape[0] - 1; d >= 0; --d) { /* the coordinates of flat index i */
      int64_t extent = x->ndim > 0 ? x->shape[d] : 1;
      out[(size_t)d * count + j] = (int64_t)(rest % (size_t)extent);
      rest /= (size_t)extent;
    }
    ++j;
  }
  result->type_index = kTVMFFITensor;
  result->v_obj = (TVMFFIObject*)h;
  return 0;
}

/* unique: items are the elements (axis None) or the slices along an axis, compared in order */
typedef struct {
  const DLTensor* x;
  size_t outer, extent, inner; /* x as [outer, extent (the items), inner] */
} ep_items;

static ep_items ep_items_of(const DLTensor* x, int axis) {
  ep_items it;
  int d;
  it.x = x;
  it.outer = 1;
  it.inner = 1;
  if (axis < 0) {
    it.extent = ep_numel(x);
    return it;
  }
  it.extent = (size_t)x->shape[axis];
  for (d = 0; d < axis; ++d) it.outer *= (size_t)x->shape[d];
  for (d = axis + 1; d < x->ndim; ++d) it.inner *= (size_t)x->shape[d];
  return it;
}

static int ep_item_cmp(const ep_items* it, size_t a, size_t b) {
  size_t o, k;
  for (o = 0; o < it->outer; ++o) {
    for (k = 0; k < it->inner; ++k) {
      int c = ep_element_cmp(it->x, (o * it->extent + a) * it->inner + k,
                             (o * it->extent + b) * it->inner + k);
      if (c != 0) return c;
    }
  }
  return 0;
}

/* A stable sort of item indices (merge sort: equal items keep their order, as NumPy's does). */
static void ep_sort_items(const ep_items* it, size_t* idx, size_t* tmp, size_t n) {
  size_t mid, a, b, k;
  if (n < 2) return;
  mid = n / 2;
  ep_sort_items(it, idx, tmp, mid);
  ep_sort_items(it, idx + mid, tmp, n - mid);
  for (a = 0, b = mid, k = 0; k < n; ++k) {
    if (b >= n || (a < mid && ep_item_cmp(it, idx[a], idx[b]) <= 0)) {
      tmp[k] = idx[a++];
    } else {
      tmp[k] = idx[b++];
    }
  }
  memcpy(idx, tmp, n * sizeof(size_t));
}

static int ep_run_unique(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  const DLTensor* x = ep_arg_tensor(args, num_args, 0);
  int sorted, want_index, want_inverse, want_counts, axis = -1, nout = 0, i;
  size_t n, g, groups = 0, k, elem;
  size_t *order = NULL, *tmp = NULL, *group_of = NULL, *first = NULL, *count = NULL, *rank = NULL;
  TVMFFIAny outs[4];
  DLDataType i64 = {kDLInt, 64, 1};
  ep_items it;
  int rc = -1;
  (void)self;
  if (x == NULL || !ep_compact(x) || num_args < 5) {
    return ep_builtin_fail("relax.run.unique expects a dense tensor and four flags");
  }
  sorted = args[1].v_int64 != 0;
  want_index = args[2].v_int64 != 0;
  want_inverse = args[3].v_int64 != 0;
  want_counts = args[4].v_int64 != 0;
  if (num_args > 5 && args[5].type_index == kTVMFFIInt) {
    axis = (int)args[5].v_int64;
    if (axis < 0) axis += x->ndim;
    if (axis < 0 || axis >= x->ndim) return ep_builtin_fail("relax.run.unique: axis out of range");
  }
  it = ep_items_of(x, axis);
  n = it.extent;
  elem = (size_t)(x->dtype.bits / 8);
  order = (size_t*)malloc((n ? n : 1) * sizeof(size_t));
  tmp = (size_t*)malloc((n ? n : 1) * sizeof(size_t));
  group_of = (size_t*)malloc((n ? n : 1) * sizeof(size_t));
  first = (size_t*)malloc((n ? n : 1) * sizeof(size_t));
  count = (size_t*)calloc(n ? n : 1, sizeof(size_t));
  rank = (size_t*)malloc((n ? n : 1) * sizeof(size_t));
  for (i = 0; i < 4; ++i) outs[i] = ep_any_none();
  if (!order || !tmp || !group_of || !first || !count || !rank) {
    TVMFFIErrorSetRaisedFromCStr("MemoryError", "edgepack: out of memory in relax.run.unique");
    goto done;
  }
  for (k = 0; k < n; ++k) order[k] = k;
  ep_sort_items(&it, order, tmp, n);
  for (k = 0; k < n; ++k) { /* groups in sorted order; first = the earliest index (stable sort) */
    if (k == 0 || ep_item_cmp(&it, order[k - 1], order[k]) != 0) first[groups++] = order[k];
    group_of[order[k]] = groups - 1;
    count[groups - 1]++;
  }
  for (g = 0; g < groups; ++g) rank[g] = g; /* rank[g]: position of group g in the output */
  if (!sorted) { /* order of first occurrence: groups ranked by their first index */
    size_t* by_first = tmp;
    for (g = 0; g < groups; ++g) by_first[g] = g;
    for (g = 1; g < groups; ++g) { /* insertion sort of group ids by first index */
      size_t v = by_first[g], j = g;
      while (j > 0 && first[by_first[j - 1]] > first[v]) {
        by_first[j] = by_first[j - 1];
        --j;
      }
      by_first[j] = v;
    }
    for (g = 0; g < groups; ++g) rank[by_first[g]] = g;
  }
  { /* the unique values */
    int64_t shape[EP_MAX_NDIM];
    int ndim = axis < 0 ? 1 : x->ndim, d;
    char* data;
    TVMFFIObjectHandle h;
    for (d = 0; d < ndim; ++d) shape[d] = axis < 0 ? (int64_t)groups : x->shape[d];
    if (axis >= 0) shape[axis] = (int64_t)groups;
    h = ep_new_tensor(x->dtype, ndim, shape, (void**)&data);
    if (h == NULL) goto done;
    outs[nout++] = ep_any_obj(h);
    for (g = 0; g < groups; ++g) {
      size_t o, src = first[g], dst = rank[g];
      for (o = 0; o < it.outer; ++o) {
        memcpy(data + ((o * groups + dst) * it.inner) * elem,
               (const char*)x->data + x->byte_offset + ((o * n + src) * it.inner) * elem,
               it.inner * elem);
      }
    }
  }
  for (i = 0; i < 3; ++i) { /* index, inverse, counts: int64, as NumPy returns them */
    int64_t len;
    int64_t* data;
    TVMFFIObjectHandle h;
    if (!(i == 0 ? want_index : i == 1 ? want_inverse : want_counts)) continue;
    len = (int64_t)(i == 1 ? n : groups);
    h = ep_new_tensor(i64, 1, &len, (void**)&data);
    if (h == NULL) goto done;
    outs[nout++] = ep_any_obj(h);
    for (k = 0; k < (size_t)len; ++k) {
      if (i == 1) {
        data[k] = (int64_t)rank[group_of[k]];
      } else {
        data[rank[k]] = (int64_t)(i == 0 ? first[k] : count[k]);
      }
    }
  }
  if (nout == 1) {
    *result = outs[0];
    outs[0] = ep_any_none();
    rc = 0;
  } else {
    TVMFFIObjectHandle make = NULL;
    TVMFFIByteArray name = {"ffi.Array", 9};
    if (TVMFFIFunctionGetGlobal(&name, &make) == 0 && make != NULL) {
      rc = TVMFFIFunctionCall(make, outs, nout, result);
      TVMFFIObjectDecRef(make);
    } else {
      TVMFFIErrorSetRaisedFromCStr("RuntimeError", "edgepack: ffi.Array is not registered");
    }
  }
done:
  for (i = 0; i < 4; ++i) ep_any_release(&outs[i]);
  free(order);
  free(tmp);
  free(group_of);
  free(first);
  free(count);
  free(rank);
  return rc;
}

/* TVM's sort kernels (tvm.contrib.sort.*: argsort for NMS, topk for TopK, sort) live in its runtime's
   optional "contrib" part, which the device runtimes lack. Same semantics: along `axis`, a stable
   sort (ties keep their order), ascending or descending. */

static void ep_arg_string(const TVMFFIAny* a, char* buf, size_t size) {
  const char* data = "";
  size_t len = 0;
  if (a->type_index == kTVMFFIRawStr) {
    data = a->v_c_str;
    len = strlen(data);
  } else if (a->type_index == kTVMFFISmallStr) {
    data = a->v_bytes;
    len = a->small_str_len;
  } else if (a->type_index == kTVMFFIStr) {
    const TVMFFIByteArray* bytes = (const TVMFFIByteArray*)((const char*)a->v_obj + sizeof(TVMFFIObject));
    data = bytes->data;
    len = bytes->size;
  }
  if (len >= size) len = size - 1;
  memcpy(buf, data, len);
  buf[len] = '\0';
}

typedef struct {
  const DLTensor* x;
  size_t base, step; /* element k of the line is x[base + k * step] */
  int descending;
} ep_line;

/* Stable order of a line: by value (descending if asked), ties by position. */
static int ep_line_before(const ep_line* l, size_t a, size_t b) {
  int c = ep_element_cmp(l->x, l->base + a * l->step, l->base + b * l->step);
  if (l->descending) c = -c;
  return c < 0 || (c == 0 && a < b);
}

static void ep_sort_line(const ep_line* l, size_t* idx, size_t* tmp, size_t n) {
  size_t mid, a, b, k;
  if (n < 2) return;
  mid = n / 2;
  ep_sort_line(l, idx, tmp, mid);
  ep_sort_line(l, idx + mid, tmp, n - mid);
  for (a = 0, b = mid, k = 0; k < n; ++k) {
    tmp[k] = (b >= n || (a < mid && !ep_line_before(l, idx[b], idx[a]))) ? idx[a++] : idx[b++];
  }
  memcpy(idx, tmp, n * sizeof(size_t));
}

static int ep_store_index(DLTensor* out, size_t pos, int64_t v) {
  char* p = (char*)out->data + out->byte_offset;
  if (out->dtype.code == kDLInt && out->dtype.bits == 32) {
    ((int32_t*)p)[pos] = (int32_t)v;
  } else if (out->dtype.code == kDLInt && out->dtype.bits == 64) {
    ((int64_t*)p)[pos] = v;
  } else if (out->dtype.code == kDLFloat && out->dtype.bits == 32) {
    ((float*)p)[pos] = (float)v;
  } else if (out->dtype.code == kDLFloat && out->dtype.bits == 64) {
    ((double*)p)[pos] = (double)v;
  } else {
    return ep_builtin_fail("tvm.contrib.sort: unsupported index dtype");
  }
  return 0;
}

/* Sort every line of x along axis; write the first k of each: values (raw copies) and/or indices. */
static int ep_sort_lines(const DLTensor* x, int axis, int descending, int64_t k, DLTensor* values,
                         DLTensor* indices) {
  size_t before = 1, after = 1, n, i, j, kk, elem = (size_t)(x->dtype.bits / 8);
  size_t *idx, *tmp;
  int d, rc = 0;
  if (axis < 0) axis += x->ndim;
  if (axis < 0 || axis >= x->ndim) return ep_builtin_fail("tvm.contrib.sort: axis out of range");
  n = (size_t)x->shape[axis];
  if (k < 1 || (size_t)k > n) k = (int64_t)n;
  for (d = 0; d < x->ndim; ++d) {
    if (d < axis) before *= (size_t)x->shape[d];
    if (d > axis) after *= (size_t)x->shape[d];
  }
  idx = (size_t*)malloc((n ? n : 1) * sizeof(size_t));
  tmp = (size_t*)malloc((n ? n : 1) * sizeof(size_t));
  if (idx == NULL || tmp == NULL) {
    free(idx);
    free(tmp);
    TVMFFIErrorSetRaisedFromCStr("MemoryError", "edgepack: out of memory in tvm.contrib.sort");
    return -1;
  }
  for (i = 0; rc == 0 && i < before; ++i) {
    for (j = 0; rc == 0 && j < after; ++j) {
      ep_line line;
      line.x = x;
      line.base = i * n * after + j;
      line.step = after;
      line.descending = descending;
      for (kk = 0; kk < n; ++kk) idx[kk] = kk;
      ep_sort_line(&line, idx, tmp, n);
      for (kk = 0; rc == 0 && kk < (size_t)k; ++kk) {
        size_t dst = i * (size_t)k * after + j + kk * after;
        if (values != NULL) {
          memcpy((char*)values->data + values->byte_offset + dst * elem,
                 (const char*)x->data + x->byte_offset + (line.base + idx[kk] * after) * elem, elem);
        }
        if (indices != NULL) rc = ep_store_index(indices, dst, (int64_t)idx[kk]);
      }
    }
  }
  free(idx);
  free(tmp);
  return rc;
}

/* argsort(data, out, axis, is_ascend) and sort(data, out, axis, is_ascend) */
static int ep_sort_call(const TVMFFIAny* args, int32_t num_args, int values) {
  const DLTensor* x = ep_arg_tensor(args, num_args, 0);
  DLTensor* out = (DLTensor*)ep_arg_tensor(args, num_args, 1);
  if (x == NULL || out == NULL || num_args < 4 || !ep_compact(x)) {
    return ep_builtin_fail("tvm.contrib.sort: expects (data, out, axis, is_ascend)");
  }
  return ep_sort_lines(x, (int)args[2].v_int64, args[3].v_int64 == 0, 0, values ? out : NULL,
                       values ? NULL : out);
}

static int ep_run_argsort(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  (void)self;
  (void)result;
  return ep_sort_call(args, num_args, 0);
}

static int ep_run_sort(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  (void)self;
  (void)result;
  return ep_sort_call(args, num_args, 1);
}

/* topk(data, [values,] [indices,] k, axis, ret_type, is_ascend) */
static int ep_run_topk(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  const DLTensor* x = ep_arg_tensor(args, num_args, 0);
  DLTensor *values = NULL, *indices = NULL;
  char ret_type[16];
  (void)self;
  (void)result;
  if (x == NULL || num_args < 6 || !ep_compact(x)) {
    return ep_builtin_fail("tvm.contrib.sort.topk: expects (data, outputs..., k, axis, ret_type, is_ascend)");
  }
  ep_arg_string(&args[num_args - 2], ret_type, sizeof(ret_type));
  if (strcmp(ret_type, "both") == 0) {
    values = (DLTensor*)ep_arg_tensor(args, num_args, 1);
    indices = (DLTensor*)ep_arg_tensor(args, num_args, 2);
  } else if (strcmp(ret_type, "values") == 0) {
    values = (DLTensor*)ep_arg_tensor(args, num_args, 1);
  } else if (strcmp(ret_type, "indices") == 0) {
    indices = (DLTensor*)ep_arg_tensor(args, num_args, 1);
  } else {
    return ep_builtin_fail("tvm.contrib.sort.topk: unsupported ret_type");
  }
  return ep_sort_lines(x, (int)args[num_args - 3].v_int64, args[num_args - 1].v_int64 == 0,
                       args[num_args - 4].v_int64, values, indices);
}

static void ep_register_builtin(const char* name, TVMFFISafeCallType call) {
  TVMFFIByteArray bytes;
  TVMFFIObjectHandle f = NULL, err = NULL;
  bytes.data = name;
  bytes.size = strlen(name);
  if (TVMFFIFunctionGetGlobal(&bytes, &f) == 0 && f != NULL) { /* Python's, or registered before */
    TVMFFIObjectDecRef(f);
    return;
  }
  f = NULL;
  if (TVMFFIFunctionCreate(NULL, call, NULL, &f) == 0) {
    TVMFFIFunctionSetGlobal(&bytes, f, 0); /* fails harmlessly if another thread was first */
    TVMFFIObjectDecRef(f);
  }
  TVMFFIErrorMoveFromRaised(&err); /* nothing is left raised for the caller's next call */
  if (err != NULL) TVMFFIObjectDecRef(err);
}

/* edgepack.set_num_threads(n): ep_set_num_threads, for a program that drives models through TVM itself
   (the RPC server's clients); returns the count. edgepack.num_threads(): the pool's count now. */
static int ep_run_set_num_threads(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  (void)self;
  if (num_args != 1 || args[0].type_index != kTVMFFIInt) {
    return ep_builtin_fail("edgepack.set_num_threads expects one integer");
  }
  if (ep_set_num_threads((int)args[0].v_int64) != EP_OK) return ep_builtin_fail(ep_last_error());
  *result = ep_any_int(ep_parallel_threads());
  return 0;
}

static int ep_run_num_threads(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  (void)self;
  (void)args;
  (void)num_args;
  *result = ep_any_int(ep_parallel_threads());
  return 0;
}

void ep_register_runtime_builtins(void) {
  static volatile int done = 0;
  if (done) return;
  ep_install_parallel();
  ep_register_builtin("edgepack.set_num_threads", ep_run_set_num_threads);
  ep_register_builtin("edgepack.num_threads", ep_run_num_threads);
  ep_register_builtin("relax.run.nonzero", ep_run_nonzero);
  ep_register_builtin("relax.run.unique", ep_run_unique);
  ep_register_builtin("tvm.contrib.sort.argsort", ep_run_argsort);
  ep_register_builtin("tvm.contrib.sort.sort", ep_run_sort);
  ep_register_builtin("tvm.contrib.sort.topk", ep_run_topk);
  ep_register_builtin(EP_PACKED_PROGRAM_LOADER, ep_load_packed_program); /* a library's compressed program */
  done = 1;
}

static ep_status ep_model_init(ep_model* m, const char* meta_text, const char* sidecar) {
  TVMFFIObjectHandle f = NULL;
  TVMFFIAny args[6];
  TVMFFIAny res;
  const char* text = meta_text;
  char* file_text = NULL;
  ep_status st;

  /* metadata first: a model without it cannot be used */
  if (text == NULL) {
    st = ep_embedded_meta(m->exec, &text);
    if (st != EP_OK) return st;
  }
  if (text == NULL && sidecar != NULL) {
    st = ep_read_file(sidecar, &file_text);
    if (st == EP_ERR_NOT_FOUND) {
      return ep_fail(EP_ERR_METADATA,
                     "no metadata for this model: it has none embedded and %s does not exist "
                     "(edgepack writes it next to the model library)",
                     sidecar);
    }
    if (st != EP_OK) return st;
    text = file_text;
  }
  if (text == NULL) {
    return ep_fail(EP_ERR_METADATA,
                   "no metadata for this model: pass the metadata text (edgepack embeds it in the "
                   "libraries it exports)");
  }
  st = ep_parse_meta(m, text);
  free(file_text);
  if (st != EP_OK) return st;

  /* executable -> virtual machine */
  st = ep_module_function(m->exec, "vm_load_executable", 0, &f);
  if (st != EP_OK) return st;
  if (f == NULL) {
    return ep_fail(EP_ERR_LOAD, "the library is not a TVM Relax VM executable "
                                "(no vm_load_executable)");
  }
  if (ep_call(f, NULL, 0, &res) != 0) {
    ep_release(&f);
    return ep_fail_tvm(EP_ERR_LOAD, "vm_load_executable");
  }
  ep_release(&f);
  if (res.type_index != kTVMFFIModule) {
    ep_any_release(&res);
    return ep_fail(EP_ERR_LOAD, "vm_load_executable did not return a module");
  }
  m->vm = res.v_obj;

  ep_register_runtime_builtins(); /* before vm_initialization, which looks the functions up */
  /* one CPU device with the pooled allocator; GPU models: the OpenCL device first, then the CPU */
  st = ep_pick_device(m);
  if (st != EP_OK) return st;
  st = ep_module_function(m->vm, "vm_initialization", 0, &f);
  if (st != EP_OK) return st;
  if (f == NULL) return ep_fail(EP_ERR_LOAD, "the VM has no vm_initialization");
  args[0] = ep_any_int(m->device_type);
  args[1] = ep_any_int(m->device_id);
  args[2] = ep_any_int(EP_TVM_ALLOCATOR_POOLED);
  args[3] = ep_any_int(kDLCPU);
  args[4] = ep_any_int(0);
  args[5] = ep_any_int(EP_TVM_ALLOCATOR_POOLED);
  if (ep_call(f, args, m->device_type == kDLCPU ? 3 : 6, &res) != 0) {
    ep_release(&f);
    return ep_fail_tvm(EP_ERR_LOAD, "vm_initialization");
  }
  ep_release(&f);
  ep_any_release(&res);

  st = ep_module_function(m->vm, "main", 0, &m->main);
  if (st != EP_OK) return st;
  if (m->main == NULL) return ep_fail(EP_ERR_LOAD, "the model has no function 'main'");
  st = ep_check_arity(m);
  if (st != EP_OK) return st;

  m->slots = (ep_input_slot*)calloc((size_t)(m->num_inputs > 0 ? m->num_inputs : 1),
                                    sizeof(ep_input_slot));
  m->out_tensors = (TVMFFIObjectHandle*)calloc((size_t)m->num_outputs, sizeof(TVMFFIObjectHandle));
  if (m->slots == NULL || m->out_tensors == NULL) {
    return ep_fail(EP_ERR_NO_MEMORY, "out of memory opening the model");
  }
  return EP_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* the model's memory on huge pages                                                            */
/*
 * Every run reads all of a model's weights: more pages than the TLB covers at 4 KiB, and the
 * hardware prefetchers stop at each page's end. Opening a model marks the process's anonymous
 * memory first; once the model is loaded, the whole huge pages that loading added (its weights,
 * the VM's buffers) are moved onto transparent huge pages in place with madvise(MADV_COLLAPSE)
 * (Linux 6.1+; elsewhere, or where the kernel refuses, nothing changes). Memory the process had
 * before is not touched. EDGEPACK_HUGE_PAGES=0 turns it off. edgepack/run/huge_pages.py does the
 * same for models loaded from Python; its text has the measurements.
 */

#if !defined(MADV_COLLAPSE)
#define MADV_COLLAPSE 25
#endif

struct ep_memory_mark {
  size_t page;       /* the huge page size; 0: nothing to do */
  uintptr_t* ranges; /* [low, high) pairs of the anonymous mappings at the mark */
  size_t count;
};

static size_t ep_huge_page_size(void) {
  const char* env = getenv("EDGEPACK_HUGE_PAGES");
  unsigned long long size = 0;
  FILE* f;
  if (env != NULL && strcmp(env, "0") == 0) return 0;
  f = fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r");
  if (f == NULL) return 0;
  if (fscanf(f, "%llu", &size) != 1) size = 0;
  fclose(f);
  return (size_t)size;
}

/* The private writable anonymous mappings (heap, mmap'ed allocations) as [low, high) pairs;
 * *count pairs in a malloc'ed array, NULL if /proc/self/maps cannot be read. */
static uintptr_t* ep_anonymous_ranges(size_t* count) {
  char line[512];
  size_t n = 0, cap = 0;
  uintptr_t* ranges = NULL;
  FILE* f = fopen("/proc/self/maps", "r");
  *count = 0;
  if (f == NULL) return NULL;
  while (fgets(line, sizeof(line), f) != NULL) {
    unsigned long long low, high, offset;
    char perms[8], dev[16];
    unsigned long inode;
    int used = 0;
    if (strchr(line, '\n') == NULL && !feof(f)) { /* a longer line: skip its rest */
      int c;
      while ((c = fgetc(f)) != EOF && c != '\n') {
      }
    }
    if (sscanf(line, "%llx-%llx %7s %llx %15s %lu %n", &low, &high, perms, &offset, dev, &inode,
               &used) < 6 ||
        strcmp(perms, "rw-p") != 0) {
      continue;
    }
    if (line[used] != '\0' && line[used] != '\n' && strncmp(line + used, "[heap]", 6) != 0 &&
        strncmp(line + used, "[anon:", 6) != 0) {
      continue; /* a file, the stack or another named mapping ([anon:...]: Android's allocators) */
    }
    if (n + 2 > cap) {
      uintptr_t* grown = (uintptr_t*)realloc(ranges, (cap ? cap * 2 : 64) * sizeof(uintptr_t));
      if (grown == NULL) break;
      ranges = grown;
      cap = cap ? cap * 2 : 64;
    }
    ranges[n++] = (uintptr_t)low;
    ranges[n++] = (uintptr_t)high;
  }
  fclose(f);
  *count = n / 2;
  return ranges;
}

static void ep_mark_memory(ep_memory_mark* mark) {
  mark->page = 0;
  mark->ranges = NULL;
  mark->count = 0;
#if defined(__linux__)
  mark->page = ep_huge_page_size();
  if (mark->page != 0) {
    mark->ranges = ep_anonymous_ranges(&mark->count);
    if (mark->ranges == NULL) mark->page = 0;
  }
#endif
}

static void ep_forget_memory_mark(ep_memory_mark* mark) {
  free(mark->ranges);
  mark->ranges = NULL;
  mark->page = 0;
}

/* Collapse the whole huge pages of the anonymous mappings that no mapping at the mark held;
 * returns how many bytes now are on huge pages. Forgets the mark. */
static size_t ep_collapse_new_memory(ep_memory_mark* mark) {
  size_t moved = 0;
#if defined(__linux__)
  size_t count = 0, i, j;
  const uintptr_t page = (uintptr_t)mark->page;
  uintptr_t* now = page ? ep_anonymous_ranges(&count) : NULL;
  for (i = 0; i < count; ++i) {
    uintptr_t start = (now[2 * i] + page - 1) / page * page;
    for (; start + page <= now[2 * i + 1]; start += page) {
      int old = 0;
      for (j = 0; j < mark->count && !old; ++j) {
        old = mark->ranges[2 * j] <= start && start + page <= mark->ranges[2 * j + 1];
      }
      if (!old && madvise((void*)start, page, MADV_COLLAPSE) == 0) moved += page;
    }
  }
  free(now);
#endif
  ep_forget_memory_mark(mark);
  return moved;
}

ep_memory_mark* ep_memory_mark_take(void) {
  ep_memory_mark* mark = (ep_memory_mark*)malloc(sizeof(ep_memory_mark));
  if (mark != NULL) ep_mark_memory(mark);
  return mark;
}

size_t ep_memory_collapse_since(ep_memory_mark* mark) {
  size_t moved = mark != NULL ? ep_collapse_new_memory(mark) : 0;
  free(mark);
  return moved;
}

size_t ep_model_huge_page_bytes(const ep_model* model) {
  return ep_model_valid(model) ? model->huge_page_bytes : 0;
}

static ep_model* ep_model_new(void) {
  ep_model* m = (ep_model*)calloc(1, sizeof(ep_model));
  if (m != NULL) m->magic = EP_MODEL_MAGIC;
  return m;
}

/* ---- architecture check: dlopen's own message for a foreign ELF is misleading ---------- */

static const char* ep_machine_name(unsigned machine) {
  switch (machine) {
    case 3: return "x86";
    case 8: return "mips";
    case 20: return "powerpc";
    case 21: return "powerpc64";
    case 40: return "arm";
    case 62: return "x86_64";
    case 183: return "aarch64";
    case 243: return "riscv";
    default: return "an unknown machine";
  }
}

static unsigned ep_host_machine(void) {
#if defined(__aarch64__)
  return 183;
#elif defined(__arm__)
  return 40;
#elif defined(__x86_64__)
  return 62;
#elif defined(__i386__)
  return 3;
#elif defined(__riscv)
  return 243;
#else
  return 0; /* unknown: skip the check */
#endif
}

/* Check the first bytes of a library: ELF, same word size and machine as this program. */
static ep_status ep_check_elf(const unsigned char* h, size_t n, const char* what) {
  unsigned machine, host = ep_host_machine();
  int elf_class;
  if (n < 20 || memcmp(h, "\177ELF", 4) != 0) {
    return ep_fail(EP_ERR_LOAD, "%s is not an ELF shared library", what);
  }
  elf_class = h[4]; /* 1: 32-bit, 2: 64-bit */
  machine = h[5] == 2 ? ((unsigned)h[18] << 8) | h[19] : ((unsigned)h[19] << 8) | h[18];
  if (host != 0 && (machine != host || elf_class != (sizeof(void*) == 8 ? 2 : 1))) {
    return ep_fail(EP_ERR_LOAD,
                   "%s is built for %s (%d-bit), but this program runs on %s (%d-bit): compile "
                   "the model for this device",
                   what, ep_machine_name(machine), elf_class == 2 ? 64 : 32,
                   ep_machine_name(host), (int)sizeof(void*) * 8);
  }
  return EP_OK;
}

static ep_status ep_check_elf_file(const char* path) {
  unsigned char h[64];
  size_t n;
  FILE* f = fopen(path, "rb");
  if (f == NULL) {
    return ep_fail(errno == ENOENT ? EP_ERR_NOT_FOUND : EP_ERR_IO, "cannot open model %s: %s",
                   path, strerror(errno));
  }
  n = fread(h, 1, sizeof(h), f);
  fclose(f);
  return ep_check_elf(h, n, path);
}

/* Load a shared library through TVM's ".so" loader (dlopen). */
static ep_status ep_load_so(const char* path, TVMFFIObjectHandle* out_exec) {
  TVMFFIAny args[2];
  TVMFFIAny res;
  char context[512];
  ep_status st;
  ep_register_runtime_builtins(); /* the loader of a compressed program among them: before the library loads */
  args[0] = ep_any_str(path);
  args[1] = ep_any_str("so");
  *out_exec = NULL;
  snprintf(context, sizeof(context), "cannot load model library %s", path);
  {
    TVMFFIObjectHandle f = NULL;
    int rc;
    st = ep_get_global("ffi.Module.load_from_file.so", &f);
    if (st != EP_OK) return st;
    rc = ep_call(f, args, 2, &res);
    ep_release(&f);
    if (rc != 0) return ep_fail_tvm(EP_ERR_LOAD, context);
  }
  if (res.type_index != kTVMFFIModule) {
    ep_any_release(&res);
    return ep_fail(EP_ERR_LOAD, "%s: the loader did not return a module", context);
  }
  *out_exec = res.v_obj;
  return EP_OK;
}

ep_status ep_model_open(const char* lib_path, const char* meta_path, ep_model** out_model) {
  struct stat sb;
  ep_memory_mark mark;
  ep_model* m;
  char* path = NULL;
  char* sidecar = NULL;
  char* meta_text = NULL;
  ep_status st;
  if (out_model == NULL) return ep_fail(EP_ERR_INVALID_ARGUMENT, "ep_model_open: out_model is NULL");
  *out_model = NULL;
  if (lib_path == NULL || lib_path[0] == '\0') {
    return ep_fail(EP_ERR_INVALID_ARGUMENT, "ep_model_open: lib_path is NULL or empty");
  }
  if (stat(lib_path, &sb) != 0) {
    return ep_fail(errno == ENOENT ? EP_ERR_NOT_FOUND : EP_ERR_IO, "cannot open model %s: %s",
                   lib_path, strerror(errno));
  }
  if (!S_ISREG(sb.st_mode)) {
    return ep_fail(EP_ERR_LOAD, "model %s is not a regular file", lib_path);
  }
  st = ep_check_elf_file(lib_path);
  if (st != EP_OK) return st;
  if (meta_path != NULL) {
    st = ep_read_file(meta_path, &meta_text);
    if (st != EP_OK) return st;
  }
  /* dlopen() searches the library path for names without a slash: make it explicit */
  path = (char*)malloc(strlen(lib_path) + 3);
  sidecar = ep_sidecar_path(lib_path);
  m = ep_model_new();
  if (path == NULL || sidecar == NULL || m == NULL) {
    free(path);
    free(sidecar);
    free(meta_text);
    ep_model_destroy(m);
    return ep_fail(EP_ERR_NO_MEMORY, "out of memory");
  }
  if (strchr(lib_path, '/') == NULL) {
    strcpy(path, "./");
    strcat(path, lib_path);
  } else {
    strcpy(path, lib_path);
  }
  ep_mark_memory(&mark);
  st = ep_autoload_plugins(path);
  if (st == EP_OK) st = ep_explain_missing_plugin(ep_load_so(path, &m->exec));
  if (st == EP_OK) st = ep_model_init(m, meta_text, sidecar);
  free(path);
  free(sidecar);
  free(meta_text);
  if (st != EP_OK) {
    ep_forget_memory_mark(&mark);
    ep_model_destroy(m);
    return st;
  }
  m->huge_page_bytes = ep_collapse_new_memory(&mark);
  *out_model = m;
  return EP_OK;
}

static int ep_write_all(int fd, const void* data, size_t size) {
  const char* p = (const char*)data;
  while (size > 0) {
    ssize_t n = write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += n;
    size -= (size_t)n;
  }
  return 0;
}

ep_status ep_model_open_memory(const void* lib_data, size_t lib_size, const char* meta_text,
                               ep_model** out_model) {
  char path[64];
  char tmp_path[512];
  int fd = -1;
  int is_tmp_file = 0;
  ep_model* m;
  ep_memory_mark mark;
  ep_status st;
  if (out_model == NULL) {
    return ep_fail(EP_ERR_INVALID_ARGUMENT, "ep_model_open_memory: out_model is NULL");
  }
  *out_model = NULL;
  if (lib_data == NULL || lib_size == 0) {
    return ep_fail(EP_ERR_INVALID_ARGUMENT, "ep_model_open_memory: no library bytes");
  }
  st = ep_check_elf((const unsigned char*)lib_data, lib_size, "the model library");
  if (st != EP_OK) return st;
#if defined(__linux__) && defined(SYS_memfd_create)
  fd = (int)syscall(SYS_memfd_create, "edgepack-model", 1u /* MFD_CLOEXEC */);
  if (fd >= 0) snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
#endif
  if (fd < 0) {
    const char* dir = getenv("TMPDIR");
    if (dir == NULL || dir[0] == '\0') dir = "/tmp";
    snprintf(tmp_path, sizeof(tmp_path), "%s/edgepack-model-XXXXXX.so", dir);
    fd = mkstemps(tmp_path, 3);
    if (fd < 0) {
      return ep_fail(EP_ERR_IO, "cannot create a temporary file in %s: %s", dir, strerror(errno));
    }
    is_tmp_file = 1;
  }
  if (ep_write_all(fd, lib_data, lib_size) != 0) {
    int err = errno;
    close(fd);
    if (is_tmp_file) unlink(tmp_path);
    return ep_fail(EP_ERR_IO, "cannot write the model library to memory: %s", strerror(err));
  }
  m = ep_model_new();
  if (m == NULL) {
    close(fd);
    if (is_tmp_file) unlink(tmp_path);
    return ep_fail(EP_ERR_NO_MEMORY, "out of memory");
  }
  ep_mark_memory(&mark);
  st = ep_autoload_plugins(NULL);
  if (st == EP_OK) st = ep_explain_missing_plugin(ep_load_so(is_tmp_file ? tmp_path : path, &m->exec));
  /* the loader has mapped the library: the file is no longer needed */
  close(fd);
  if (is_tmp_file) unlink(tmp_path);
  if (st == EP_OK) st = ep_model_init(m, meta_text, NULL);
  if (st != EP_OK) {
    ep_forget_memory_mark(&mark);
    ep_model_destroy(m);
    return st;
  }
  m->huge_page_bytes = ep_collapse_new_memory(&mark);
  *out_model = m;
  return EP_OK;
}

ep_status ep_model_open_system_lib(const char* prefix, const char* meta_text,
                                   ep_model** out_model) {
  TVMFFIAny args[1];
  TVMFFIAny res;
  TVMFFIObjectHandle probe = NULL;
  ep_model* m;
  ep_memory_mark mark;
  ep_status st;
  if (out_model == NULL) {
    return ep_fail(EP_ERR_INVALID_ARGUMENT, "ep_model_open_system_lib: out_model is NULL");
  }
  *out_model = NULL;
  if (prefix == NULL) prefix = "";
  st = ep_autoload_plugins(NULL);
  if (st != EP_OK) return st;
  ep_register_runtime_builtins(); /* the loader of a compressed program among them: before the library loads */
  ep_mark_memory(&mark);
  args[0] = ep_any_str(prefix);
  st = ep_call_global("ffi.SystemLib", args, 1, &res, EP_ERR_LOAD);
  if (st == EP_OK && res.type_index != kTVMFFIModule) {
    ep_any_release(&res);
    st = ep_fail(EP_ERR_LOAD, "ffi.SystemLib did not return a module");
  }
  m = st == EP_OK ? ep_model_new() : NULL;
  if (st == EP_OK && m == NULL) {
    ep_any_release(&res);
    st = ep_fail(EP_ERR_NO_MEMORY, "out of memory");
  }
  if (st != EP_OK) {
    ep_forget_memory_mark(&mark);
    return st;
  }
  m->exec = res.v_obj;
  /* without a linked-in model the system library is empty */
  st = ep_module_function(m->exec, "vm_load_executable", 0, &probe);
  if (st == EP_OK && probe == NULL) {
    st = ep_fail(EP_ERR_NOT_FOUND,
                 "no model is linked into this program (system-lib prefix \"%s\"); link the "
                 "model archive with -Wl,--whole-archive",
                 prefix);
  }
  ep_release(&probe);
  if (st == EP_OK) st = ep_model_init(m, meta_text, NULL);
  if (st != EP_OK) {
    ep_forget_memory_mark(&mark);
    ep_model_destroy(m);
    return st;
  }
  m->huge_page_bytes = ep_collapse_new_memory(&mark);
  *out_model = m;
  return EP_OK;
}

ep_status ep_model_close(ep_model** model) {
  if (model == NULL || *model == NULL) return EP_OK;
  if (!ep_model_valid(*model)) {
    return ep_fail(EP_ERR_INVALID_ARGUMENT, "ep_model_close: not a model (already closed?)");
  }
  ep_model_destroy(*model);
  *model = NULL;
  return EP_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* introspection                                                                              */

ep_status ep_model_num_inputs(const ep_model* model, int* out_count) {
  EP_CHECK_MODEL(model);
  if (out_count == NULL) return ep_fail(EP_ERR_INVALID_ARGUMENT, "%s: out_count is NULL", __func__);
  *out_count = model->num_inputs;
  return EP_OK;
}

ep_status ep_model_num_outputs(const ep_model* model, int* out_count) {
  EP_CHECK_MODEL(model);
  if (out_count == NULL) return ep_fail(EP_ERR_INVALID_ARGUMENT, "%s: out_count is NULL", __func__);
  *out_count = model->num_outputs;
  return EP_OK;
}

static ep_status ep_info(const ep_tensor_info* infos, int count, const char* what, int index,
                         ep_tensor_info* out_info) {
  if (out_info == NULL) return ep_fail(EP_ERR_INVALID_ARGUMENT, "%s info: out_info is NULL", what);
  if (index < 0 || index >= count) {
    return ep_fail(EP_ERR_INDEX, "%s index %d out of range: the model has %d %ss", what, index,
                   count, what);
  }
  *out_info = infos[index];
  return EP_OK;
}

ep_status ep_model_input_info(const ep_model* model, int index, ep_tensor_info* out_info) {
  EP_CHECK_MODEL(model);
  return ep_info(model->inputs, model->num_inputs, "input", index, out_info);
}

ep_status ep_model_output_info(const ep_model* model, int index, ep_tensor_info* out_info) {
  ep_status st;
  EP_CHECK_MODEL(model);
  st = ep_info(model->outputs, model->num_outputs, "output", index, out_info);
  if (st == EP_OK && model->has_run && ep_is_dynamic(out_info)) { /* what the last run produced */
    const DLTensor* t = (const DLTensor*)((const char*)model->out_tensors[index] + sizeof(TVMFFIObject));
    int d;
    for (d = 0; d < t->ndim && d < EP_MAX_NDIM; ++d) out_info->shape[d] = t->shape[d];
    out_info->byte_size = ep_produced_size(t);
  }
  return st;
}

static ep_status ep_find(const ep_tensor_info* infos, int count, const char* what,
                         const char* name, int* out_index) {
  int i;
  if (name == NULL || out_index == NULL) {
    return ep_fail(EP_ERR_INVALID_ARGUMENT, "find %s: name or out_index is NULL", what);
  }
  for (i = 0; i < count; ++i) {
    if (strcmp(infos[i].name, name) == 0) {
      *out_index = i;
      return EP_OK;
    }
  }
  return ep_fail(EP_ERR_NOT_FOUND, "the model has no %s named '%s'", what, name);
}

ep_status ep_model_find_input(const ep_model* model, const char* name, int* out_index) {
  EP_CHECK_MODEL(model);
  return ep_find(model->inputs, model->num_inputs, "input", name, out_index);
}

ep_status ep_model_find_output(const ep_model* model, const char* name, int* out_index) {
  EP_CHECK_MODEL(model);
  return ep_find(model->outputs, model->num_outputs, "output", name, out_index);
}

/* ---------------------------------------------------------------------------------------- */
/* inputs                                                                                     */

static void ep_format_shape(const int64_t* shape, int ndim, char* buf, size_t size) {
  size_t pos = 0;
  int i;
  buf[0] = '\0';
  pos += (size_t)snprintf(buf + pos, size - pos, "[");
  for (i = 0; i < ndim && pos < size; ++i) {
    pos += (size_t)snprintf(buf + pos, size - pos, i ? ",%lld" : "%lld", (long long)shape[i]);
  }
  if (pos < size) snprintf(buf + pos, size - pos, "]");
}

typedef struct {
  DLManagedTensor managed; /* must stay first: the deleter frees the whole struct */
  int64_t shape[EP_MAX_NDIM];
} ep_dlpack_view;

static void ep_dlpack_view_deleter(DLManagedTensor* self) { free(self); }

/* Whether input `index` has dynamic dimensions; their names, comma-separated, into buf. */
static int ep_input_dynamic_names(const ep_model* m, int index, char* buf, size_t size) {
  const ep_tensor_info* info = &m->inputs[index];
  size_t pos = 0;
  int i, n = 0;
  buf[0] = '\0';
  for (i = 0; i < info->ndim; ++i) {
    int ref = m->input_dims[index].ref[i];
    if (ref < 0) continue;
    if (pos < size) {
      pos += (size_t)snprintf(buf + pos, size - pos, n ? ", %s" : "%s", m->dims[ref].name);
    }
    ++n;
  }
  return n > 0;
}

/* Point input `index` at data (byte_size bytes, laid out as `shape`, already checked). */
static ep_status ep_set_input_data(ep_model* model, int index, const void* data, size_t byte_size,
                                   const int64_t* shape) {
  const ep_tensor_info* info = &model->inputs[index];
  ep_input_slot* slot;
  ep_dlpack_view* view;
  TVMFFIObjectHandle tensor = NULL;
  void* ptr = (void*)data;
  const ep_dtype_entry* dt;
  int d;
  if (data == NULL && byte_size != 0) {
    return ep_fail(EP_ERR_INVALID_ARGUMENT, "input %d '%s': data is NULL", index, info->name);
  }
  slot = &model->slots[index];
  if (data == NULL || ((uintptr_t)data % EP_ALIGNMENT) != 0) {
    /* TVM kernels may assume aligned data (NEON loads with alignment hints on armv7) */
    if (slot->copy == NULL || slot->copy_size < byte_size) {
      ep_free(slot->copy);
      slot->copy = ep_alloc(byte_size);
      slot->copy_size = byte_size;
      if (slot->copy == NULL) {
        slot->copy_size = 0;
        return ep_fail(EP_ERR_NO_MEMORY, "out of memory copying input %d", index);
      }
    }
    if (byte_size != 0) memcpy(slot->copy, data, byte_size);
    ptr = slot->copy;
  }
  view = (ep_dlpack_view*)calloc(1, sizeof(ep_dlpack_view));
  if (view == NULL) return ep_fail(EP_ERR_NO_MEMORY, "out of memory setting input %d", index);
  dt = ep_dtype_lookup(info->dtype);
  for (d = 0; d < info->ndim; ++d) view->shape[d] = shape[d];
  view->managed.dl_tensor.data = ptr;
  view->managed.dl_tensor.device.device_type = kDLCPU;
  view->managed.dl_tensor.device.device_id = 0;
  view->managed.dl_tensor.ndim = info->ndim;
  view->managed.dl_tensor.dtype.code = dt->code;
  view->managed.dl_tensor.dtype.bits = dt->bits;
  view->managed.dl_tensor.dtype.lanes = 1;
  view->managed.dl_tensor.shape = view->shape;
  view->managed.dl_tensor.strides = NULL;
  view->managed.dl_tensor.byte_offset = 0;
  view->managed.manager_ctx = NULL;
  view->managed.deleter = ep_dlpack_view_deleter;
  if (TVMFFITensorFromDLPack(&view->managed, 0, 0, &tensor) != 0) {
    free(view); /* not consumed on failure */
    return ep_fail_tvm(EP_ERR_RUNTIME, "cannot wrap the input buffer");
  }
  ep_release(&slot->tensor);
  slot->tensor = tensor;
  slot->ndim = info->ndim;
  memset(slot->shape, 0, sizeof(slot->shape));
  for (d = 0; d < info->ndim; ++d) slot->shape[d] = shape[d];
  return EP_OK;
}

ep_status ep_model_set_input(ep_model* model, int index, const void* data, size_t byte_size) {
  const ep_tensor_info* info;
  char names[160];
  EP_CHECK_MODEL(model);
  if (index < 0 || index >= model->num_inputs) {
    return ep_fail(EP_ERR_INDEX, "input index %d out of range: the model has %d inputs", index,
                   model->num_inputs);
  }
  info = &model->inputs[index];
  if (ep_input_dynamic_names(model, index, names, sizeof(names))) {
    return ep_fail(EP_ERR_SHAPE,
                   "input %d '%s' has dynamic dimensions (%s): set it with "
                   "ep_model_set_input_typed, which states the shape of the data",
                   index, info->name, names);
  }
  if (byte_size != info->byte_size) {
    char shape[160];
    ep_format_shape(info->shape, info->ndim, shape, sizeof(shape));
    return ep_fail(EP_ERR_SHAPE, "input %d '%s' needs %zu bytes (%s %s), got %zu", index,
                   info->name, info->byte_size, ep_dtype_name(info->dtype), shape, byte_size);
  }
  return ep_set_input_data(model, index, data, byte_size, info->shape);
}

/* The input's shape as the metadata has it, a dynamic dimension as its name: "[1,3,48,W]". */
static void ep_format_input_shape(const ep_model* m, int index, char* buf, size_t size) {
  const ep_tensor_info* info = &m->inputs[index];
  size_t pos = 0;
  int i;
  pos += (size_t)snprintf(buf, size, "[");
  for (i = 0; i < info->ndim && pos < size; ++i) {
    int ref = m->input_dims[index].ref[i];
    if (ref >= 0) {
      pos += (size_t)snprintf(buf + pos, size - pos, i ? ",%s" : "%s", m->dims[ref].name);
    } else {
      pos += (size_t)snprintf(buf + pos, size - pos, i ? ",%lld" : "%lld",
                              (long long)info->shape[i]);
    }
  }
  if (pos < size) snprintf(buf + pos, size - pos, "]");
}

ep_status ep_model_set_input_typed(ep_model* model, int index, const void* data, ep_dtype dtype,
                                   int32_t ndim, const int64_t* shape) {
  const ep_tensor_info* info;
  size_t byte_size;
  int i;
  EP_CHECK_MODEL(model);
  if (index < 0 || index >= model->num_inputs) {
    return ep_fail(EP_ERR_INDEX, "input index %d out of range: the model has %d inputs", index,
                   model->num_inputs);
  }
  info = &model->inputs[index];
  if (dtype != info->dtype) {
    return ep_fail(EP_ERR_DTYPE, "input %d '%s' has dtype %s, got %s", index, info->name,
                   ep_dtype_name(info->dtype), ep_dtype_name(dtype));
  }
  if (ndim < 0 || (ndim > 0 && shape == NULL)) {
    return ep_fail(EP_ERR_INVALID_ARGUMENT, "input %d '%s': bad ndim/shape", index, info->name);
  }
  if (ndim != info->ndim) {
    return ep_fail(EP_ERR_SHAPE, "input %d '%s' has %d dimensions, got %d", index, info->name,
                   info->ndim, ndim);
  }
  for (i = 0; i < ndim; ++i) {
    if (model->input_dims[index].ref[i] < 0 && shape[i] != info->shape[i]) {
      char want[160], got[160];
      ep_format_input_shape(model, index, want, sizeof(want));
      ep_format_shape(shape, ndim, got, sizeof(got));
      return ep_fail(EP_ERR_SHAPE, "input %d '%s' has shape %s, got %s", index, info->name, want,
                     got);
    }
  }
  byte_size = ep_dtype_size(info->dtype);
  for (i = 0; i < ndim; ++i) {
    int ref = model->input_dims[index].ref[i];
    if (ref >= 0) {
      const ep_dim_def* d = &model->dims[ref];
      if (shape[i] < d->min || shape[i] > d->max || (shape[i] - d->min) % d->step != 0) {
        if (d->step == 1) {
          return ep_fail(EP_ERR_SHAPE,
                         "input %d '%s' dimension %d (%s) is %lld; the model takes %s from %lld "
                         "to %lld",
                         index, info->name, i, d->name, (long long)shape[i], d->name,
                         (long long)d->min, (long long)d->max);
        }
        return ep_fail(EP_ERR_SHAPE,
                       "input %d '%s' dimension %d (%s) is %lld; the model takes %s from %lld to "
                       "%lld in steps of %lld",
                       index, info->name, i, d->name, (long long)shape[i], d->name,
                       (long long)d->min, (long long)d->max, (long long)d->step);
      }
    }
    /* within the metadata's maximum size, so this does not overflow */
    byte_size *= (size_t)shape[i];
  }
  return ep_set_input_data(model, index, data, byte_size, shape);
}

ep_status ep_model_input_dim(const ep_model* model, int index, int dim, ep_dim_range* out) {
  const ep_tensor_info* info;
  int ref;
  EP_CHECK_MODEL(model);
  if (out == NULL) return ep_fail(EP_ERR_INVALID_ARGUMENT, "ep_model_input_dim: out is NULL");
  if (index < 0 || index >= model->num_inputs) {
    return ep_fail(EP_ERR_INDEX, "input index %d out of range: the model has %d inputs", index,
                   model->num_inputs);
  }
  info = &model->inputs[index];
  if (dim < 0 || dim >= info->ndim) {
    return ep_fail(EP_ERR_INDEX, "dimension %d out of range: input %d '%s' has %d dimensions", dim,
                   index, info->name, info->ndim);
  }
  ref = model->input_dims[index].ref[dim];
  if (ref < 0) {
    out->name = "";
    out->min = out->max = info->shape[dim];
    out->step = 1;
  } else {
    out->name = model->dims[ref].name;
    out->min = model->dims[ref].min;
    out->max = model->dims[ref].max;
    out->step = model->dims[ref].step;
  }
  return EP_OK;
}

/* Every dynamic dimension has one value across the inputs set now. */
static ep_status ep_check_shared_dims(const ep_model* m) {
  int k, i, d;
  for (k = 0; k < m->num_dims; ++k) {
    int first_input = -1, first_axis = -1;
    int64_t value = 0;
    for (i = 0; i < m->num_inputs; ++i) {
      for (d = 0; d < m->inputs[i].ndim; ++d) {
        if (m->input_dims[i].ref[d] != k) continue;
        if (first_input < 0) {
          first_input = i;
          first_axis = d;
          value = m->slots[i].shape[d];
        } else if (m->slots[i].shape[d] != value) {
          return ep_fail(EP_ERR_SHAPE,
                         "dimension %s is %lld in input %d '%s' (dimension %d) but %lld in input "
                         "%d '%s' (dimension %d); every use of %s must have the same value",
                         m->dims[k].name, (long long)value, first_input,
                         m->inputs[first_input].name, first_axis,
                         (long long)m->slots[i].shape[d], i, m->inputs[i].name, d,
                         m->dims[k].name);
        }
      }
    }
  }
  return EP_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* run and outputs                                                                            */

static void ep_clear_outputs(ep_model* m) {
  int i;
  for (i = 0; i < m->num_outputs; ++i) ep_release(&m->out_tensors[i]);
  m->has_run = 0;
}

/* Append the tensors of `value` (a tensor or a possibly nested tuple) to out[*count]. */
static ep_status ep_collect(ep_model* m, TVMFFIAny* value, TVMFFIObjectHandle* out, int* count,
                            int depth) {
  if (value->type_index == kTVMFFITensor) {
    if (*count < m->num_outputs) {
      TVMFFIObjectIncRef(value->v_obj);
      out[*count] = value->v_obj;
    }
    ++*count;
    return EP_OK;
  }
  if (value->type_index == kTVMFFIArray && depth < 8) {
    TVMFFIAny args[2];
    TVMFFIAny res;
    int64_t n, i;
    ep_status st;
    args[0] = ep_any_obj(value->v_obj);
    st = ep_call_global("ffi.ArraySize", args, 1, &res, EP_ERR_RUNTIME);
    if (st != EP_OK) return st;
    n = res.v_int64;
    for (i = 0; i < n; ++i) {
      args[1] = ep_any_int(i);
      st = ep_call_global("ffi.ArrayGetItem", args, 2, &res, EP_ERR_RUNTIME);
      if (st != EP_OK) return st;
      st = ep_collect(m, &res, out, count, depth + 1);
      ep_any_release(&res);
      if (st != EP_OK) return st;
    }
    return EP_OK;
  }
  return ep_fail(EP_ERR_RUNTIME, "the model returned a value of type index %d, not a tensor",
                 (int)value->type_index);
}

/* Check the produced tensors against the metadata. */
static ep_status ep_check_outputs(const ep_model* m) {
  int i, d;
  for (i = 0; i < m->num_outputs; ++i) {
    const DLTensor* t = (const DLTensor*)((const char*)m->out_tensors[i] + sizeof(TVMFFIObject));
    const ep_tensor_info* info = &m->outputs[i];
    int mismatch = ep_dtype_from_dl(t->dtype) != info->dtype || t->ndim != info->ndim;
    for (d = 0; !mismatch && d < t->ndim; ++d) {
      mismatch = info->shape[d] >= 0 && t->shape[d] != info->shape[d]; /* '?' takes any extent */
    }
    if (!mismatch && t->strides != NULL) {
      int64_t expect = 1;
      for (d = t->ndim - 1; d >= 0; --d) {
        if (t->shape[d] != 1 && t->strides[d] != expect) {
          return ep_fail(EP_ERR_RUNTIME, "output %d '%s' is not a dense tensor", i, info->name);
        }
        expect *= t->shape[d];
      }
    }
    if (t->device.device_type != kDLCPU) {
      return ep_fail(EP_ERR_RUNTIME, "output %d '%s' is not in CPU memory", i, info->name);
    }
    if (mismatch) {
      char want[160], got[160];
      ep_format_shape(info->shape, info->ndim, want, sizeof(want));
      ep_format_shape(t->shape, t->ndim, got, sizeof(got));
      return ep_fail(EP_ERR_METADATA,
                     "output %d '%s': the metadata says %s %s but the model produced %s %s", i,
                     info->name, ep_dtype_name(info->dtype), want,
                     ep_dtype_name(ep_dtype_from_dl(t->dtype)), got);
    }
  }
  return EP_OK;
}

ep_status ep_set_num_threads(int num_threads) {
  char text[16];
  TVMFFIAny args[2];
  TVMFFIAny res;
  ep_status st;
  if (num_threads <= 0) num_threads = ep_parallel_default_threads();
  ep_parallel_set_threads(num_threads); /* edgepack's pool, for every thread */
  /* TVM's own (EDGEPACK_PARALLEL=tvm, and what the runtime itself runs in parallel): it sizes a
     thread's worker pool from TVM_NUM_THREADS when the pool is made, and runtime.config_threadpool
     (mode 1: all big cores) makes or reconfigures this thread's pool. */
  snprintf(text, sizeof(text), "%d", num_threads);
  if (setenv("TVM_NUM_THREADS", text, 1) != 0) {
    return ep_fail(EP_ERR_RUNTIME, "cannot set TVM_NUM_THREADS: %s", strerror(errno));
  }
  args[0] = ep_any_int(1);
  args[1] = ep_any_int(num_threads);
  st = ep_call_global("runtime.config_threadpool", args, 2, &res, EP_ERR_RUNTIME);
  if (st == EP_OK) ep_any_release(&res);
  return st;
}

int ep_num_threads(void) { return ep_parallel_threads(); }

ep_status ep_model_run(ep_model* model) {
  TVMFFIAny stack_args[16];
  TVMFFIAny* args = stack_args;
  TVMFFIAny res;
  int i, count = 0;
  int rc;
  ep_status st;
  EP_CHECK_MODEL(model);
  for (i = 0; i < model->num_inputs; ++i) {
    if (model->slots[i].tensor == NULL) {
      return ep_fail(EP_ERR_STATE, "input %d '%s' was not set before ep_model_run", i,
                     model->inputs[i].name);
    }
  }
  st = ep_check_shared_dims(model);
  if (st != EP_OK) return st;
  ep_clear_outputs(model);
  if (model->num_inputs > 16) {
    args = (TVMFFIAny*)malloc((size_t)model->num_inputs * sizeof(TVMFFIAny));
    if (args == NULL) return ep_fail(EP_ERR_NO_MEMORY, "out of memory");
  }
  st = EP_OK;
  for (i = 0; i < model->num_inputs; ++i) args[i] = ep_any_obj(model->slots[i].tensor);
  if (model->device_type != kDLCPU) {
    /* GPU model: the VM's main takes tensors on the device; copy the inputs there */
    int copied = 0;
    for (; copied < model->num_inputs; ++copied) {
      TVMFFIObjectHandle on_device = NULL;
      st = ep_copy_tensor_to(model->slots[copied].tensor, model->device_type, model->device_id,
                             &on_device);
      if (st != EP_OK) break;
      args[copied] = ep_any_obj(on_device);
    }
    if (st != EP_OK) {
      for (i = 0; i < copied; ++i) TVMFFIObjectDecRef(args[i].v_obj);
      if (args != stack_args) free(args);
      return st;
    }
  }
  rc = ep_call(model->main, args, model->num_inputs, &res);
  if (model->device_type != kDLCPU) {
    for (i = 0; i < model->num_inputs; ++i) TVMFFIObjectDecRef(args[i].v_obj);
  }
  if (args != stack_args) free(args);
  if (rc != 0) return ep_fail_tvm(EP_ERR_RUNTIME, "running the model failed");
  st = ep_collect(model, &res, model->out_tensors, &count, 0);
  ep_any_release(&res);
  if (st == EP_OK && model->device_type != kDLCPU) {
    /* outputs back to CPU memory (blocking: the device's work is done when this returns) */
    for (i = 0; i < count && i < model->num_outputs && st == EP_OK; ++i) {
      TVMFFIObjectHandle on_host = NULL;
      st = ep_copy_tensor_to(model->out_tensors[i], kDLCPU, 0, &on_host);
      if (st == EP_OK) {
        ep_release(&model->out_tensors[i]);
        model->out_tensors[i] = on_host;
      }
    }
  }
  if (st == EP_OK && count != model->num_outputs) {
    st = ep_fail(EP_ERR_METADATA, "the metadata lists %d outputs but the model produced %d",
                 model->num_outputs, count);
  }
  if (st == EP_OK) st = ep_check_outputs(model);
  if (st != EP_OK) {
    ep_clear_outputs(model);
    return st;
  }
  model->has_run = 1;
  return EP_OK;
}

static ep_status ep_output_ref(const ep_model* model, int index, const DLTensor** out) {
  EP_CHECK_MODEL(model);
  if (index < 0 || index >= model->num_outputs) {
    return ep_fail(EP_ERR_INDEX, "output index %d out of range: the model has %d outputs", index,
                   model->num_outputs);
  }
  if (!model->has_run) {
    return ep_fail(EP_ERR_STATE, "no outputs yet: call ep_model_run first (and check its status)");
  }
  *out = (const DLTensor*)((const char*)model->out_tensors[index] + sizeof(TVMFFIObject));
  return EP_OK;
}

ep_status ep_model_get_output(const ep_model* model, int index, const void** out_data,
                              size_t* out_byte_size) {
  const DLTensor* t = NULL;
  ep_status st;
  if (out_data == NULL || out_byte_size == NULL) {
    return ep_fail(EP_ERR_INVALID_ARGUMENT, "ep_model_get_output: out_data or out_byte_size is NULL");
  }
  st = ep_output_ref(model, index, &t);
  if (st != EP_OK) return st;
  *out_data = (const char*)t->data + t->byte_offset;
  *out_byte_size = ep_produced_size(t);
  return EP_OK;
}

ep_status ep_model_output_shape(const ep_model* model, int index, int32_t* out_ndim,
                               int64_t* out_shape) {
  const DLTensor* t = NULL;
  ep_status st;
  int d;
  if (out_ndim == NULL || out_shape == NULL) {
    return ep_fail(EP_ERR_INVALID_ARGUMENT, "ep_model_output_shape: out_ndim or out_shape is NULL");
  }
  st = ep_output_ref(model, index, &t);
  if (st != EP_OK) return st;
  if (t->ndim > EP_MAX_NDIM) {
    return ep_fail(EP_ERR_RUNTIME, "output %d has %d dimensions, more than EP_MAX_NDIM", index,
                   (int)t->ndim);
  }
  *out_ndim = t->ndim;
  for (d = 0; d < t->ndim; ++d) out_shape[d] = t->shape[d];
  return EP_OK;
}

ep_status ep_model_copy_output(const ep_model* model, int index, void* dst, size_t dst_size) {
  const void* data;
  size_t size;
  ep_status st = ep_model_get_output(model, index, &data, &size);
  if (st != EP_OK) return st;
  if (dst == NULL || dst_size < size) {
    return ep_fail(EP_ERR_INVALID_ARGUMENT, "output %d '%s' needs a %zu-byte buffer, got %zu",
                   index, model->outputs[index].name, size, dst == NULL ? (size_t)0 : dst_size);
  }
  if (size != 0) memcpy(dst, data, size);
  return EP_OK;
}
