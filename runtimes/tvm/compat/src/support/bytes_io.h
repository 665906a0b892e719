/*
 * edgepack compat header (not part of the apache-tvm wheel).
 *
 * Streams over in-memory bytes, used to (de)serialize modules and VM executables.
 */
#ifndef TVM_SUPPORT_BYTES_IO_H_
#define TVM_SUPPORT_BYTES_IO_H_

#include <tvm/ffi/string.h>
#include <tvm/support/io.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace tvm {
namespace support {

/*! \brief Reads from a byte buffer that must outlive the stream (ffi::Bytes are kept alive). */
class BytesInStream : public Stream {
 public:
  using Stream::Read;
  using Stream::Write;

  explicit BytesInStream(const std::string& buffer) : data_(buffer.data()), size_(buffer.size()) {}
  explicit BytesInStream(const ffi::Bytes& buffer)
      : holder_(buffer), data_(holder_.data()), size_(holder_.size()) {}
  BytesInStream(const void* data, size_t size)
      : data_(static_cast<const char*>(data)), size_(size) {}

  size_t Read(void* ptr, size_t size) final {
    size_t n = std::min(size, size_ - pos_);
    if (n != 0) std::memcpy(ptr, data_ + pos_, n);
    pos_ += n;
    return n;
  }
  size_t Write(const void*, size_t) final { return 0; }

  /*! \brief Move the read position (clamped to the end). */
  void Seek(size_t pos) { pos_ = std::min(pos, size_); }
  /*! \brief Current read position. */
  size_t Tell() const { return pos_; }

 private:
  ffi::Bytes holder_;
  const char* data_;
  size_t size_;
  size_t pos_{0};
};

/*! \brief Appends to a caller-owned std::string. */
class BytesOutStream : public Stream {
 public:
  using Stream::Read;
  using Stream::Write;

  explicit BytesOutStream(std::string* buffer) : buffer_(buffer) {}

  size_t Read(void*, size_t) final { return 0; }
  size_t Write(const void* ptr, size_t size) final {
    buffer_->append(static_cast<const char*>(ptr), size);
    return size;
  }
  /*! \brief Number of bytes in the buffer. */
  size_t Tell() const { return buffer_->size(); }

 private:
  std::string* buffer_;
};

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_BYTES_IO_H_
