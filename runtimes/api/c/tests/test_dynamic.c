/*
 * test_dynamic - dynamic input dimensions through the edgepack C API (metadata version 2).
 *
 *   test_dynamic MODEL.so WORKDIR
 *
 * MODEL.so is the model tests/test_c_dynamic_shapes.py builds, with its metadata embedded:
 *     edgepack-model-meta 2
 *     dim W 8 64 4
 *     input x float32 2,W
 *     input y float32 2,W
 *     output a float32 2,?        a = x * 2 + y
 *     output b float32 2,?        b = concat([x, y], axis=1)
 * WORKDIR is a writable directory for scratch metadata files.
 * Prints one line per failed check and a final line "N passed, M failed"; exits 1 on failure.
 */
#if !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1
#endif

#include <edgepack.h>

#include <math.h>
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

/* Expect status `want` and, for a failure, a non-empty error message. */
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

#define CHECK_ERROR_HAS(text) CHECK(strstr(ep_last_error(), (text)) != NULL)

static int write_text(const char* path, const char* text) {
  FILE* f = fopen(path, "wb");
  if (f == NULL) return 0;
  fputs(text, f);
  return fclose(f) == 0;
}

/* x[i] = seed + i / 8, y[i] = -i / 16 over 2 x w elements. */
static void fill(float* x, float* y, int64_t w, float seed) {
  int64_t i;
  for (i = 0; i < 2 * w; ++i) {
    x[i] = seed + (float)i / 8.0f;
    y[i] = -(float)i / 16.0f;
  }
}

/* Run at width w with x (at an offset of `shift` floats: unaligned when shift > 0) and y; check
   the produced shapes and values. */
static void run_at(ep_model* m, int64_t w, int shift) {
  float* xbuf = (float*)ep_alloc((size_t)(2 * 64 + 16) * sizeof(float));
  float* y = (float*)ep_alloc((size_t)(2 * 64) * sizeof(float));
  float* x = xbuf + shift;
  int64_t shape[2];
  int64_t out_shape[EP_MAX_NDIM];
  int32_t ndim = -1;
  const void* data = NULL;
  size_t size = 0;
  ep_tensor_info info;
  int64_t r, c;
  int ok = 1;
  shape[0] = 2;
  shape[1] = w;
  fill(x, y, w, (float)w);
  CHECK_STATUS(ep_model_set_input_typed(m, 0, x, EP_DTYPE_FLOAT32, 2, shape), EP_OK);
  CHECK_STATUS(ep_model_set_input_typed(m, 1, y, EP_DTYPE_FLOAT32, 2, shape), EP_OK);
  /* the caller's shape array is copied: changing it afterwards changes nothing */
  shape[1] = 12345;
  CHECK_STATUS(ep_model_run(m), EP_OK);

  CHECK_STATUS(ep_model_output_shape(m, 0, &ndim, out_shape), EP_OK);
  CHECK(ndim == 2 && out_shape[0] == 2 && out_shape[1] == w);
  CHECK_STATUS(ep_model_get_output(m, 0, &data, &size), EP_OK);
  CHECK(size == (size_t)(2 * w) * sizeof(float));
  if (data != NULL && size == (size_t)(2 * w) * sizeof(float)) {
    const float* a = (const float*)data;
    for (r = 0; r < 2 * w; ++r) ok &= fabsf(a[r] - (x[r] * 2.0f + y[r])) < 1e-5f;
    CHECK(ok);
  }
  CHECK_STATUS(ep_model_output_info(m, 0, &info), EP_OK);
  CHECK(info.ndim == 2 && info.shape[1] == w && info.byte_size == (size_t)(2 * w) * sizeof(float));

  CHECK_STATUS(ep_model_output_shape(m, 1, &ndim, out_shape), EP_OK);
  CHECK(ndim == 2 && out_shape[0] == 2 && out_shape[1] == 2 * w);
  CHECK_STATUS(ep_model_get_output(m, 1, &data, &size), EP_OK);
  CHECK(size == (size_t)(4 * w) * sizeof(float));
  if (data != NULL && size == (size_t)(4 * w) * sizeof(float)) {
    const float* b = (const float*)data;
    ok = 1;
    for (r = 0; r < 2; ++r) {
      for (c = 0; c < w; ++c) {
        ok &= b[r * 2 * w + c] == x[r * w + c];
        ok &= b[r * 2 * w + w + c] == y[r * w + c];
      }
    }
    CHECK(ok);
  }
  ep_free(xbuf);
  ep_free(y);
}

static void test_model(const char* model_path) {
  ep_model* m = NULL;
  ep_tensor_info info;
  ep_dim_range r;
  int64_t shape[2];
  int64_t out_shape[EP_MAX_NDIM];
  int32_t ndim = 0;
  float* x = (float*)ep_alloc((size_t)(2 * 64) * sizeof(float));
  float* y = (float*)ep_alloc((size_t)(2 * 64) * sizeof(float));

  CHECK(EP_API_VERSION == 2);
  CHECK_STATUS(ep_model_open(model_path, NULL, &m), EP_OK);
  if (m == NULL) return;

  CHECK_STATUS(ep_model_input_info(m, 0, &info), EP_OK);
  CHECK(info.ndim == 2 && info.shape[0] == 2 && info.shape[1] == -1);
  CHECK(info.byte_size == (size_t)(2 * 64) * sizeof(float)); /* W at its max */
  CHECK_STATUS(ep_model_output_info(m, 1, &info), EP_OK);
  CHECK(info.ndim == 2 && info.shape[1] == -1 && info.byte_size == 0);

  /* ranges */
  CHECK_STATUS(ep_model_input_dim(m, 0, 1, &r), EP_OK);
  CHECK(strcmp(r.name, "W") == 0 && r.min == 8 && r.max == 64 && r.step == 4);
  CHECK_STATUS(ep_model_input_dim(m, 1, 1, &r), EP_OK);
  CHECK(strcmp(r.name, "W") == 0);
  CHECK_STATUS(ep_model_input_dim(m, 0, 0, &r), EP_OK);
  CHECK(strcmp(r.name, "") == 0 && r.min == 2 && r.max == 2 && r.step == 1);
  CHECK_STATUS(ep_model_input_dim(m, 0, 2, &r), EP_ERR_INDEX);
  CHECK_STATUS(ep_model_input_dim(m, 0, -1, &r), EP_ERR_INDEX);
  CHECK_STATUS(ep_model_input_dim(m, 2, 0, &r), EP_ERR_INDEX);
  CHECK_STATUS(ep_model_input_dim(m, -1, 0, &r), EP_ERR_INDEX);
  CHECK_STATUS(ep_model_input_dim(m, 0, 0, NULL), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_input_dim(NULL, 0, 0, &r), EP_ERR_INVALID_ARGUMENT);

  /* no outputs before a run */
  CHECK_STATUS(ep_model_output_shape(m, 0, &ndim, out_shape), EP_ERR_STATE);

  /* a byte size does not say W */
  CHECK_STATUS(ep_model_set_input(m, 0, x, (size_t)(2 * 64) * sizeof(float)), EP_ERR_SHAPE);
  CHECK_ERROR_HAS("dynamic dimensions (W)");
  CHECK_ERROR_HAS("ep_model_set_input_typed");

  /* W out of range or off the step; the static dimension still has to match */
  shape[0] = 2;
  shape[1] = 10;
  CHECK_STATUS(ep_model_set_input_typed(m, 0, x, EP_DTYPE_FLOAT32, 2, shape), EP_ERR_SHAPE);
  CHECK_ERROR_HAS("input 0 'x' dimension 1 (W) is 10; the model takes W from 8 to 64 in steps of 4");
  shape[1] = 68;
  CHECK_STATUS(ep_model_set_input_typed(m, 0, x, EP_DTYPE_FLOAT32, 2, shape), EP_ERR_SHAPE);
  CHECK_ERROR_HAS("(W) is 68");
  shape[1] = 4;
  CHECK_STATUS(ep_model_set_input_typed(m, 1, y, EP_DTYPE_FLOAT32, 2, shape), EP_ERR_SHAPE);
  CHECK_ERROR_HAS("input 1 'y' dimension 1 (W) is 4");
  shape[0] = 3;
  shape[1] = 8;
  CHECK_STATUS(ep_model_set_input_typed(m, 0, x, EP_DTYPE_FLOAT32, 2, shape), EP_ERR_SHAPE);
  CHECK_ERROR_HAS("[2,W]");
  shape[0] = 2;
  CHECK_STATUS(ep_model_set_input_typed(m, 0, x, EP_DTYPE_FLOAT32, 1, shape), EP_ERR_SHAPE);
  CHECK_STATUS(ep_model_set_input_typed(m, 0, x, EP_DTYPE_INT32, 2, shape), EP_ERR_DTYPE);
  CHECK_STATUS(ep_model_set_input_typed(m, 0, NULL, EP_DTYPE_FLOAT32, 2, shape),
               EP_ERR_INVALID_ARGUMENT);

  /* two sizes, growing and shrinking, aligned and unaligned (copied) buffers */
  run_at(m, 12, 0);
  run_at(m, 64, 3);
  run_at(m, 8, 0);
  run_at(m, 36, 1);

  /* W differs between x and y: refused before TVM sees it; the inputs can be set again */
  shape[0] = 2;
  shape[1] = 12;
  CHECK_STATUS(ep_model_set_input_typed(m, 0, x, EP_DTYPE_FLOAT32, 2, shape), EP_OK);
  shape[1] = 16;
  CHECK_STATUS(ep_model_set_input_typed(m, 1, y, EP_DTYPE_FLOAT32, 2, shape), EP_OK);
  CHECK_STATUS(ep_model_run(m), EP_ERR_SHAPE);
  CHECK_ERROR_HAS("dimension W is 12 in input 0 'x'");
  CHECK_ERROR_HAS("16 in input 1 'y'");
  run_at(m, 16, 0);

  CHECK_STATUS(ep_model_output_shape(m, 2, &ndim, out_shape), EP_ERR_INDEX);
  CHECK_STATUS(ep_model_output_shape(m, -1, &ndim, out_shape), EP_ERR_INDEX);
  CHECK_STATUS(ep_model_output_shape(m, 0, NULL, out_shape), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_output_shape(m, 0, &ndim, NULL), EP_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(ep_model_output_shape(NULL, 0, &ndim, out_shape), EP_ERR_INVALID_ARGUMENT);

  CHECK_STATUS(ep_model_close(&m), EP_OK);
  ep_free(x);
  ep_free(y);
}

/* Metadata that does not open (the model's library, this text as the metadata file). */
static void expect_bad_meta(const char* model_path, const char* workdir, const char* text,
                            const char* message) {
  char path[1024];
  ep_model* m = NULL;
  snprintf(path, sizeof(path), "%s/bad.meta", workdir);
  CHECK(write_text(path, text));
  CHECK_STATUS(ep_model_open(model_path, path, &m), EP_ERR_METADATA);
  CHECK(m == NULL);
  if (strstr(ep_last_error(), message) == NULL) {
    ++g_failed;
    printf("FAIL %s:%d: error '%s' does not contain '%s'\n", __FILE__, __LINE__, ep_last_error(),
           message);
  } else {
    ++g_passed;
  }
}

static void test_metadata(const char* model_path, const char* workdir) {
  static const char outputs[] = "output a float32 2,?\noutput b float32 2,?\n";
  char text[4096];
  char path[1024];
  size_t pos;
  int i;
  ep_model* m = NULL;
  ep_tensor_info info;
  ep_dim_range r;

  snprintf(text, sizeof(text), "edgepack-model-meta 2\ndim W 8 64 4\ninput x float32 2,V\ninput y float32 2,W\n%s", outputs);
  expect_bad_meta(model_path, workdir, text, "line 3: dimension 'V' is not declared");
  snprintf(text, sizeof(text), "edgepack-model-meta 2\ndim W 8 66 4\ninput x float32 2,W\ninput y float32 2,W\n%s", outputs);
  expect_bad_meta(model_path, workdir, text, "line 2: bad range for dimension W");
  snprintf(text, sizeof(text), "edgepack-model-meta 2\ndim W 0 64 4\ninput x float32 2,W\ninput y float32 2,W\n%s", outputs);
  expect_bad_meta(model_path, workdir, text, "line 2: bad range");
  snprintf(text, sizeof(text), "edgepack-model-meta 2\ndim W 8 64 0\ninput x float32 2,W\ninput y float32 2,W\n%s", outputs);
  expect_bad_meta(model_path, workdir, text, "line 2: bad range");
  snprintf(text, sizeof(text), "edgepack-model-meta 2\ndim W 9 8 1\ninput x float32 2,W\ninput y float32 2,W\n%s", outputs);
  expect_bad_meta(model_path, workdir, text, "line 2: bad range");
  snprintf(text, sizeof(text), "edgepack-model-meta 2\ndim W 8 64\ninput x float32 2,W\ninput y float32 2,W\n%s", outputs);
  expect_bad_meta(model_path, workdir, text, "line 2: expected 'dim W <min> <max> <step>'");
  snprintf(text, sizeof(text), "edgepack-model-meta 2\ndim 9W 8 64 4\ninput x float32 2,W\ninput y float32 2,W\n%s", outputs);
  expect_bad_meta(model_path, workdir, text, "line 2: dimension name '9W' is not an identifier");
  snprintf(text, sizeof(text), "edgepack-model-meta 2\ndim W 8 64 4\ndim W 8 64 4\ninput x float32 2,W\ninput y float32 2,W\n%s", outputs);
  expect_bad_meta(model_path, workdir, text, "line 3: dimension 'W' is declared twice");
  snprintf(text, sizeof(text), "edgepack-model-meta 2\ninput x float32 2,8\ndim W 8 64 4\ninput y float32 2,W\n%s", outputs);
  expect_bad_meta(model_path, workdir, text, "line 3: 'dim' lines must come before");
  snprintf(text, sizeof(text), "edgepack-model-meta 1\ndim W 8 64 4\ninput x float32 2,W\ninput y float32 2,W\n%s", outputs);
  expect_bad_meta(model_path, workdir, text, "line 2: 'dim' lines need the header 'edgepack-model-meta 2'");
  snprintf(text, sizeof(text), "edgepack-model-meta 1\ninput x float32 2,W\ninput y float32 2,W\n%s", outputs);
  expect_bad_meta(model_path, workdir, text, "line 2: dimension 'W' is a name");
  snprintf(text, sizeof(text), "edgepack-model-meta 2\ndim W 8 64 4\ninput x float32 2,W\ninput y float32 2,W\noutput a float32 2,W\noutput b float32 2,?\n");
  expect_bad_meta(model_path, workdir, text, "line 5: dimension 'W' is a name");
  snprintf(text, sizeof(text), "edgepack-model-meta 2\ndim W 8 64 4\ninput x float32 2,?\ninput y float32 2,W\n%s", outputs);
  expect_bad_meta(model_path, workdir, text, "line 3: input 'x' has a dimension decided at run time");
  snprintf(text, sizeof(text), "edgepack-model-meta 3\n%s", outputs);
  expect_bad_meta(model_path, workdir, text, "unsupported metadata version");
  /* more dynamic dimensions than the runtime takes */
  pos = (size_t)snprintf(text, sizeof(text), "edgepack-model-meta 2\n");
  for (i = 0; i < 40; ++i) pos += (size_t)snprintf(text + pos, sizeof(text) - pos, "dim D%d 1 2 1\n", i);
  snprintf(text + pos, sizeof(text) - pos, "input x float32 2,D0\ninput y float32 2,D0\n%s", outputs);
  expect_bad_meta(model_path, workdir, text, "line 34: more than 32 dynamic dimensions");

  /* valid variants: one name twice in one input, comments, two dims (unused ones allowed) */
  snprintf(path, sizeof(path), "%s/good.meta", workdir);
  CHECK(write_text(path, "# a comment\nedgepack-model-meta 2\n\ndim W 8 64 4\ndim H 1 1 1\n"
                         "input x float32 2,W\ninput y float32 2,W\noutput a float32 2,?\n"
                         "output b float32 2,?\n"));
  CHECK_STATUS(ep_model_open(model_path, path, &m), EP_OK);
  if (m != NULL) {
    CHECK_STATUS(ep_model_input_dim(m, 1, 1, &r), EP_OK);
    CHECK(strcmp(r.name, "W") == 0 && r.step == 4);
    CHECK_STATUS(ep_model_input_info(m, 1, &info), EP_OK);
    CHECK(info.byte_size == 2 * 64 * 4);
    ep_model_close(&m);
  }
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: test_dynamic MODEL.so WORKDIR\n");
    return 2;
  }
  test_model(argv[1]);
  test_metadata(argv[1], argv[2]);
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
