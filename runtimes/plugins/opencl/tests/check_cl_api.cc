// Compile-time check: src/cl_api.h declares the same types, constants and entry point signatures
// as the Khronos headers (apt-get install opencl-headers). Only compiled, never run:
//   g++ -std=c++17 -fsyntax-only -I runtimes/plugins/opencl/src runtimes/plugins/opencl/tests/check_cl_api.cc
#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>

#include <type_traits>

// The Khronos constants are macros and would clash with cl_api.h's constexpr names: take their
// values first, then undefine them.
namespace khr {
constexpr auto k_CL_SUCCESS = CL_SUCCESS;
#undef CL_SUCCESS
constexpr auto k_CL_DEVICE_NOT_FOUND = CL_DEVICE_NOT_FOUND;
#undef CL_DEVICE_NOT_FOUND
constexpr auto k_CL_BUILD_PROGRAM_FAILURE = CL_BUILD_PROGRAM_FAILURE;
#undef CL_BUILD_PROGRAM_FAILURE
constexpr auto k_CL_FALSE = CL_FALSE;
#undef CL_FALSE
constexpr auto k_CL_TRUE = CL_TRUE;
#undef CL_TRUE
constexpr auto k_CL_DEVICE_TYPE_DEFAULT = CL_DEVICE_TYPE_DEFAULT;
#undef CL_DEVICE_TYPE_DEFAULT
constexpr auto k_CL_DEVICE_TYPE_CPU = CL_DEVICE_TYPE_CPU;
#undef CL_DEVICE_TYPE_CPU
constexpr auto k_CL_DEVICE_TYPE_GPU = CL_DEVICE_TYPE_GPU;
#undef CL_DEVICE_TYPE_GPU
constexpr auto k_CL_DEVICE_TYPE_ACCELERATOR = CL_DEVICE_TYPE_ACCELERATOR;
#undef CL_DEVICE_TYPE_ACCELERATOR
constexpr auto k_CL_DEVICE_TYPE_ALL = CL_DEVICE_TYPE_ALL;
#undef CL_DEVICE_TYPE_ALL
constexpr auto k_CL_PLATFORM_VERSION = CL_PLATFORM_VERSION;
#undef CL_PLATFORM_VERSION
constexpr auto k_CL_PLATFORM_NAME = CL_PLATFORM_NAME;
#undef CL_PLATFORM_NAME
constexpr auto k_CL_PLATFORM_VENDOR = CL_PLATFORM_VENDOR;
#undef CL_PLATFORM_VENDOR
constexpr auto k_CL_DEVICE_TYPE = CL_DEVICE_TYPE;
#undef CL_DEVICE_TYPE
constexpr auto k_CL_DEVICE_MAX_COMPUTE_UNITS = CL_DEVICE_MAX_COMPUTE_UNITS;
#undef CL_DEVICE_MAX_COMPUTE_UNITS
constexpr auto k_CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS = CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS;
#undef CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS
constexpr auto k_CL_DEVICE_MAX_WORK_GROUP_SIZE = CL_DEVICE_MAX_WORK_GROUP_SIZE;
#undef CL_DEVICE_MAX_WORK_GROUP_SIZE
constexpr auto k_CL_DEVICE_MAX_WORK_ITEM_SIZES = CL_DEVICE_MAX_WORK_ITEM_SIZES;
#undef CL_DEVICE_MAX_WORK_ITEM_SIZES
constexpr auto k_CL_DEVICE_MAX_CLOCK_FREQUENCY = CL_DEVICE_MAX_CLOCK_FREQUENCY;
#undef CL_DEVICE_MAX_CLOCK_FREQUENCY
constexpr auto k_CL_DEVICE_MAX_MEM_ALLOC_SIZE = CL_DEVICE_MAX_MEM_ALLOC_SIZE;
#undef CL_DEVICE_MAX_MEM_ALLOC_SIZE
constexpr auto k_CL_DEVICE_GLOBAL_MEM_CACHE_SIZE = CL_DEVICE_GLOBAL_MEM_CACHE_SIZE;
#undef CL_DEVICE_GLOBAL_MEM_CACHE_SIZE
constexpr auto k_CL_DEVICE_GLOBAL_MEM_SIZE = CL_DEVICE_GLOBAL_MEM_SIZE;
#undef CL_DEVICE_GLOBAL_MEM_SIZE
constexpr auto k_CL_DEVICE_LOCAL_MEM_SIZE = CL_DEVICE_LOCAL_MEM_SIZE;
#undef CL_DEVICE_LOCAL_MEM_SIZE
constexpr auto k_CL_DEVICE_NAME = CL_DEVICE_NAME;
#undef CL_DEVICE_NAME
constexpr auto k_CL_DEVICE_VENDOR = CL_DEVICE_VENDOR;
#undef CL_DEVICE_VENDOR
constexpr auto k_CL_DRIVER_VERSION = CL_DRIVER_VERSION;
#undef CL_DRIVER_VERSION
constexpr auto k_CL_DEVICE_VERSION = CL_DEVICE_VERSION;
#undef CL_DEVICE_VERSION
constexpr auto k_CL_DEVICE_EXTENSIONS = CL_DEVICE_EXTENSIONS;
#undef CL_DEVICE_EXTENSIONS
constexpr auto k_CL_DEVICE_OPENCL_C_VERSION = CL_DEVICE_OPENCL_C_VERSION;
#undef CL_DEVICE_OPENCL_C_VERSION
constexpr auto k_CL_DEVICE_IMAGE_PITCH_ALIGNMENT = CL_DEVICE_IMAGE_PITCH_ALIGNMENT;
#undef CL_DEVICE_IMAGE_PITCH_ALIGNMENT
constexpr auto k_CL_CONTEXT_PLATFORM = CL_CONTEXT_PLATFORM;
#undef CL_CONTEXT_PLATFORM
constexpr auto k_CL_MEM_READ_WRITE = CL_MEM_READ_WRITE;
#undef CL_MEM_READ_WRITE
constexpr auto k_CL_PROGRAM_BUILD_LOG = CL_PROGRAM_BUILD_LOG;
#undef CL_PROGRAM_BUILD_LOG
constexpr auto k_CL_KERNEL_WORK_GROUP_SIZE = CL_KERNEL_WORK_GROUP_SIZE;
#undef CL_KERNEL_WORK_GROUP_SIZE
}  // namespace khr

#include "cl_api.h"

namespace ep = edgepack::cl;

#define SAME_VALUE(name) static_assert(ep::name == khr::k_##name, #name)
#define SAME_TYPE(name) static_assert(std::is_same<ep::name, ::name>::value, #name)

SAME_TYPE(cl_int);
SAME_TYPE(cl_uint);
SAME_TYPE(cl_ulong);
SAME_TYPE(cl_bool);
SAME_TYPE(cl_bitfield);
SAME_TYPE(cl_device_type);
SAME_TYPE(cl_platform_info);
SAME_TYPE(cl_device_info);
SAME_TYPE(cl_command_queue_properties);
SAME_TYPE(cl_context_properties);
SAME_TYPE(cl_mem_flags);
SAME_TYPE(cl_program_build_info);
SAME_TYPE(cl_kernel_work_group_info);
SAME_TYPE(cl_platform_id);
SAME_TYPE(cl_device_id);
SAME_TYPE(cl_context);
SAME_TYPE(cl_command_queue);
SAME_TYPE(cl_mem);
SAME_TYPE(cl_program);
SAME_TYPE(cl_kernel);
SAME_TYPE(cl_event);

SAME_VALUE(CL_SUCCESS);
SAME_VALUE(CL_DEVICE_NOT_FOUND);
SAME_VALUE(CL_BUILD_PROGRAM_FAILURE);
SAME_VALUE(CL_FALSE);
SAME_VALUE(CL_TRUE);
SAME_VALUE(CL_DEVICE_TYPE_DEFAULT);
SAME_VALUE(CL_DEVICE_TYPE_CPU);
SAME_VALUE(CL_DEVICE_TYPE_GPU);
SAME_VALUE(CL_DEVICE_TYPE_ACCELERATOR);
SAME_VALUE(CL_DEVICE_TYPE_ALL);
SAME_VALUE(CL_PLATFORM_VERSION);
SAME_VALUE(CL_PLATFORM_NAME);
SAME_VALUE(CL_PLATFORM_VENDOR);
SAME_VALUE(CL_DEVICE_TYPE);
SAME_VALUE(CL_DEVICE_MAX_COMPUTE_UNITS);
SAME_VALUE(CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS);
SAME_VALUE(CL_DEVICE_MAX_WORK_GROUP_SIZE);
SAME_VALUE(CL_DEVICE_MAX_WORK_ITEM_SIZES);
SAME_VALUE(CL_DEVICE_MAX_CLOCK_FREQUENCY);
SAME_VALUE(CL_DEVICE_MAX_MEM_ALLOC_SIZE);
SAME_VALUE(CL_DEVICE_GLOBAL_MEM_CACHE_SIZE);
SAME_VALUE(CL_DEVICE_GLOBAL_MEM_SIZE);
SAME_VALUE(CL_DEVICE_LOCAL_MEM_SIZE);
SAME_VALUE(CL_DEVICE_NAME);
SAME_VALUE(CL_DEVICE_VENDOR);
SAME_VALUE(CL_DRIVER_VERSION);
SAME_VALUE(CL_DEVICE_VERSION);
SAME_VALUE(CL_DEVICE_EXTENSIONS);
SAME_VALUE(CL_DEVICE_OPENCL_C_VERSION);
SAME_VALUE(CL_DEVICE_IMAGE_PITCH_ALIGNMENT);
SAME_VALUE(CL_CONTEXT_PLATFORM);
SAME_VALUE(CL_MEM_READ_WRITE);
SAME_VALUE(CL_PROGRAM_BUILD_LOG);
SAME_VALUE(CL_KERNEL_WORK_GROUP_SIZE);

// entry points: the function pointer types of the table match the real prototypes
#define SAME_SIGNATURE(member, function) \
  static_assert(std::is_same<decltype(ep::Api::member), decltype(&function)>::value, #function)

SAME_SIGNATURE(GetPlatformIDs, clGetPlatformIDs);
SAME_SIGNATURE(GetPlatformInfo, clGetPlatformInfo);
SAME_SIGNATURE(GetDeviceIDs, clGetDeviceIDs);
SAME_SIGNATURE(GetDeviceInfo, clGetDeviceInfo);
SAME_SIGNATURE(CreateContext, clCreateContext);
SAME_SIGNATURE(ReleaseContext, clReleaseContext);
SAME_SIGNATURE(CreateCommandQueue, clCreateCommandQueue);
SAME_SIGNATURE(ReleaseCommandQueue, clReleaseCommandQueue);
SAME_SIGNATURE(Finish, clFinish);
SAME_SIGNATURE(Flush, clFlush);
SAME_SIGNATURE(CreateBuffer, clCreateBuffer);
SAME_SIGNATURE(ReleaseMemObject, clReleaseMemObject);
SAME_SIGNATURE(EnqueueReadBuffer, clEnqueueReadBuffer);
SAME_SIGNATURE(EnqueueWriteBuffer, clEnqueueWriteBuffer);
SAME_SIGNATURE(EnqueueCopyBuffer, clEnqueueCopyBuffer);
SAME_SIGNATURE(CreateProgramWithSource, clCreateProgramWithSource);
SAME_SIGNATURE(BuildProgram, clBuildProgram);
SAME_SIGNATURE(GetProgramBuildInfo, clGetProgramBuildInfo);
SAME_SIGNATURE(ReleaseProgram, clReleaseProgram);
SAME_SIGNATURE(CreateKernel, clCreateKernel);
SAME_SIGNATURE(ReleaseKernel, clReleaseKernel);
SAME_SIGNATURE(SetKernelArg, clSetKernelArg);
SAME_SIGNATURE(GetKernelWorkGroupInfo, clGetKernelWorkGroupInfo);
SAME_SIGNATURE(EnqueueNDRangeKernel, clEnqueueNDRangeKernel);

int main() { return 0; }
