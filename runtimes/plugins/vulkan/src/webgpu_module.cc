/*
 * webgpu_module.cc - the TVM module that runs the WGSL compute shaders TVM's webgpu target
 * generates ("ffi.Module.load_from_bytes.webgpu"), on wgpu-native, and the plug-in's global
 * registrations.
 *
 * What TVM 0.27's WebGPU code generator stores (see edgepack_gpu/module_data.h):
 *   fmap : the kernels' FunctionInfo (arg types, launch tags)
 *   smap : kernel name -> WGSL source of one shader with one entry point of that name
 *
 * How TVM's WGSL binds arguments (as its own JavaScript runtime, web/src/webgpu.ts, does):
 *   @binding(i) for the i-th buffer argument: var<storage, read_write> when the launch tag
 *     "paramWriteAccess:[..]" marks it written, else var<storage, read>;
 *   @binding(n_buffers): var<uniform> podArgs, a struct of the scalar arguments in order (32-bit
 *     each: i32, u32, f32) followed by packGridDimX: u32, the grid size along x.
 * Launch arguments after the kernel arguments: blockIdx.x/y and threadIdx.x/y/z extents. The
 * workgroup size is compiled into the shader (@workgroup_size). A grid larger than the device's
 * maxComputeWorkgroupsPerDimension along x is folded into z; the shader recovers the block index
 * as blockIdx.z * gridDim.x + blockIdx.x and returns past packGridDimX.
 *
 * Each shader is compiled (shader module + bind group layout + compute pipeline) once per device
 * the first time it runs; a WGSL error is reported with the kernel name, the adapter and the
 * message of wgpu's shader compiler (naga).
 */
#include <tvm/ffi/any.h>
#include <tvm/ffi/cast.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "edgepack_gpu/kernel_cache.h"
#include "edgepack_gpu/kernel_module.h"
#include "edgepack_gpu/launch.h"
#include "edgepack_gpu/module_data.h"
#include "edgepack_gpu/util.h"
#include "webgpu_common.h"

namespace edgepack {
namespace vulkan {

namespace ffi = tvm::ffi;
using gpu::KernelInfo;
using gpu::LaunchConfig;

namespace {

constexpr const char* kRuntime = "WebGPU";
constexpr const char* kWriteAccessTag = "paramWriteAccess:";

/*! \brief "paramWriteAccess:[1,0,0]" -> {1, 0, 0} */
std::vector<int> ParseWriteAccess(const std::string& tag, const std::string& kernel) {
  std::vector<int> out;
  std::string list = tag.substr(std::strlen(kWriteAccessTag));
  size_t open = list.find('['), close = list.rfind(']');
  if (open == std::string::npos || close == std::string::npos || close < open) {
    TVM_FFI_THROW(ValueError) << "WebGPU kernel " << kernel << ": cannot read launch tag '" << tag
                              << "'";
  }
  std::stringstream items(list.substr(open + 1, close - open - 1));
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.find_first_not_of(" ") == std::string::npos) continue;
    out.push_back(std::atoi(item.c_str()) != 0 ? 1 : 0);
  }
  return out;
}

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

}  // namespace

/*! \brief Per-kernel facts derived once from its FunctionInfo and shader. */
struct KernelPlan {
  LaunchConfig launch;
  std::vector<size_t> buffer_args;  // argument indices bound as storage buffers, in binding order
  std::vector<size_t> pod_args;     // argument indices packed into the uniform, in order
  std::vector<int> write_access;    // per buffer argument: written by the shader
  bool inclusive_guard = false;     // the shader returns when index > packGridDimX (not >=)
};

/*! \brief A compiled shader: what is created once and reused by every launch. */
struct Pipeline {
  WGPUShaderModule shader = nullptr;
  WGPUBindGroupLayout group_layout = nullptr;
  WGPUPipelineLayout layout = nullptr;
  WGPUComputePipeline pipeline = nullptr;

  void Release() {
    const wgpu::Api* api = wgpu::GetApi();
    if (api == nullptr || ShuttingDown()) return;
    if (pipeline) api->wgpuComputePipelineRelease(pipeline);
    if (layout) api->wgpuPipelineLayoutRelease(layout);
    if (group_layout) api->wgpuBindGroupLayoutRelease(group_layout);
    if (shader) api->wgpuShaderModuleRelease(shader);
    pipeline = nullptr;
    layout = nullptr;
    group_layout = nullptr;
    shader = nullptr;
  }
};

class WebGPUModuleObj final : public gpu::KernelModuleObj {
 public:
  WebGPUModuleObj(std::vector<KernelInfo> kernels,
                  std::vector<std::pair<std::string, std::string>> shaders)
      : KernelModuleObj(std::move(kernels)), shaders_(std::move(shaders)) {
    for (size_t i = 0; i < shaders_.size(); ++i) shader_index_[shaders_[i].first] = i;
    for (const KernelInfo& k : kernels_) {
      KernelPlan plan;
      plan.launch = LaunchConfig::From(k, kRuntime, [&](const std::string& tag) {
        if (tag.compare(0, std::strlen(kWriteAccessTag), kWriteAccessTag) != 0) return false;
        plan.write_access = ParseWriteAccess(tag, k.name);
        return true;
      });
      for (size_t a = 0; a < k.arg_types.size(); ++a) {
        (k.arg_types[a].code == kDLOpaqueHandle ? plan.buffer_args : plan.pod_args).push_back(a);
      }
      if (plan.write_access.empty()) plan.write_access.assign(plan.buffer_args.size(), 1);
      if (plan.write_access.size() != plan.buffer_args.size()) {
        TVM_FFI_THROW(ValueError) << "WebGPU kernel " << k.name << " has "
                                  << plan.buffer_args.size() << " buffer arguments but "
                                  << plan.write_access.size() << " write-access flags";
      }
      auto s = shader_index_.find(k.name);
      if (s != shader_index_.end()) {
        const std::string& code = shaders_[s->second].second;
        plan.inclusive_guard = code.find("> podArgs.packGridDimX") != std::string::npos &&
                               code.find(">= podArgs.packGridDimX") == std::string::npos;
      }
      plans_.push_back(std::move(plan));
    }
  }

  ~WebGPUModuleObj() {
    cache_.ForEach([](Pipeline& p) { p.Release(); });
  }

  const char* kind() const final { return "webgpu"; }

  ffi::Bytes SaveToBytes() const final {
    gpu::ByteWriter w;
    w.FunctionMap(kernels_);
    w.StringMap(shaders_);
    return ffi::Bytes(w.bytes());
  }

  ffi::String InspectSource(const ffi::String& /*format*/) const final {
    std::string all;
    for (const auto& kv : shaders_) all += kv.second + "\n";
    return ffi::String(all);
  }

  ffi::Array<ffi::String> GetWriteFormats() const final { return {ffi::String("wgsl")}; }

  void WriteToFile(const ffi::String& file_name, const ffi::String& format) const final {
    std::ofstream out(std::string(file_name), std::ios::binary);
    out << std::string(InspectSource(format));
    if (!out) TVM_FFI_THROW(RuntimeError) << "Cannot write " << file_name;
  }

  static ffi::Module LoadFromBytes(const ffi::Bytes& bytes) {
    gpu::ByteReader r(bytes.data(), bytes.size(), "WebGPU");
    std::vector<KernelInfo> kernels = r.FunctionMap();
    std::vector<std::pair<std::string, std::string>> shaders = r.StringMap();
    r.ExpectEnd();
    return ffi::Module(ffi::make_object<WebGPUModuleObj>(std::move(kernels), std::move(shaders)));
  }

 private:
  Pipeline* GetPipeline(size_t index) {
    return cache_.Get(0, index, [&]() { return Compile(index); });
  }

  std::unique_ptr<Pipeline> Compile(size_t index) {
    WebGPUWorkspace* ws = WebGPUWorkspace::Global();
    DeviceEntry& dev = ws->Entry(0);
    const wgpu::Api& api = ws->Api();
    const KernelInfo& info = kernels_[index];
    const KernelPlan& plan = plans_[index];
    auto s = shader_index_.find(info.name);
    if (s == shader_index_.end()) {
      TVM_FFI_THROW(RuntimeError) << "WebGPU kernel '" << info.name
                                  << "' has no WGSL shader in the module";
    }
    const std::string& code = shaders_[s->second].second;
    if (plan.buffer_args.size() > dev.limits.maxStorageBuffersPerShaderStage) {
      TVM_FFI_THROW(RuntimeError)
          << "WebGPU kernel '" << info.name << "' binds " << plan.buffer_args.size()
          << " storage buffers; " << dev.name << " allows " << dev.limits.maxStorageBuffersPerShaderStage
          << " per shader stage";
    }
    auto p = std::make_unique<Pipeline>();
    std::string error = ws->WithErrorScope([&]() {
      WGPUShaderSourceWGSL source = WGPU_SHADER_SOURCE_WGSL_INIT;
      source.code = wgpu::View(code);
      WGPUShaderModuleDescriptor mdesc = WGPU_SHADER_MODULE_DESCRIPTOR_INIT;
      mdesc.nextInChain = &source.chain;
      mdesc.label = wgpu::View(info.name);
      p->shader = api.wgpuDeviceCreateShaderModule(dev.device, &mdesc);

      std::vector<WGPUBindGroupLayoutEntry> entries;
      for (size_t b = 0; b <= plan.buffer_args.size(); ++b) {
        WGPUBindGroupLayoutEntry e = WGPU_BIND_GROUP_LAYOUT_ENTRY_INIT;
        e.binding = static_cast<uint32_t>(b);
        e.visibility = WGPUShaderStage_Compute;
        if (b == plan.buffer_args.size()) {
          e.buffer.type = WGPUBufferBindingType_Uniform;  // the scalar arguments (podArgs)
        } else {
          e.buffer.type = plan.write_access[b] ? WGPUBufferBindingType_Storage
                                               : WGPUBufferBindingType_ReadOnlyStorage;
        }
        entries.push_back(e);
      }
      WGPUBindGroupLayoutDescriptor gdesc = WGPU_BIND_GROUP_LAYOUT_DESCRIPTOR_INIT;
      gdesc.entryCount = entries.size();
      gdesc.entries = entries.data();
      p->group_layout = api.wgpuDeviceCreateBindGroupLayout(dev.device, &gdesc);
      WGPUPipelineLayoutDescriptor ldesc = WGPU_PIPELINE_LAYOUT_DESCRIPTOR_INIT;
      ldesc.bindGroupLayoutCount = 1;
      ldesc.bindGroupLayouts = &p->group_layout;
      p->layout = api.wgpuDeviceCreatePipelineLayout(dev.device, &ldesc);
      WGPUComputePipelineDescriptor cdesc = WGPU_COMPUTE_PIPELINE_DESCRIPTOR_INIT;
      cdesc.label = wgpu::View(info.name);
      cdesc.layout = p->layout;
      cdesc.compute.module = p->shader;
      cdesc.compute.entryPoint = wgpu::View(info.name);
      p->pipeline = api.wgpuDeviceCreateComputePipeline(dev.device, &cdesc);
    });
    if (!error.empty() || p->pipeline == nullptr) {
      p->Release();
      TVM_FFI_THROW(RuntimeError) << "WebGPU shader '" << info.name << "' failed to compile on "
                                  << dev.name << " (" << dev.backend << "). wgpu says:\n"
                                  << (error.empty() ? "(no message)" : error);
    }
    return p;
  }

  void Launch(size_t index, ffi::PackedArgs args) final {
    const KernelInfo& info = kernels_[index];
    const KernelPlan& plan = plans_[index];
    const TVMFFIAny* raw = gpu::KernelArgs(info, plan.launch, args.data(), args.size(), kRuntime);
    gpu::LaunchDims dims = gpu::ReadLaunch(info, plan.launch, raw);
    if (dims.empty) return;
    WebGPUWorkspace* ws = WebGPUWorkspace::Global();
    DeviceEntry& dev = ws->Entry(0);
    const wgpu::Api& api = ws->Api();
    Pipeline* p = GetPipeline(index);

    // the uniform: scalar arguments (32 bits each) then packGridDimX
    std::vector<uint32_t> pod(plan.pod_args.size() + 1, 0);
    for (size_t k = 0; k < plan.pod_args.size(); ++k) {
      size_t a = plan.pod_args[k];
      DLDataType t = info.arg_types[a];
      // TVM's WGSL declares every integer scalar i32/u32 (int64 shape variables included) and
      // floats f32: pass 32 bits, refusing a value that does not fit
      const bool is_int = t.code == kDLInt || t.code == kDLUInt;
      if ((!is_int && t.bits > 32) || !gpu::PackScalar(t, raw[a], 4, &pod[k])) {
        TVM_FFI_THROW(RuntimeError) << "WebGPU kernel " << info.name << ": argument " << a
                                    << " has type " << gpu::TypeName(t)
                                    << ", which cannot be passed to a WGSL shader";
      }
      const int64_t v = raw[a].v_int64;
      if (is_int && (t.code == kDLInt ? (v < INT32_MIN || v > INT32_MAX) : (v < 0 || v > UINT32_MAX))) {
        TVM_FFI_THROW(RuntimeError) << "WebGPU kernel " << info.name << ": argument " << a << " = "
                                    << v << " does not fit the 32-bit integer WGSL passes it as";
      }
    }
    if (dims.grid[2] != 1) {
      TVM_FFI_THROW(RuntimeError) << "WebGPU kernel " << info.name
                                  << " launches along blockIdx.z, which TVM's WGSL reserves";
    }
    const uint64_t limit = dev.limits.maxComputeWorkgroupsPerDimension;
    uint64_t gx = dims.grid[0], gz = 1;
    while (gx > limit) {  // fold x into z (the shader unfolds it)
      gx = (gx + 1) / 2;
      gz *= 2;
    }
    if (dims.grid[1] > limit || gz > limit) {
      TVM_FFI_THROW(RuntimeError) << "WebGPU kernel " << info.name << " needs a grid of "
                                  << dims.grid[0] << "x" << dims.grid[1] << " work groups; "
                                  << dev.name << " allows " << limit << " per dimension";
    }
    // with a "> packGridDimX" guard, the last valid block index is the one to pass
    pod.back() = static_cast<uint32_t>(plan.inclusive_guard ? dims.grid[0] - 1 : dims.grid[0]);

    WGPUBufferDescriptor udesc = WGPU_BUFFER_DESCRIPTOR_INIT;
    udesc.usage = WGPUBufferUsage_Uniform;
    udesc.size = RoundUp(pod.size() * 4, 16);
    udesc.mappedAtCreation = 1;
    WGPUBuffer uniform = api.wgpuDeviceCreateBuffer(dev.device, &udesc);
    void* mapped = uniform ? api.wgpuBufferGetMappedRange(uniform, 0, udesc.size) : nullptr;
    if (mapped == nullptr) {
      if (uniform) api.wgpuBufferRelease(uniform);
      TVM_FFI_THROW(RuntimeError) << "WebGPU: could not create the argument buffer of kernel "
                                  << info.name << ": " << ws->TakeErrors();
    }
    std::memset(mapped, 0, udesc.size);
    std::memcpy(mapped, pod.data(), pod.size() * 4);
    api.wgpuBufferUnmap(uniform);

    std::vector<WGPUBindGroupEntry> entries;
    for (size_t b = 0; b < plan.buffer_args.size(); ++b) {
      size_t a = plan.buffer_args[b];
      uint64_t size = 0;
      WGPUBindGroupEntry e = WGPU_BIND_GROUP_ENTRY_INIT;
      e.binding = static_cast<uint32_t>(b);
      e.buffer = ws->BufferOf(raw[a].v_ptr, &size);
      if (size > dev.limits.maxStorageBufferBindingSize) {
        api.wgpuBufferRelease(uniform);
        TVM_FFI_THROW(RuntimeError) << "WebGPU kernel " << info.name << ": argument " << a << " ("
                                    << size << " bytes) is larger than " << dev.name
                                    << "'s storage binding limit of "
                                    << dev.limits.maxStorageBufferBindingSize << " bytes";
      }
      e.offset = 0;
      e.size = size;
      entries.push_back(e);
    }
    WGPUBindGroupEntry u = WGPU_BIND_GROUP_ENTRY_INIT;
    u.binding = static_cast<uint32_t>(plan.buffer_args.size());
    u.buffer = uniform;
    u.offset = 0;
    u.size = udesc.size;
    entries.push_back(u);
    WGPUBindGroupDescriptor gdesc = WGPU_BIND_GROUP_DESCRIPTOR_INIT;
    gdesc.layout = p->group_layout;
    gdesc.entryCount = entries.size();
    gdesc.entries = entries.data();
    WGPUBindGroup group = api.wgpuDeviceCreateBindGroup(dev.device, &gdesc);
    try {
      ws->Dispatch(info.name, p->pipeline, group, static_cast<uint32_t>(gx),
                   static_cast<uint32_t>(dims.grid[1]), static_cast<uint32_t>(gz));
    } catch (...) {
      api.wgpuBindGroupRelease(group);
      api.wgpuBufferRelease(uniform);
      throw;
    }
    // recorded commands keep both alive until they have run
    api.wgpuBindGroupRelease(group);
    api.wgpuBufferRelease(uniform);
  }

  std::vector<std::pair<std::string, std::string>> shaders_;
  std::unordered_map<std::string, size_t> shader_index_;
  std::vector<KernelPlan> plans_;
  gpu::KernelCache<Pipeline> cache_;
};

// ---------------------------------------------------------------------------------------------
// registrations

namespace {

std::string VersionString(uint32_t v) {
  std::ostringstream os;
  os << (v >> 24) << "." << ((v >> 16) & 0xff) << "." << ((v >> 8) & 0xff) << "." << (v & 0xff);
  return os.str();
}

/*! \brief JSON: the wgpu-native library loaded and the adapter webgpu(0) is. */
std::string RuntimeInfo() {
  using gpu::JsonEscape;
  WebGPUWorkspace* ws = WebGPUWorkspace::Global();
  std::string why;
  bool ok = ws->Init(&why);
  const wgpu::Api* api = wgpu::GetApi();
  std::ostringstream os;
  os << "{\"runtime\": \"edgepack-vulkan\", \"version\": \"" EDGEPACK_VULKAN_VERSION "\", "
     << "\"library\": \"" << JsonEscape(wgpu::LoadedLibrary()) << "\", "
     << "\"wgpu_version\": \"" << (api ? VersionString(api->wgpuGetVersion()) : "") << "\", "
     << "\"available\": " << (ok ? "true" : "false") << ", "
     << "\"error\": \"" << JsonEscape(why) << "\", \"devices\": [";
  if (ok) {
    const DeviceEntry& e = ws->Entry(0);
    const WGPULimits& l = e.limits;
    os << "{\"index\": 0, \"name\": \"" << JsonEscape(e.name) << "\", \"vendor\": \""
       << JsonEscape(e.vendor) << "\", \"architecture\": \"" << JsonEscape(e.architecture)
       << "\", \"driver\": \"" << JsonEscape(e.description) << "\", \"backend\": \"" << e.backend
       << "\", \"type\": \"" << e.adapter_type << "\", \"vendor_id\": " << e.vendor_id
       << ", \"device_id\": " << e.device_id
       << ", \"max_workgroup_invocations\": " << l.maxComputeInvocationsPerWorkgroup
       << ", \"max_workgroup_size\": [" << l.maxComputeWorkgroupSizeX << ", "
       << l.maxComputeWorkgroupSizeY << ", " << l.maxComputeWorkgroupSizeZ << "]"
       << ", \"max_workgroup_storage\": " << l.maxComputeWorkgroupStorageSize
       << ", \"max_workgroups_per_dimension\": " << l.maxComputeWorkgroupsPerDimension
       << ", \"max_storage_buffers_per_stage\": " << l.maxStorageBuffersPerShaderStage
       << ", \"max_storage_binding_size\": " << l.maxStorageBufferBindingSize
       << ", \"max_buffer_size\": " << l.maxBufferSize
       << ", \"shader_f16\": " << (e.shader_f16 ? "true" : "false") << "}";
  }
  os << "]}";
  return os.str();
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  gpu::RegisterPlugin(
      "webgpu", "vulkan", [] { return WebGPUWorkspace::Global(); },
      [](const ffi::Bytes& bytes) { return WebGPUModuleObj::LoadFromBytes(bytes); }, RuntimeInfo);
}

}  // namespace vulkan
}  // namespace edgepack
