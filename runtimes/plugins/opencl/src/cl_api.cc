/*
 * cl_api.cc - load the OpenCL library at run time (dlopen) and resolve the entry points.
 */
#include "cl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

namespace edgepack {
namespace cl {
namespace {

struct Loaded {
  Api api{};
  bool ok = false;
  std::string error;
  std::string library;
};

std::vector<std::string> Candidates() {
  std::vector<std::string> names;
  if (const char* env = std::getenv("EDGEPACK_OPENCL_LIBRARY")) {
    if (*env != '\0') names.emplace_back(env);
  }
  names.insert(names.end(), {
                                "libOpenCL.so.1",
                                "libOpenCL.so",
#if defined(__ANDROID__)
                                "/vendor/lib64/libOpenCL.so",
                                "/system/vendor/lib64/libOpenCL.so",
                                "/system/lib64/libOpenCL.so",
                                "/vendor/lib64/egl/libGLES_mali.so",
                                "/system/vendor/lib64/egl/libGLES_mali.so",
                                "/system/lib64/egl/libGLES_mali.so",
#endif
                                "libmali.so.1",
                                "libmali.so",
                            });
  return names;
}

template <typename T>
bool Resolve(void* handle, const char* name, T* out, std::string* missing) {
  *out = reinterpret_cast<T>(dlsym(handle, name));
  if (*out == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
    return false;
  }
  return true;
}

bool ResolveAll(void* h, Api* a, std::string* missing) {
  bool ok = true;
  ok &= Resolve(h, "clGetPlatformIDs", &a->GetPlatformIDs, missing);
  ok &= Resolve(h, "clGetPlatformInfo", &a->GetPlatformInfo, missing);
  ok &= Resolve(h, "clGetDeviceIDs", &a->GetDeviceIDs, missing);
  ok &= Resolve(h, "clGetDeviceInfo", &a->GetDeviceInfo, missing);
  ok &= Resolve(h, "clCreateContext", &a->CreateContext, missing);
  ok &= Resolve(h, "clReleaseContext", &a->ReleaseContext, missing);
  ok &= Resolve(h, "clCreateCommandQueue", &a->CreateCommandQueue, missing);
  ok &= Resolve(h, "clReleaseCommandQueue", &a->ReleaseCommandQueue, missing);
  ok &= Resolve(h, "clFinish", &a->Finish, missing);
  ok &= Resolve(h, "clFlush", &a->Flush, missing);
  ok &= Resolve(h, "clCreateBuffer", &a->CreateBuffer, missing);
  ok &= Resolve(h, "clReleaseMemObject", &a->ReleaseMemObject, missing);
  ok &= Resolve(h, "clEnqueueReadBuffer", &a->EnqueueReadBuffer, missing);
  ok &= Resolve(h, "clEnqueueWriteBuffer", &a->EnqueueWriteBuffer, missing);
  ok &= Resolve(h, "clEnqueueCopyBuffer", &a->EnqueueCopyBuffer, missing);
  ok &= Resolve(h, "clCreateProgramWithSource", &a->CreateProgramWithSource, missing);
  ok &= Resolve(h, "clBuildProgram", &a->BuildProgram, missing);
  ok &= Resolve(h, "clGetProgramBuildInfo", &a->GetProgramBuildInfo, missing);
  ok &= Resolve(h, "clReleaseProgram", &a->ReleaseProgram, missing);
  ok &= Resolve(h, "clCreateKernel", &a->CreateKernel, missing);
  ok &= Resolve(h, "clReleaseKernel", &a->ReleaseKernel, missing);
  ok &= Resolve(h, "clSetKernelArg", &a->SetKernelArg, missing);
  ok &= Resolve(h, "clGetKernelWorkGroupInfo", &a->GetKernelWorkGroupInfo, missing);
  ok &= Resolve(h, "clEnqueueNDRangeKernel", &a->EnqueueNDRangeKernel, missing);
  return ok;
}

Loaded* Load() {
  static Loaded* loaded = [] {
    auto* l = new Loaded();  // never freed: entry points stay valid until exit
    std::string tried;
    for (const std::string& name : Candidates()) {
      void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        const char* why = dlerror();
        tried += (tried.empty() ? "" : "; ") + std::string(why ? why : (name + ": not found").c_str());
        continue;
      }
      std::string missing;
      if (ResolveAll(handle, &l->api, &missing)) {
        l->ok = true;
        l->library = name;
        return l;
      }
      tried += (tried.empty() ? "" : "; ") + name + " lacks " + missing;
      dlclose(handle);
    }
    l->api = Api{};
    l->error = "no usable OpenCL library was found (" + tried +
               "). Install the device's OpenCL driver (an ICD loader libOpenCL.so.1 and a vendor "
               "ICD), or set EDGEPACK_OPENCL_LIBRARY to the library that provides OpenCL";
    return l;
  }();
  return loaded;
}

}  // namespace

const Api* GetApi() {
  Loaded* l = Load();
  return l->ok ? &l->api : nullptr;
}

const std::string& LoadError() { return Load()->error; }

const std::string& LoadedLibrary() { return Load()->library; }

const char* ErrorName(cl_int code) {
  switch (code) {
    case 0: return "CL_SUCCESS";
    case -1: return "CL_DEVICE_NOT_FOUND";
    case -2: return "CL_DEVICE_NOT_AVAILABLE";
    case -3: return "CL_COMPILER_NOT_AVAILABLE";
    case -4: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case -5: return "CL_OUT_OF_RESOURCES";
    case -6: return "CL_OUT_OF_HOST_MEMORY";
    case -7: return "CL_PROFILING_INFO_NOT_AVAILABLE";
    case -8: return "CL_MEM_COPY_OVERLAP";
    case -9: return "CL_IMAGE_FORMAT_MISMATCH";
    case -10: return "CL_IMAGE_FORMAT_NOT_SUPPORTED";
    case -11: return "CL_BUILD_PROGRAM_FAILURE";
    case -12: return "CL_MAP_FAILURE";
    case -13: return "CL_MISALIGNED_SUB_BUFFER_OFFSET";
    case -14: return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
    case -15: return "CL_COMPILE_PROGRAM_FAILURE";
    case -16: return "CL_LINKER_NOT_AVAILABLE";
    case -17: return "CL_LINK_PROGRAM_FAILURE";
    case -18: return "CL_DEVICE_PARTITION_FAILED";
    case -19: return "CL_KERNEL_ARG_INFO_NOT_AVAILABLE";
    case -30: return "CL_INVALID_VALUE";
    case -31: return "CL_INVALID_DEVICE_TYPE";
    case -32: return "CL_INVALID_PLATFORM";
    case -33: return "CL_INVALID_DEVICE";
    case -34: return "CL_INVALID_CONTEXT";
    case -35: return "CL_INVALID_QUEUE_PROPERTIES";
    case -36: return "CL_INVALID_COMMAND_QUEUE";
    case -37: return "CL_INVALID_HOST_PTR";
    case -38: return "CL_INVALID_MEM_OBJECT";
    case -39: return "CL_INVALID_IMAGE_FORMAT_DESCRIPTOR";
    case -40: return "CL_INVALID_IMAGE_SIZE";
    case -41: return "CL_INVALID_SAMPLER";
    case -42: return "CL_INVALID_BINARY";
    case -43: return "CL_INVALID_BUILD_OPTIONS";
    case -44: return "CL_INVALID_PROGRAM";
    case -45: return "CL_INVALID_PROGRAM_EXECUTABLE";
    case -46: return "CL_INVALID_KERNEL_NAME";
    case -47: return "CL_INVALID_KERNEL_DEFINITION";
    case -48: return "CL_INVALID_KERNEL";
    case -49: return "CL_INVALID_ARG_INDEX";
    case -50: return "CL_INVALID_ARG_VALUE";
    case -51: return "CL_INVALID_ARG_SIZE";
    case -52: return "CL_INVALID_KERNEL_ARGS";
    case -53: return "CL_INVALID_WORK_DIMENSION";
    case -54: return "CL_INVALID_WORK_GROUP_SIZE";
    case -55: return "CL_INVALID_WORK_ITEM_SIZE";
    case -56: return "CL_INVALID_GLOBAL_OFFSET";
    case -57: return "CL_INVALID_EVENT_WAIT_LIST";
    case -58: return "CL_INVALID_EVENT";
    case -59: return "CL_INVALID_OPERATION";
    case -60: return "CL_INVALID_GL_OBJECT";
    case -61: return "CL_INVALID_BUFFER_SIZE";
    case -62: return "CL_INVALID_MIP_LEVEL";
    case -63: return "CL_INVALID_GLOBAL_WORK_SIZE";
    case -64: return "CL_INVALID_PROPERTY";
    case -65: return "CL_INVALID_IMAGE_DESCRIPTOR";
    case -66: return "CL_INVALID_COMPILER_OPTIONS";
    case -67: return "CL_INVALID_LINKER_OPTIONS";
    case -68: return "CL_INVALID_DEVICE_PARTITION_COUNT";
    case -69: return "CL_INVALID_PIPE_SIZE";
    case -70: return "CL_INVALID_DEVICE_QUEUE";
    case -71: return "CL_INVALID_SPEC_ID";
    case -72: return "CL_MAX_SIZE_RESTRICTION_EXCEEDED";
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "CL_UNKNOWN_ERROR";
  }
}

}  // namespace cl
}  // namespace edgepack
