/*
 * edgepack compat header (not part of the apache-tvm wheel).
 *
 * Small string/environment helpers used by thread_pool.cc, rpc_endpoint.cc and
 * (in the CUDA/TensorRT parts edgepack does not build) a few others.
 */
#ifndef TVM_SUPPORT_UTILS_H_
#define TVM_SUPPORT_UTILS_H_

#include <cctype>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace tvm {
namespace support {

/*! \brief True when str is a non-empty run of decimal digits. */
inline bool IsNumber(const std::string& str) {
  if (str.empty()) return false;
  for (char c : str) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

/*! \brief True when str starts with prefix. */
inline bool StartsWith(const std::string& str, const std::string& prefix) {
  return str.size() >= prefix.size() && str.compare(0, prefix.size(), prefix) == 0;
}

/*! \brief True when str ends with suffix. */
inline bool EndsWith(const std::string& str, const std::string& suffix) {
  return str.size() >= suffix.size() &&
         str.compare(str.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/*! \brief Split str at every delim. */
inline std::vector<std::string> Split(const std::string& str, char delim) {
  std::vector<std::string> result;
  std::string item;
  std::istringstream is(str);
  while (std::getline(is, item, delim)) result.push_back(item);
  return result;
}

/*! \brief The value of an environment variable parsed as T, or default_value when unset. */
template <typename T>
inline T GetEnv(const char* key, T default_value) {
  const char* val = std::getenv(key);
  if (val == nullptr) return default_value;
  T ret{};
  std::istringstream is(val);
  is >> ret;
  return ret;
}

/*! \brief std::string specialisation: take the value verbatim. */
template <>
inline std::string GetEnv<std::string>(const char* key, std::string default_value) {
  const char* val = std::getenv(key);
  return val == nullptr ? default_value : std::string(val);
}

/*! \brief Boost-style hash combination. */
template <typename T>
inline size_t HashCombine(size_t key, const T& value) {
  return key ^ (static_cast<size_t>(value) + 0x9e3779b9 + (key << 6) + (key >> 2));
}

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_UTILS_H_
