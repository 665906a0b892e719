/*
 * opencl_device_api.cc - TVM DeviceAPI for OpenCL devices ("device_api.opencl").
 *
 * Devices: every device of every platform the ICD loader lists, GPUs only when there is at
 * least one GPU (EDGEPACK_OPENCL_DEVICE_TYPE=gpu|cpu|accelerator|all overrides; and
 * EDGEPACK_OPENCL_PLATFORM=<substring of the platform name> narrows the platforms).
 * tvm.opencl(i) is the i-th of them. One context per platform, one in-order queue per device;
 * CreateStream makes more queues.
 */
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "edgepack_gpu/util.h"
#include "opencl_common.h"

namespace edgepack {
namespace opencl {

namespace {

std::atomic<bool> g_exiting{false};

thread_local int t_current_device = 0;
// the stream (queue) SetStream made current, per device id, on this thread
thread_local std::unordered_map<int, cl::cl_command_queue> t_streams;

using gpu::Lower;

std::string PlatformString(const cl::Api& api, cl::cl_platform_id p, cl::cl_platform_info what) {
  size_t size = 0;
  if (api.GetPlatformInfo(p, what, 0, nullptr, &size) != cl::CL_SUCCESS || size == 0) return "";
  std::string s(size, '\0');
  if (api.GetPlatformInfo(p, what, size, &s[0], nullptr) != cl::CL_SUCCESS) return "";
  s.resize(std::strlen(s.c_str()));
  return s;
}

std::string DeviceString(const cl::Api& api, cl::cl_device_id d, cl::cl_device_info what) {
  size_t size = 0;
  if (api.GetDeviceInfo(d, what, 0, nullptr, &size) != cl::CL_SUCCESS || size == 0) return "";
  std::string s(size, '\0');
  if (api.GetDeviceInfo(d, what, size, &s[0], nullptr) != cl::CL_SUCCESS) return "";
  s.resize(std::strlen(s.c_str()));
  return s;
}

template <typename T>
T DeviceValue(const cl::Api& api, cl::cl_device_id d, cl::cl_device_info what) {
  T value{};
  if (api.GetDeviceInfo(d, what, sizeof(T), &value, nullptr) != cl::CL_SUCCESS) return T{};
  return value;
}

cl::cl_device_type WantedType(bool* explicit_choice) {
  const char* env = std::getenv("EDGEPACK_OPENCL_DEVICE_TYPE");
  *explicit_choice = env != nullptr && *env != '\0';
  if (!*explicit_choice) return cl::CL_DEVICE_TYPE_GPU;
  std::string v = Lower(env);
  if (v == "gpu") return cl::CL_DEVICE_TYPE_GPU;
  if (v == "cpu") return cl::CL_DEVICE_TYPE_CPU;
  if (v == "accelerator") return cl::CL_DEVICE_TYPE_ACCELERATOR;
  return cl::CL_DEVICE_TYPE_ALL;
}

std::string OpenCLVersionNumber(const std::string& version) {
  // "OpenCL 3.0 PoCL ..." -> "3.0"
  const std::string prefix = "OpenCL ";
  if (version.compare(0, prefix.size(), prefix) != 0) return version;
  std::string rest = version.substr(prefix.size());
  return rest.substr(0, rest.find(' '));
}

gpu::DeviceAttrs Attrs(const cl::Api& api, const DeviceEntry& e) {
  gpu::DeviceAttrs a;
  a.max_threads_per_block = static_cast<int64_t>(e.max_work_group_size);
  a.max_shared_memory_per_block = static_cast<int64_t>(e.local_mem_size);
  for (int d = 0; d < 3; ++d) a.max_thread_dims[d] = static_cast<int64_t>(e.max_work_item_sizes[d]);
  a.name = e.name;
  a.compute_version = OpenCLVersionNumber(e.version);
  a.driver_version = e.driver_version;
  a.api_version = 120;  // the OpenCL API level this runtime uses
  a.max_clock_khz = static_cast<int64_t>(e.max_clock_mhz) * 1000;  // kHz, as the CUDA runtime reports
  a.multi_processor_count = static_cast<int64_t>(e.compute_units);
  a.l2_cache_bytes = static_cast<int64_t>(e.global_mem_cache_size);
  a.total_global_memory = static_cast<int64_t>(e.global_mem_size);
  cl::cl_uint align = 0;  // OpenCL 2.0+: unset where the driver does not answer
  if (api.GetDeviceInfo(e.id, cl::CL_DEVICE_IMAGE_PITCH_ALIGNMENT, sizeof(align), &align, nullptr) ==
      cl::CL_SUCCESS) {
    a.image_pitch_alignment = static_cast<int64_t>(align);
  }
  return a;
}

}  // namespace

bool ShuttingDown() { return g_exiting.load(std::memory_order_relaxed); }

void ThrowCLError(cl::cl_int code, const std::string& what) {
  TVM_FFI_THROW(RuntimeError) << "OpenCL error " << cl::ErrorName(code) << " (" << code
                              << ") in " << what;
  TVM_FFI_UNREACHABLE();
}

OpenCLWorkspace* OpenCLWorkspace::Global() {
  // never destroyed: the driver may be gone when static destructors run
  static OpenCLWorkspace* inst = new OpenCLWorkspace();
  return inst;
}

bool OpenCLWorkspace::Init(std::string* why) {
  std::call_once(init_once_, [this] {
    const cl::Api* api = cl::GetApi();
    if (api == nullptr) {
      init_error_ = cl::LoadError();
      return;
    }
    // At exit, skip releasing OpenCL objects: drivers tear themselves down in their own
    // destructors, which run after atexit handlers registered now.
    std::atexit([] { g_exiting.store(true); });
    cl::cl_uint num_platforms = 0;
    cl::cl_int err = api->GetPlatformIDs(0, nullptr, &num_platforms);
    if (err != cl::CL_SUCCESS || num_platforms == 0) {
      init_error_ = std::string("the OpenCL library ") + cl::LoadedLibrary() +
                    " lists no platform (" + cl::ErrorName(err) +
                    "): no OpenCL driver (ICD) is installed or visible";
      return;
    }
    std::vector<cl::cl_platform_id> platforms(num_platforms);
    api->GetPlatformIDs(num_platforms, platforms.data(), nullptr);
    const char* platform_filter = std::getenv("EDGEPACK_OPENCL_PLATFORM");
    bool explicit_type = false;
    cl::cl_device_type wanted = WantedType(&explicit_type);

    auto collect = [&](cl::cl_device_type type) {
      std::vector<DeviceEntry> found;
      for (cl::cl_platform_id p : platforms) {
        std::string pname = PlatformString(*api, p, cl::CL_PLATFORM_NAME);
        if (platform_filter && *platform_filter &&
            Lower(pname).find(Lower(platform_filter)) == std::string::npos) {
          continue;
        }
        cl::cl_uint n = 0;
        if (api->GetDeviceIDs(p, type, 0, nullptr, &n) != cl::CL_SUCCESS || n == 0) continue;
        std::vector<cl::cl_device_id> ids(n);
        api->GetDeviceIDs(p, type, n, ids.data(), nullptr);
        for (cl::cl_device_id id : ids) {
          DeviceEntry e;
          e.platform = p;
          e.id = id;
          e.platform_name = pname;
          found.push_back(e);
        }
      }
      return found;
    };
    std::vector<DeviceEntry> found = collect(wanted);
    if (found.empty() && !explicit_type) found = collect(cl::CL_DEVICE_TYPE_ALL);
    if (found.empty()) {
      init_error_ = "no OpenCL device found (library " + cl::LoadedLibrary() + ")";
      return;
    }
    // one context per platform, holding that platform's chosen devices
    std::unordered_map<cl::cl_platform_id, cl::cl_context> contexts;
    for (DeviceEntry& e : found) {
      if (contexts.count(e.platform)) continue;
      std::vector<cl::cl_device_id> ids;
      for (const DeviceEntry& o : found) {
        if (o.platform == e.platform) ids.push_back(o.id);
      }
      cl::cl_context_properties props[] = {
          cl::CL_CONTEXT_PLATFORM, reinterpret_cast<cl::cl_context_properties>(e.platform), 0};
      cl::cl_int cerr = cl::CL_SUCCESS;
      cl::cl_context ctx = api->CreateContext(props, static_cast<cl::cl_uint>(ids.size()),
                                              ids.data(), nullptr, nullptr, &cerr);
      if (cerr != cl::CL_SUCCESS || ctx == nullptr) {
        init_error_ = std::string("clCreateContext failed on platform ") + e.platform_name +
                      ": " + cl::ErrorName(cerr);
        return;
      }
      contexts[e.platform] = ctx;
    }
    for (DeviceEntry& e : found) {
      e.context = contexts[e.platform];
      cl::cl_int qerr = cl::CL_SUCCESS;
      e.queue = api->CreateCommandQueue(e.context, e.id, 0, &qerr);
      if (qerr != cl::CL_SUCCESS || e.queue == nullptr) {
        init_error_ = std::string("clCreateCommandQueue failed: ") + cl::ErrorName(qerr);
        return;
      }
      e.type = DeviceValue<cl::cl_device_type>(*api, e.id, cl::CL_DEVICE_TYPE);
      e.name = DeviceString(*api, e.id, cl::CL_DEVICE_NAME);
      e.vendor = DeviceString(*api, e.id, cl::CL_DEVICE_VENDOR);
      e.version = DeviceString(*api, e.id, cl::CL_DEVICE_VERSION);
      e.driver_version = DeviceString(*api, e.id, cl::CL_DRIVER_VERSION);
      e.extensions = DeviceString(*api, e.id, cl::CL_DEVICE_EXTENSIONS);
      e.max_work_group_size = DeviceValue<size_t>(*api, e.id, cl::CL_DEVICE_MAX_WORK_GROUP_SIZE);
      api->GetDeviceInfo(e.id, cl::CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof(e.max_work_item_sizes),
                         e.max_work_item_sizes, nullptr);
      e.local_mem_size = DeviceValue<cl::cl_ulong>(*api, e.id, cl::CL_DEVICE_LOCAL_MEM_SIZE);
      e.global_mem_size = DeviceValue<cl::cl_ulong>(*api, e.id, cl::CL_DEVICE_GLOBAL_MEM_SIZE);
      e.global_mem_cache_size =
          DeviceValue<cl::cl_ulong>(*api, e.id, cl::CL_DEVICE_GLOBAL_MEM_CACHE_SIZE);
      e.compute_units = DeviceValue<cl::cl_uint>(*api, e.id, cl::CL_DEVICE_MAX_COMPUTE_UNITS);
      e.max_clock_mhz = DeviceValue<cl::cl_uint>(*api, e.id, cl::CL_DEVICE_MAX_CLOCK_FREQUENCY);
      e.attrs = Attrs(*api, e);
    }
    devices_ = std::move(found);
    initialized_ = true;
  });
  if (!initialized_ && why != nullptr) *why = init_error_;
  return initialized_;
}

const cl::Api& OpenCLWorkspace::Api() {
  std::string why;
  if (!Init(&why)) {
    TVM_FFI_THROW(RuntimeError) << "OpenCL is not available: " << why;
  }
  return *cl::GetApi();
}

size_t OpenCLWorkspace::NumDevices() { return Init() ? devices_.size() : 0; }

DeviceEntry& OpenCLWorkspace::Entry(int dev_id) {
  Api();
  if (dev_id < 0 || static_cast<size_t>(dev_id) >= devices_.size()) {
    TVM_FFI_THROW(IndexError) << "opencl(" << dev_id << ") does not exist: this machine has "
                              << devices_.size() << " OpenCL device(s)";
  }
  return devices_[dev_id];
}

int OpenCLWorkspace::CurrentDeviceId() const { return t_current_device; }

cl::cl_command_queue OpenCLWorkspace::QueueFor(Device dev) {
  DeviceEntry& e = Entry(dev.device_id);
  auto it = t_streams.find(dev.device_id);
  if (it != t_streams.end() && it->second != nullptr) return it->second;
  return e.queue;
}

void OpenCLWorkspace::SetDevice(Device dev) { t_current_device = dev.device_id; }

const gpu::DeviceAttrs* OpenCLWorkspace::AttrsOf(int dev_id) {
  if (!Init() || dev_id < 0 || static_cast<size_t>(dev_id) >= devices_.size()) return nullptr;
  return &devices_[dev_id].attrs;
}

void OpenCLWorkspace::GetAttr(Device dev, DeviceAttrKind kind, tvm::ffi::Any* rv) {
  gpu::GetDeviceAttr(AttrsOf(dev.device_id), kind, rv);
}

void OpenCLWorkspace::GetTargetProperty(Device dev, const std::string& property,
                                        tvm::ffi::Any* rv) {
  gpu::GetDeviceTargetProperty(AttrsOf(dev.device_id), property, rv);
}

void* OpenCLWorkspace::AllocDataSpace(Device dev, size_t nbytes, size_t /*alignment*/,
                                      DLDataType /*type_hint*/) {
  DeviceEntry& e = Entry(dev.device_id);
  cl::cl_int err = cl::CL_SUCCESS;
  // a zero-sized buffer is invalid in OpenCL; TVM may ask for one (empty tensors)
  cl::cl_mem mem =
      Api().CreateBuffer(e.context, cl::CL_MEM_READ_WRITE, std::max<size_t>(nbytes, 1), nullptr,
                         &err);
  if (err != cl::CL_SUCCESS || mem == nullptr) {
    TVM_FFI_THROW(RuntimeError) << "OpenCL could not allocate " << nbytes << " bytes on "
                                << e.name << ": " << cl::ErrorName(err);
  }
  return mem;
}

void OpenCLWorkspace::FreeDataSpace(Device /*dev*/, void* ptr) {
  if (ptr == nullptr || ShuttingDown()) return;
  // the driver keeps the buffer alive until the commands that use it have finished
  cl::GetApi()->ReleaseMemObject(static_cast<cl::cl_mem>(ptr));
}

TVMStreamHandle OpenCLWorkspace::CreateStream(Device dev) {
  DeviceEntry& e = Entry(dev.device_id);
  cl::cl_int err = cl::CL_SUCCESS;
  cl::cl_command_queue q = Api().CreateCommandQueue(e.context, e.id, 0, &err);
  if (err != cl::CL_SUCCESS) ThrowCLError(err, "clCreateCommandQueue");
  return q;
}

void OpenCLWorkspace::FreeStream(Device dev, TVMStreamHandle stream) {
  if (stream == nullptr || ShuttingDown()) return;
  auto it = t_streams.find(dev.device_id);
  if (it != t_streams.end() && it->second == stream) t_streams.erase(it);
  EDGEPACK_CL_CALL(Api().Finish(static_cast<cl::cl_command_queue>(stream)));
  Api().ReleaseCommandQueue(static_cast<cl::cl_command_queue>(stream));
}

void OpenCLWorkspace::StreamSync(Device dev, TVMStreamHandle stream) {
  cl::cl_command_queue q =
      stream != nullptr ? static_cast<cl::cl_command_queue>(stream) : QueueFor(dev);
  cl::cl_int err = Api().Finish(q);
  if (err != cl::CL_SUCCESS) {
    TVM_FFI_THROW(RuntimeError) << "OpenCL: waiting for the device " << Entry(dev.device_id).name
                                << " failed with " << cl::ErrorName(err)
                                << " (a kernel failed; run with EDGEPACK_OPENCL_SYNC=1 to find it)";
  }
}

void OpenCLWorkspace::SetStream(Device dev, TVMStreamHandle stream) {
  t_streams[dev.device_id] = static_cast<cl::cl_command_queue>(stream);
}

TVMStreamHandle OpenCLWorkspace::GetCurrentStream(Device dev) {
  auto it = t_streams.find(dev.device_id);
  return it != t_streams.end() ? it->second : nullptr;
}

void OpenCLWorkspace::SyncStreamFromTo(Device dev, TVMStreamHandle event_src,
                                       TVMStreamHandle /*event_dst*/) {
  // in-order queues: finishing the source is enough for the destination to see its results
  StreamSync(dev, event_src);
}

void OpenCLWorkspace::CopyDataFromTo(const void* from, size_t from_offset, void* to,
                                     size_t to_offset, size_t size, Device dev_from,
                                     Device dev_to, DLDataType /*type_hint*/,
                                     TVMStreamHandle stream) {
  if (size == 0) return;
  const cl::Api& api = Api();
  const bool from_cl = dev_from.device_type == kDLOpenCL;
  const bool to_cl = dev_to.device_type == kDLOpenCL;
  auto queue_of = [&](Device d) {
    return stream != nullptr ? static_cast<cl::cl_command_queue>(stream) : QueueFor(d);
  };
  if (from_cl && to_cl) {
    DeviceEntry& src = Entry(dev_from.device_id);
    DeviceEntry& dst = Entry(dev_to.device_id);
    if (src.context == dst.context) {
      cl::cl_command_queue q = queue_of(dev_from);
      EDGEPACK_CL_CALL(api.EnqueueCopyBuffer(q, static_cast<cl::cl_mem>(const_cast<void*>(from)),
                                             static_cast<cl::cl_mem>(to), from_offset, to_offset,
                                             size, 0, nullptr, nullptr));
      if (dev_from.device_id != dev_to.device_id) EDGEPACK_CL_CALL(api.Finish(q));
    } else {
      std::vector<char> staging(size);
      EDGEPACK_CL_CALL(api.EnqueueReadBuffer(
          queue_of(dev_from), static_cast<cl::cl_mem>(const_cast<void*>(from)), cl::CL_TRUE,
          from_offset, size, staging.data(), 0, nullptr, nullptr));
      EDGEPACK_CL_CALL(api.EnqueueWriteBuffer(queue_of(dev_to), static_cast<cl::cl_mem>(to),
                                              cl::CL_TRUE, to_offset, size, staging.data(), 0,
                                              nullptr, nullptr));
    }
  } else if (from_cl && dev_to.device_type == kDLCPU) {
    EDGEPACK_CL_CALL(api.EnqueueReadBuffer(
        queue_of(dev_from), static_cast<cl::cl_mem>(const_cast<void*>(from)), cl::CL_TRUE,
        from_offset, size, static_cast<char*>(to) + to_offset, 0, nullptr, nullptr));
  } else if (dev_from.device_type == kDLCPU && to_cl) {
    // blocking: the caller may free or reuse the host memory as soon as we return
    EDGEPACK_CL_CALL(api.EnqueueWriteBuffer(queue_of(dev_to), static_cast<cl::cl_mem>(to),
                                            cl::CL_TRUE, to_offset, size,
                                            static_cast<const char*>(from) + from_offset, 0,
                                            nullptr, nullptr));
  } else {
    TVM_FFI_THROW(RuntimeError) << "OpenCL runtime: cannot copy from device type "
                                << dev_from.device_type << " to device type "
                                << dev_to.device_type;
  }
}

}  // namespace opencl
}  // namespace edgepack
