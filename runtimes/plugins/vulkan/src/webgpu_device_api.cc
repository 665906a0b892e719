/*
 * webgpu_device_api.cc - TVM DeviceAPI for the "webgpu" device ("device_api.webgpu") over
 * wgpu-native: one adapter, one device, one queue.
 *
 * Adapter: among those wgpu-native lists for the backend (EDGEPACK_WGPU_BACKEND=vulkan (default)
 * |gl|metal|dx12|all), the one whose name contains $EDGEPACK_WGPU_ADAPTER, else the first
 * discrete GPU, then integrated GPU, then anything else (lavapipe is a "CPU" adapter). The device
 * is created with the adapter's own limits (not WebGPU's small defaults), so kernels may use as
 * many storage buffers, threads and workgroup memory as the Vulkan driver allows.
 */
#include <tvm/ffi/function.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "edgepack_gpu/util.h"
#include "webgpu_common.h"

namespace edgepack {
namespace vulkan {

namespace {

std::atomic<bool> g_exiting{false};

using gpu::Lower;

const char* BackendName(WGPUBackendType t) {
  switch (t) {
    case WGPUBackendType_Vulkan: return "vulkan";
    case WGPUBackendType_OpenGL: return "opengl";
    case WGPUBackendType_OpenGLES: return "opengles";
    case WGPUBackendType_Metal: return "metal";
    case WGPUBackendType_D3D12: return "d3d12";
    case WGPUBackendType_D3D11: return "d3d11";
    default: return "other";
  }
}

const char* AdapterTypeName(WGPUAdapterType t) {
  switch (t) {
    case WGPUAdapterType_DiscreteGPU: return "discrete-gpu";
    case WGPUAdapterType_IntegratedGPU: return "integrated-gpu";
    case WGPUAdapterType_CPU: return "cpu";
    default: return "unknown";
  }
}

int AdapterRank(WGPUAdapterType t) {
  switch (t) {
    case WGPUAdapterType_DiscreteGPU: return 0;
    case WGPUAdapterType_IntegratedGPU: return 1;
    case WGPUAdapterType_CPU: return 3;
    default: return 2;
  }
}

bool WantedBackends(WGPUInstanceBackend* out, std::string* error) {
  const char* env = std::getenv("EDGEPACK_WGPU_BACKEND");
  std::string v = env != nullptr && *env != '\0' ? Lower(env) : "vulkan";
  if (v == "vulkan") {
    *out = WGPUInstanceBackend_Vulkan;
  } else if (v == "gl" || v == "opengl" || v == "gles") {
    *out = WGPUInstanceBackend_GL;
  } else if (v == "metal") {
    *out = WGPUInstanceBackend_Metal;
  } else if (v == "dx12") {
    *out = WGPUInstanceBackend_DX12;
  } else if (v == "all") {
    *out = WGPUInstanceBackend_All;
  } else {
    *error = "EDGEPACK_WGPU_BACKEND=" + v + " is not one of vulkan, gl, metal, dx12, all";
    return false;
  }
  return true;
}

uint64_t RoundUp4(uint64_t n) { return (n + 3) & ~static_cast<uint64_t>(3); }

gpu::DeviceAttrs Attrs(const wgpu::Api& api, const DeviceEntry& e) {
  const WGPULimits& l = e.limits;
  gpu::DeviceAttrs a;
  a.max_threads_per_block = static_cast<int64_t>(l.maxComputeInvocationsPerWorkgroup);
  a.max_shared_memory_per_block = static_cast<int64_t>(l.maxComputeWorkgroupStorageSize);
  a.max_thread_dims[0] = static_cast<int64_t>(l.maxComputeWorkgroupSizeX);
  a.max_thread_dims[1] = static_cast<int64_t>(l.maxComputeWorkgroupSizeY);
  a.max_thread_dims[2] = static_cast<int64_t>(l.maxComputeWorkgroupSizeZ);
  a.name = e.name;
  a.compute_version = e.backend;
  a.driver_version = e.description;
  a.api_version = static_cast<int64_t>(api.wgpuGetVersion());
  // clock, compute units and memory sizes are not known through WebGPU: left unset
  return a;
}

}  // namespace

bool ShuttingDown() { return g_exiting.load(std::memory_order_relaxed); }

WebGPUWorkspace* WebGPUWorkspace::Global() {
  // never destroyed: the driver may be gone when static destructors run
  static WebGPUWorkspace* inst = new WebGPUWorkspace();
  return inst;
}

void WebGPUWorkspace::RecordError(const std::string& message) {
  std::lock_guard<std::mutex> lock(error_mutex_);
  errors_.push_back(message);
}

std::string WebGPUWorkspace::TakeErrors() {
  std::lock_guard<std::mutex> lock(error_mutex_);
  std::string out;
  for (size_t i = 0; i < errors_.size(); ++i) out += (i ? "\n" : "") + errors_[i];
  errors_.clear();
  return out;
}

void WebGPUWorkspace::WaitFor(const bool* done, const char* what) {
  const wgpu::Api& api = *wgpu::GetApi();
  auto start = std::chrono::steady_clock::now();
  while (!*done) {
    api.wgpuInstanceProcessEvents(entry_.instance);
    if (*done) break;
    if (entry_.device != nullptr) api.wgpuDevicePoll(entry_.device, true, nullptr);
    api.wgpuInstanceProcessEvents(entry_.instance);
    if (*done) break;
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(300)) {
      TVM_FFI_THROW(RuntimeError) << "WebGPU: no answer from wgpu-native after 300 s while waiting for "
                                  << what << " (the device may be lost)";
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

bool WebGPUWorkspace::Init(std::string* why) {
  std::call_once(init_once_, [this] {
    const wgpu::Api* api = wgpu::GetApi();
    if (api == nullptr) {
      init_error_ = wgpu::LoadError();
      return;
    }
    // At exit, skip releasing wgpu objects: the driver tears itself down in its own destructors.
    std::atexit([] { g_exiting.store(true); });
    WGPUInstanceBackend backends = WGPUInstanceBackend_Vulkan;
    if (!WantedBackends(&backends, &init_error_)) return;
    WGPUInstanceExtras extras{};
    extras.chain.sType = static_cast<WGPUSType>(WGPUSType_InstanceExtras);
    extras.backends = backends;
    WGPUInstanceDescriptor idesc = WGPU_INSTANCE_DESCRIPTOR_INIT;
    idesc.nextInChain = &extras.chain;
    entry_.instance = api->wgpuCreateInstance(&idesc);
    if (entry_.instance == nullptr) {
      init_error_ = "wgpu-native could not create an instance";
      return;
    }
    WGPUInstanceEnumerateAdapterOptions opts{};
    opts.backends = backends;
    size_t n = api->wgpuInstanceEnumerateAdapters(entry_.instance, &opts, nullptr);
    std::vector<WGPUAdapter> adapters(n);
    if (n > 0) n = api->wgpuInstanceEnumerateAdapters(entry_.instance, &opts, adapters.data());
    adapters.resize(n);
    if (adapters.empty()) {
      init_error_ = std::string("wgpu-native (") + wgpu::LoadedLibrary() +
                    ") found no adapter for the " +
                    (backends == WGPUInstanceBackend_Vulkan ? "Vulkan" : "requested") +
                    " backend: no Vulkan driver (ICD) is installed or visible";
      return;
    }
    const char* filter = std::getenv("EDGEPACK_WGPU_ADAPTER");
    int best = -1, best_rank = 1 << 30;
    std::vector<std::string> names;
    for (size_t i = 0; i < adapters.size(); ++i) {
      WGPUAdapterInfo info = WGPU_ADAPTER_INFO_INIT;
      if (api->wgpuAdapterGetInfo(adapters[i], &info) != WGPUStatus_Success) continue;
      std::string name = wgpu::Str(info.device);
      names.push_back(name);
      int rank = AdapterRank(info.adapterType);
      bool match = filter == nullptr || *filter == '\0' ||
                   Lower(name).find(Lower(filter)) != std::string::npos;
      if (match && rank < best_rank) {
        best = static_cast<int>(i);
        best_rank = rank;
      }
      api->wgpuAdapterInfoFreeMembers(info);
    }
    if (best < 0) {
      init_error_ = std::string("no adapter matches EDGEPACK_WGPU_ADAPTER=") + filter + " (found:";
      for (const std::string& name : names) init_error_ += " '" + name + "'";
      init_error_ += ")";
      return;
    }
    for (size_t i = 0; i < adapters.size(); ++i) {
      if (static_cast<int>(i) != best) api->wgpuAdapterRelease(adapters[i]);
    }
    entry_.adapter = adapters[best];
    WGPUAdapterInfo info = WGPU_ADAPTER_INFO_INIT;
    api->wgpuAdapterGetInfo(entry_.adapter, &info);
    entry_.name = wgpu::Str(info.device);
    entry_.vendor = wgpu::Str(info.vendor);
    entry_.architecture = wgpu::Str(info.architecture);
    entry_.description = wgpu::Str(info.description);
    entry_.backend = BackendName(info.backendType);
    entry_.adapter_type = AdapterTypeName(info.adapterType);
    entry_.vendor_id = info.vendorID;
    entry_.device_id = info.deviceID;
    api->wgpuAdapterInfoFreeMembers(info);

    WGPULimits limits = WGPU_LIMITS_INIT;
    if (api->wgpuAdapterGetLimits(entry_.adapter, &limits) != WGPUStatus_Success) {
      init_error_ = "wgpu-native could not read the limits of " + entry_.name;
      return;
    }
    struct Request {
      bool done = false;
      WGPUDevice device = nullptr;
      std::string message;
    } request;
    WGPUDeviceDescriptor ddesc = WGPU_DEVICE_DESCRIPTOR_INIT;
    std::string label = "edgepack";
    ddesc.label = wgpu::View(label);
    ddesc.requiredLimits = &limits;
    // TVM's WGSL for float16 models starts with "enable f16;": ask for it when the driver has it
    std::vector<WGPUFeatureName> features;
    if (api->wgpuAdapterHasFeature(entry_.adapter, WGPUFeatureName_ShaderF16)) {
      features.push_back(WGPUFeatureName_ShaderF16);
      entry_.shader_f16 = true;
    }
    ddesc.requiredFeatureCount = features.size();
    ddesc.requiredFeatures = features.data();
    ddesc.uncapturedErrorCallbackInfo.callback = [](WGPUDevice const*, WGPUErrorType,
                                                    WGPUStringView message, void* self, void*) {
      static_cast<WebGPUWorkspace*>(self)->RecordError(wgpu::Str(message));
    };
    ddesc.uncapturedErrorCallbackInfo.userdata1 = this;
    ddesc.deviceLostCallbackInfo.mode = WGPUCallbackMode_AllowProcessEvents;
    ddesc.deviceLostCallbackInfo.callback = [](WGPUDevice const*, WGPUDeviceLostReason reason,
                                               WGPUStringView message, void* self, void*) {
      if (reason == WGPUDeviceLostReason_Destroyed || ShuttingDown()) return;
      static_cast<WebGPUWorkspace*>(self)->RecordError("the device was lost: " + wgpu::Str(message));
    };
    ddesc.deviceLostCallbackInfo.userdata1 = this;
    WGPURequestDeviceCallbackInfo cb = WGPU_REQUEST_DEVICE_CALLBACK_INFO_INIT;
    cb.mode = WGPUCallbackMode_AllowProcessEvents;
    cb.callback = [](WGPURequestDeviceStatus status, WGPUDevice device, WGPUStringView message,
                     void* userdata, void*) {
      Request* r = static_cast<Request*>(userdata);
      if (status == WGPURequestDeviceStatus_Success) {
        r->device = device;
      } else {
        r->message = wgpu::Str(message);
      }
      r->done = true;
    };
    cb.userdata1 = &request;
    api->wgpuAdapterRequestDevice(entry_.adapter, &ddesc, cb);
    WaitFor(&request.done, "the device");
    if (request.device == nullptr) {
      init_error_ = "wgpu-native could not create a device on " + entry_.name + ": " + request.message;
      return;
    }
    entry_.device = request.device;
    entry_.queue = api->wgpuDeviceGetQueue(entry_.device);
    entry_.limits = WGPU_LIMITS_INIT;
    if (api->wgpuDeviceGetLimits(entry_.device, &entry_.limits) != WGPUStatus_Success) {
      entry_.limits = limits;
    }
    entry_.attrs = Attrs(*api, entry_);
    sync_each_launch_ = gpu::EnvFlag("EDGEPACK_WGPU_SYNC");
    initialized_ = true;
  });
  if (!initialized_ && why != nullptr) *why = init_error_;
  return initialized_;
}

const wgpu::Api& WebGPUWorkspace::Api() {
  std::string why;
  if (!Init(&why)) {
    TVM_FFI_THROW(RuntimeError) << "WebGPU/Vulkan is not available: " << why;
  }
  return *wgpu::GetApi();
}

size_t WebGPUWorkspace::NumDevices() { return Init() ? 1 : 0; }

DeviceEntry& WebGPUWorkspace::Entry(int dev_id) {
  Api();
  if (dev_id != 0) {
    TVM_FFI_THROW(IndexError) << "webgpu(" << dev_id
                              << ") does not exist: edgepack's Vulkan runtime uses one adapter, "
                                 "webgpu(0) (choose it with EDGEPACK_WGPU_ADAPTER)";
  }
  return entry_;
}

WGPUBuffer WebGPUWorkspace::BufferOf(const void* ptr, uint64_t* size) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  auto it = buffers_.find(ptr);
  if (it == buffers_.end()) {
    TVM_FFI_THROW(RuntimeError) << "WebGPU: " << ptr
                                << " is not a buffer of this device (a host pointer, a tensor "
                                   "view with an offset, or a freed buffer)";
  }
  if (size != nullptr) *size = it->second;
  return static_cast<WGPUBuffer>(const_cast<void*>(ptr));
}

void WebGPUWorkspace::SetDevice(Device /*dev*/) {}

const gpu::DeviceAttrs* WebGPUWorkspace::AttrsOf(int dev_id) {
  return Init() && dev_id == 0 ? &entry_.attrs : nullptr;
}

void WebGPUWorkspace::GetAttr(Device dev, DeviceAttrKind kind, tvm::ffi::Any* rv) {
  gpu::GetDeviceAttr(AttrsOf(dev.device_id), kind, rv);
}

void WebGPUWorkspace::GetTargetProperty(Device dev, const std::string& property,
                                        tvm::ffi::Any* rv) {
  gpu::GetDeviceTargetProperty(AttrsOf(dev.device_id), property, rv);
}

void* WebGPUWorkspace::AllocDataSpace(Device dev, size_t nbytes, size_t /*alignment*/,
                                      DLDataType /*type_hint*/) {
  DeviceEntry& e = Entry(dev.device_id);
  const wgpu::Api& api = Api();
  // copies and storage bindings work in 4-byte units; an empty tensor still gets a buffer
  uint64_t size = std::max<uint64_t>(RoundUp4(nbytes), 4);
  if (size > e.limits.maxBufferSize) {
    TVM_FFI_THROW(RuntimeError) << "WebGPU: cannot allocate " << nbytes << " bytes on " << e.name
                                << ": the device's largest buffer is " << e.limits.maxBufferSize
                                << " bytes";
  }
  WGPUBufferDescriptor desc = WGPU_BUFFER_DESCRIPTOR_INIT;
  desc.usage = WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc | WGPUBufferUsage_CopyDst;
  desc.size = size;
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  WGPUBuffer buffer = api.wgpuDeviceCreateBuffer(e.device, &desc);
  std::string errors = TakeErrors();
  if (buffer == nullptr || !errors.empty()) {
    TVM_FFI_THROW(RuntimeError) << "WebGPU could not allocate " << nbytes << " bytes on " << e.name
                                << (errors.empty() ? "" : ": ") << errors;
  }
  buffers_[buffer] = size;
  return buffer;
}

void WebGPUWorkspace::FreeDataSpace(Device /*dev*/, void* ptr) {
  if (ptr == nullptr || ShuttingDown()) return;
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (buffers_.erase(ptr) == 0) return;
  // a release, not a destroy: pending commands keep the buffer alive until they have run
  wgpu::GetApi()->wgpuBufferRelease(static_cast<WGPUBuffer>(ptr));
}

WGPUCommandEncoder WebGPUWorkspace::Encoder() {
  if (pending_ == nullptr) {
    WGPUCommandEncoderDescriptor desc = WGPU_COMMAND_ENCODER_DESCRIPTOR_INIT;
    pending_ = Api().wgpuDeviceCreateCommandEncoder(entry_.device, &desc);
  }
  return pending_;
}

void WebGPUWorkspace::FlushLocked() {
  if (pending_ == nullptr) return;
  const wgpu::Api& api = Api();
  WGPUCommandBufferDescriptor desc = WGPU_COMMAND_BUFFER_DESCRIPTOR_INIT;
  WGPUCommandBuffer commands = api.wgpuCommandEncoderFinish(pending_, &desc);
  api.wgpuCommandEncoderRelease(pending_);
  pending_ = nullptr;
  pending_launches_ = 0;
  if (commands != nullptr) {
    api.wgpuQueueSubmit(entry_.queue, 1, &commands);
    api.wgpuCommandBufferRelease(commands);
  }
}

void WebGPUWorkspace::WaitLocked(const std::string& what) {
  FlushLocked();
  const wgpu::Api& api = Api();
  api.wgpuDevicePoll(entry_.device, true, nullptr);
  api.wgpuInstanceProcessEvents(entry_.instance);
  std::string errors = TakeErrors();
  if (!errors.empty()) {
    TVM_FFI_THROW(RuntimeError) << "WebGPU (wgpu-native, " << entry_.backend << " on "
                                << entry_.name << ") reported an error " << what << ":\n"
                                << errors;
  }
}

void WebGPUWorkspace::Wait(const std::string& what) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  WaitLocked(what);
}

void WebGPUWorkspace::Dispatch(const std::string& kernel, WGPUComputePipeline pipeline,
                               WGPUBindGroup group, uint32_t x, uint32_t y, uint32_t z) {
  const wgpu::Api& api = Api();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  WGPUComputePassDescriptor desc = WGPU_COMPUTE_PASS_DESCRIPTOR_INIT;
  WGPUComputePassEncoder pass = api.wgpuCommandEncoderBeginComputePass(Encoder(), &desc);
  api.wgpuComputePassEncoderSetPipeline(pass, pipeline);
  api.wgpuComputePassEncoderSetBindGroup(pass, 0, group, 0, nullptr);
  api.wgpuComputePassEncoderDispatchWorkgroups(pass, x, y, z);
  api.wgpuComputePassEncoderEnd(pass);
  api.wgpuComputePassEncoderRelease(pass);
  ++pending_launches_;
  if (sync_each_launch_) {
    WaitLocked("running kernel '" + kernel + "'");
  } else if (pending_launches_ >= 64) {
    FlushLocked();  // let the device start while more launches are recorded
  }
}

void WebGPUWorkspace::ReadLocked(WGPUBuffer src, uint64_t offset, uint64_t size, void* out) {
  const wgpu::Api& api = Api();
  if (staging_size_ < size) {
    if (staging_ != nullptr) api.wgpuBufferRelease(staging_);
    WGPUBufferDescriptor desc = WGPU_BUFFER_DESCRIPTOR_INIT;
    desc.usage = WGPUBufferUsage_MapRead | WGPUBufferUsage_CopyDst;
    desc.size = std::max<uint64_t>(size, 1 << 16);
    staging_ = api.wgpuDeviceCreateBuffer(entry_.device, &desc);
    staging_size_ = staging_ != nullptr ? desc.size : 0;
    if (staging_ == nullptr) {
      TVM_FFI_THROW(RuntimeError) << "WebGPU could not allocate a " << desc.size
                                  << "-byte staging buffer: " << TakeErrors();
    }
  }
  api.wgpuCommandEncoderCopyBufferToBuffer(Encoder(), src, offset, staging_, 0, size);
  FlushLocked();
  struct Map {
    bool done = false;
    WGPUMapAsyncStatus status = WGPUMapAsyncStatus_Error;
    std::string message;
  } map;
  WGPUBufferMapCallbackInfo cb = WGPU_BUFFER_MAP_CALLBACK_INFO_INIT;
  cb.mode = WGPUCallbackMode_AllowProcessEvents;
  cb.callback = [](WGPUMapAsyncStatus status, WGPUStringView message, void* userdata, void*) {
    Map* m = static_cast<Map*>(userdata);
    m->status = status;
    m->message = wgpu::Str(message);
    m->done = true;
  };
  cb.userdata1 = &map;
  api.wgpuBufferMapAsync(staging_, WGPUMapMode_Read, 0, static_cast<size_t>(size), cb);
  WaitFor(&map.done, "a copy from the device");
  std::string errors = TakeErrors();
  if (map.status != WGPUMapAsyncStatus_Success || !errors.empty()) {
    if (map.status == WGPUMapAsyncStatus_Success) api.wgpuBufferUnmap(staging_);
    TVM_FFI_THROW(RuntimeError) << "WebGPU (wgpu-native, " << entry_.backend << " on "
                                << entry_.name << "): reading from the device failed: "
                                << (errors.empty() ? map.message : errors);
  }
  const void* data = api.wgpuBufferGetConstMappedRange(staging_, 0, static_cast<size_t>(size));
  if (data != nullptr) std::memcpy(out, data, static_cast<size_t>(size));
  api.wgpuBufferUnmap(staging_);
  if (data == nullptr) TVM_FFI_THROW(RuntimeError) << "WebGPU: mapping the staging buffer failed";
}

void WebGPUWorkspace::WriteLocked(WGPUBuffer dst, uint64_t offset, uint64_t size,
                                  const void* data) {
  // writeBuffer runs before the commands of the next submission: submit the pending ones first
  FlushLocked();
  Api().wgpuQueueWriteBuffer(entry_.queue, dst, offset, data, static_cast<size_t>(size));
}

TVMStreamHandle WebGPUWorkspace::CreateStream(Device /*dev*/) { return nullptr; }  // one queue

void WebGPUWorkspace::FreeStream(Device /*dev*/, TVMStreamHandle /*stream*/) {}

void WebGPUWorkspace::StreamSync(Device dev, TVMStreamHandle /*stream*/) {
  Entry(dev.device_id);
  Wait("while waiting for the device (run with EDGEPACK_WGPU_SYNC=1 to find the failing kernel)");
}

void WebGPUWorkspace::SetStream(Device /*dev*/, TVMStreamHandle /*stream*/) {}

TVMStreamHandle WebGPUWorkspace::GetCurrentStream(Device /*dev*/) { return nullptr; }

void WebGPUWorkspace::SyncStreamFromTo(Device /*dev*/, TVMStreamHandle /*event_src*/,
                                       TVMStreamHandle /*event_dst*/) {
  // one in-order queue: nothing to do
}

void WebGPUWorkspace::CopyDataFromTo(const void* from, size_t from_offset, void* to,
                                     size_t to_offset, size_t size, Device dev_from,
                                     Device dev_to, DLDataType /*type_hint*/,
                                     TVMStreamHandle /*stream*/) {
  if (size == 0) return;
  const bool from_gpu = dev_from.device_type == kDeviceType;
  const bool to_gpu = dev_to.device_type == kDeviceType;
  if ((from_gpu && dev_from.device_id != 0) || (to_gpu && dev_to.device_id != 0)) Entry(1);
  Entry(0);
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  // the 4-byte aligned span of a buffer that holds [offset, offset + n)
  auto span = [](size_t offset, size_t n, uint64_t* begin, uint64_t* end) {
    *begin = offset & ~static_cast<size_t>(3);
    *end = RoundUp4(offset + n);
  };
  auto check_range = [](uint64_t buffer_size, size_t offset, size_t n) {
    if (offset + n > buffer_size) {
      TVM_FFI_THROW(RuntimeError) << "WebGPU: copy of " << n << " bytes at offset " << offset
                                  << " goes past the end of a " << buffer_size << "-byte buffer";
    }
  };
  if (from_gpu && dev_to.device_type == kDLCPU) {
    uint64_t bsize = 0;
    WGPUBuffer src = BufferOf(from, &bsize);
    check_range(bsize, from_offset, size);
    uint64_t b, e;
    span(from_offset, size, &b, &e);
    if (b == from_offset && e == from_offset + size) {
      ReadLocked(src, b, e - b, static_cast<char*>(to) + to_offset);
    } else {
      std::vector<char> tmp(e - b);
      ReadLocked(src, b, e - b, tmp.data());
      std::memcpy(static_cast<char*>(to) + to_offset, tmp.data() + (from_offset - b), size);
    }
  } else if (dev_from.device_type == kDLCPU && to_gpu) {
    uint64_t bsize = 0;
    WGPUBuffer dst = BufferOf(to, &bsize);
    check_range(bsize, to_offset, size);
    const char* src = static_cast<const char*>(from) + from_offset;
    uint64_t b, e;
    span(to_offset, size, &b, &e);
    if (b == to_offset && e == to_offset + size) {
      WriteLocked(dst, b, size, src);  // writeBuffer copies the data now: the caller may reuse it
    } else {  // read-modify-write of the aligned span around it
      std::vector<char> tmp(e - b);
      ReadLocked(dst, b, e - b, tmp.data());
      std::memcpy(tmp.data() + (to_offset - b), src, size);
      WriteLocked(dst, b, e - b, tmp.data());
    }
  } else if (from_gpu && to_gpu) {
    uint64_t fsize = 0, tsize = 0;
    WGPUBuffer src = BufferOf(from, &fsize);
    WGPUBuffer dst = BufferOf(to, &tsize);
    check_range(fsize, from_offset, size);
    check_range(tsize, to_offset, size);
    if (src != dst && from_offset % 4 == 0 && to_offset % 4 == 0 && size % 4 == 0) {
      Api().wgpuCommandEncoderCopyBufferToBuffer(Encoder(), src, from_offset, dst, to_offset, size);
    } else {  // unaligned, or within one buffer (WebGPU forbids that copy): through the host
      std::vector<char> tmp(size);
      CopyDataFromTo(from, from_offset, tmp.data(), 0, size, dev_from, Device{kDLCPU, 0},
                     DLDataType{kDLUInt, 8, 1}, nullptr);
      CopyDataFromTo(tmp.data(), 0, to, to_offset, size, Device{kDLCPU, 0}, dev_to,
                     DLDataType{kDLUInt, 8, 1}, nullptr);
    }
  } else {
    TVM_FFI_THROW(RuntimeError) << "WebGPU runtime: cannot copy from device type "
                                << dev_from.device_type << " to device type "
                                << dev_to.device_type;
  }
}

}  // namespace vulkan
}  // namespace edgepack
