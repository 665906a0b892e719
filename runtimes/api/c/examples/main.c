/*
 * edgepack_run - run an edgepack model from the command line (example of the C API).
 *
 *   edgepack_run [MODEL.so] [--meta FILE] [--input NAME=FILE ...] [--output-dir DIR]
 *                [--repeat N] [--warmup N] [--threads N] [--from-memory] [--info] [--quiet]
 *
 *   MODEL.so           model library; omit it to run the model linked into this program
 *                      (static build with the model's system-lib archive)
 *   --meta FILE        metadata file (default: embedded in the model, else MODEL.meta)
 *   --input NAME=FILE  input tensor NAME from FILE: a .npy file (dtype and shape are checked)
 *                      or raw little-endian bytes (any other extension; size is checked).
 *                      Inputs not given are filled with zeros (a note goes to stderr).
 *                      An input with dynamic dimensions (W=32..1280:8 in --info) takes a .npy of
 *                      any shape in range (raw bytes do not say the shape); not given, it is
 *                      filled with zeros at the value another input gave the same dimension,
 *                      else at the smallest size (each dynamic dimension at its min).
 *   --output-dir DIR   write output i as DIR/<i>_<name>.npy, where <name> keeps [A-Za-z0-9._-]
 *                      of the output name and replaces other bytes by '_'
 *   --repeat N         time N runs and print one JSON line:
 *                      {"runs": N, "mean_ms": .., "median_ms": .., "min_ms": .., "max_ms": ..,
 *                       "std_ms": .., "threads": N, "huge_page_bytes": N, "parallel_loops": N}
 *                      (huge_page_bytes: the model's memory on huge pages, ep_model_huge_page_bytes;
 *                      parallel_loops: kernels' loops run on edgepack's thread pool, ep_parallel_loops)
 *   --warmup N         untimed runs before timing (default 1 with --repeat)
 *   --threads N        threads for the model's parallel kernels (default: $TVM_NUM_THREADS, else
 *                      the big cores)
 *   --from-memory      read MODEL.so into memory and use ep_model_open_memory()
 *   --info             print the model's inputs and outputs and exit (a dynamic input dimension
 *                      as NAME=MIN..MAX:STEP, e.g. [1,3,48,W=32..1280:8])
 *   --quiet            no per-output summary lines
 *
 * Prints one line per output: output <i> <name> <dtype> <shape> min=.. max=.. mean=.. [file]
 * (<shape> and the .npy files: the shape the run produced, ep_model_output_shape)
 * Exit status: 0 success, 1 model or run error (message on stderr), 2 bad usage.
 */
#if !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1 /* clock_gettime */
#endif

#include <edgepack.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define MAX_INPUT_ARGS 64

typedef struct {
  const char* name;
  const char* path;
} input_arg;

typedef struct {
  const char* model_path;
  const char* meta_path;
  const char* output_dir;
  input_arg inputs[MAX_INPUT_ARGS];
  int num_inputs;
  long repeat;
  long warmup;
  long threads;
  int from_memory;
  int info;
  int quiet;
} options;

static void usage(FILE* f) {
  fprintf(f,
          "usage: edgepack_run [MODEL.so] [--meta FILE] [--input NAME=FILE ...]\n"
          "                    [--output-dir DIR] [--repeat N] [--warmup N] [--threads N]\n"
          "                    [--from-memory] [--info] [--quiet]\n");
}

static int fail(const char* what, ep_status st) {
  fprintf(stderr, "edgepack_run: %s: %s (%s)\n", what, ep_last_error(), ep_status_name(st));
  return 1;
}

static int parse_long(const char* s, long* out) {
  char* end = NULL;
  long v;
  errno = 0;
  v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < 0) return 0;
  *out = v;
  return 1;
}

/* Returns 0 on success, 2 on a usage error (message printed). */
static int parse_args(int argc, char** argv, options* o) {
  int i;
  memset(o, 0, sizeof(*o));
  o->repeat = 0;
  o->warmup = -1;
  for (i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      exit(0);
    } else if (strcmp(a, "--meta") == 0 && next) {
      o->meta_path = next;
      ++i;
    } else if (strcmp(a, "--input") == 0 && next) {
      const char* eq = strchr(next, '=');
      if (eq == NULL || eq == next || eq[1] == '\0') {
        fprintf(stderr, "edgepack_run: --input expects NAME=FILE, got '%s'\n", next);
        return 2;
      }
      if (o->num_inputs == MAX_INPUT_ARGS) {
        fprintf(stderr, "edgepack_run: too many --input options\n");
        return 2;
      }
      {
        size_t n = (size_t)(eq - next);
        char* name = (char*)malloc(n + 1);
        if (name == NULL) return 2;
        memcpy(name, next, n);
        name[n] = '\0';
        o->inputs[o->num_inputs].name = name;
        o->inputs[o->num_inputs].path = eq + 1;
        o->num_inputs++;
      }
      ++i;
    } else if (strcmp(a, "--output-dir") == 0 && next) {
      o->output_dir = next;
      ++i;
    } else if (strcmp(a, "--repeat") == 0 && next) {
      if (!parse_long(next, &o->repeat) || o->repeat < 1) {
        fprintf(stderr, "edgepack_run: --repeat expects a positive integer\n");
        return 2;
      }
      ++i;
    } else if (strcmp(a, "--warmup") == 0 && next) {
      if (!parse_long(next, &o->warmup)) {
        fprintf(stderr, "edgepack_run: --warmup expects a non-negative integer\n");
        return 2;
      }
      ++i;
    } else if (strcmp(a, "--threads") == 0 && next) {
      if (!parse_long(next, &o->threads) || o->threads < 1 || o->threads > 1024) {
        fprintf(stderr, "edgepack_run: --threads expects a positive integer\n");
        return 2;
      }
      ++i;
    } else if (strcmp(a, "--from-memory") == 0) {
      o->from_memory = 1;
    } else if (strcmp(a, "--info") == 0) {
      o->info = 1;
    } else if (strcmp(a, "--quiet") == 0) {
      o->quiet = 1;
    } else if (a[0] == '-' && a[1] == '-') {
      fprintf(stderr, "edgepack_run: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return 2;
    } else if (o->model_path == NULL) {
      o->model_path = a;
    } else {
      fprintf(stderr, "edgepack_run: unexpected argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (o->warmup < 0) o->warmup = o->repeat > 0 ? 1 : 0;
  if (o->from_memory && o->model_path == NULL) {
    fprintf(stderr, "edgepack_run: --from-memory needs a model path\n");
    return 2;
  }
  return 0;
}

/* ---- files --------------------------------------------------------------------------------- */

static int read_file(const char* path, unsigned char** out, size_t* out_size) {
  FILE* f = fopen(path, "rb");
  long size;
  unsigned char* buf;
  if (f == NULL) {
    fprintf(stderr, "edgepack_run: cannot open %s: %s\n", path, strerror(errno));
    return 0;
  }
  if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fprintf(stderr, "edgepack_run: cannot read %s\n", path);
    fclose(f);
    return 0;
  }
  buf = (unsigned char*)ep_alloc((size_t)size);
  if (buf == NULL || (size > 0 && fread(buf, 1, (size_t)size, f) != (size_t)size)) {
    fprintf(stderr, "edgepack_run: cannot read %s\n", path);
    ep_free(buf);
    fclose(f);
    return 0;
  }
  fclose(f);
  *out = buf;
  *out_size = (size_t)size;
  return 1;
}

static int ends_with(const char* s, const char* suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int make_dirs(const char* path) {
  char buf[4096];
  size_t i, n = strlen(path);
  if (n == 0 || n >= sizeof(buf)) return 0;
  memcpy(buf, path, n + 1);
  for (i = 1; i <= n; ++i) {
    if (buf[i] == '/' || buf[i] == '\0') {
      char saved = buf[i];
      buf[i] = '\0';
      if (mkdir(buf, 0777) != 0 && errno != EEXIST) return 0;
      buf[i] = saved;
    }
  }
  return 1;
}

/* ---- .npy ---------------------------------------------------------------------------------- */

static ep_dtype dtype_from_descr(const char* d) {
  char order = d[0];
  const char* t = d + 1;
  if (order != '<' && order != '|' && order != '=') return EP_DTYPE_UNKNOWN;
  if (strcmp(t, "f4") == 0) return EP_DTYPE_FLOAT32;
  if (strcmp(t, "f2") == 0) return EP_DTYPE_FLOAT16;
  if (strcmp(t, "f8") == 0) return EP_DTYPE_FLOAT64;
  if (strcmp(t, "i1") == 0) return EP_DTYPE_INT8;
  if (strcmp(t, "i2") == 0) return EP_DTYPE_INT16;
  if (strcmp(t, "i4") == 0) return EP_DTYPE_INT32;
  if (strcmp(t, "i8") == 0) return EP_DTYPE_INT64;
  if (strcmp(t, "u1") == 0) return EP_DTYPE_UINT8;
  if (strcmp(t, "u2") == 0) return EP_DTYPE_UINT16;
  if (strcmp(t, "u4") == 0) return EP_DTYPE_UINT32;
  if (strcmp(t, "u8") == 0) return EP_DTYPE_UINT64;
  if (strcmp(t, "b1") == 0) return EP_DTYPE_BOOL;
  return EP_DTYPE_UNKNOWN;
}

static const char* descr_of(ep_dtype dt) {
  switch (dt) {
    case EP_DTYPE_FLOAT32: return "<f4";
    case EP_DTYPE_FLOAT16: return "<f2";
    case EP_DTYPE_FLOAT64: return "<f8";
    case EP_DTYPE_INT8: return "|i1";
    case EP_DTYPE_INT16: return "<i2";
    case EP_DTYPE_INT32: return "<i4";
    case EP_DTYPE_INT64: return "<i8";
    case EP_DTYPE_UINT8: return "|u1";
    case EP_DTYPE_UINT16: return "<u2";
    case EP_DTYPE_UINT32: return "<u4";
    case EP_DTYPE_UINT64: return "<u8";
    case EP_DTYPE_BOOL: return "|b1";
    case EP_DTYPE_BFLOAT16: return "<u2"; /* numpy has no bfloat16: raw bits */
    case EP_DTYPE_FLOAT8_E4M3FN:
    case EP_DTYPE_FLOAT8_E4M3FNUZ:
    case EP_DTYPE_FLOAT8_E5M2:
    case EP_DTYPE_FLOAT8_E5M2FNUZ:
    case EP_DTYPE_FLOAT8_E8M0FNU: return "|u1"; /* nor 8-bit floats */
    default: return NULL;
  }
}

typedef struct {
  ep_dtype dtype;
  int32_t ndim;
  int64_t shape[EP_MAX_NDIM];
  size_t data_offset;
} npy_header;

/* Parse a .npy header (versions 1-3). Returns 0 with a message on error. */
static int parse_npy(const unsigned char* buf, size_t size, const char* path, npy_header* h) {
  size_t header_len, start;
  char header[4096];
  const char* p;
  char descr[16];
  size_t i;
  if (size < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) {
    fprintf(stderr, "edgepack_run: %s is not a .npy file\n", path);
    return 0;
  }
  if (buf[6] == 1) {
    header_len = (size_t)buf[8] | ((size_t)buf[9] << 8);
    start = 10;
  } else if ((buf[6] == 2 || buf[6] == 3) && size >= 12) {
    header_len = (size_t)buf[8] | ((size_t)buf[9] << 8) | ((size_t)buf[10] << 16) |
                 ((size_t)buf[11] << 24);
    start = 12;
  } else {
    fprintf(stderr, "edgepack_run: %s: unsupported .npy version %d\n", path, buf[6]);
    return 0;
  }
  if (start + header_len > size || header_len >= sizeof(header)) {
    fprintf(stderr, "edgepack_run: %s: truncated .npy header\n", path);
    return 0;
  }
  memcpy(header, buf + start, header_len);
  header[header_len] = '\0';
  h->data_offset = start + header_len;

  p = strstr(header, "'descr'");
  if (p == NULL || (p = strchr(p + 7, '\'')) == NULL) goto bad;
  ++p;
  for (i = 0; i < sizeof(descr) - 1 && p[i] != '\'' && p[i] != '\0'; ++i) descr[i] = p[i];
  descr[i] = '\0';
  h->dtype = dtype_from_descr(descr);
  if (h->dtype == EP_DTYPE_UNKNOWN) {
    fprintf(stderr, "edgepack_run: %s: unsupported .npy dtype '%s'\n", path, descr);
    return 0;
  }
  p = strstr(header, "'fortran_order'");
  if (p == NULL) goto bad;
  p = strchr(p, ':');
  if (p == NULL) goto bad;
  while (*++p == ' ') {
  }
  if (strncmp(p, "True", 4) == 0) {
    fprintf(stderr, "edgepack_run: %s: Fortran-ordered arrays are not supported "
                    "(save with np.ascontiguousarray)\n", path);
    return 0;
  }
  p = strstr(header, "'shape'");
  if (p == NULL || (p = strchr(p, '(')) == NULL) goto bad;
  ++p;
  h->ndim = 0;
  for (;;) {
    char* end;
    long long v;
    while (*p == ' ' || *p == ',') ++p;
    if (*p == ')') break;
    v = strtoll(p, &end, 10);
    if (end == p || v < 0 || h->ndim == EP_MAX_NDIM) goto bad;
    h->shape[h->ndim++] = v;
    p = end;
    while (*p == 'L') ++p;
  }
  return 1;
bad:
  fprintf(stderr, "edgepack_run: %s: malformed .npy header\n", path);
  return 0;
}

static int write_npy(const char* path, const ep_tensor_info* info, const void* data) {
  char header[512];
  char dims[256];
  size_t pos = 0, len, total;
  int i;
  FILE* f;
  const char* descr = descr_of(info->dtype);
  if (descr == NULL) return 0;
  dims[0] = '\0';
  for (i = 0; i < info->ndim; ++i) {
    pos += (size_t)snprintf(dims + pos, sizeof(dims) - pos, "%lld,%s", (long long)info->shape[i],
                            (i + 1 < info->ndim) ? " " : "");
  }
  if (info->ndim > 1) dims[pos - 1] = '\0'; /* "(2, 3)" not "(2, 3,)" */
  len = (size_t)snprintf(header, sizeof(header),
                         "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, dims);
  /* pad so that the data starts at a multiple of 64 bytes; the header ends with '\n' */
  total = 10 + len + 1;
  while (total % 64 != 0) {
    header[len++] = ' ';
    ++total;
  }
  header[len++] = '\n';
  f = fopen(path, "wb");
  if (f == NULL) return 0;
  {
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
    pre[8] = (unsigned char)(len & 0xff);
    pre[9] = (unsigned char)(len >> 8);
    if (fwrite(pre, 1, 10, f) != 10 || fwrite(header, 1, len, f) != len ||
        (info->byte_size > 0 && fwrite(data, 1, info->byte_size, f) != info->byte_size)) {
      fclose(f);
      return 0;
    }
  }
  return fclose(f) == 0;
}

/* ---- value statistics ---------------------------------------------------------------------- */

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = ldexpf((float)man, -24);
    return sign ? -f : f;
  }
  if (exp == 31) return man ? NAN : (sign ? -INFINITY : INFINITY);
  {
    uint32_t bits = sign | ((exp + 112) << 23) | (man << 13);
    memcpy(&f, &bits, sizeof(f));
  }
  return f;
}

/* An 8-bit float: ebits exponent and mbits mantissa bits below the sign; style 0 is IEEE-like (the
   top exponent holds inf and NaN), 1 "fn" (no inf; NaN is all ones), 2 "fnuz" (no inf, no -0; NaN
   is 0x80). */
static double minifloat(unsigned bits, int ebits, int mbits, int bias, int style) {
  unsigned top = (1u << ebits) - 1, sign = (bits >> (ebits + mbits)) & 1u;
  unsigned exp = (bits >> mbits) & top, man = bits & ((1u << mbits) - 1);
  double v;
  if (style == 2 && bits == 0x80) return NAN;
  if (style == 1 && exp == top && man == (1u << mbits) - 1) return NAN;
  if (style == 0 && exp == top) return man ? NAN : (sign ? -INFINITY : INFINITY);
  v = exp ? ldexp(1.0 + (double)man / (double)(1u << mbits), (int)exp - bias)
          : ldexp((double)man / (double)(1u << mbits), 1 - bias);
  return sign ? -v : v;
}

static double element(const void* data, ep_dtype dt, size_t i) {
  switch (dt) {
    case EP_DTYPE_FLOAT32: return ((const float*)data)[i];
    case EP_DTYPE_FLOAT64: return ((const double*)data)[i];
    case EP_DTYPE_FLOAT16: return half_to_float(((const uint16_t*)data)[i]);
    case EP_DTYPE_BFLOAT16: {
      uint32_t bits = (uint32_t)((const uint16_t*)data)[i] << 16;
      float f;
      memcpy(&f, &bits, sizeof(f));
      return f;
    }
    case EP_DTYPE_INT8: return ((const int8_t*)data)[i];
    case EP_DTYPE_INT16: return ((const int16_t*)data)[i];
    case EP_DTYPE_INT32: return ((const int32_t*)data)[i];
    case EP_DTYPE_INT64: return (double)((const int64_t*)data)[i];
    case EP_DTYPE_UINT8:
    case EP_DTYPE_BOOL: return ((const uint8_t*)data)[i];
    case EP_DTYPE_UINT16: return ((const uint16_t*)data)[i];
    case EP_DTYPE_UINT32: return ((const uint32_t*)data)[i];
    case EP_DTYPE_UINT64: return (double)((const uint64_t*)data)[i];
    case EP_DTYPE_FLOAT8_E4M3FN: return minifloat(((const uint8_t*)data)[i], 4, 3, 7, 1);
    case EP_DTYPE_FLOAT8_E4M3FNUZ: return minifloat(((const uint8_t*)data)[i], 4, 3, 8, 2);
    case EP_DTYPE_FLOAT8_E5M2: return minifloat(((const uint8_t*)data)[i], 5, 2, 15, 0);
    case EP_DTYPE_FLOAT8_E5M2FNUZ: return minifloat(((const uint8_t*)data)[i], 5, 2, 16, 2);
    case EP_DTYPE_FLOAT8_E8M0FNU: {
      unsigned bits = ((const uint8_t*)data)[i];
      return bits == 0xff ? NAN : ldexp(1.0, (int)bits - 127);
    }
    default: return 0.0;
  }
}

/* "[1,3,48,W=32..1280:8]": a dynamic dimension of input `input` (-1: an output) with its range. */
static void format_shape(const ep_model* model, int input, const ep_tensor_info* info, char* buf,
                         size_t size) {
  size_t pos = (size_t)snprintf(buf, size, "[");
  int i;
  for (i = 0; i < info->ndim && pos < size; ++i) {
    ep_dim_range r;
    if (input >= 0 && info->shape[i] < 0 && ep_model_input_dim(model, input, i, &r) == EP_OK) {
      pos += (size_t)snprintf(buf + pos, size - pos, "%s%s=%lld..%lld:%lld", i ? "," : "", r.name,
                              (long long)r.min, (long long)r.max, (long long)r.step);
      continue;
    }
    pos += (size_t)snprintf(buf + pos, size - pos, i ? ",%lld" : "%lld",
                            (long long)info->shape[i]);
  }
  if (pos < size) snprintf(buf + pos, size - pos, "]");
}

static void sanitize(const char* name, char* out, size_t size) {
  size_t i, n = 0;
  for (i = 0; name[i] != '\0' && n + 1 < size; ++i) {
    char c = name[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    out[n++] = ok ? c : '_';
  }
  if (n == 0) {
    snprintf(out, size, "output");
    return;
  }
  out[n] = '\0';
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* ---- main ---------------------------------------------------------------------------------- */

/* The value input `index`'s dynamic dimension `dim` gets when the input is not given: what an
   input set before (given, or filled) has for the same dimension name, else the dimension's min. */
static int64_t fill_extent(ep_model* model, int index, int dim, int num_inputs, void** buffers,
                           int64_t (*given_shapes)[EP_MAX_NDIM]) {
  ep_dim_range r, other;
  ep_tensor_info info;
  int i, d;
  ep_model_input_dim(model, index, dim, &r);
  for (i = 0; i < num_inputs; ++i) {
    if (buffers[i] == NULL || i == index) continue;
    ep_model_input_info(model, i, &info);
    for (d = 0; d < info.ndim; ++d) {
      if (info.shape[d] < 0 && ep_model_input_dim(model, i, d, &other) == EP_OK &&
          strcmp(other.name, r.name) == 0) {
        return given_shapes[i][d];
      }
    }
  }
  return r.min;
}

static int set_inputs(ep_model* model, const options* o, int num_inputs, void** buffers) {
  int i, j;
  ep_status st;
  int64_t (*given_shapes)[EP_MAX_NDIM] =
      (int64_t (*)[EP_MAX_NDIM])calloc((size_t)(num_inputs > 0 ? num_inputs : 1),
                                       sizeof(*given_shapes));
  int rc = 1;
  if (given_shapes == NULL) {
    fprintf(stderr, "edgepack_run: out of memory\n");
    return 1;
  }
  for (j = 0; j < o->num_inputs; ++j) {
    int index;
    ep_tensor_info info;
    unsigned char* buf = NULL;
    size_t size = 0;
    st = ep_model_find_input(model, o->inputs[j].name, &index);
    if (st != EP_OK) {
      fprintf(stderr, "edgepack_run: --input %s: %s; the inputs are:", o->inputs[j].name,
              ep_last_error());
      for (i = 0; i < num_inputs; ++i) {
        ep_model_input_info(model, i, &info);
        fprintf(stderr, " %s", info.name);
      }
      fprintf(stderr, "\n");
      goto done;
    }
    ep_model_input_info(model, index, &info);
    if (!read_file(o->inputs[j].path, &buf, &size)) goto done;
    buffers[index] = buf;
    if (ends_with(o->inputs[j].path, ".npy")) {
      npy_header h;
      void* data;
      if (!parse_npy(buf, size, o->inputs[j].path, &h)) goto done;
      {
        size_t need = ep_dtype_size(h.dtype);
        for (i = 0; i < h.ndim; ++i) need *= (size_t)h.shape[i];
        if (h.data_offset + need > size) {
          fprintf(stderr, "edgepack_run: %s: file is shorter than its header says\n",
                  o->inputs[j].path);
          goto done;
        }
      }
      /* move the data to the start of the aligned buffer so it is used without a copy */
      data = buf;
      memmove(data, buf + h.data_offset, size - h.data_offset);
      st = ep_model_set_input_typed(model, index, data, h.dtype, h.ndim, h.shape);
      for (i = 0; i < h.ndim; ++i) given_shapes[index][i] = h.shape[i];
    } else {
      st = ep_model_set_input(model, index, buf, size);
    }
    if (st != EP_OK) {
      int raw_dynamic = 0;
      for (i = 0; i < info.ndim; ++i) raw_dynamic |= info.shape[i] < 0;
      raw_dynamic &= !ends_with(o->inputs[j].path, ".npy");
      fprintf(stderr, "edgepack_run: input %s from %s: %s (%s)%s\n", info.name, o->inputs[j].path,
              ep_last_error(), ep_status_name(st),
              raw_dynamic ? "; give it as a .npy file, which states the shape" : "");
      goto done;
    }
  }
  for (i = 0; i < num_inputs; ++i) {
    ep_tensor_info info;
    int d, dynamic = 0;
    int64_t shape[EP_MAX_NDIM];
    size_t size;
    if (buffers[i] != NULL) continue;
    ep_model_input_info(model, i, &info);
    size = ep_dtype_size(info.dtype);
    for (d = 0; d < info.ndim; ++d) {
      shape[d] = info.shape[d];
      if (shape[d] < 0) { /* dynamic: see fill_extent */
        shape[d] = fill_extent(model, i, d, num_inputs, buffers, given_shapes);
        dynamic = 1;
      }
      size *= (size_t)shape[d];
    }
    buffers[i] = ep_alloc(size);
    if (buffers[i] == NULL) {
      fprintf(stderr, "edgepack_run: out of memory\n");
      goto done;
    }
    memset(buffers[i], 0, size);
    for (d = 0; d < info.ndim; ++d) given_shapes[i][d] = shape[d];
    if (dynamic) {
      char text[160];
      ep_tensor_info filled = info;
      for (d = 0; d < info.ndim; ++d) filled.shape[d] = shape[d];
      format_shape(model, -1, &filled, text, sizeof(text));
      fprintf(stderr, "edgepack_run: note: input %s not given, using zeros of shape %s\n", info.name,
              text);
      st = ep_model_set_input_typed(model, i, buffers[i], info.dtype, info.ndim, shape);
    } else {
      fprintf(stderr, "edgepack_run: note: input %s not given, using zeros\n", info.name);
      st = ep_model_set_input(model, i, buffers[i], info.byte_size);
    }
    if (st != EP_OK) {
      fail("set input", st);
      goto done;
    }
  }
  rc = 0;
done:
  free(given_shapes);
  return rc;
}

static int report_outputs(ep_model* model, const options* o, int num_outputs) {
  int i;
  if (o->output_dir != NULL && !make_dirs(o->output_dir)) {
    fprintf(stderr, "edgepack_run: cannot create %s: %s\n", o->output_dir, strerror(errno));
    return 1;
  }
  for (i = 0; i < num_outputs; ++i) {
    ep_tensor_info info;
    const void* data;
    size_t size, n, k;
    double mn = 0, mx = 0, sum = 0;
    char shape[160];
    char path[4096];
    ep_status st = ep_model_output_info(model, i, &info);
    if (st == EP_OK) st = ep_model_get_output(model, i, &data, &size);
    /* the shape this run produced (outputs can depend on dynamic input dimensions) */
    if (st == EP_OK) st = ep_model_output_shape(model, i, &info.ndim, info.shape);
    if (st != EP_OK) return fail("get output", st);
    info.byte_size = size;
    n = ep_dtype_size(info.dtype) ? size / ep_dtype_size(info.dtype) : 0;
    for (k = 0; k < n; ++k) {
      double v = element(data, info.dtype, k);
      if (k == 0 || v < mn) mn = v;
      if (k == 0 || v > mx) mx = v;
      sum += v;
    }
    path[0] = '\0';
    if (o->output_dir != NULL) {
      char clean[200];
      sanitize(info.name, clean, sizeof(clean));
      snprintf(path, sizeof(path), "%s/%d_%s.npy", o->output_dir, i, clean);
      if (!write_npy(path, &info, data)) {
        fprintf(stderr, "edgepack_run: cannot write %s: %s\n", path, strerror(errno));
        return 1;
      }
    }
    if (!o->quiet) {
      format_shape(model, -1, &info, shape, sizeof(shape));
      printf("output %d %s %s %s min=%.6g max=%.6g mean=%.6g%s%s\n", i, info.name,
             ep_dtype_name(info.dtype), shape, mn, mx, n ? sum / (double)n : 0.0,
             path[0] ? " -> " : "", path);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  options o;
  ep_model* model = NULL;
  ep_status st;
  int num_inputs = 0, num_outputs = 0, i, rc = 0;
  void** buffers = NULL;
  double* times = NULL;
  char* meta_text = NULL;

  rc = parse_args(argc, argv, &o);
  if (rc != 0) return rc;

  if (o.model_path == NULL) {
    if (o.meta_path != NULL) {
      unsigned char* text;
      size_t size;
      if (!read_file(o.meta_path, &text, &size)) return 1;
      meta_text = (char*)malloc(size + 1);
      if (meta_text == NULL) return 1;
      memcpy(meta_text, text, size);
      meta_text[size] = '\0';
      ep_free(text);
    }
    st = ep_model_open_system_lib(NULL, meta_text, &model);
    if (st != EP_OK) return fail("no model path given", st);
  } else if (o.from_memory) {
    unsigned char* lib;
    size_t size;
    if (!read_file(o.model_path, &lib, &size)) return 1;
    if (o.meta_path != NULL) {
      unsigned char* text;
      size_t tsize;
      if (!read_file(o.meta_path, &text, &tsize)) return 1;
      meta_text = (char*)malloc(tsize + 1);
      if (meta_text == NULL) return 1;
      memcpy(meta_text, text, tsize);
      meta_text[tsize] = '\0';
      ep_free(text);
    }
    st = ep_model_open_memory(lib, size, meta_text, &model);
    ep_free(lib);
    if (st != EP_OK) return fail("open model", st);
  } else {
    st = ep_model_open(o.model_path, o.meta_path, &model);
    if (st != EP_OK) return fail("open model", st);
  }
  free(meta_text);
  st = ep_set_num_threads((int)o.threads); /* 0: $TVM_NUM_THREADS, else the big cores */
  if (st != EP_OK) return fail("set threads", st);

  ep_model_num_inputs(model, &num_inputs);
  ep_model_num_outputs(model, &num_outputs);
  if (o.info) {
    for (i = 0; i < num_inputs + num_outputs; ++i) {
      ep_tensor_info info;
      char shape[160];
      int is_in = i < num_inputs;
      if (is_in) {
        ep_model_input_info(model, i, &info);
      } else {
        ep_model_output_info(model, i - num_inputs, &info);
      }
      format_shape(model, is_in ? i : -1, &info, shape, sizeof(shape));
      printf("%s %d %s %s %s\n", is_in ? "input" : "output", is_in ? i : i - num_inputs,
             info.name, ep_dtype_name(info.dtype), shape);
    }
    ep_model_close(&model);
    return 0;
  }

  buffers = (void**)calloc((size_t)(num_inputs > 0 ? num_inputs : 1), sizeof(void*));
  if (buffers == NULL) return 1;
  rc = set_inputs(model, &o, num_inputs, buffers);

  for (i = 0; rc == 0 && i < o.warmup; ++i) {
    st = ep_model_run(model);
    if (st != EP_OK) rc = fail("run", st);
  }
  if (rc == 0 && o.repeat > 0) {
    double mean = 0, var = 0;
    long k;
    times = (double*)malloc((size_t)o.repeat * sizeof(double));
    if (times == NULL) rc = 1;
    for (k = 0; rc == 0 && k < o.repeat; ++k) {
      double t0 = now_ms();
      st = ep_model_run(model);
      times[k] = now_ms() - t0;
      if (st != EP_OK) rc = fail("run", st);
    }
    if (rc == 0) {
      for (k = 0; k < o.repeat; ++k) mean += times[k];
      mean /= (double)o.repeat;
      for (k = 0; k < o.repeat; ++k) var += (times[k] - mean) * (times[k] - mean);
      var /= (double)o.repeat;
      qsort(times, (size_t)o.repeat, sizeof(double), cmp_double);
      printf("{\"runs\": %ld, \"mean_ms\": %.4f, \"median_ms\": %.4f, \"min_ms\": %.4f, "
             "\"max_ms\": %.4f, \"std_ms\": %.4f, \"threads\": %d, \"huge_page_bytes\": %zu, "
             "\"parallel_loops\": %lu}\n",
             o.repeat, mean,
             o.repeat % 2 ? times[o.repeat / 2]
                          : 0.5 * (times[o.repeat / 2 - 1] + times[o.repeat / 2]),
             times[0], times[o.repeat - 1], sqrt(var), ep_num_threads(), ep_model_huge_page_bytes(model),
             ep_parallel_loops());
    }
  } else if (rc == 0 && o.warmup == 0) {
    st = ep_model_run(model);
    if (st != EP_OK) rc = fail("run", st);
  }
  if (rc == 0) rc = report_outputs(model, &o, num_outputs);

  ep_model_close(&model);
  for (i = 0; i < num_inputs; ++i) ep_free(buffers[i]);
  free(buffers);
  free(times);
  for (i = 0; i < o.num_inputs; ++i) free((void*)o.inputs[i].name);
  return rc;
}
