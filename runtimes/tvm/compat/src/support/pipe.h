/*
 * edgepack compat header (not part of the apache-tvm wheel).
 *
 * A blocking byte pipe over a POSIX file descriptor (used by the process-based
 * RPC/disco sessions). Copies share the fd; Close() must be called explicitly.
 */
#ifndef TVM_SUPPORT_PIPE_H_
#define TVM_SUPPORT_PIPE_H_

#if defined(_WIN32)
#error "edgepack's TVM compat pipe.h supports POSIX systems only"
#endif

#include <tvm/ffi/error.h>
#include <tvm/support/io.h>
#include <unistd.h>

#include <cstring>

#include "errno_handling.h"
#include "ssize.h"

namespace tvm {
namespace support {

class Pipe : public Stream {
 public:
  using PipeHandle = int;
  using Stream::Read;
  using Stream::Write;

  explicit Pipe(int64_t handle) : handle_(static_cast<PipeHandle>(handle)) {}

  /*! \brief Read exactly size bytes unless the writer closes first. */
  size_t Read(void* ptr, size_t size) final {
    if (size == 0) return 0;
    char* p = static_cast<char*>(ptr);
    size_t done = 0;
    while (done < size) {
      ssize_t n =
          RetryCallOnEINTR([&]() { return read(handle_, p + done, size - done); }, GetLastErrorCode);
      if (n == -1) TVM_FFI_THROW(RuntimeError) << "Pipe read error: " << std::strerror(errno);
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    return done;
  }
  /*! \brief Write all size bytes. */
  size_t Write(const void* ptr, size_t size) final {
    const char* p = static_cast<const char*>(ptr);
    size_t done = 0;
    while (done < size) {
      ssize_t n = RetryCallOnEINTR([&]() { return write(handle_, p + done, size - done); },
                                   GetLastErrorCode);
      if (n == -1) TVM_FFI_THROW(RuntimeError) << "Pipe write error: " << std::strerror(errno);
      done += static_cast<size_t>(n);
    }
    return done;
  }
  void Flush() {}
  void Close() {
    if (handle_ != -1) {
      close(handle_);
      handle_ = -1;
    }
  }

 private:
  PipeHandle handle_;
};

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_PIPE_H_
