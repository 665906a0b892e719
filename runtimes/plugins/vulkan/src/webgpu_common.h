/*
 * webgpu_common.h - edgepack's Vulkan runtime for TVM: TVM's "webgpu" device (kDLWebGPU = 15) run
 * by wgpu-native, on its Vulkan backend by default. Shared by the device API and the module.
 *
 * Memory model: buffers only. A TVM data pointer on this device is a WGPUBuffer (usage storage +
 * copy source/destination, size rounded up to 4 bytes); the workspace keeps a table of live
 * buffers so a pointer that is not one is reported instead of crashing the driver.
 *
 * Ordering: one queue. Kernel launches are recorded into a pending command encoder (one compute
 * pass each) and submitted in batches; every copy and every sync first puts the pending work in
 * order (copies out of the device are recorded into the same encoder, writes into the device
 * flush it first, as the queue performs writeBuffer before the next submitted commands).
 */
#ifndef EDGEPACK_VULKAN_WEBGPU_COMMON_H_
#define EDGEPACK_VULKAN_WEBGPU_COMMON_H_

#include <tvm/ffi/error.h>
#include <tvm/runtime/device_api.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "edgepack_gpu/device_attrs.h"
#include "wgpu_api.h"

namespace edgepack {
namespace vulkan {

using tvm::Device;
using tvm::runtime::DeviceAPI;
using tvm::runtime::DeviceAttrKind;

/*! \brief TVM's device type for what its webgpu target generates. */
constexpr int kDeviceType = 15;  // kDLWebGPU

/*! \brief The adapter and device behind tvm.webgpu(0). */
struct DeviceEntry {
  WGPUInstance instance = nullptr;
  WGPUAdapter adapter = nullptr;
  WGPUDevice device = nullptr;
  WGPUQueue queue = nullptr;
  std::string name, vendor, architecture, description, backend, adapter_type;
  uint32_t vendor_id = 0, device_id = 0;
  bool shader_f16 = false;  // the device was created with WGSL's f16 (float16 models)
  WGPULimits limits = WGPU_LIMITS_INIT;
  gpu::DeviceAttrs attrs;  // TVM's GetAttr answers, from the limits and adapter info
};

/*! \brief True once the process is exiting: wgpu objects are then left to the driver. */
bool ShuttingDown();

class WebGPUWorkspace final : public DeviceAPI {
 public:
  static WebGPUWorkspace* Global();

  /*! \brief Find the adapter and create the device once. False (and *why) without one. */
  bool Init(std::string* why = nullptr);
  /*! \brief The device; throws a clear error when there is no library/adapter/device. */
  DeviceEntry& Entry(int dev_id);
  size_t NumDevices();
  const wgpu::Api& Api();
  /*! \brief The attributes of webgpu(dev_id); nullptr (no error) when it does not exist. */
  const gpu::DeviceAttrs* AttrsOf(int dev_id);

  /*! \brief The WGPUBuffer behind a TVM data pointer (throws for anything else). */
  WGPUBuffer BufferOf(const void* ptr, uint64_t* size = nullptr);

  /*!
   * \brief Record one kernel launch (a compute pass) into the pending encoder. ``kernel`` names
   * it in errors. With EDGEPACK_WGPU_SYNC=1 every launch is submitted and waited for.
   */
  void Dispatch(const std::string& kernel, WGPUComputePipeline pipeline, WGPUBindGroup group,
                uint32_t x, uint32_t y, uint32_t z);
  /*! \brief Submit pending work and wait for the device; throws the errors wgpu reported. */
  void Wait(const std::string& what);
  /*!
   * \brief Run ``create`` inside a wgpu validation error scope; returns the error message (empty
   * when there was none).
   */
  template <typename F>
  std::string WithErrorScope(F create);

  // DeviceAPI
  void SetDevice(Device dev) final;
  void GetAttr(Device dev, DeviceAttrKind kind, tvm::ffi::Any* rv) final;
  void GetTargetProperty(Device dev, const std::string& property, tvm::ffi::Any* rv) final;
  void* AllocDataSpace(Device dev, size_t nbytes, size_t alignment, DLDataType type_hint) final;
  void FreeDataSpace(Device dev, void* ptr) final;
  TVMStreamHandle CreateStream(Device dev) final;
  void FreeStream(Device dev, TVMStreamHandle stream) final;
  void StreamSync(Device dev, TVMStreamHandle stream) final;
  void SetStream(Device dev, TVMStreamHandle stream) final;
  TVMStreamHandle GetCurrentStream(Device dev) final;
  void SyncStreamFromTo(Device dev, TVMStreamHandle event_src, TVMStreamHandle event_dst) final;

  /*! \brief Errors wgpu reported outside an error scope (uncaptured), taken (cleared). */
  std::string TakeErrors();
  void RecordError(const std::string& message);

  /*! \brief Pump wgpu's callbacks until ``*done`` (bounded: a lost device must not hang). */
  void WaitFor(const bool* done, const char* what);

 protected:
  void CopyDataFromTo(const void* from, size_t from_offset, void* to, size_t to_offset,
                      size_t size, Device dev_from, Device dev_to, DLDataType type_hint,
                      TVMStreamHandle stream) final;

 private:
  WebGPUWorkspace() = default;
  // all below: with mutex_ held
  WGPUCommandEncoder Encoder();
  void FlushLocked();
  void WaitLocked(const std::string& what);
  void ReadLocked(WGPUBuffer src, uint64_t offset, uint64_t size, void* out);
  void WriteLocked(WGPUBuffer dst, uint64_t offset, uint64_t size, const void* data);

  std::once_flag init_once_;
  bool initialized_ = false;
  std::string init_error_;
  DeviceEntry entry_;
  bool sync_each_launch_ = false;

  std::recursive_mutex mutex_;
  WGPUCommandEncoder pending_ = nullptr;
  size_t pending_launches_ = 0;
  WGPUBuffer staging_ = nullptr;  // MapRead buffer for reads, grown as needed
  uint64_t staging_size_ = 0;
  std::unordered_map<const void*, uint64_t> buffers_;  // live buffers -> size

  std::mutex error_mutex_;
  std::vector<std::string> errors_;
};

template <typename F>
std::string WebGPUWorkspace::WithErrorScope(F create) {
  DeviceEntry& e = Entry(0);
  const wgpu::Api& api = Api();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  api.wgpuDevicePushErrorScope(e.device, WGPUErrorFilter_Validation);
  create();
  struct Result {
    bool done = false;
    std::string message;
  } result;
  WGPUPopErrorScopeCallbackInfo info = WGPU_POP_ERROR_SCOPE_CALLBACK_INFO_INIT;
  info.mode = WGPUCallbackMode_AllowProcessEvents;
  info.callback = [](WGPUPopErrorScopeStatus status, WGPUErrorType type, WGPUStringView message,
                     void* userdata1, void*) {
    Result* r = static_cast<Result*>(userdata1);
    if (status != WGPUPopErrorScopeStatus_Success) {
      r->message = "wgpu could not report the error scope: " + wgpu::Str(message);
    } else if (type != WGPUErrorType_NoError) {
      r->message = wgpu::Str(message);
      if (r->message.empty()) r->message = "wgpu reported an error without a message";
    }
    r->done = true;
  };
  info.userdata1 = &result;
  api.wgpuDevicePopErrorScope(e.device, info);
  WaitFor(&result.done, "an error scope");
  return result.message;
}

}  // namespace vulkan
}  // namespace edgepack

#endif  // EDGEPACK_VULKAN_WEBGPU_COMMON_H_
