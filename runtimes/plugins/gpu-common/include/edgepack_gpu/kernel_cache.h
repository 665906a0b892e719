/*
 * edgepack_gpu/kernel_cache.h - compiled kernels (OpenCL cl_kernel, WebGPU compute pipeline),
 * made once per (device, kernel) the first time they are launched; shared by edgepack's OpenCL
 * and Vulkan runtime modules. Header-only.
 */
#ifndef EDGEPACK_GPU_KERNEL_CACHE_H_
#define EDGEPACK_GPU_KERNEL_CACHE_H_

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace edgepack {
namespace gpu {

template <typename Compiled>
class KernelCache {
 public:
  /*!
   * \brief The compiled kernel ``index`` for device ``dev_id``; ``make()`` (returning a
   * std::unique_ptr<Compiled>) builds it when it is not cached yet. A ``make`` that throws caches
   * nothing, so the next launch reports the same error again. Builds are serialised (drivers are
   * not all thread-safe while compiling, and each kernel is built once).
   */
  template <typename Make>
  Compiled* Get(int dev_id, size_t index, Make make) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (per_device_.size() <= static_cast<size_t>(dev_id)) per_device_.resize(dev_id + 1);
    auto& table = per_device_[dev_id];
    auto it = table.find(index);
    if (it != table.end()) return it->second.get();
    std::unique_ptr<Compiled> made = make();
    Compiled* raw = made.get();
    table.emplace(index, std::move(made));
    return raw;
  }

  /*! \brief Visit every compiled kernel (to release driver objects). */
  template <typename F>
  void ForEach(F f) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& table : per_device_) {
      for (auto& kv : table) f(*kv.second);
    }
  }

 private:
  std::mutex mutex_;
  std::vector<std::unordered_map<size_t, std::unique_ptr<Compiled>>> per_device_;
};

}  // namespace gpu
}  // namespace edgepack

#endif  // EDGEPACK_GPU_KERNEL_CACHE_H_
