/*
 * edgepack compat header (not part of the apache-tvm wheel).
 *
 * Binary stream interface used by the TVM runtime sources shipped in the
 * apache-tvm 0.27 wheel (tensor.h, vm/executable.h, file_utils.h, rpc/...).
 * Only what those sources use is provided.
 *
 * Wire format: every value is written in the host byte order of the device,
 * which is little endian on every target edgepack supports; this matches the
 * format the x86 compiler writes into exported libraries.
 */
#ifndef TVM_SUPPORT_IO_H_
#define TVM_SUPPORT_IO_H_

#include <cstddef>
#include <cstdint>

namespace tvm {
namespace support {

template <typename T, typename Enable>
struct Serializer;

/*! \brief A byte stream; subclasses implement the two raw virtual calls. */
class Stream {
 public:
  virtual ~Stream() = default;
  /*! \brief Read up to size bytes; returns the number of bytes read. */
  virtual size_t Read(void* ptr, size_t size) = 0;
  /*! \brief Write size bytes; returns the number of bytes written. */
  virtual size_t Write(const void* ptr, size_t size) = 0;

  /*! \brief Serialize one value through Serializer<T>. */
  template <typename T>
  inline void Write(const T& data);
  /*! \brief Deserialize one value; false on a short or malformed stream. */
  template <typename T>
  inline bool Read(T* out);
  /*! \brief Serialize num_elems values, without a length prefix. */
  template <typename T>
  inline void WriteArray(const T* data, size_t num_elems);
  /*! \brief Deserialize num_elems values, without a length prefix. */
  template <typename T>
  inline bool ReadArray(T* data, size_t num_elems);
};

}  // namespace support
}  // namespace tvm

#include <tvm/support/serializer.h>

namespace tvm {
namespace support {

template <typename T>
inline void Stream::Write(const T& data) {
  static_assert(Serializer<T, void>::enabled, "no Serializer for this type");
  Serializer<T, void>::Write(this, data);
}

template <typename T>
inline bool Stream::Read(T* out) {
  static_assert(Serializer<T, void>::enabled, "no Serializer for this type");
  return Serializer<T, void>::Read(this, out);
}

template <typename T>
inline void Stream::WriteArray(const T* data, size_t num_elems) {
  for (size_t i = 0; i < num_elems; ++i) this->Write<T>(data[i]);
}

template <typename T>
inline bool Stream::ReadArray(T* data, size_t num_elems) {
  for (size_t i = 0; i < num_elems; ++i) {
    if (!this->Read<T>(data + i)) return false;
  }
  return true;
}

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_IO_H_
