/*
 * edgepack_gpu/kernel_module.h - what edgepack's OpenCL and WebGPU modules do the same way: a
 * kernel is found by name and returned as a function that launches it, the module is runnable
 * and serialisable; and the plug-in's global functions are registered once. Header-only.
 */
#ifndef EDGEPACK_GPU_KERNEL_MODULE_H_
#define EDGEPACK_GPU_KERNEL_MODULE_H_

#include <tvm/ffi/any.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>
#include <tvm/runtime/device_api.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "edgepack_gpu/lz4_block.h"
#include "edgepack_gpu/module_data.h"
#include "edgepack_gpu/util.h"

namespace edgepack {
namespace gpu {

/*! \brief A device module of TVM kernels (``kernels_``, in module order), run by ``Launch``. */
class KernelModuleObj : public tvm::ffi::ModuleObj {
 public:
  explicit KernelModuleObj(std::vector<KernelInfo> kernels) : kernels_(std::move(kernels)) {
    for (size_t i = 0; i < kernels_.size(); ++i) index_[kernels_[i].name] = i;
  }

  int GetPropertyMask() const final {
    return tvm::ffi::Module::kBinarySerializable | tvm::ffi::Module::kRunnable;
  }

  tvm::ffi::Optional<tvm::ffi::Function> GetFunction(const tvm::ffi::String& name) final {
    auto it = index_.find(std::string(name));
    if (it == index_.end()) return std::nullopt;
    size_t index = it->second;
    tvm::ffi::Module self = tvm::ffi::GetRef<tvm::ffi::Module>(this);  // keeps the module alive
    return tvm::ffi::Function::FromPacked(
        [self, this, index](tvm::ffi::PackedArgs args, tvm::ffi::Any* /*rv*/) { this->Launch(index, args); });
  }

 protected:
  /*! \brief Run kernel ``index``: its arguments, then one int64 per launch parameter tag. */
  virtual void Launch(size_t index, tvm::ffi::PackedArgs args) = 0;

  std::vector<KernelInfo> kernels_;

 private:
  std::unordered_map<std::string, size_t> index_;
};

/*!
 * \brief Register a GPU plug-in's global functions (``device``: TVM's device name, "opencl" or
 * "webgpu"; ``plugin``: edgepack's, "opencl" or "vulkan"):
 *   device_api.<device>                    the DeviceAPI ``workspace()`` returns
 *   ffi.Module.load_from_bytes.<device>    ``load(bytes)``, the module TVM's code generator wrote
 *   ffi.Module.load_from_bytes.<device>_lz4  the same module stored compressed by edgepack
 *                                          (``u64 length`` + one LZ4 block: lz4_block.h)
 *   edgepack.<plugin>.uses_<device>        does a model (module tree) need this device? (for C)
 *   edgepack.<plugin>.runtime_info         ``info()``: JSON about the library and devices found
 * each unless another copy of the plug-in registered it first (see GlobalTaken).
 */
template <typename Workspace, typename Load, typename Info>
void RegisterPlugin(const std::string& device, const std::string& plugin, Workspace workspace,
                    Load load, Info info) {
  namespace ffi = tvm::ffi;
  namespace refl = tvm::ffi::reflection;
  const std::string api_name = "device_api." + device;
  if (!GlobalTaken(api_name.c_str())) {
    refl::GlobalDef().def_packed(api_name.c_str(), [workspace](ffi::PackedArgs, ffi::Any* rv) {
      *rv = static_cast<void*>(static_cast<tvm::runtime::DeviceAPI*>(workspace()));
    });
  }
  const std::string load_name = "ffi.Module.load_from_bytes." + device;
  if (!GlobalTaken(load_name.c_str())) {
    refl::GlobalDef().def(load_name.c_str(), [load](const ffi::Bytes& bytes) { return load(bytes); });
  }
  const std::string packed_name = load_name + "_lz4";
  if (!GlobalTaken(packed_name.c_str())) {
    refl::GlobalDef().def(packed_name.c_str(), [load, device](const ffi::Bytes& bytes) {
      const unsigned char* data = reinterpret_cast<const unsigned char*>(bytes.data());
      uint64_t expected = 0;
      if (bytes.size() < sizeof(expected)) {
        TVM_FFI_THROW(RuntimeError) << "The compressed " << device << " module is cut off";
      }
      for (size_t i = 0; i < sizeof(expected); ++i) expected |= static_cast<uint64_t>(data[i]) << (8 * i);
      std::string plain;
      std::string why = Lz4DecodeBlock(data + sizeof(expected), bytes.size() - sizeof(expected),
                                       static_cast<size_t>(expected), &plain);
      if (!why.empty()) {
        TVM_FFI_THROW(RuntimeError) << "The compressed " << device << " module of this library is damaged: "
                                    << why;
      }
      return load(ffi::Bytes(plain));
    });
  }
  const std::string uses_name = "edgepack." + plugin + ".uses_" + device;
  if (!GlobalTaken(uses_name.c_str())) {
    refl::GlobalDef().def(uses_name.c_str(),
                          [device](const ffi::Module& mod) { return UsesModuleKind(mod, device.c_str()); });
  }
  const std::string info_name = "edgepack." + plugin + ".runtime_info";
  if (!GlobalTaken(info_name.c_str())) {
    refl::GlobalDef().def(info_name.c_str(), [info]() { return ffi::String(info()); });
  }
}

}  // namespace gpu
}  // namespace edgepack

#endif  // EDGEPACK_GPU_KERNEL_MODULE_H_
