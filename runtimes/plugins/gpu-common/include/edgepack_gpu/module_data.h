/*
 * edgepack_gpu/module_data.h - reading and writing the device-module data TVM 0.27's GPU code
 * generators store in a library (their SaveToBytes), shared by edgepack's OpenCL and Vulkan
 * (WebGPU/WGSL) runtime modules. Header-only.
 *
 * Every GPU module TVM writes starts from the same pieces, little-endian as TVM's streams:
 *   str          = u64 length + bytes
 *   FunctionInfo = name: str,
 *                  arg_types: u64 n, n x {u8 code, u8 bits, u16 lanes},
 *                  launch_param_tags: u64 n, n x str   ("blockIdx.x", "threadIdx.x", ...)
 *                  arg_extra_tags: u64 n, n x i32
 *   fmap         = u64 n, n x (key: str, FunctionInfo)
 * The OpenCL module is  fmt: str, fmap, source: str;  the WebGPU module is  fmap, smap with
 *   smap         = u64 n, n x (kernel name: str, WGSL shader: str).
 */
#ifndef EDGEPACK_GPU_MODULE_DATA_H_
#define EDGEPACK_GPU_MODULE_DATA_H_

#include <dlpack/dlpack.h>
#include <tvm/ffi/error.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace edgepack {
namespace gpu {

/*! \brief What TVM records about one device kernel (its runtime::FunctionInfo). */
struct KernelInfo {
  std::string name;
  std::vector<DLDataType> arg_types;
  std::vector<std::string> launch_param_tags;
  std::vector<int32_t> arg_extra_tags;
};

/*! \brief Bounds-checked little-endian reader; errors name the module kind ("OpenCL", "WebGPU"). */
class ByteReader {
 public:
  ByteReader(const char* data, size_t size, std::string what)
      : data_(data), size_(size), what_(std::move(what)) {}

  uint64_t U64() {
    Need(8, "integer");
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(Byte(pos_ + i)) << (8 * i);
    pos_ += 8;
    return v;
  }
  int32_t I32() {
    Need(4, "integer");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(Byte(pos_ + i)) << (8 * i);
    pos_ += 4;
    return static_cast<int32_t>(v);
  }
  DLDataType DType() {
    Need(4, "data type");
    DLDataType t;
    t.code = Byte(pos_);
    t.bits = Byte(pos_ + 1);
    t.lanes = static_cast<uint16_t>(Byte(pos_ + 2) | (Byte(pos_ + 3) << 8));
    pos_ += 4;
    return t;
  }
  std::string Str() {
    uint64_t n = Count(1);
    std::string s(data_ + pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  /*! \brief An element count, checked against what is left (corrupt input cannot allocate wildly). */
  uint64_t Count(size_t min_element_size) {
    uint64_t n = U64();
    if (n > (size_ - pos_) / std::max<size_t>(min_element_size, 1)) Fail("count");
    return n;
  }
  KernelInfo Function() {
    KernelInfo k;
    k.name = Str();
    uint64_t nargs = Count(4);
    for (uint64_t j = 0; j < nargs; ++j) k.arg_types.push_back(DType());
    uint64_t ntags = Count(8);
    for (uint64_t j = 0; j < ntags; ++j) k.launch_param_tags.push_back(Str());
    uint64_t nextra = Count(4);
    for (uint64_t j = 0; j < nextra; ++j) k.arg_extra_tags.push_back(I32());
    return k;
  }
  /*! \brief fmap: the kernels in file order (a kernel without a name takes its key). */
  std::vector<KernelInfo> FunctionMap() {
    uint64_t n = Count(8);
    std::vector<KernelInfo> kernels;
    for (uint64_t i = 0; i < n; ++i) {
      std::string key = Str();
      KernelInfo k = Function();
      if (k.name.empty()) k.name = key;
      kernels.push_back(std::move(k));
    }
    return kernels;
  }
  /*! \brief A str -> str map (the WebGPU module's shaders), in file order. */
  std::vector<std::pair<std::string, std::string>> StringMap() {
    uint64_t n = Count(16);
    std::vector<std::pair<std::string, std::string>> out;
    for (uint64_t i = 0; i < n; ++i) {
      std::string key = Str();
      out.emplace_back(std::move(key), Str());
    }
    return out;
  }
  bool AtEnd() const { return pos_ == size_; }
  /*! \brief Everything was read: bytes left over mean this is not what TVM 0.27 writes. */
  void ExpectEnd() const {
    if (!AtEnd()) {
      TVM_FFI_THROW(ValueError) << "The " << what_ << " module data has trailing bytes: not a module "
                                << "written by TVM 0.27's " << what_ << " code generator";
    }
  }

 private:
  uint8_t Byte(size_t i) const { return static_cast<uint8_t>(data_[i]); }
  void Need(size_t n, const char* what) {
    if (size_ - pos_ < n) Fail(what);
  }
  [[noreturn]] void Fail(const char* what) {
    TVM_FFI_THROW(ValueError) << "The " << what_ << " module data is truncated or corrupt (bad "
                              << what << " at byte " << pos_ << " of " << size_ << ")";
    TVM_FFI_UNREACHABLE();
  }
  const char* data_;
  size_t size_;
  std::string what_;
  size_t pos_ = 0;
};

/*! \brief The inverse of ByteReader (SaveToBytes of a loaded module writes what it read). */
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
  void Function(const KernelInfo& k) {
    Str(k.name);
    U64(k.arg_types.size());
    for (DLDataType t : k.arg_types) DType(t);
    U64(k.launch_param_tags.size());
    for (const std::string& tag : k.launch_param_tags) Str(tag);
    U64(k.arg_extra_tags.size());
    for (int32_t t : k.arg_extra_tags) I32(t);
  }
  void FunctionMap(const std::vector<KernelInfo>& kernels) {
    U64(kernels.size());
    for (const KernelInfo& k : kernels) {
      Str(k.name);  // key
      Function(k);
    }
  }
  void StringMap(const std::vector<std::pair<std::string, std::string>>& map) {
    U64(map.size());
    for (const auto& kv : map) {
      Str(kv.first);
      Str(kv.second);
    }
  }
  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
};

}  // namespace gpu
}  // namespace edgepack

#endif  // EDGEPACK_GPU_MODULE_DATA_H_
