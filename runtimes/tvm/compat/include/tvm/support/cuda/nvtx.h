/*
 * edgepack compat header (not part of the apache-tvm wheel).
 *
 * NVTX profiling ranges. The device runtimes edgepack builds have no CUDA, so a
 * range is a no-op object; the constructor accepts whatever label the sources pass.
 */
#ifndef TVM_SUPPORT_CUDA_NVTX_H_
#define TVM_SUPPORT_CUDA_NVTX_H_

namespace tvm {
namespace support {

/*! \brief RAII profiling range; compiled out without CUDA. */
class NVTXScopedRange {
 public:
  template <typename Label>
  explicit NVTXScopedRange(const Label& /*name*/) {}
  NVTXScopedRange(const NVTXScopedRange&) = delete;
  NVTXScopedRange& operator=(const NVTXScopedRange&) = delete;
};

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_CUDA_NVTX_H_
