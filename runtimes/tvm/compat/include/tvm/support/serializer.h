/*
 * edgepack compat header (not part of the apache-tvm wheel).
 *
 * Serializer<T> specialisations used by the TVM runtime sources of the
 * apache-tvm 0.27 wheel.  The byte layout is the dmlc one that TVM has always
 * used, so that a VM executable serialized by the x86 compiler loads here:
 *   - trivially copyable values (integers, floats, enums, DLDataType,
 *     DLDevice, pointers): their raw bytes;
 *   - strings (std::string, ffi::String, ffi::Bytes): uint64 length + bytes;
 *   - sequences (std::vector, ffi::Array): uint64 length + elements;
 *   - std::pair: first then second; maps: uint64 length + (key, value) pairs.
 * Sources may specialise Serializer<X> themselves (template <> struct
 * Serializer<X> { static constexpr bool enabled = true; Write; Read; }).
 */
#ifndef TVM_SUPPORT_SERIALIZER_H_
#define TVM_SUPPORT_SERIALIZER_H_

#include <tvm/support/io.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tvm {
namespace support {

/*! \brief Primary template: types without a serializer are rejected at compile time. */
template <typename T, typename Enable = void>
struct Serializer {
  static constexpr bool enabled = false;
};

/*! \brief Raw bytes of trivially copyable values. */
template <typename T>
struct Serializer<T, std::enable_if_t<std::is_trivially_copyable<T>::value>> {
  static constexpr bool enabled = true;
  static void Write(Stream* strm, const T& data) { strm->Write(&data, sizeof(T)); }
  static bool Read(Stream* strm, T* data) { return strm->Read(data, sizeof(T)) == sizeof(T); }
};

namespace detail {
/*! \brief uint64 length followed by raw characters. */
inline void WriteChars(Stream* strm, const char* data, size_t size) {
  uint64_t n = static_cast<uint64_t>(size);
  strm->Write(&n, sizeof(n));
  if (n != 0) strm->Write(data, size);
}
inline bool ReadChars(Stream* strm, std::string* out) {
  uint64_t n = 0;
  if (strm->Read(&n, sizeof(n)) != sizeof(n)) return false;
  out->resize(static_cast<size_t>(n));
  if (n == 0) return true;
  return strm->Read(&(*out)[0], static_cast<size_t>(n)) == static_cast<size_t>(n);
}
}  // namespace detail

template <>
struct Serializer<std::string, void> {
  static constexpr bool enabled = true;
  static void Write(Stream* strm, const std::string& data) {
    detail::WriteChars(strm, data.data(), data.size());
  }
  static bool Read(Stream* strm, std::string* data) { return detail::ReadChars(strm, data); }
};

template <>
struct Serializer<ffi::String, void> {
  static constexpr bool enabled = true;
  static void Write(Stream* strm, const ffi::String& data) {
    detail::WriteChars(strm, data.data(), data.size());
  }
  static bool Read(Stream* strm, ffi::String* data) {
    std::string tmp;
    if (!detail::ReadChars(strm, &tmp)) return false;
    *data = ffi::String(std::move(tmp));
    return true;
  }
};

template <>
struct Serializer<ffi::Bytes, void> {
  static constexpr bool enabled = true;
  static void Write(Stream* strm, const ffi::Bytes& data) {
    detail::WriteChars(strm, data.data(), data.size());
  }
  static bool Read(Stream* strm, ffi::Bytes* data) {
    std::string tmp;
    if (!detail::ReadChars(strm, &tmp)) return false;
    *data = ffi::Bytes(std::move(tmp));
    return true;
  }
};

template <typename T>
struct Serializer<std::vector<T>, void> {
  static constexpr bool enabled = Serializer<T>::enabled;
  static void Write(Stream* strm, const std::vector<T>& data) {
    uint64_t n = static_cast<uint64_t>(data.size());
    strm->Write(&n, sizeof(n));
    if constexpr (std::is_trivially_copyable<T>::value) {
      if (n != 0) strm->Write(data.data(), sizeof(T) * data.size());
    } else {
      for (const T& item : data) Serializer<T>::Write(strm, item);
    }
  }
  static bool Read(Stream* strm, std::vector<T>* data) {
    uint64_t n = 0;
    if (strm->Read(&n, sizeof(n)) != sizeof(n)) return false;
    data->resize(static_cast<size_t>(n));
    if constexpr (std::is_trivially_copyable<T>::value) {
      size_t bytes = sizeof(T) * static_cast<size_t>(n);
      return n == 0 || strm->Read(data->data(), bytes) == bytes;
    } else {
      for (T& item : *data) {
        if (!Serializer<T>::Read(strm, &item)) return false;
      }
      return true;
    }
  }
};

template <typename T>
struct Serializer<ffi::Array<T>, void> {
  static constexpr bool enabled = Serializer<T>::enabled;
  static void Write(Stream* strm, const ffi::Array<T>& data) {
    uint64_t n = static_cast<uint64_t>(data.size());
    strm->Write(&n, sizeof(n));
    for (const T& item : data) Serializer<T>::Write(strm, item);
  }
  static bool Read(Stream* strm, ffi::Array<T>* data) {
    uint64_t n = 0;
    if (strm->Read(&n, sizeof(n)) != sizeof(n)) return false;
    ffi::Array<T> result;
    for (uint64_t i = 0; i < n; ++i) {
      T item;
      if (!Serializer<T>::Read(strm, &item)) return false;
      result.push_back(std::move(item));
    }
    *data = std::move(result);
    return true;
  }
};

template <typename A, typename B>
struct Serializer<std::pair<A, B>, std::enable_if_t<!std::is_trivially_copyable<std::pair<A, B>>::value>> {
  static constexpr bool enabled = Serializer<A>::enabled && Serializer<B>::enabled;
  static void Write(Stream* strm, const std::pair<A, B>& data) {
    Serializer<A>::Write(strm, data.first);
    Serializer<B>::Write(strm, data.second);
  }
  static bool Read(Stream* strm, std::pair<A, B>* data) {
    return Serializer<A>::Read(strm, &data->first) && Serializer<B>::Read(strm, &data->second);
  }
};

namespace detail {
template <typename M>
struct MapSerializer {
  using K = typename M::key_type;
  using V = typename M::mapped_type;
  static constexpr bool enabled = Serializer<K>::enabled && Serializer<V>::enabled;
  static void Write(Stream* strm, const M& data) {
    uint64_t n = static_cast<uint64_t>(data.size());
    strm->Write(&n, sizeof(n));
    for (const auto& kv : data) {
      Serializer<K>::Write(strm, kv.first);
      Serializer<V>::Write(strm, kv.second);
    }
  }
  static bool Read(Stream* strm, M* data) {
    uint64_t n = 0;
    if (strm->Read(&n, sizeof(n)) != sizeof(n)) return false;
    data->clear();
    for (uint64_t i = 0; i < n; ++i) {
      K key;
      V value;
      if (!Serializer<K>::Read(strm, &key) || !Serializer<V>::Read(strm, &value)) return false;
      data->emplace(std::move(key), std::move(value));
    }
    return true;
  }
};
}  // namespace detail

template <typename K, typename V>
struct Serializer<std::map<K, V>, void> : detail::MapSerializer<std::map<K, V>> {};

template <typename K, typename V>
struct Serializer<std::unordered_map<K, V>, void>
    : detail::MapSerializer<std::unordered_map<K, V>> {};

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_SERIALIZER_H_
