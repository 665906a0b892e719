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
#include <unordered_map>

#include "opencl_common.h"

namespace edgepack {
namespace opencl {

namespace ffi = tvm::ffi;

// ---------------------------------------------------------------------------------------------
// (de)serialization

class ByteReader {
 public:
  ByteReader(const char* data, size_t size) : data_(data), size_(size) {}

  uint64_t U64() {
    Need(8, "integer");
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
    pos_ += 8;
    return v;
  }
  int32_t I32() {
    Need(4, "integer");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
    pos_ += 4;
    return static_cast<int32_t>(v);
  }
  DLDataType DType() {
    Need(4, "data type");
    DLDataType t;
    t.code = static_cast<uint8_t>(data_[pos_]);
    t.bits = static_cast<uint8_t>(data_[pos_ + 1]);
    t.lanes = static_cast<uint16_t>(static_cast<uint8_t>(data_[pos_ + 2]) |
                                    (static_cast<uint8_t>(data_[pos_ + 3]) << 8));
    pos_ += 4;
    return t;
  }
  std::string Str() {
    uint64_t n = Count(1);
    std::string s(data_ + pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  // an element count, checked against what is left (so corrupt input cannot allocate wildly)
  uint64_t Count(size_t min_element_size) {
    uint64_t n = U64();
    if (n > (size_ - pos_) / std::max<size_t>(min_element_size, 1)) Fail("count");
    return n;
  }
  bool AtEnd() const { return pos_ == size_; }

 private:
  void Need(size_t n, const char* what) {
    if (size_ - pos_ < n) Fail(what);
  }
  [[noreturn]] void Fail(const char* what) {
    TVM_FFI_THROW(ValueError) << "The OpenCL module data is truncated or corrupt (bad " << what
                              << " at byte " << pos_ << " of " << size_ << ")";
    TVM_FFI_UNREACHABLE();
  }
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

class ByteWriter {
 public:
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void I32(int32_t v) {
    uint32_t u = static_cast<uint32_t>(v);
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  void DType(DLDataType t) {
    out_.push_back(static_cast<char>(t.code));
    out_.push_back(static_cast<char>(t.bits));
    out_.push_back(static_cast<char>(t.lanes & 0xff));
    out_.push_back(static_cast<char>((t.lanes >> 8) & 0xff));
  }
  void Str(const std::string& s) {
    U64(s.size());
    out_ += s;
  }
  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
};

// ---------------------------------------------------------------------------------------------
// kernels

struct KernelInfo {
  std::string name;
  std::vector<DLDataType> arg_types;
  std::vector<std::string> launch_param_tags;
  std::vector<int32_t> arg_extra_tags;
};

/*! \brief Where each launch parameter goes: 0-2 grid x/y/z, 3-5 block x/y/z. */
struct LaunchConfig {
  std::vector<int> slots;
  cl::cl_uint work_dim = 1;

  static LaunchConfig From(const KernelInfo& info) {
    LaunchConfig c;
    bool filled[6] = {false, false, false, false, false, false};
    for (const std::string& tag : info.launch_param_tags) {
      int rank = -1;
      if (tag.compare(0, 9, "blockIdx.") == 0) {
        rank = 0;
      } else if (tag.compare(0, 10, "threadIdx.") == 0) {
        rank = 1;
      } else if (tag == "tirx.use_required_block_dimension") {
        continue;  // a hint; OpenCL takes the block size from the launch anyway
      } else {
        TVM_FFI_THROW(RuntimeError) << "OpenCL kernel " << info.name
                                    << " needs launch parameter '" << tag
                                    << "', which edgepack's OpenCL runtime does not support";
      }
      char axis = tag.back();
      if (axis < 'x' || axis > 'z') {
        TVM_FFI_THROW(RuntimeError) << "OpenCL kernel " << info.name
                                    << ": unknown launch parameter '" << tag << "'";
      }
      int slot = rank * 3 + (axis - 'x');
      c.slots.push_back(slot);
      filled[slot] = true;
    }
    for (int i = 0; i < 3; ++i) {
      if (filled[i] || filled[i + 3]) c.work_dim = static_cast<cl::cl_uint>(i + 1);
    }
    return c;
  }
};

struct CompiledKernel {
  cl::cl_program program = nullptr;
  cl::cl_kernel kernel = nullptr;
  std::mutex launch_mutex;  // clSetKernelArg + enqueue must not interleave between threads
};

bool EnvFlag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

class OpenCLModuleObj final : public ffi::ModuleObj {
 public:
  OpenCLModuleObj(std::string fmt, std::vector<KernelInfo> kernels, std::string source)
      : fmt_(std::move(fmt)), kernels_(std::move(kernels)), source_(std::move(source)) {
    for (size_t i = 0; i < kernels_.size(); ++i) {
      index_[kernels_[i].name] = i;
      launch_.push_back(LaunchConfig::From(kernels_[i]));
    }
    SplitSections();
  }

  ~OpenCLModuleObj() {
    if (ShuttingDown() || cl::GetApi() == nullptr) return;
    const cl::Api& api = *cl::GetApi();
    for (auto& per_device : compiled_) {
      for (auto& kv : per_device) {
        if (kv.second->kernel) api.ReleaseKernel(kv.second->kernel);
        if (kv.second->program) api.ReleaseProgram(kv.second->program);
      }
    }
  }

  const char* kind() const final { return "opencl"; }

  int GetPropertyMask() const final {
    return ffi::Module::kBinarySerializable | ffi::Module::kRunnable;
  }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    auto it = index_.find(std::string(name));
    if (it == index_.end()) return std::nullopt;
    size_t index = it->second;
    ffi::Module self = ffi::GetRef<ffi::Module>(this);  // keeps the module alive
    return ffi::Function::FromPacked([self, this, index](ffi::PackedArgs args, ffi::Any* rv) {
      (void)rv;
      this->Launch(index, args);
    });
  }

  ffi::Bytes SaveToBytes() const final {
    ByteWriter w;
    w.Str(fmt_);
    w.U64(kernels_.size());
    for (const KernelInfo& k : kernels_) {
      w.Str(k.name);  // key
      w.Str(k.name);
      w.U64(k.arg_types.size());
      for (DLDataType t : k.arg_types) w.DType(t);
      w.U64(k.launch_param_tags.size());
      for (const std::string& tag : k.launch_param_tags) w.Str(tag);
      w.U64(k.arg_extra_tags.size());
      for (int32_t t : k.arg_extra_tags) w.I32(t);
    }
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
    ByteReader r(bytes.data(), bytes.size());
    std::string fmt = r.Str();
    uint64_t n = r.Count(8);
    std::vector<KernelInfo> kernels;
    for (uint64_t i = 0; i < n; ++i) {
      KernelInfo k;
      std::string key = r.Str();
      k.name = r.Str();
      if (k.name.empty()) k.name = key;
      uint64_t nargs = r.Count(4);
      for (uint64_t j = 0; j < nargs; ++j) k.arg_types.push_back(r.DType());
      uint64_t ntags = r.Count(8);
      for (uint64_t j = 0; j < ntags; ++j) k.launch_param_tags.push_back(r.Str());
      uint64_t nextra = r.Count(4);
      for (uint64_t j = 0; j < nextra; ++j) k.arg_extra_tags.push_back(r.I32());
      kernels.push_back(std::move(k));
    }
    std::string source = r.Str();
    if (!r.AtEnd()) {
      TVM_FFI_THROW(ValueError) << "The OpenCL module data has trailing bytes: not a module "
                                   "written by TVM 0.27's OpenCL code generator";
    }
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
    OpenCLWorkspace* ws = OpenCLWorkspace::Global();
    const KernelInfo& info = kernels_[index];
    std::lock_guard<std::mutex> lock(mutex_);
    if (compiled_.size() <= static_cast<size_t>(dev_id)) compiled_.resize(dev_id + 1);
    auto& table = compiled_[dev_id];
    auto it = table.find(info.name);
    if (it != table.end()) return it->second.get();

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
    CompiledKernel* raw = entry.get();
    table[info.name] = std::move(entry);
    return raw;
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

  void Launch(size_t index, ffi::PackedArgs args) {
    const KernelInfo& info = kernels_[index];
    const LaunchConfig& launch = launch_[index];
    const size_t nargs = info.arg_types.size();
    if (static_cast<size_t>(args.size()) < nargs + launch.slots.size()) {
      TVM_FFI_THROW(RuntimeError) << "OpenCL kernel " << info.name << " expects "
                                  << nargs + launch.slots.size() << " arguments, got "
                                  << args.size();
    }
    const TVMFFIAny* raw = reinterpret_cast<const TVMFFIAny*>(args.data());
    OpenCLWorkspace* ws = OpenCLWorkspace::Global();
    const int dev_id = ws->CurrentDeviceId();
    CompiledKernel* k = GetKernel(dev_id, index);
    const cl::Api& api = *cl::GetApi();

    size_t grid[3] = {1, 1, 1};
    size_t block[3] = {1, 1, 1};
    for (size_t i = 0; i < launch.slots.size(); ++i) {
      int64_t v = raw[nargs + i].v_int64;
      if (v <= 0) return;  // nothing to do (dynamic shapes can give empty launches)
      int slot = launch.slots[i];
      (slot < 3 ? grid[slot] : block[slot - 3]) = static_cast<size_t>(v);
    }
    size_t global[3], local[3];
    for (int d = 0; d < 3; ++d) {
      global[d] = grid[d] * block[d];
      local[d] = block[d];
    }

    std::lock_guard<std::mutex> lock(k->launch_mutex);
    for (size_t i = 0; i < nargs; ++i) {
      const DLDataType t = info.arg_types[i];
      const TVMFFIAny& a = raw[i];
      cl::cl_int err = cl::CL_SUCCESS;
      if (t.code == kDLOpaqueHandle) {
        cl::cl_mem mem = static_cast<cl::cl_mem>(a.v_ptr);
        err = api.SetKernelArg(k->kernel, static_cast<cl::cl_uint>(i), sizeof(cl::cl_mem), &mem);
      } else if (t.lanes != 1) {
        TVM_FFI_THROW(RuntimeError) << "OpenCL kernel " << info.name << ": vector argument "
                                    << i << " is not supported";
      } else if (t.code == kDLFloat && t.bits == 32) {
        float v = static_cast<float>(a.v_float64);
        err = api.SetKernelArg(k->kernel, static_cast<cl::cl_uint>(i), sizeof(v), &v);
      } else if (t.code == kDLFloat && t.bits == 64) {
        double v = a.v_float64;
        err = api.SetKernelArg(k->kernel, static_cast<cl::cl_uint>(i), sizeof(v), &v);
      } else if ((t.code == kDLInt || t.code == kDLUInt) &&
                 (t.bits == 8 || t.bits == 16 || t.bits == 32 || t.bits == 64)) {
        // little-endian: the low bytes of the int64 are the narrower integer
        int64_t v = a.v_int64;
        err = api.SetKernelArg(k->kernel, static_cast<cl::cl_uint>(i), t.bits / 8, &v);
      } else {
        TVM_FFI_THROW(RuntimeError) << "OpenCL kernel " << info.name << ": argument " << i
                                    << " has type " << ffi::DLDataTypeToString(t)
                                    << ", which cannot be passed to an OpenCL kernel";
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
  std::vector<KernelInfo> kernels_;
  std::string source_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<LaunchConfig> launch_;
  std::unordered_map<std::string, std::string> sections_;
  std::mutex mutex_;
  std::vector<std::unordered_map<std::string, std::unique_ptr<CompiledKernel>>> compiled_;
  bool sync_each_launch_ = EnvFlag("EDGEPACK_OPENCL_SYNC");
};

// ---------------------------------------------------------------------------------------------
// registrations

namespace {

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
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
       << ", \"global_mem_size\": " << e.global_mem_size << "}";
  }
  os << "]}";
  return os.str();
}

/*! \brief Whether ``mod`` or a module it imports (recursively) runs OpenCL kernels. */
bool UsesOpenCL(const ffi::Module& mod, int depth = 0) {
  if (std::strcmp(mod->kind(), "opencl") == 0) return true;
  if (depth > 16) return false;
  for (const ffi::Any& item : mod->imports()) {
    if (auto child = item.try_cast<ffi::Module>()) {
      if (UsesOpenCL(child.value(), depth + 1)) return true;
    }
  }
  return false;
}

// A name already taken means another copy of this plug-in (from another path) was loaded
// first: it wins, so device pointers and modules never mix two copies' state.
bool Taken(const char* name) { return ffi::Function::GetGlobal(name).has_value(); }

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  if (!Taken("device_api.opencl")) {
    refl::GlobalDef().def_packed("device_api.opencl", [](ffi::PackedArgs, ffi::Any* rv) {
      *rv = static_cast<void*>(static_cast<DeviceAPI*>(OpenCLWorkspace::Global()));
    });
  }
  if (!Taken("ffi.Module.load_from_bytes.opencl")) {
    refl::GlobalDef().def("ffi.Module.load_from_bytes.opencl", [](const ffi::Bytes& bytes) {
      return OpenCLModuleObj::LoadFromBytes(bytes);
    });
  }
  if (!Taken("edgepack.opencl.uses_opencl")) {
    // for C programs (edgepack.c): does this model need the OpenCL device?
    refl::GlobalDef().def("edgepack.opencl.uses_opencl",
                          [](const ffi::Module& mod) { return UsesOpenCL(mod); });
  }
  if (!Taken("edgepack.opencl.runtime_info")) {
    refl::GlobalDef().def("edgepack.opencl.runtime_info",
                          []() { return ffi::String(RuntimeInfo()); });
  }
}

}  // namespace opencl
}  // namespace edgepack
