/*
 * opencl_module.cc - the TVM module that runs the OpenCL kernels TVM generated
 * ("ffi.Module.load_from_bytes.opencl"), and the global registrations of the plug-in.
 *
 * What TVM's OpenCL code generator stores (its SaveToBytes; little-endian, as TVM's streams):
 *   fmt  : str                      "cl" (OpenCL C source)
 *   fmap : u64 n, n x (key: str, FunctionInfo)
 *            FunctionInfo = name: str,
 *                           arg_types: u64 n, n x {u8 code, u8 bits, u16 lanes},
 *                           launch_param_tags: u64 n, n x str   ("blockIdx.x", "threadIdx.x", ...)
 *                           arg_extra_tags: u64 n, n x i32
 *   data : str                      the OpenCL C source; one section per kernel, each starting
 *                                   with a line "// Function: <name>"
 *   str = u64 length + bytes.
 *
 * A kernel call from TVM's host code passes the kernel's arguments (cl_mem buffers as opaque
 * pointers, then scalars) followed by one int64 per launch parameter tag: the grid
 * (blockIdx.*) and block (threadIdx.*) extents. The global work size is grid * block.
 *
 * Each kernel is built from its own section, lazily, the first time it is launched on a device,
 * and the cl_kernel is cached per device. A build failure is reported with the kernel name, the
 * device and the driver's build log.
 */
#include <tvm/ffi/any.h>
#include <tvm/ffi/cast.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>

#include "edgepack_gpu/kernel_cache.h"
#include "edgepack_gpu/kernel_module.h"
#include "edgepack_gpu/launch.h"
#include "edgepack_gpu/module_data.h"
#include "edgepack_gpu/util.h"
#include "opencl_common.h"

namespace edgepack {
namespace opencl {

namespace ffi = tvm::ffi;
// shared with the Vulkan runtime (runtimes/plugins/gpu-common): module data, launch sizes, kernel cache,
// lookup of kernels by name, registrations
using gpu::KernelInfo;
using gpu::LaunchConfig;

constexpr const char* kRuntime = "OpenCL";

struct CompiledKernel {
  cl::cl_program program = nullptr;
  cl::cl_kernel kernel = nullptr;
  std::mutex launch_mutex;  // clSetKernelArg + enqueue must not interleave between threads
};

class OpenCLModuleObj final : public gpu::KernelModuleObj {
 public:
  OpenCLModuleObj(std::string fmt, std::vector<KernelInfo> kernels, std::string source)
      : KernelModuleObj(std::move(kernels)), fmt_(std::move(fmt)), source_(std::move(source)) {
    for (const KernelInfo& k : kernels_) {
      // "tirx.use_required_block_dimension" is a hint: OpenCL takes the block size from the launch
      launch_.push_back(LaunchConfig::From(k, kRuntime, [](const std::string& tag) {
        return tag == "tirx.use_required_block_dimension";
      }));
    }
    SplitSections();
  }

  ~OpenCLModuleObj() {
    if (ShuttingDown() || cl::GetApi() == nullptr) return;
    const cl::Api& api = *cl::GetApi();
    compiled_.ForEach([&api](CompiledKernel& k) {
      if (k.kernel) api.ReleaseKernel(k.kernel);
      if (k.program) api.ReleaseProgram(k.program);
    });
  }

  const char* kind() const final { return "opencl"; }

  ffi::Bytes SaveToBytes() const final {
    gpu::ByteWriter w;
    w.Str(fmt_);
    w.FunctionMap(kernels_);
    w.Str(source_);
    return ffi::Bytes(w.bytes());
  }

  ffi::String InspectSource(const ffi::String& format) const final {
    std::string f(format);
    if (f.empty() || f == "cl" || f == "opencl" || f == fmt_) return ffi::String(source_);
    return ffi::String("");
  }

  ffi::Array<ffi::String> GetWriteFormats() const final { return {ffi::String("cl")}; }

  void WriteToFile(const ffi::String& file_name, const ffi::String& /*format*/) const final {
    std::ofstream out(std::string(file_name), std::ios::binary);
    out << source_;
    if (!out) TVM_FFI_THROW(RuntimeError) << "Cannot write " << file_name;
  }

  static ffi::Module LoadFromBytes(const ffi::Bytes& bytes) {
    gpu::ByteReader r(bytes.data(), bytes.size(), "OpenCL");
    std::string fmt = r.Str();
    std::vector<KernelInfo> kernels = r.FunctionMap();
    std::string source = r.Str();
    r.ExpectEnd();
    if (fmt != "cl") {
      TVM_FFI_THROW(ValueError) << "The OpenCL module holds '" << fmt
                                << "' code; edgepack's OpenCL runtime runs OpenCL C source "
                                   "('cl') only";
    }
    return ffi::Module(ffi::make_object<OpenCLModuleObj>(std::move(fmt), std::move(kernels),
                                                         std::move(source)));
  }

 private:
  void SplitSections() {
    static const std::string kMarker = "// Function: ";
    std::vector<std::pair<size_t, std::string>> starts;
    size_t pos = 0;
    while ((pos = source_.find(kMarker, pos)) != std::string::npos) {
      if (pos == 0 || source_[pos - 1] == '\n') {
        size_t name_begin = pos + kMarker.size();
        size_t eol = source_.find('\n', name_begin);
        std::string name = source_.substr(name_begin, eol == std::string::npos
                                                          ? std::string::npos
                                                          : eol - name_begin);
        while (!name.empty() && (name.back() == '\r' || name.back() == ' ')) name.pop_back();
        starts.emplace_back(pos, name);
      }
      pos += kMarker.size();
    }
    for (size_t i = 0; i < starts.size(); ++i) {
      size_t end = i + 1 < starts.size() ? starts[i + 1].first : source_.size();
      // a prologue before the first marker (pragmas, helpers) belongs to every section
      sections_[starts[i].second] =
          source_.substr(0, starts.empty() ? 0 : starts[0].first) +
          source_.substr(starts[i].first, end - starts[i].first);
    }
  }

  CompiledKernel* GetKernel(int dev_id, size_t index) {
    return compiled_.Get(dev_id, index, [&]() { return Build(dev_id, index); });
  }

  std::unique_ptr<CompiledKernel> Build(int dev_id, size_t index) {
    OpenCLWorkspace* ws = OpenCLWorkspace::Global();
    const KernelInfo& info = kernels_[index];
    const cl::Api& api = ws->Api();
    DeviceEntry& dev = ws->Entry(dev_id);
    auto sec = sections_.find(info.name);
    // without per-kernel sections, the whole source is one program
    const std::string& text = sec != sections_.end() ? sec->second : source_;
    auto entry = std::make_unique<CompiledKernel>();
    cl::cl_int err = cl::CL_SUCCESS;
    const char* src = text.c_str();
    size_t len = text.size();
    entry->program = api.CreateProgramWithSource(dev.context, 1, &src, &len, &err);
    if (err != cl::CL_SUCCESS) ThrowCLError(err, "clCreateProgramWithSource for " + info.name);
    const char* options = std::getenv("EDGEPACK_OPENCL_BUILD_OPTIONS");
    err = api.BuildProgram(entry->program, 1, &dev.id, options ? options : "", nullptr, nullptr);
    if (err != cl::CL_SUCCESS) {
      std::string log = BuildLog(api, entry->program, dev.id);
      api.ReleaseProgram(entry->program);
      TVM_FFI_THROW(RuntimeError)
          << "OpenCL kernel '" << info.name << "' failed to build on " << dev.name << " ("
          << dev.platform_name << "): " << cl::ErrorName(err) << ". Driver build log:\n"
          << (log.empty() ? std::string("(the driver gave no build log)") : log);
    }
    entry->kernel = api.CreateKernel(entry->program, info.name.c_str(), &err);
    if (err != cl::CL_SUCCESS) {
      api.ReleaseProgram(entry->program);
      ThrowCLError(err, "clCreateKernel(" + info.name + ")");
    }
    return entry;
  }

  static std::string BuildLog(const cl::Api& api, cl::cl_program program, cl::cl_device_id dev) {
    size_t size = 0;
    if (api.GetProgramBuildInfo(program, dev, cl::CL_PROGRAM_BUILD_LOG, 0, nullptr, &size) !=
            cl::CL_SUCCESS ||
        size == 0) {
      return "";
    }
    std::string log(size, '\0');
    api.GetProgramBuildInfo(program, dev, cl::CL_PROGRAM_BUILD_LOG, size, &log[0], nullptr);
    log.resize(std::strlen(log.c_str()));
    while (!log.empty() && (log.back() == '\n' || log.back() == ' ')) log.pop_back();
    return log;
  }

  void Launch(size_t index, ffi::PackedArgs args) final {
    const KernelInfo& info = kernels_[index];
    const LaunchConfig& launch = launch_[index];
    const size_t nargs = info.arg_types.size();
    const TVMFFIAny* raw = gpu::KernelArgs(info, launch, args.data(), args.size(), kRuntime);
    gpu::LaunchDims dims = gpu::ReadLaunch(info, launch, raw);
    if (dims.empty) return;  // nothing to do (dynamic shapes can give empty launches)
    OpenCLWorkspace* ws = OpenCLWorkspace::Global();
    const int dev_id = ws->CurrentDeviceId();
    CompiledKernel* k = GetKernel(dev_id, index);
    const cl::Api& api = *cl::GetApi();

    size_t global[3], local[3];
    for (int d = 0; d < 3; ++d) {
      global[d] = static_cast<size_t>(dims.grid[d] * dims.block[d]);
      local[d] = static_cast<size_t>(dims.block[d]);
    }

    std::lock_guard<std::mutex> lock(k->launch_mutex);
    for (size_t i = 0; i < nargs; ++i) {
      const DLDataType t = info.arg_types[i];
      const TVMFFIAny& a = raw[i];
      cl::cl_int err = cl::CL_SUCCESS;
      if (t.code == kDLOpaqueHandle) {
        cl::cl_mem mem = static_cast<cl::cl_mem>(a.v_ptr);
        err = api.SetKernelArg(k->kernel, static_cast<cl::cl_uint>(i), sizeof(cl::cl_mem), &mem);
      } else {
        // scalars in their own width: int8..int64 / uint8..uint64, float32, float64
        unsigned char value[8];
        const size_t width = t.bits / 8;
        if (t.bits % 8 != 0 || !gpu::PackScalar(t, a, width, value)) {
          TVM_FFI_THROW(RuntimeError) << "OpenCL kernel " << info.name << ": argument " << i
                                      << " has type " << gpu::TypeName(t)
                                      << ", which cannot be passed to an OpenCL kernel";
        }
        err = api.SetKernelArg(k->kernel, static_cast<cl::cl_uint>(i), width, value);
      }
      if (err != cl::CL_SUCCESS) {
        ThrowCLError(err, "clSetKernelArg(" + info.name + ", " + std::to_string(i) + ")");
      }
    }
    cl::cl_command_queue queue = ws->QueueFor(Device{kDLOpenCL, dev_id});
    cl::cl_int err = api.EnqueueNDRangeKernel(queue, k->kernel, launch.work_dim, nullptr, global,
                                              local, 0, nullptr, nullptr);
    if (err != cl::CL_SUCCESS) {
      DeviceEntry& dev = ws->Entry(dev_id);
      size_t kernel_wg = 0;
      api.GetKernelWorkGroupInfo(k->kernel, dev.id, cl::CL_KERNEL_WORK_GROUP_SIZE,
                                 sizeof(kernel_wg), &kernel_wg, nullptr);
      TVM_FFI_THROW(RuntimeError)
          << "Launching OpenCL kernel '" << info.name << "' on " << dev.name << " failed: "
          << cl::ErrorName(err) << " (global " << global[0] << "x" << global[1] << "x"
          << global[2] << ", local " << local[0] << "x" << local[1] << "x" << local[2]
          << "; the kernel allows work groups up to " << kernel_wg << ", the device "
          << dev.max_work_group_size << ")";
    }
    if (sync_each_launch_) {
      err = api.Finish(queue);
      if (err != cl::CL_SUCCESS) {
        TVM_FFI_THROW(RuntimeError) << "OpenCL kernel '" << info.name << "' failed on the device: "
                                    << cl::ErrorName(err);
      }
    }
  }

  std::string fmt_;
  std::string source_;
  std::vector<LaunchConfig> launch_;
  std::unordered_map<std::string, std::string> sections_;
  gpu::KernelCache<CompiledKernel> compiled_;
  bool sync_each_launch_ = gpu::EnvFlag("EDGEPACK_OPENCL_SYNC");
};

// ---------------------------------------------------------------------------------------------
// registrations

namespace {

using gpu::JsonEscape;

/*! \brief Whether a space-separated CL_DEVICE_EXTENSIONS string names ``name``. */
bool HasExtension(const std::string& extensions, const std::string& name) {
  std::istringstream words(extensions);
  std::string word;
  while (words >> word) {
    if (word == name) return true;
  }
  return false;
}

/*! \brief JSON: the OpenCL library loaded, and the devices tvm.opencl(i) maps to. */
std::string RuntimeInfo() {
  OpenCLWorkspace* ws = OpenCLWorkspace::Global();
  std::string why;
  bool ok = ws->Init(&why);
  std::ostringstream os;
  os << "{\"runtime\": \"edgepack-opencl\", \"version\": \"" EDGEPACK_OPENCL_VERSION "\", "
     << "\"library\": \"" << JsonEscape(cl::LoadedLibrary()) << "\", "
     << "\"available\": " << (ok ? "true" : "false") << ", "
     << "\"error\": \"" << JsonEscape(why) << "\", \"devices\": [";
  for (size_t i = 0; ok && i < ws->NumDevices(); ++i) {
    const DeviceEntry& e = ws->Entry(static_cast<int>(i));
    os << (i ? ", " : "") << "{\"index\": " << i << ", \"name\": \"" << JsonEscape(e.name)
       << "\", \"vendor\": \"" << JsonEscape(e.vendor) << "\", \"platform\": \""
       << JsonEscape(e.platform_name) << "\", \"version\": \"" << JsonEscape(e.version)
       << "\", \"driver\": \"" << JsonEscape(e.driver_version) << "\", \"type\": \""
       << ((e.type & cl::CL_DEVICE_TYPE_GPU) ? "gpu"
           : (e.type & cl::CL_DEVICE_TYPE_CPU) ? "cpu"
                                                : "other")
       << "\", \"compute_units\": " << e.compute_units
       << ", \"max_work_group_size\": " << e.max_work_group_size
       << ", \"local_mem_size\": " << e.local_mem_size
       << ", \"global_mem_size\": " << e.global_mem_size
       << ", \"fp16\": " << (HasExtension(e.extensions, "cl_khr_fp16") ? "true" : "false") << "}";
  }
  os << "]}";
  return os.str();
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  gpu::RegisterPlugin(
      "opencl", "opencl", [] { return OpenCLWorkspace::Global(); },
      [](const ffi::Bytes& bytes) { return OpenCLModuleObj::LoadFromBytes(bytes); }, RuntimeInfo);
}

}  // namespace opencl
}  // namespace edgepack
