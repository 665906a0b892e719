/*
 * edgepack compat header (not part of the apache-tvm wheel).
 *
 * Growable FIFO byte ring used by the RPC endpoint for its reader and writer
 * buffers. Not thread-safe.
 */
#ifndef TVM_SUPPORT_RING_BUFFER_H_
#define TVM_SUPPORT_RING_BUFFER_H_

#include <tvm/ffi/error.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace tvm {
namespace support {

class RingBuffer {
 public:
  static const constexpr size_t kInitCapacity = 4 << 10;

  RingBuffer() : ring_(kInitCapacity) {}

  /*! \brief Number of bytes that can be read. */
  size_t bytes_available() const { return bytes_available_; }
  /*! \brief Current capacity. */
  size_t capacity() const { return ring_.size(); }

  /*! \brief Make room for at least n bytes in total (never shrinks below the content). */
  void Reserve(size_t n) {
    if (ring_.size() >= n) return;
    size_t new_size = std::max(ring_.size() * 2, n);
    std::vector<char> grown(new_size);
    CopyOut(grown.data(), bytes_available_);
    ring_.swap(grown);
    head_ptr_ = 0;
  }

  /*! \brief Pop exactly size bytes (size must not exceed bytes_available()). */
  void Read(void* data, size_t size) {
    TVM_FFI_ICHECK_GE(bytes_available_, size);
    CopyOut(static_cast<char*>(data), size);
    Consume(size);
  }

  /*!
   * \brief Hand at most max_nbytes of the oldest bytes to fsend(const void*, size_t) -> size_t
   *        in one call and drop what it accepted.
   * \return bytes consumed.
   */
  template <typename FSend>
  size_t ReadWithCallback(FSend fsend, size_t max_nbytes) {
    size_t size = std::min(max_nbytes, bytes_available_);
    size = std::min(size, ring_.size() - head_ptr_);  // contiguous part only
    if (size == 0) return 0;
    size_t n = fsend(ring_.data() + head_ptr_, size);
    TVM_FFI_ICHECK_LE(n, size);
    Consume(n);
    return n;
  }

  /*! \brief Append size bytes. */
  void Write(const void* data, size_t size) {
    Reserve(bytes_available_ + size);
    const char* src = static_cast<const char*>(data);
    size_t tail = (head_ptr_ + bytes_available_) % ring_.size();
    size_t first = std::min(size, ring_.size() - tail);
    if (first != 0) std::memcpy(ring_.data() + tail, src, first);
    if (size > first) std::memcpy(ring_.data(), src + first, size - first);
    bytes_available_ += size;
  }

  /*!
   * \brief Let frecv(void*, size_t) -> size_t fill at most max_nbytes at the end, in one call.
   * \return bytes appended (0 means the peer closed).
   */
  template <typename FRecv>
  size_t WriteWithCallback(FRecv frecv, size_t max_nbytes) {
    Reserve(bytes_available_ + max_nbytes);
    size_t tail = (head_ptr_ + bytes_available_) % ring_.size();
    size_t free_bytes = ring_.size() - bytes_available_;
    size_t size = std::min({max_nbytes, free_bytes, ring_.size() - tail});
    size_t n = frecv(ring_.data() + tail, size);
    TVM_FFI_ICHECK_LE(n, size);
    bytes_available_ += n;
    return n;
  }

 private:
  void CopyOut(char* dst, size_t size) const {
    size_t first = std::min(size, ring_.size() - head_ptr_);
    if (first != 0) std::memcpy(dst, ring_.data() + head_ptr_, first);
    if (size > first) std::memcpy(dst + first, ring_.data(), size - first);
  }
  void Consume(size_t n) {
    head_ptr_ = (head_ptr_ + n) % ring_.size();
    bytes_available_ -= n;
    if (bytes_available_ == 0) head_ptr_ = 0;
  }

  std::vector<char> ring_;
  size_t head_ptr_{0};
  size_t bytes_available_{0};
};

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_RING_BUFFER_H_
