/*
 * wgpu_api.h - the wgpu-native C API functions edgepack's Vulkan runtime uses, loaded with dlopen()
 * at run time (so the plug-in has no link-time dependency on wgpu-native, and a missing library is
 * a clear error when a GPU is first used, not a failure to load the plug-in).
 *
 * The declarations come from the real headers shipped with the pinned wgpu-native (webgpu.h and
 * wgpu.h of the PyPI `wgpu` 0.32.0 wheel = wgpu-native 29.0.1.1): every pointer has the exact type
 * of the function it holds (decltype of the header's prototype), so an API change breaks the build.
 *
 * Where the library comes from, first match wins:
 *   $EDGEPACK_WGPU_LIBRARY (a path), libwgpu_native.so next to this plug-in (a C bundle's lib/,
 *   edgepack's plug-in cache), then the dynamic loader's search path (LD_LIBRARY_PATH, an Android
 *   app's native library directory).
 */
#ifndef EDGEPACK_VULKAN_WGPU_API_H_
#define EDGEPACK_VULKAN_WGPU_API_H_

#include <string>

#include "webgpu.h"
#include "wgpu.h"

namespace edgepack {
namespace wgpu {

#define EDGEPACK_WGPU_FUNCTIONS(X)                                                   \
  X(wgpuGetVersion)                                                                  \
  X(wgpuCreateInstance)                                                              \
  X(wgpuInstanceRelease)                                                             \
  X(wgpuInstanceEnumerateAdapters)                                                   \
  X(wgpuInstanceProcessEvents)                                                       \
  X(wgpuAdapterGetInfo)                                                              \
  X(wgpuAdapterInfoFreeMembers)                                                      \
  X(wgpuAdapterGetLimits)                                                            \
  X(wgpuAdapterHasFeature)                                                           \
  X(wgpuAdapterRequestDevice)                                                        \
  X(wgpuAdapterRelease)                                                              \
  X(wgpuDeviceGetQueue)                                                              \
  X(wgpuDeviceGetLimits)                                                             \
  X(wgpuDevicePoll)                                                                  \
  X(wgpuDevicePushErrorScope)                                                        \
  X(wgpuDevicePopErrorScope)                                                         \
  X(wgpuDeviceCreateBuffer)                                                          \
  X(wgpuDeviceCreateShaderModule)                                                    \
  X(wgpuDeviceCreateBindGroupLayout)                                                 \
  X(wgpuDeviceCreatePipelineLayout)                                                  \
  X(wgpuDeviceCreateComputePipeline)                                                 \
  X(wgpuDeviceCreateBindGroup)                                                       \
  X(wgpuDeviceCreateCommandEncoder)                                                  \
  X(wgpuBufferMapAsync)                                                              \
  X(wgpuBufferGetConstMappedRange)                                                   \
  X(wgpuBufferGetMappedRange)                                                        \
  X(wgpuBufferUnmap)                                                                 \
  X(wgpuBufferRelease)                                                               \
  X(wgpuQueueWriteBuffer)                                                            \
  X(wgpuQueueSubmit)                                                                 \
  X(wgpuCommandEncoderCopyBufferToBuffer)                                            \
  X(wgpuCommandEncoderBeginComputePass)                                              \
  X(wgpuCommandEncoderFinish)                                                        \
  X(wgpuCommandEncoderRelease)                                                       \
  X(wgpuCommandBufferRelease)                                                        \
  X(wgpuComputePassEncoderSetPipeline)                                               \
  X(wgpuComputePassEncoderSetBindGroup)                                              \
  X(wgpuComputePassEncoderDispatchWorkgroups)                                        \
  X(wgpuComputePassEncoderEnd)                                                       \
  X(wgpuComputePassEncoderRelease)                                                   \
  X(wgpuShaderModuleRelease)                                                         \
  X(wgpuBindGroupLayoutRelease)                                                      \
  X(wgpuPipelineLayoutRelease)                                                       \
  X(wgpuComputePipelineRelease)                                                      \
  X(wgpuBindGroupRelease)

/*! \brief The loaded functions (all non-null once GetApi() returns non-null). */
struct Api {
#define EDGEPACK_WGPU_DECLARE(name) decltype(&::name) name = nullptr;
  EDGEPACK_WGPU_FUNCTIONS(EDGEPACK_WGPU_DECLARE)
#undef EDGEPACK_WGPU_DECLARE
};

/*! \brief The API, loading the library on first use; nullptr when no usable library was found. */
const Api* GetApi();
/*! \brief Why GetApi() returned nullptr (every place tried, with the loader's message). */
std::string LoadError();
/*! \brief The path of the library that was loaded ("" before/without one). */
std::string LoadedLibrary();

/*! \brief A WGPUStringView as std::string. */
inline std::string Str(WGPUStringView v) {
  if (v.data == nullptr) return "";
  if (v.length == WGPU_STRLEN) return std::string(v.data);
  return std::string(v.data, v.length);
}

/*! \brief A std::string as a WGPUStringView (valid while ``s`` lives). */
inline WGPUStringView View(const std::string& s) { return WGPUStringView{s.data(), s.size()}; }

}  // namespace wgpu
}  // namespace edgepack

#endif  // EDGEPACK_VULKAN_WGPU_API_H_
