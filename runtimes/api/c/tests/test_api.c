/*
 * test_api - error paths and one happy path of the edgepack C API.
 *
 *   test_api MODEL.so WRONG_ARCH.so WORKDIR
 *
 * MODEL.so must have its metadata next to it (MODEL.meta) and at least one input.
 * WRONG_ARCH.so is any shared library built for another architecture.
 * WORKDIR is a writable directory for scratch files.
 * Prints one line per failed check and a final line "N passed, M failed"; exits 1 on failure.
 */
#if !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1
#endif

#include <edgepack.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_passed = 0;
static int g_failed = 0;

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (cond) {                                                                      \
      ++g_passed;                                                                    \
    } else {                                                                         \
      ++g_failed;                                                                    \
      printf("FAIL %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond,         \
             ep_last_error());                                                       \
    }                                                                                \
  } while (0)

/* Expect status `want` and a non-empty error message. */
#define CHECK_STATUS(call, want)                                                     \
  do {                                                                               \
    ep_status got_ = (call);                                                         \
    if (got_ == (want) && (want == EP_OK || ep_last_error()[0] != '\0')) {           \
      ++g_passed;                                                                    \
    } else {                                                                         \
      ++g_failed;                                                                    \
      printf("FAIL %s:%d: %s returned %s, expected %s (last error: %s)\n", __FILE__, \
             __LINE__, #call, ep_status_name(got_), ep_status_name(want),            \
             ep_last_error());                                                       \
    }                                                                                \
  } while (0)

static int write_text(const char* path, const char* text) {
  FILE* f = fopen(path, "wb");
  if (f == NULL) return 0;
  fputs(text, f);
  return fclose(f) == 0;
}

static unsigned char* read_all(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  long n;
  unsigned char* buf;
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  buf = (unsigned char*)malloc((size_t)n + 1);
  if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *size = (size_t)n;
  return buf;
}

/* Deterministic input data in [-1, 1) (floats) or small integers. */
static void fill_pattern(unsigned char* buf, const ep_tensor_info* info, int seed) {
  size_t i, n = info->byte_size / ep_dtype_size(info->dtype);
  for (i = 0; i < n; ++i) {
    int v = (int)((i * 7 + (size_t)seed * 13) % 17) - 8;
    switch (info->dtype) {
      case EP_DTYPE_FLOAT32: ((float*)buf)[i] = (float)v / 8.0f; break;
      case EP_DTYPE_FLOAT64: ((double*)buf)[i] = (double)v / 8.0; break;
      case EP_DTYPE_INT32: ((int32_t*)buf)[i] = v; break;
      case EP_DTYPE_INT64: ((int64_t*)buf)[i] = v; break;
      default: buf[i * ep_dtype_size(info->dtype)] = (unsigned char)(v & 0x7f); break;
    }
  }
}

static void test_helpers(void) {
  CHECK(ep_dtype_from_name("float32") == EP_DTYPE_FLOAT32);
  CHECK(ep_dtype_from_name("nope") == EP_DTYPE_UNKNOWN);
  CHECK(ep_dtype_from_name(NULL) == EP_DTYPE_UNKNOWN);
  CHECK(strcmp(ep_dtype_name(EP_DTYPE_INT8), "int8") == 0);
  CHECK(ep_dtype_size(EP_DTYPE_FLOAT16) == 2 && ep_dtype_size(EP_DTYPE_BOOL) == 1);
  CHECK(ep_dtype_from_name("float8_e5m2") == EP_DTYPE_FLOAT8_E5M2);
  CHECK(strcmp(ep_dtype_name(EP_DTYPE_FLOAT8_E8M0FNU), "float8_e8m0fnu") == 0);
  CHECK(ep_dtype_size(EP_DTYPE_FLOAT8_E4M3FNUZ) == 1);
  CHECK(strcmp(ep_status_name(EP_ERR_SHAPE), "EP_ERR_SHAPE") == 0);
  {
    void* p = ep_alloc(100);
    CHECK(p != NULL && ((uintptr_t)p % EP_ALIGNMENT) == 0);
    ep_free(p);
    ep_free(NULL);
  }
}

static void test_open_errors(const char* model, const char* wrong_arch, const char* workdir) {
  ep_model* m = (ep_model*)1; /* must be reset to NULL on failure */
  char path[1024];
  CHECK_STATUS(ep_model_open(model, NULL, NULL), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_open(NULL, NULL, &m), EP_ERR_INVALID_ARGUMENT);
  CHECK(m == NULL);
  CHECK_STATUS(ep_model_open("", NULL, &m), EP_ERR_INVALID_ARGUMENT);

  snprintf(path, sizeof(path), "%s/does-not-exist.so", workdir);
  CHECK_STATUS(ep_model_open(path, NULL, &m), EP_ERR_NOT_FOUND);
  CHECK(m == NULL);
  CHECK(strstr(ep_last_error(), "does-not-exist.so") != NULL);

  CHECK_STATUS(ep_model_open(wrong_arch, NULL, &m), EP_ERR_LOAD);
  CHECK(strstr(ep_last_error(), "built for") != NULL);
  CHECK(m == NULL);

  snprintf(path, sizeof(path), "%s/not-a-library.so", workdir);
  CHECK(write_text(path, "this is not a shared library\n"));
  CHECK_STATUS(ep_model_open(path, NULL, &m), EP_ERR_LOAD);

  /* metadata problems */
  snprintf(path, sizeof(path), "%s/missing.meta", workdir);
  CHECK_STATUS(ep_model_open(model, path, &m), EP_ERR_NOT_FOUND);
  snprintf(path, sizeof(path), "%s/bad.meta", workdir);
  CHECK(write_text(path, "edgepack-model-meta 1\ninput x float99 1,2\noutput y float32 2\n"));
  CHECK_STATUS(ep_model_open(model, path, &m), EP_ERR_METADATA);
  CHECK(strstr(ep_last_error(), "float99") != NULL);
  CHECK(write_text(path, "edgepack-model-meta 1\ninput x float32 1,?\noutput y float32 2\n"));
  CHECK_STATUS(ep_model_open(model, path, &m), EP_ERR_METADATA);
  CHECK(write_text(path, "not-edgepack 1\n"));
  CHECK_STATUS(ep_model_open(model, path, &m), EP_ERR_METADATA);
  CHECK(write_text(path, "edgepack-model-meta 3\n"));
  CHECK_STATUS(ep_model_open(model, path, &m), EP_ERR_METADATA);
  CHECK(strstr(ep_last_error(), "version") != NULL);
  /* version 2 (dynamic dimensions): an undeclared dimension name, a 'dim' line after an input */
  CHECK(write_text(path, "edgepack-model-meta 2\ninput x float32 1,W\noutput y float32 2\n"));
  CHECK_STATUS(ep_model_open(model, path, &m), EP_ERR_METADATA);
  CHECK(strstr(ep_last_error(), "line 2") != NULL && strstr(ep_last_error(), "'W'") != NULL);
  CHECK(write_text(path, "edgepack-model-meta 2\ninput x float32 1\ndim W 1 2 1\noutput y float32 2\n"));
  CHECK_STATUS(ep_model_open(model, path, &m), EP_ERR_METADATA);
  CHECK(strstr(ep_last_error(), "line 3") != NULL);
  /* an input count that does not match the model's main function */
  CHECK(write_text(path, "edgepack-model-meta 1\n"
                         "input a float32 1\ninput b float32 1\ninput c float32 1\n"
                         "input d float32 1\ninput e float32 1\ninput f float32 1\n"
                         "output y float32 1\n"));
  CHECK_STATUS(ep_model_open(model, path, &m), EP_ERR_METADATA);
  CHECK(m == NULL);

  /* from memory */
  {
    static const char junk[] = "definitely not ELF";
    CHECK_STATUS(ep_model_open_memory(NULL, 0, NULL, &m), EP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(ep_model_open_memory(junk, sizeof(junk), NULL, &m), EP_ERR_LOAD);
  }
  {
    size_t size = 0;
    unsigned char* bytes = read_all(wrong_arch, &size);
    CHECK(bytes != NULL);
    if (bytes != NULL) {
      CHECK_STATUS(ep_model_open_memory(bytes, size, NULL, &m), EP_ERR_LOAD);
      free(bytes);
    }
  }
  /* no model linked into this test program */
  CHECK_STATUS(ep_model_open_system_lib("no_such_prefix_", NULL, &m), EP_ERR_NOT_FOUND);
  CHECK(m == NULL);
}

static void test_null_handles(void) {
  int n = 0;
  ep_tensor_info info;
  const void* data;
  size_t size;
  ep_model* m = NULL;
  CHECK_STATUS(ep_model_num_inputs(NULL, &n), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_num_outputs(NULL, &n), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_input_info(NULL, 0, &info), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_set_input(NULL, 0, &n, sizeof(n)), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_run(NULL), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_get_output(NULL, 0, &data, &size), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_close(NULL), EP_OK);
  CHECK_STATUS(ep_model_close(&m), EP_OK);
}

static void test_model(const char* model_path, const char* workdir) {
  ep_model* m = NULL;
  ep_model* m2 = NULL;
  int nin = 0, nout = 0, i, idx = -1;
  ep_tensor_info info, out_info;
  unsigned char** inputs;
  unsigned char* first_output = NULL;
  const void* data = NULL;
  size_t size = 0;
  (void)workdir;

  CHECK_STATUS(ep_model_open(model_path, NULL, &m), EP_OK);
  if (m == NULL) return;
  CHECK_STATUS(ep_model_num_inputs(m, &nin), EP_OK);
  CHECK_STATUS(ep_model_num_outputs(m, &nout), EP_OK);
  CHECK(nin >= 1 && nout >= 1);
  CHECK_STATUS(ep_model_num_inputs(m, NULL), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_input_info(m, -1, &info), EP_ERR_INDEX);
  CHECK_STATUS(ep_model_input_info(m, nin, &info), EP_ERR_INDEX);
  CHECK_STATUS(ep_model_output_info(m, nout, &info), EP_ERR_INDEX);
  CHECK_STATUS(ep_model_input_info(m, 0, NULL), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_input_info(m, 0, &info), EP_OK);
  if (info.ndim > 0) { /* a static dimension's range is its extent */
    ep_dim_range r;
    CHECK_STATUS(ep_model_input_dim(m, 0, 0, &r), EP_OK);
    CHECK(r.name != NULL && r.name[0] == '\0' && r.min == info.shape[0] && r.max == info.shape[0] &&
          r.step == 1);
    CHECK_STATUS(ep_model_input_dim(m, 0, info.ndim, &r), EP_ERR_INDEX);
  }
  CHECK_STATUS(ep_model_find_input(m, info.name, &idx), EP_OK);
  CHECK(idx == 0);
  CHECK_STATUS(ep_model_find_input(m, "no such input", &idx), EP_ERR_NOT_FOUND);
  CHECK_STATUS(ep_model_output_info(m, 0, &out_info), EP_OK);
  CHECK_STATUS(ep_model_find_output(m, out_info.name, &idx), EP_OK);

  /* nothing is set yet */
  CHECK_STATUS(ep_model_run(m), EP_ERR_STATE);
  CHECK(strstr(ep_last_error(), "was not set") != NULL);
  CHECK_STATUS(ep_model_get_output(m, 0, &data, &size), EP_ERR_STATE);
  {
    int32_t ndim = 0;
    int64_t shape[EP_MAX_NDIM];
    CHECK_STATUS(ep_model_output_shape(m, 0, &ndim, shape), EP_ERR_STATE);
  }

  inputs = (unsigned char**)calloc((size_t)nin, sizeof(unsigned char*));
  for (i = 0; i < nin; ++i) {
    ep_model_input_info(m, i, &info);
    /* one spare element so that an unaligned view of the same data fits */
    inputs[i] = (unsigned char*)ep_alloc(info.byte_size + 16);
    fill_pattern(inputs[i], &info, i);
  }

  /* wrong index, size, dtype, shape */
  ep_model_input_info(m, 0, &info);
  CHECK_STATUS(ep_model_set_input(m, -1, inputs[0], info.byte_size), EP_ERR_INDEX);
  CHECK_STATUS(ep_model_set_input(m, nin, inputs[0], info.byte_size), EP_ERR_INDEX);
  CHECK_STATUS(ep_model_set_input(m, 0, inputs[0], info.byte_size + 4), EP_ERR_SHAPE);
  CHECK_STATUS(ep_model_set_input(m, 0, NULL, info.byte_size), EP_ERR_INVALID_ARGUMENT);
  {
    ep_dtype other = info.dtype == EP_DTYPE_INT64 ? EP_DTYPE_FLOAT32 : EP_DTYPE_INT64;
    int64_t shape[EP_MAX_NDIM];
    memcpy(shape, info.shape, sizeof(shape));
    CHECK_STATUS(ep_model_set_input_typed(m, 0, inputs[0], other, info.ndim, shape), EP_ERR_DTYPE);
    if (info.ndim > 0) {
      shape[0] += 1;
      CHECK_STATUS(ep_model_set_input_typed(m, 0, inputs[0], info.dtype, info.ndim, shape),
                   EP_ERR_SHAPE);
      shape[0] -= 1;
    }
    CHECK_STATUS(ep_model_set_input_typed(m, 0, inputs[0], info.dtype, info.ndim + 1, shape),
                 EP_ERR_SHAPE);
    CHECK_STATUS(ep_model_set_input_typed(m, 0, inputs[0], info.dtype, info.ndim, shape), EP_OK);
  }
  /* a partial set is still not runnable when there is more than one input */
  if (nin > 1) CHECK_STATUS(ep_model_run(m), EP_ERR_STATE);

  /* happy path (aligned buffers: used in place) */
  for (i = 0; i < nin; ++i) {
    ep_model_input_info(m, i, &info);
    CHECK_STATUS(ep_model_set_input(m, i, inputs[i], info.byte_size), EP_OK);
  }
  CHECK_STATUS(ep_model_run(m), EP_OK);
  CHECK_STATUS(ep_model_get_output(m, nout, &data, &size), EP_ERR_INDEX);
  CHECK_STATUS(ep_model_get_output(m, 0, NULL, &size), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_get_output(m, 0, &data, &size), EP_OK);
  CHECK(data != NULL && size == out_info.byte_size);
  {
    int32_t ndim = -1;
    int64_t shape[EP_MAX_NDIM];
    CHECK_STATUS(ep_model_output_shape(m, 0, &ndim, shape), EP_OK);
    CHECK(ndim == out_info.ndim && (ndim == 0 || memcmp(shape, out_info.shape,
                                                        (size_t)ndim * sizeof(int64_t)) == 0));
  }
  first_output = (unsigned char*)malloc(size + 1);
  CHECK_STATUS(ep_model_copy_output(m, 0, first_output, size - 1), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_copy_output(m, 0, first_output, size), EP_OK);
  CHECK(memcmp(first_output, data, size) == 0);

  /* the same data through unaligned buffers (copied) gives the same result */
  for (i = 0; i < nin; ++i) {
    ep_model_input_info(m, i, &info);
    memmove(inputs[i] + 4, inputs[i], info.byte_size);
    CHECK_STATUS(ep_model_set_input(m, i, inputs[i] + 4, info.byte_size), EP_OK);
  }
  CHECK_STATUS(ep_model_run(m), EP_OK);
  CHECK_STATUS(ep_model_get_output(m, 0, &data, &size), EP_OK);
  CHECK(size == out_info.byte_size && memcmp(first_output, data, size) == 0);

  /* a second handle of the same model from memory, used alongside the first */
  {
    size_t lib_size = 0;
    unsigned char* lib = read_all(model_path, &lib_size);
    char meta_path[1024];
    size_t meta_size = 0;
    unsigned char* meta;
    const char* dot = strrchr(model_path, '.');
    snprintf(meta_path, sizeof(meta_path), "%.*s.meta",
             (int)(dot ? (size_t)(dot - model_path) : strlen(model_path)), model_path);
    meta = read_all(meta_path, &meta_size);
    CHECK(lib != NULL && meta != NULL);
    if (lib != NULL && meta != NULL) {
      meta[meta_size] = '\0';
      CHECK_STATUS(ep_model_open_memory(lib, lib_size, (const char*)meta, &m2), EP_OK);
      free(lib);
      free(meta);
      if (m2 != NULL) {
        for (i = 0; i < nin; ++i) {
          ep_model_input_info(m2, i, &info);
          CHECK_STATUS(ep_model_set_input(m2, i, inputs[i] + 4, info.byte_size), EP_OK);
        }
        CHECK_STATUS(ep_model_run(m2), EP_OK);
        CHECK_STATUS(ep_model_get_output(m2, 0, &data, &size), EP_OK);
        CHECK(size == out_info.byte_size && memcmp(first_output, data, size) == 0);
        CHECK_STATUS(ep_model_close(&m2), EP_OK);
        CHECK(m2 == NULL);
      }
    }
  }

  /* closed model */
  CHECK_STATUS(ep_model_close(&m), EP_OK);
  CHECK(m == NULL);
  CHECK_STATUS(ep_model_run(m), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_num_inputs(m, &nin), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_close(&m), EP_OK);

  for (i = 0; i < nin; ++i) ep_free(inputs[i]);
  free(inputs);
  free(first_output);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: test_api MODEL.so WRONG_ARCH.so WORKDIR\n");
    return 2;
  }
  test_helpers();
  test_null_handles();
  test_open_errors(argv[1], argv[2], argv[3]);
  test_model(argv[1], argv[3]);
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
