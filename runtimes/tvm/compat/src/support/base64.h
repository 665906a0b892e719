/*
 * edgepack compat header (not part of the apache-tvm wheel).
 *
 * Standard base64 (RFC 4648, '=' padding) streams layered over another Stream;
 * tensor.cc uses them for the JSON form of tensors.
 */
#ifndef TVM_SUPPORT_BASE64_H_
#define TVM_SUPPORT_BASE64_H_

#include <tvm/ffi/error.h>
#include <tvm/support/io.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <string>

namespace tvm {
namespace support {

namespace base64 {
inline const char* EncodeTable() {
  return "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}
/*! \brief Value of a base64 digit, -1 for anything else. */
inline int Decode(int c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}
}  // namespace base64

/*! \brief Decodes base64 text read from another stream. Reading stops at '=', EOF or '"'. */
class Base64InStream : public Stream {
 public:
  using Stream::Read;
  using Stream::Write;

  explicit Base64InStream(Stream* fs) : fs_(fs) {}

  /*! \brief Skip leading white space; call once before reading. */
  void InitPosition() {
    do {
      next_ = GetChar();
    } while (next_ != EOF && std::isspace(next_));
  }

  size_t Read(void* ptr, size_t size) final {
    unsigned char* out = static_cast<unsigned char*>(ptr);
    size_t n = 0;
    while (n < size) {
      if (buf_len_ == 0 && !Refill()) break;
      out[n++] = buf_[buf_pos_++];
      --buf_len_;
    }
    return n;
  }
  size_t Write(const void*, size_t) final {
    TVM_FFI_THROW(InternalError) << "Base64InStream is read-only";
    return 0;
  }

 private:
  int GetChar() {
    unsigned char c;
    return fs_->Read(&c, 1) == 1 ? static_cast<int>(c) : EOF;
  }
  /*! \brief Next significant character, consuming it; EOF at the end of the data. */
  int NextDigit() {
    if (next_ == -2) next_ = GetChar();
    while (next_ != EOF && std::isspace(next_)) next_ = GetChar();
    int c = next_;
    if (c == EOF || c == '"' || c == '=') return EOF;
    next_ = -2;
    return c;
  }
  /*! \brief Decode one group of up to 4 digits into up to 3 bytes. */
  bool Refill() {
    if (finished_) return false;
    int v[4];
    int count = 0;
    for (; count < 4; ++count) {
      int c = NextDigit();
      if (c == EOF) break;
      v[count] = base64::Decode(c);
      TVM_FFI_ICHECK(v[count] >= 0) << "invalid base64 character " << c;
    }
    if (count < 4) finished_ = true;
    if (count < 2) return false;
    uint32_t bits = 0;
    for (int i = 0; i < 4; ++i) bits = (bits << 6) | static_cast<uint32_t>(i < count ? v[i] : 0);
    buf_[0] = static_cast<unsigned char>((bits >> 16) & 0xFF);
    buf_[1] = static_cast<unsigned char>((bits >> 8) & 0xFF);
    buf_[2] = static_cast<unsigned char>(bits & 0xFF);
    buf_pos_ = 0;
    buf_len_ = static_cast<size_t>(count - 1);
    return true;
  }

  Stream* fs_;
  int next_{-2};  // -2: nothing looked ahead yet
  bool finished_{false};
  unsigned char buf_[3];
  size_t buf_pos_{0};
  size_t buf_len_{0};
};

/*! \brief Encodes bytes as base64 text into another stream; call Finish() at the end. */
class Base64OutStream : public Stream {
 public:
  using Stream::Read;
  using Stream::Write;

  explicit Base64OutStream(Stream* fp) : fp_(fp) {}

  size_t Write(const void* ptr, size_t size) final {
    const unsigned char* in = static_cast<const unsigned char*>(ptr);
    for (size_t i = 0; i < size; ++i) {
      buf_[buf_len_++] = in[i];
      if (buf_len_ == 3) Emit();
    }
    return size;
  }
  size_t Read(void*, size_t) final {
    TVM_FFI_THROW(InternalError) << "Base64OutStream is write-only";
    return 0;
  }

  /*! \brief Flush the last group with '=' padding; append endch unless it is EOF. */
  void Finish(int endch = EOF) {
    if (buf_len_ != 0) Emit();
    if (endch != EOF) {
      char c = static_cast<char>(endch);
      fp_->Write(&c, 1);
    }
  }

 private:
  void Emit() {
    const char* table = base64::EncodeTable();
    uint32_t bits = (static_cast<uint32_t>(buf_[0]) << 16) |
                    (buf_len_ > 1 ? static_cast<uint32_t>(buf_[1]) << 8 : 0u) |
                    (buf_len_ > 2 ? static_cast<uint32_t>(buf_[2]) : 0u);
    char out[4];
    out[0] = table[(bits >> 18) & 0x3F];
    out[1] = table[(bits >> 12) & 0x3F];
    out[2] = buf_len_ > 1 ? table[(bits >> 6) & 0x3F] : '=';
    out[3] = buf_len_ > 2 ? table[bits & 0x3F] : '=';
    fp_->Write(out, 4);
    buf_len_ = 0;
  }

  Stream* fp_;
  unsigned char buf_[3];
  size_t buf_len_{0};
};

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_BASE64_H_
