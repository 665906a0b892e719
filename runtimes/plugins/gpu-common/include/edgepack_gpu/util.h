/*
 * edgepack_gpu/util.h - small helpers the OpenCL and Vulkan runtime plug-ins share. Header-only.
 */
#ifndef EDGEPACK_GPU_UTIL_H_
#define EDGEPACK_GPU_UTIL_H_

#include <tvm/ffi/any.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace edgepack {
namespace gpu {

/*! \brief An environment flag: set, non-empty and not "0". */
inline bool EnvFlag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

/*! \brief ``s`` in ASCII lower case (environment choices and name filters are case-insensitive). */
inline std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

/*! \brief ``s`` as the inside of a JSON string. */
inline std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

/*! \brief Whether ``mod`` or a module it imports (recursively) is of kind ``kind``. */
inline bool UsesModuleKind(const tvm::ffi::Module& mod, const char* kind, int depth = 0) {
  if (std::strcmp(mod->kind(), kind) == 0) return true;
  if (depth > 16) return false;
  for (const tvm::ffi::Any& item : mod->imports()) {
    if (auto child = item.try_cast<tvm::ffi::Module>()) {
      if (UsesModuleKind(child.value(), kind, depth + 1)) return true;
    }
  }
  return false;
}

/*!
 * \brief Whether a global function is registered already. A name already taken means another copy
 * of a plug-in (from another path) was loaded first: it wins, so device pointers and modules never
 * mix two copies' state.
 */
inline bool GlobalTaken(const char* name) {
  return tvm::ffi::Function::GetGlobal(name).has_value();
}

}  // namespace gpu
}  // namespace edgepack

#endif  // EDGEPACK_GPU_UTIL_H_
