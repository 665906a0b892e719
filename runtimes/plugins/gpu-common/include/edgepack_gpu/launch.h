/*
 * edgepack_gpu/launch.h - how TVM's host code launches a device kernel, and how its arguments
 * are packed; shared by edgepack's OpenCL and Vulkan (WebGPU) runtime modules. Header-only.
 *
 * A kernel call from TVM's host code passes the kernel's arguments (device buffers as opaque
 * pointers, then scalars, as KernelInfo::arg_types lists them) followed by one int64 per launch
 * parameter tag "blockIdx.[xyz]" / "threadIdx.[xyz]": the grid and block extents. Other tags are
 * runtime-specific (OpenCL: "tirx.use_required_block_dimension"; WebGPU: "paramWriteAccess:[..]")
 * and take no argument; each runtime says which ones it accepts.
 */
#ifndef EDGEPACK_GPU_LAUNCH_H_
#define EDGEPACK_GPU_LAUNCH_H_

#include <tvm/ffi/c_api.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "module_data.h"

namespace edgepack {
namespace gpu {

/*! \brief Where each launch argument goes: slots 0-2 grid x/y/z, 3-5 block x/y/z. */
struct LaunchConfig {
  std::vector<int> slots;
  unsigned work_dim = 1;  // highest dimension used (1..3)

  /*! \brief ``other_tag(tag)`` returns true for a tag without an argument the runtime accepts. */
  static LaunchConfig From(const KernelInfo& info, const char* runtime,
                           const std::function<bool(const std::string&)>& other_tag) {
    LaunchConfig c;
    bool filled[6] = {false, false, false, false, false, false};
    for (const std::string& tag : info.launch_param_tags) {
      int rank = -1;
      if (tag.compare(0, 9, "blockIdx.") == 0) {
        rank = 0;
      } else if (tag.compare(0, 10, "threadIdx.") == 0) {
        rank = 1;
      } else if (other_tag && other_tag(tag)) {
        continue;
      } else {
        TVM_FFI_THROW(RuntimeError) << runtime << " kernel " << info.name
                                    << " needs launch parameter '" << tag << "', which edgepack's "
                                    << runtime << " runtime does not support";
      }
      char axis = tag.back();
      if (axis < 'x' || axis > 'z') {
        TVM_FFI_THROW(RuntimeError) << runtime << " kernel " << info.name
                                    << ": unknown launch parameter '" << tag << "'";
      }
      int slot = rank * 3 + (axis - 'x');
      c.slots.push_back(slot);
      filled[slot] = true;
    }
    for (int i = 0; i < 3; ++i) {
      if (filled[i] || filled[i + 3]) c.work_dim = static_cast<unsigned>(i + 1);
    }
    return c;
  }
};

/*! \brief Grid (work groups) and block (work-group size) of one launch. */
struct LaunchDims {
  uint64_t grid[3] = {1, 1, 1};
  uint64_t block[3] = {1, 1, 1};
  bool empty = false;  // an extent <= 0: nothing to run (dynamic shapes can give empty launches)
};

/*! \brief The raw arguments of a packed call, checked to hold a kernel's arguments + launch sizes. */
inline const TVMFFIAny* KernelArgs(const KernelInfo& info, const LaunchConfig& launch,
                                   const void* packed_args, int32_t num_args, const char* runtime) {
  const size_t need = info.arg_types.size() + launch.slots.size();
  if (num_args < 0 || static_cast<size_t>(num_args) < need) {
    TVM_FFI_THROW(RuntimeError) << runtime << " kernel " << info.name << " expects " << need
                                << " arguments, got " << num_args;
  }
  return static_cast<const TVMFFIAny*>(packed_args);
}

/*! \brief The launch sizes that follow the kernel arguments in ``raw``. */
inline LaunchDims ReadLaunch(const KernelInfo& info, const LaunchConfig& launch,
                             const TVMFFIAny* raw) {
  LaunchDims d;
  const size_t first = info.arg_types.size();
  for (size_t i = 0; i < launch.slots.size(); ++i) {
    int64_t v = raw[first + i].v_int64;
    if (v <= 0) {
      d.empty = true;
      continue;
    }
    int slot = launch.slots[i];
    (slot < 3 ? d.grid[slot] : d.block[slot - 3]) = static_cast<uint64_t>(v);
  }
  return d;
}

/*!
 * \brief Write a scalar kernel argument as ``width`` little-endian bytes into ``out``.
 *
 * Integers (int/uint 8..64) are the low ``width`` bytes of their int64 value (C's conversion);
 * floats are written as float (width 4) or double (width 8). Returns false for a type that cannot
 * be passed this way (vectors, fp16, bfloat, width mismatches), so the caller can name it.
 */
inline bool PackScalar(DLDataType t, const TVMFFIAny& a, size_t width, void* out) {
  if (t.lanes != 1) return false;
  if ((t.code == kDLInt || t.code == kDLUInt) &&
      (t.bits == 8 || t.bits == 16 || t.bits == 32 || t.bits == 64) && width >= 1 && width <= 8) {
    uint64_t v = static_cast<uint64_t>(a.v_int64);
    unsigned char bytes[8];
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>((v >> (8 * i)) & 0xff);
    std::memcpy(out, bytes, width);
    return true;
  }
  if (t.code == kDLFloat && (t.bits == 32 || t.bits == 64)) {
    if (width == 4) {
      float f = static_cast<float>(a.v_float64);
      std::memcpy(out, &f, 4);
      return true;
    }
    if (width == 8) {
      double f = a.v_float64;
      std::memcpy(out, &f, 8);
      return true;
    }
  }
  return false;
}

/*! \brief "float32", "int64", ... for error messages. */
inline std::string TypeName(DLDataType t) { return std::string(tvm::ffi::DLDataTypeToString(t)); }

}  // namespace gpu
}  // namespace edgepack

#endif  // EDGEPACK_GPU_LAUNCH_H_
