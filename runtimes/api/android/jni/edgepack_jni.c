/*
 * edgepack_jni.c - the JNI layer of edgepack's Java API: a thin C layer over the C API
 * (edgepack.h). Every decision about models, tensors, buffers and errors is made by the C API
 * (src/edgepack.c, the same code the C bundle ships); this file only converts between Java and C
 * and turns a failed ep_status into an ai.edgepack.EdgepackException carrying ep_last_error().
 *
 * The native methods are registered in JNI_OnLoad with RegisterNatives on the class named by
 * EDGEPACK_JNI_CLASS (default "ai/edgepack/NativeModel"), so they need no mangled symbol names
 * and a mismatch between this library and the Java class fails at load time, not at first call.
 *
 * Build (the library is called libedgepack_jni.so):
 *   cc -std=c11 -O2 -Wall -Wextra -fPIC -shared -I<edgepack.h dir> -I<tvm/ffi, dlpack dirs>
 *      [-I<JDK>/include -I<JDK>/include/linux]   (the NDK's sysroot already has jni.h)
 *      edgepack_jni.c edgepack.c -ltvm_runtime -ltvm_ffi -o libedgepack_jni.so
 *
 * Handles: a model is a jlong holding the ep_model pointer; 0 after close. The C API checks
 * every handle (NULL or closed gives EP_ERR_INVALID_ARGUMENT with a message), so a closed
 * model produces the C API's own message. The Java class serialises calls on one model.
 */
#include <jni.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "edgepack.h"

#ifndef EDGEPACK_JNI_CLASS
#define EDGEPACK_JNI_CLASS "ai/edgepack/NativeModel"
#endif
#ifndef EDGEPACK_JNI_EXCEPTION
#define EDGEPACK_JNI_EXCEPTION "ai/edgepack/EdgepackException"
#endif

static jclass g_exception_class;    /* global ref to EdgepackException */
static jmethodID g_exception_init;  /* EdgepackException(String message, int status) */

static ep_model* to_model(jlong handle) { return (ep_model*)(intptr_t)handle; }

/* Throw EdgepackException(message, status); returns 0 so callers can `return fail(...)`. */
static jlong throw_message(JNIEnv* env, ep_status status, const char* message) {
  jstring text;
  jobject exc;
  if ((*env)->ExceptionCheck(env)) return 0; /* keep the first pending exception */
  text = (*env)->NewStringUTF(env, message);
  if (text == NULL) return 0; /* OutOfMemoryError is pending */
  exc = (*env)->NewObject(env, g_exception_class, g_exception_init, text, (jint)status);
  if (exc != NULL) (*env)->Throw(env, (jthrowable)exc);
  return 0;
}

/* Throw for a failed C API call: the message is the C API's own (ep_last_error). */
static jlong throw_status(JNIEnv* env, ep_status status) {
  const char* message = ep_last_error();
  if (message == NULL || message[0] == '\0') message = ep_status_name(status);
  return throw_message(env, status, message);
}

/* The address of byte `offset` of a direct buffer holding at least offset + size bytes (checked
 * by the Java caller), or NULL with an exception pending. */
static void* buffer_address(JNIEnv* env, jobject buffer, jlong offset, jlong size) {
  char* base;
  if (buffer == NULL || offset < 0 || size < 0) {
    throw_message(env, EP_ERR_INVALID_ARGUMENT, "buffer is null or its position/size is negative");
    return NULL;
  }
  base = (char*)(*env)->GetDirectBufferAddress(env, buffer);
  if (base == NULL) {
    throw_message(env, EP_ERR_INVALID_ARGUMENT,
                  "buffer is not a direct buffer (use ByteBuffer.allocateDirect or "
                  "NativeModel.allocate)");
    return NULL;
  }
  return base + offset;
}

/* ---- opening and closing ------------------------------------------------------------------ */

static jlong native_open(JNIEnv* env, jclass cls, jstring path) {
  const char* c_path;
  ep_model* model = NULL;
  ep_status st;
  (void)cls;
  if (path == NULL) return throw_message(env, EP_ERR_INVALID_ARGUMENT, "library path is null");
  c_path = (*env)->GetStringUTFChars(env, path, NULL);
  if (c_path == NULL) return 0;
  st = ep_model_open(c_path, NULL, &model);
  (*env)->ReleaseStringUTFChars(env, path, c_path);
  if (st != EP_OK) return throw_status(env, st);
  return (jlong)(intptr_t)model;
}

static jlong native_open_memory(JNIEnv* env, jclass cls, jobject buffer, jlong offset,
                                jlong size) {
  ep_model* model = NULL;
  ep_status st;
  void* data;
  (void)cls;
  data = buffer_address(env, buffer, offset, size);
  if (data == NULL) return 0;
  st = ep_model_open_memory(data, (size_t)size, NULL, &model);
  if (st != EP_OK) return throw_status(env, st);
  return (jlong)(intptr_t)model;
}

static void native_close(JNIEnv* env, jclass cls, jlong handle) {
  ep_model* model = to_model(handle);
  ep_status st;
  (void)cls;
  st = ep_model_close(&model);
  if (st != EP_OK) throw_status(env, st);
}

/* ---- introspection ------------------------------------------------------------------------ */

static jint native_count(JNIEnv* env, jclass cls, jlong handle, jboolean outputs) {
  int count = 0;
  ep_status st;
  (void)cls;
  st = outputs ? ep_model_num_outputs(to_model(handle), &count)
               : ep_model_num_inputs(to_model(handle), &count);
  if (st != EP_OK) return (jint)throw_status(env, st);
  return (jint)count;
}

static int get_info(JNIEnv* env, jlong handle, jboolean output, jint index, ep_tensor_info* info) {
  ep_status st = output ? ep_model_output_info(to_model(handle), (int)index, info)
                        : ep_model_input_info(to_model(handle), (int)index, info);
  if (st != EP_OK) {
    throw_status(env, st);
    return 0;
  }
  return 1;
}

static jstring native_name(JNIEnv* env, jclass cls, jlong handle, jboolean output, jint index) {
  ep_tensor_info info;
  (void)cls;
  if (!get_info(env, handle, output, index, &info)) return NULL;
  return (*env)->NewStringUTF(env, info.name);
}

static jint native_dtype(JNIEnv* env, jclass cls, jlong handle, jboolean output, jint index) {
  ep_tensor_info info;
  (void)cls;
  if (!get_info(env, handle, output, index, &info)) return 0;
  return (jint)info.dtype;
}

static jlongArray native_shape(JNIEnv* env, jclass cls, jlong handle, jboolean output,
                               jint index) {
  ep_tensor_info info;
  jlong dims[EP_MAX_NDIM];
  jlongArray shape;
  int i;
  (void)cls;
  if (!get_info(env, handle, output, index, &info)) return NULL;
  for (i = 0; i < info.ndim; ++i) dims[i] = (jlong)info.shape[i];
  shape = (*env)->NewLongArray(env, (jsize)info.ndim);
  if (shape != NULL && info.ndim > 0) {
    (*env)->SetLongArrayRegion(env, shape, 0, (jsize)info.ndim, dims);
  }
  return shape;
}

static jint native_find(JNIEnv* env, jclass cls, jlong handle, jboolean output, jstring name) {
  const char* c_name;
  int index = -1;
  ep_status st;
  (void)cls;
  if (name == NULL) return (jint)throw_message(env, EP_ERR_INVALID_ARGUMENT, "name is null");
  c_name = (*env)->GetStringUTFChars(env, name, NULL);
  if (c_name == NULL) return -1;
  st = output ? ep_model_find_output(to_model(handle), c_name, &index)
              : ep_model_find_input(to_model(handle), c_name, &index);
  (*env)->ReleaseStringUTFChars(env, name, c_name);
  if (st != EP_OK) {
    throw_status(env, st);
    return -1;
  }
  return (jint)index;
}

/* Dimension `dim` of input `index` into `range`; 0 with a Java exception thrown where the C API refuses. */
static int input_dim(JNIEnv* env, jlong handle, jint index, jint dim, ep_dim_range* range) {
  ep_status st = ep_model_input_dim(to_model(handle), (int)index, (int)dim, range);
  if (st != EP_OK) {
    throw_status(env, st);
    return 0;
  }
  return 1;
}

/* The range of dimension `dim` of input `index` (a dynamic one: its name's min, max, step; a static
 * one: min = max = its extent, step 1) as {min, max, step}. */
static jlongArray native_input_dim(JNIEnv* env, jclass cls, jlong handle, jint index, jint dim) {
  ep_dim_range range;
  jlong values[3];
  jlongArray out;
  (void)cls;
  if (!input_dim(env, handle, index, dim, &range)) return NULL;
  values[0] = (jlong)range.min;
  values[1] = (jlong)range.max;
  values[2] = (jlong)range.step;
  out = (*env)->NewLongArray(env, 3);
  if (out != NULL) (*env)->SetLongArrayRegion(env, out, 0, 3, values);
  return out;
}

/* The name of dimension `dim` of input `index`: a dynamic one's ("W"), "" for a static one. */
static jstring native_input_dim_name(JNIEnv* env, jclass cls, jlong handle, jint index, jint dim) {
  ep_dim_range range;
  (void)cls;
  if (!input_dim(env, handle, index, dim, &range)) return NULL;
  return (*env)->NewStringUTF(env, range.name != NULL ? range.name : "");
}

/* ---- running ------------------------------------------------------------------------------ */

/* The buffer is used in place when 64-byte aligned (see edgepack.h "Ownership"); the Java class
 * keeps a reference to it until the next run so that it stays alive. */
static void native_set_input(JNIEnv* env, jclass cls, jlong handle, jint index, jobject buffer,
                             jlong offset, jlong size) {
  void* data;
  ep_status st;
  (void)cls;
  data = buffer_address(env, buffer, offset, size);
  if (data == NULL) return;
  st = ep_model_set_input(to_model(handle), (int)index, data, (size_t)size);
  if (st != EP_OK) throw_status(env, st);
}

/* Dense size in bytes of `ndim` extents of `elem`-byte elements; 0 (and *out untouched) when an
 * extent is negative or the size does not fit in a jlong. */
static int shape_bytes(const int64_t* shape, int ndim, size_t elem, jlong* out) {
  int64_t bytes = (int64_t)elem;
  int i;
  for (i = 0; i < ndim; ++i) {
    if (shape[i] < 0) return 0;
    if (shape[i] != 0 && bytes > INT64_MAX / shape[i]) return 0;
    bytes *= shape[i];
  }
  *out = (jlong)bytes;
  return 1;
}

/* Throw EP_ERR_SHAPE for a buffer of `size` bytes that is too small for `shape` (`needed` bytes;
 * 0: the shape has a negative extent or is too large to address). */
static void throw_too_small(JNIEnv* env, jlong handle, jint index, const int64_t* shape, int ndim,
                            jlong needed, jlong size) {
  ep_tensor_info info;
  char dims[160], message[320];
  size_t pos = 0;
  int i;
  dims[0] = '\0';
  for (i = 0; i < ndim && pos < sizeof(dims); ++i) {
    pos += (size_t)snprintf(dims + pos, sizeof(dims) - pos, i ? ",%lld" : "%lld",
                            (long long)shape[i]);
  }
  if (ep_model_input_info(to_model(handle), (int)index, &info) != EP_OK) info.name = "?";
  if (needed > 0) {
    snprintf(message, sizeof(message),
             "input %d '%s': shape [%s] needs %lld bytes, the buffer holds %lld", (int)index,
             info.name, dims, (long long)needed, (long long)size);
  } else {
    snprintf(message, sizeof(message), "input %d '%s': [%s] is not a shape it can take",
             (int)index, info.name, dims);
  }
  throw_message(env, EP_ERR_SHAPE, message);
}

/* Set input `index` from a buffer holding the dense values of `shape` (at least that many bytes
 * from offset; more are ignored) with ep_model_set_input_typed, which takes any value of a dynamic
 * dimension in its range and refuses others with EP_ERR_SHAPE naming the dimension and its range.
 * The C API reads as many bytes as the shape has, so a buffer too small for it is refused here, but
 * only after the C API has judged the shape without data (it checks index, dtype and shape, then
 * stops at the NULL data, leaving the model as it was): a size out of range gets its message. */
static void native_set_input_typed(JNIEnv* env, jclass cls, jlong handle, jint index,
                                   jobject buffer, jlong offset, jlong size, jint dtype,
                                   jlongArray shape) {
  int64_t dims[EP_MAX_NDIM];
  jlong values[EP_MAX_NDIM];
  jlong needed = 0;
  jsize ndim;
  void* data;
  ep_status st;
  int i;
  (void)cls;
  if (shape == NULL) {
    throw_message(env, EP_ERR_INVALID_ARGUMENT, "shape is null");
    return;
  }
  ndim = (*env)->GetArrayLength(env, shape);
  if (ndim > EP_MAX_NDIM) {
    throw_message(env, EP_ERR_SHAPE, "the shape has more dimensions than EP_MAX_NDIM (8)");
    return;
  }
  if (ndim > 0) (*env)->GetLongArrayRegion(env, shape, 0, ndim, values);
  for (i = 0; i < (int)ndim; ++i) dims[i] = (int64_t)values[i];
  data = buffer_address(env, buffer, offset, size);
  if (data == NULL) return;
  if (!shape_bytes(dims, (int)ndim, ep_dtype_size((ep_dtype)dtype), &needed) || needed > size) {
    st = ep_model_set_input_typed(to_model(handle), (int)index, NULL, (ep_dtype)dtype,
                                  (int32_t)ndim, dims);
    if (st != EP_OK && (st != EP_ERR_INVALID_ARGUMENT || to_model(handle) == NULL)) {
      throw_status(env, st);
    } else {
      throw_too_small(env, handle, index, dims, (int)ndim, needed, size);
    }
    return;
  }
  st = ep_model_set_input_typed(to_model(handle), (int)index, data, (ep_dtype)dtype,
                                (int32_t)ndim, dims);
  if (st != EP_OK) throw_status(env, st);
}

static void native_run(JNIEnv* env, jclass cls, jlong handle) {
  ep_status st;
  (void)cls;
  st = ep_model_run(to_model(handle));
  if (st != EP_OK) throw_status(env, st);
}

static void native_copy_output(JNIEnv* env, jclass cls, jlong handle, jint index, jobject buffer,
                               jlong offset, jlong size) {
  void* data;
  ep_status st;
  (void)cls;
  data = buffer_address(env, buffer, offset, size);
  if (data == NULL) return;
  st = ep_model_copy_output(to_model(handle), (int)index, data, (size_t)size);
  if (st != EP_OK) throw_status(env, st);
}

/* The shape output `index` had in the last run (ep_model_output_shape). */
static jlongArray native_output_shape(JNIEnv* env, jclass cls, jlong handle, jint index) {
  int64_t dims[EP_MAX_NDIM];
  jlong values[EP_MAX_NDIM];
  int32_t ndim = 0;
  jlongArray shape;
  ep_status st;
  int i;
  (void)cls;
  st = ep_model_output_shape(to_model(handle), (int)index, &ndim, dims);
  if (st != EP_OK) {
    throw_status(env, st);
    return NULL;
  }
  for (i = 0; i < ndim; ++i) values[i] = (jlong)dims[i];
  shape = (*env)->NewLongArray(env, (jsize)ndim);
  if (shape != NULL && ndim > 0) (*env)->SetLongArrayRegion(env, shape, 0, (jsize)ndim, values);
  return shape;
}

static jlong native_address(JNIEnv* env, jclass cls, jobject buffer) {
  (void)cls;
  return (jlong)(intptr_t)buffer_address(env, buffer, 0, 0);
}

static jint native_api_version(JNIEnv* env, jclass cls) {
  (void)env;
  (void)cls;
  return (jint)EP_API_VERSION;
}

/* ---- registration ------------------------------------------------------------------------- */

#define BUF "Ljava/nio/Buffer;"
static const JNINativeMethod g_methods[] = {
    {"nativeOpen", "(Ljava/lang/String;)J", (void*)native_open},
    {"nativeOpenMemory", "(" BUF "JJ)J", (void*)native_open_memory},
    {"nativeClose", "(J)V", (void*)native_close},
    {"nativeCount", "(JZ)I", (void*)native_count},
    {"nativeName", "(JZI)Ljava/lang/String;", (void*)native_name},
    {"nativeDtype", "(JZI)I", (void*)native_dtype},
    {"nativeShape", "(JZI)[J", (void*)native_shape},
    {"nativeFind", "(JZLjava/lang/String;)I", (void*)native_find},
    {"nativeInputDim", "(JII)[J", (void*)native_input_dim},
    {"nativeInputDimName", "(JII)Ljava/lang/String;", (void*)native_input_dim_name},
    {"nativeSetInput", "(JI" BUF "JJ)V", (void*)native_set_input},
    {"nativeSetInputTyped", "(JI" BUF "JJI[J)V", (void*)native_set_input_typed},
    {"nativeRun", "(J)V", (void*)native_run},
    {"nativeCopyOutput", "(JI" BUF "JJ)V", (void*)native_copy_output},
    {"nativeOutputShape", "(JI)[J", (void*)native_output_shape},
    {"nativeAddress", "(" BUF ")J", (void*)native_address},
    {"nativeApiVersion", "()I", (void*)native_api_version},
};
#undef BUF

JNIEXPORT jint JNICALL JNI_OnLoad(JavaVM* vm, void* reserved) {
  JNIEnv* env = NULL;
  jclass model_class;
  jclass exception_class;
  (void)reserved;
  if ((*vm)->GetEnv(vm, (void**)&env, JNI_VERSION_1_6) != JNI_OK) return JNI_ERR;
  exception_class = (*env)->FindClass(env, EDGEPACK_JNI_EXCEPTION);
  if (exception_class == NULL) return JNI_ERR;
  g_exception_init =
      (*env)->GetMethodID(env, exception_class, "<init>", "(Ljava/lang/String;I)V");
  if (g_exception_init == NULL) return JNI_ERR;
  g_exception_class = (jclass)(*env)->NewGlobalRef(env, exception_class);
  (*env)->DeleteLocalRef(env, exception_class);
  if (g_exception_class == NULL) return JNI_ERR;
  model_class = (*env)->FindClass(env, EDGEPACK_JNI_CLASS);
  if (model_class == NULL) return JNI_ERR;
  if ((*env)->RegisterNatives(env, model_class, g_methods,
                              (jint)(sizeof(g_methods) / sizeof(g_methods[0]))) != 0) {
    return JNI_ERR;
  }
  (*env)->DeleteLocalRef(env, model_class);
  return JNI_VERSION_1_6;
}

JNIEXPORT void JNICALL JNI_OnUnload(JavaVM* vm, void* reserved) {
  JNIEnv* env = NULL;
  (void)reserved;
  if ((*vm)->GetEnv(vm, (void**)&env, JNI_VERSION_1_6) != JNI_OK) return;
  if (g_exception_class != NULL) {
    (*env)->DeleteGlobalRef(env, g_exception_class);
    g_exception_class = NULL;
  }
}
