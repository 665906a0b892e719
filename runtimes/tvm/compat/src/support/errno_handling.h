/*
 * edgepack compat header (not part of the apache-tvm wheel).
 *
 * Retry of system calls interrupted by a signal (EINTR), used by socket.h and pipe.h.
 */
#ifndef TVM_SUPPORT_ERRNO_HANDLING_H_
#define TVM_SUPPORT_ERRNO_HANDLING_H_

#include <errno.h>

#include "ssize.h"

namespace tvm {
namespace support {

/*! \brief The last error code of the calling thread. */
inline int GetLastErrorCode() { return errno; }

/*!
 * \brief Call func until it does not fail with EINTR.
 * \param func A call returning -1 on failure.
 * \param fgetlasterror Returns the error code of the failure.
 */
template <typename FuncType, typename GetErrorCodeFuncType>
inline auto RetryCallOnEINTR(FuncType func, GetErrorCodeFuncType fgetlasterror) -> decltype(func()) {
  while (true) {
    auto ret = func();
    if (ret != -1) return ret;
    if (fgetlasterror() != EINTR) return ret;
  }
}

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_ERRNO_HANDLING_H_
