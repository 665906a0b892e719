/*
 * cl_api.h - the part of the OpenCL 1.2 C API that edgepack's runtime uses, loaded at run time.
 *
 * The plug-in has no link-time dependency on libOpenCL: it dlopen()s the ICD loader (or a
 * vendor library such as libmali.so) the first time an OpenCL device is touched and takes
 * the entry points below with dlsym(). The types and constants are those of the Khronos
 * headers (CL/cl.h, OpenCL 1.2); tests/check_cl_api.cc static_asserts them against the real
 * header, so this file needs no OpenCL SDK to build, natively or cross.
 */
#ifndef EDGEPACK_OPENCL_CL_API_H_
#define EDGEPACK_OPENCL_CL_API_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace edgepack {
namespace cl {

// ---- types (cl_platform.h / cl.h) ----
using cl_int = int32_t;
using cl_uint = uint32_t;
using cl_ulong = uint64_t;
using cl_bool = cl_uint;
using cl_bitfield = cl_ulong;
using cl_device_type = cl_bitfield;
using cl_platform_info = cl_uint;
using cl_device_info = cl_uint;
using cl_command_queue_properties = cl_bitfield;
using cl_context_properties = intptr_t;
using cl_mem_flags = cl_bitfield;
using cl_program_build_info = cl_uint;
using cl_kernel_work_group_info = cl_uint;

using cl_platform_id = struct _cl_platform_id*;
using cl_device_id = struct _cl_device_id*;
using cl_context = struct _cl_context*;
using cl_command_queue = struct _cl_command_queue*;
using cl_mem = struct _cl_mem*;
using cl_program = struct _cl_program*;
using cl_kernel = struct _cl_kernel*;
using cl_event = struct _cl_event*;

// ---- constants ----
constexpr cl_int CL_SUCCESS = 0;
constexpr cl_int CL_DEVICE_NOT_FOUND = -1;
constexpr cl_int CL_BUILD_PROGRAM_FAILURE = -11;
constexpr cl_bool CL_FALSE = 0;
constexpr cl_bool CL_TRUE = 1;

constexpr cl_device_type CL_DEVICE_TYPE_DEFAULT = 1 << 0;
constexpr cl_device_type CL_DEVICE_TYPE_CPU = 1 << 1;
constexpr cl_device_type CL_DEVICE_TYPE_GPU = 1 << 2;
constexpr cl_device_type CL_DEVICE_TYPE_ACCELERATOR = 1 << 3;
constexpr cl_device_type CL_DEVICE_TYPE_ALL = 0xFFFFFFFF;

constexpr cl_platform_info CL_PLATFORM_VERSION = 0x0901;
constexpr cl_platform_info CL_PLATFORM_NAME = 0x0902;
constexpr cl_platform_info CL_PLATFORM_VENDOR = 0x0903;

constexpr cl_device_info CL_DEVICE_TYPE = 0x1000;
constexpr cl_device_info CL_DEVICE_MAX_COMPUTE_UNITS = 0x1002;
constexpr cl_device_info CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS = 0x1003;
constexpr cl_device_info CL_DEVICE_MAX_WORK_GROUP_SIZE = 0x1004;
constexpr cl_device_info CL_DEVICE_MAX_WORK_ITEM_SIZES = 0x1005;
constexpr cl_device_info CL_DEVICE_MAX_CLOCK_FREQUENCY = 0x100C;
constexpr cl_device_info CL_DEVICE_MAX_MEM_ALLOC_SIZE = 0x1010;
constexpr cl_device_info CL_DEVICE_GLOBAL_MEM_CACHE_SIZE = 0x101E;
constexpr cl_device_info CL_DEVICE_GLOBAL_MEM_SIZE = 0x101F;
constexpr cl_device_info CL_DEVICE_LOCAL_MEM_SIZE = 0x1023;
constexpr cl_device_info CL_DEVICE_NAME = 0x102B;
constexpr cl_device_info CL_DEVICE_VENDOR = 0x102C;
constexpr cl_device_info CL_DRIVER_VERSION = 0x102D;
constexpr cl_device_info CL_DEVICE_VERSION = 0x102F;
constexpr cl_device_info CL_DEVICE_EXTENSIONS = 0x1030;
constexpr cl_device_info CL_DEVICE_OPENCL_C_VERSION = 0x103D;
constexpr cl_device_info CL_DEVICE_IMAGE_PITCH_ALIGNMENT = 0x104A;

constexpr cl_context_properties CL_CONTEXT_PLATFORM = 0x1084;
constexpr cl_mem_flags CL_MEM_READ_WRITE = 1 << 0;
constexpr cl_program_build_info CL_PROGRAM_BUILD_LOG = 0x1183;
constexpr cl_kernel_work_group_info CL_KERNEL_WORK_GROUP_SIZE = 0x11B0;

// ---- entry points (all CL_API_CALL = default calling convention on Linux/Android) ----
struct Api {
  cl_int (*GetPlatformIDs)(cl_uint, cl_platform_id*, cl_uint*);
  cl_int (*GetPlatformInfo)(cl_platform_id, cl_platform_info, size_t, void*, size_t*);
  cl_int (*GetDeviceIDs)(cl_platform_id, cl_device_type, cl_uint, cl_device_id*, cl_uint*);
  cl_int (*GetDeviceInfo)(cl_device_id, cl_device_info, size_t, void*, size_t*);
  cl_context (*CreateContext)(const cl_context_properties*, cl_uint, const cl_device_id*,
                              void (*)(const char*, const void*, size_t, void*), void*, cl_int*);
  cl_int (*ReleaseContext)(cl_context);
  cl_command_queue (*CreateCommandQueue)(cl_context, cl_device_id, cl_command_queue_properties,
                                         cl_int*);
  cl_int (*ReleaseCommandQueue)(cl_command_queue);
  cl_int (*Finish)(cl_command_queue);
  cl_int (*Flush)(cl_command_queue);
  cl_mem (*CreateBuffer)(cl_context, cl_mem_flags, size_t, void*, cl_int*);
  cl_int (*ReleaseMemObject)(cl_mem);
  cl_int (*EnqueueReadBuffer)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, void*, cl_uint,
                              const cl_event*, cl_event*);
  cl_int (*EnqueueWriteBuffer)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void*,
                               cl_uint, const cl_event*, cl_event*);
  cl_int (*EnqueueCopyBuffer)(cl_command_queue, cl_mem, cl_mem, size_t, size_t, size_t, cl_uint,
                              const cl_event*, cl_event*);
  cl_program (*CreateProgramWithSource)(cl_context, cl_uint, const char**, const size_t*,
                                        cl_int*);
  cl_int (*BuildProgram)(cl_program, cl_uint, const cl_device_id*, const char*,
                         void (*)(cl_program, void*), void*);
  cl_int (*GetProgramBuildInfo)(cl_program, cl_device_id, cl_program_build_info, size_t, void*,
                                size_t*);
  cl_int (*ReleaseProgram)(cl_program);
  cl_kernel (*CreateKernel)(cl_program, const char*, cl_int*);
  cl_int (*ReleaseKernel)(cl_kernel);
  cl_int (*SetKernelArg)(cl_kernel, cl_uint, size_t, const void*);
  cl_int (*GetKernelWorkGroupInfo)(cl_kernel, cl_device_id, cl_kernel_work_group_info, size_t,
                                   void*, size_t*);
  cl_int (*EnqueueNDRangeKernel)(cl_command_queue, cl_kernel, cl_uint, const size_t*,
                                 const size_t*, const size_t*, cl_uint, const cl_event*,
                                 cl_event*);
};

/*!
 * \brief The OpenCL entry points, loaded once (thread-safe). Returns nullptr when no OpenCL
 *  library could be loaded; LoadError() then says what was tried.
 *
 *  Search order: $EDGEPACK_OPENCL_LIBRARY (a path or a name), libOpenCL.so.1, libOpenCL.so,
 *  then the vendor locations of Android and Mali boards (see cl_api.cc).
 */
const Api* GetApi();
/*! \brief Why GetApi() returned nullptr (empty if it did not). */
const std::string& LoadError();
/*! \brief The file the entry points came from (empty when none was loaded). */
const std::string& LoadedLibrary();
/*! \brief "CL_BUILD_PROGRAM_FAILURE" for -11, etc. */
const char* ErrorName(cl_int code);

}  // namespace cl
}  // namespace edgepack

#endif  // EDGEPACK_OPENCL_CL_API_H_
