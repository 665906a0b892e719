/*
 * edgepack_gpu/device_attrs.h - what TVM asks a device about (DeviceAPI::GetAttr and
 * GetTargetProperty), answered the same way by edgepack's OpenCL and Vulkan runtimes from limits
 * each of them reads once when it finds its devices. Header-only.
 */
#ifndef EDGEPACK_GPU_DEVICE_ATTRS_H_
#define EDGEPACK_GPU_DEVICE_ATTRS_H_

#include <tvm/ffi/any.h>
#include <tvm/ffi/string.h>
#include <tvm/runtime/device_api.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>

namespace edgepack {
namespace gpu {

/*! \brief One device's answers to TVM's attribute queries. */
struct DeviceAttrs {
  int64_t max_threads_per_block = 0;        // work-group / workgroup invocations
  int64_t max_shared_memory_per_block = 0;  // local / workgroup memory, bytes
  int64_t max_thread_dims[3] = {0, 0, 0};   // per-dimension work-group size limits
  std::string name;
  std::string compute_version;              // OpenCL "3.0"; WebGPU: the backend ("vulkan")
  std::string driver_version;
  int64_t api_version = 0;
  // not known through every API: left unset, TVM then sees no value
  std::optional<int64_t> max_clock_khz;
  std::optional<int64_t> multi_processor_count;
  std::optional<int64_t> l2_cache_bytes;
  std::optional<int64_t> total_global_memory;
  std::optional<int64_t> image_pitch_alignment;
};

/*!
 * \brief DeviceAPI::GetAttr for a device with ``attrs`` (nullptr: the device does not exist, and
 * only kExist is answered). Neither OpenCL nor WGSL without the subgroups extension has warps:
 * the warp size is 1, as TVM's own OpenCL runtime and webgpu target say.
 */
inline void GetDeviceAttr(const DeviceAttrs* attrs, tvm::runtime::DeviceAttrKind kind,
                          tvm::ffi::Any* rv) {
  namespace rt = tvm::runtime;
  if (kind == rt::kExist) {
    *rv = static_cast<int>(attrs != nullptr);
    return;
  }
  if (attrs == nullptr) return;
  const DeviceAttrs& a = *attrs;
  auto set_optional = [rv](const std::optional<int64_t>& v) {
    if (v) *rv = *v;
  };
  switch (kind) {
    case rt::kMaxThreadsPerBlock: *rv = a.max_threads_per_block; break;
    case rt::kWarpSize: *rv = 1; break;
    case rt::kMaxSharedMemoryPerBlock: *rv = a.max_shared_memory_per_block; break;
    case rt::kComputeVersion: *rv = tvm::ffi::String(a.compute_version); break;
    case rt::kDeviceName: *rv = tvm::ffi::String(a.name); break;
    case rt::kMaxThreadDimensions: {
      std::ostringstream os;
      os << "[" << a.max_thread_dims[0] << ", " << a.max_thread_dims[1] << ", " << a.max_thread_dims[2]
         << "]";
      *rv = tvm::ffi::String(os.str());
      break;
    }
    case rt::kApiVersion: *rv = a.api_version; break;
    case rt::kDriverVersion: *rv = tvm::ffi::String(a.driver_version); break;
    case rt::kMaxClockRate: set_optional(a.max_clock_khz); break;
    case rt::kMultiProcessorCount: set_optional(a.multi_processor_count); break;
    case rt::kL2CacheSizeBytes: set_optional(a.l2_cache_bytes); break;
    case rt::kTotalGlobalMemory: set_optional(a.total_global_memory); break;
    case rt::kImagePitchAlignment: set_optional(a.image_pitch_alignment); break;
    default: break;  // registers per block, GCN arch, available memory: not known here
  }
}

/*! \brief DeviceAPI::GetTargetProperty (TVM's target-from-device detection) from the same limits. */
inline void GetDeviceTargetProperty(const DeviceAttrs* attrs, const std::string& property,
                                    tvm::ffi::Any* rv) {
  if (attrs == nullptr) return;
  if (property == "max_num_threads") {
    *rv = attrs->max_threads_per_block;
  } else if (property == "thread_warp_size") {
    *rv = 1;
  } else if (property == "max_shared_memory_per_block") {
    *rv = attrs->max_shared_memory_per_block;
  }
}

}  // namespace gpu
}  // namespace edgepack

#endif  // EDGEPACK_GPU_DEVICE_ATTRS_H_
