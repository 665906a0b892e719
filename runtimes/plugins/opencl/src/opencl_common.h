/*
 * opencl_common.h - edgepack's OpenCL runtime for TVM: the device API shared by the module.
 *
 * Memory model: buffers only. A TVM data pointer on an OpenCL device is a cl_mem (created with
 * CL_MEM_READ_WRITE); there is no image/texture memory, so memory scopes other than "global"
 * are refused by TVM's base DeviceAPI.
 */
#ifndef EDGEPACK_OPENCL_OPENCL_COMMON_H_
#define EDGEPACK_OPENCL_OPENCL_COMMON_H_

#include <tvm/ffi/error.h>
#include <tvm/runtime/device_api.h>

#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "cl_api.h"
#include "edgepack_gpu/device_attrs.h"

namespace edgepack {
namespace opencl {

using tvm::Device;
using tvm::runtime::DeviceAPI;
using tvm::runtime::DeviceAttrKind;

/*! \brief One OpenCL device TVM can use: tvm.opencl(i) is devices()[i]. */
struct DeviceEntry {
  cl::cl_platform_id platform = nullptr;
  cl::cl_device_id id = nullptr;
  cl::cl_context context = nullptr;   // one context per platform, shared by its devices
  cl::cl_command_queue queue = nullptr;  // the default (in-order) queue of this device
  cl::cl_device_type type = 0;
  std::string name, vendor, version, driver_version, platform_name, extensions;
  size_t max_work_group_size = 0;
  size_t max_work_item_sizes[3] = {0, 0, 0};
  cl::cl_ulong local_mem_size = 0;
  cl::cl_ulong global_mem_size = 0;
  cl::cl_ulong global_mem_cache_size = 0;
  cl::cl_uint compute_units = 0;
  cl::cl_uint max_clock_mhz = 0;
  gpu::DeviceAttrs attrs;  // TVM's GetAttr answers, from the values above
};

/*! \brief True once the process is exiting: OpenCL objects are then left to the driver. */
bool ShuttingDown();

/*! \brief Throw a TVM RuntimeError for a failed OpenCL call. */
[[noreturn]] void ThrowCLError(cl::cl_int code, const std::string& what);

#define EDGEPACK_CL_CALL(expr)                                               \
  do {                                                                       \
    ::edgepack::cl::cl_int _edgepack_cl_err = (expr);                        \
    if (_edgepack_cl_err != ::edgepack::cl::CL_SUCCESS) {                    \
      ::edgepack::opencl::ThrowCLError(_edgepack_cl_err, #expr);             \
    }                                                                        \
  } while (0)

class OpenCLWorkspace final : public DeviceAPI {
 public:
  static OpenCLWorkspace* Global();

  /*! \brief Enumerate platforms/devices once. Returns false (and sets *why) without OpenCL. */
  bool Init(std::string* why = nullptr);
  /*! \brief The OpenCL API; throws a clear error when there is no OpenCL library/device. */
  const cl::Api& Api();
  /*! \brief Device entry for tvm.opencl(dev_id); throws when out of range. */
  DeviceEntry& Entry(int dev_id);
  size_t NumDevices();
  /*! \brief The attributes of tvm.opencl(dev_id); nullptr (no error) when it does not exist. */
  const gpu::DeviceAttrs* AttrsOf(int dev_id);
  /*! \brief The queue a launch or copy on ``dev`` goes to (the thread's current stream). */
  cl::cl_command_queue QueueFor(Device dev);
  /*! \brief The device set by SetDevice on this thread (TVM's host code calls it). */
  int CurrentDeviceId() const;

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

 protected:
  void CopyDataFromTo(const void* from, size_t from_offset, void* to, size_t to_offset,
                      size_t size, Device dev_from, Device dev_to, DLDataType type_hint,
                      TVMStreamHandle stream) final;

 private:
  OpenCLWorkspace() = default;
  std::once_flag init_once_;
  bool initialized_ = false;
  std::string init_error_;
  std::vector<DeviceEntry> devices_;
};

}  // namespace opencl
}  // namespace edgepack

#endif  // EDGEPACK_OPENCL_OPENCL_COMMON_H_
