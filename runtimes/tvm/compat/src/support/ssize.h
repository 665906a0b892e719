/*
 * edgepack compat header (not part of the apache-tvm wheel).
 *
 * ssize_t for the socket/pipe helpers: POSIX has it, MSVC does not.
 */
#ifndef TVM_SUPPORT_SSIZE_H_
#define TVM_SUPPORT_SSIZE_H_

#if defined(_MSC_VER)
#include <BaseTsd.h>
typedef SSIZE_T ssize_t;
#else
#include <sys/types.h>
#endif

#endif  // TVM_SUPPORT_SSIZE_H_
