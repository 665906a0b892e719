// Self-test of the compat headers (serializer, streams, base64, ring buffer, arena, fp16).
//
//   compat_test FP16_OUT
//
// Checks what can be checked in C++ and prints "N passed, M failed". It also writes FP16_OUT:
// the float -> half results for a fixed set of inputs and all 65536 half -> float results, which
// the Python test compares bit for bit with numpy.
#include <builtin_fp16.h>
#include <tvm/support/io.h>
#include <tvm/support/serializer.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "../../src/support/arena.h"
#include "../../src/support/base64.h"
#include "../../src/support/bytes_io.h"
#include "../../src/support/ring_buffer.h"
#include "../../src/support/utils.h"

static int g_passed = 0, g_failed = 0;
#define CHECK(cond)                                                   \
  do {                                                                \
    if (cond) {                                                       \
      ++g_passed;                                                     \
    } else {                                                          \
      ++g_failed;                                                     \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);     \
    }                                                                 \
  } while (0)

namespace sup = tvm::support;

static void TestSerializer() {
  std::string buf;
  sup::BytesOutStream out(&buf);
  uint64_t magic = 0xD225DE2F4214151DULL;
  std::string version = "0.27";
  std::vector<int64_t> offsets = {1, 2, 3};
  std::vector<std::string> names = {"a", "", "long name"};
  DLDataType dtype{kDLFloat, 32, 1};
  DLDevice dev{kDLCPU, 3};
  std::map<std::string, int> m = {{"x", 1}, {"y", 2}};
  out.Write(magic);
  out.Write(version);
  out.Write(offsets);
  out.Write(names);
  out.Write(dtype);
  out.Write(dev);
  out.Write(m);
  out.WriteArray(offsets.data(), offsets.size());
  out.Write(tvm::ffi::String("ffi"));
  // dmlc layout: raw value, then uint64 length + bytes
  CHECK(buf.size() > 16);
  uint64_t first;
  std::memcpy(&first, buf.data(), 8);
  CHECK(first == magic);
  uint64_t vlen;
  std::memcpy(&vlen, buf.data() + 8, 8);
  CHECK(vlen == 4 && buf.compare(16, 4, "0.27") == 0);

  sup::BytesInStream in(buf);
  uint64_t magic2 = 0;
  std::string version2;
  std::vector<int64_t> offsets2;
  std::vector<std::string> names2;
  DLDataType dtype2{};
  DLDevice dev2{};
  std::map<std::string, int> m2;
  int64_t arr[3];
  tvm::ffi::String s2("");
  CHECK(in.Read(&magic2) && magic2 == magic);
  CHECK(in.Read(&version2) && version2 == version);
  CHECK(in.Read(&offsets2) && offsets2 == offsets);
  CHECK(in.Read(&names2) && names2 == names);
  CHECK(in.Read(&dtype2) && dtype2.code == kDLFloat && dtype2.bits == 32 && dtype2.lanes == 1);
  CHECK(in.Read(&dev2) && dev2.device_type == kDLCPU && dev2.device_id == 3);
  CHECK(in.Read(&m2) && m2 == m);
  CHECK(in.ReadArray(arr, 3) && arr[2] == 3);
  CHECK(in.Read(&s2) && s2 == "ffi");
  uint64_t past_end;
  CHECK(!in.Read(&past_end));  // short read is reported, not an exception

  tvm::ffi::Bytes bytes(buf);
  sup::BytesInStream in_bytes(bytes);
  uint64_t again = 0;
  CHECK(in_bytes.Read(&again) && again == magic);
}

static void TestBase64() {
  const char* cases[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
  const char* expect[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
  for (int i = 0; i < 7; ++i) {
    std::string encoded;
    sup::BytesOutStream out(&encoded);
    sup::Base64OutStream b64(&out);
    b64.Write(cases[i], std::strlen(cases[i]));
    b64.Finish();
    CHECK(encoded == expect[i]);
    sup::BytesInStream in(encoded);
    sup::Base64InStream dec(&in);
    dec.InitPosition();
    char back[16] = {0};
    size_t n = dec.Read(back, sizeof(back));
    CHECK(n == std::strlen(cases[i]) && std::memcmp(back, cases[i], n) == 0);
  }
}

static void TestRingBuffer() {
  sup::RingBuffer rb;
  std::vector<char> data(10000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31);
  std::vector<char> got;
  size_t written = 0;
  // interleave writes and partial reads so that the ring wraps and grows
  while (got.size() < data.size()) {
    size_t chunk = std::min<size_t>(777, data.size() - written);
    if (chunk) {
      rb.Write(data.data() + written, chunk);
      written += chunk;
    }
    size_t take = std::min<size_t>(500, rb.bytes_available());
    rb.ReadWithCallback(
        [&](const void* p, size_t n) {
          got.insert(got.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
          return n;
        },
        take);
    if (written == data.size() && rb.bytes_available() > 0) {
      std::vector<char> rest(rb.bytes_available());
      rb.Read(rest.data(), rest.size());
      got.insert(got.end(), rest.begin(), rest.end());
    }
  }
  CHECK(got == data);
  size_t n = rb.WriteWithCallback(
      [](void* p, size_t size) {
        std::memset(p, 7, size);
        return size;
      },
      100);
  CHECK(n > 0 && rb.bytes_available() == n);
}

static void TestArena() {
  sup::Arena arena;
  for (int round = 0; round < 3; ++round) {
    int64_t* a = arena.allocate_<int64_t>(10);
    char* big = arena.allocate_<char>(100000);
    double* b = arena.allocate_<double>(1);
    CHECK(reinterpret_cast<uintptr_t>(a) % alignof(int64_t) == 0);
    CHECK(reinterpret_cast<uintptr_t>(b) % alignof(double) == 0);
    a[9] = 1;
    big[99999] = 2;
    *b = 3.0;
    arena.RecycleAll();
  }
}

static void TestUtils() {
  CHECK(sup::IsNumber("123") && !sup::IsNumber("") && !sup::IsNumber("1a"));
  CHECK(sup::StartsWith("RPCSessionTimeoutError: x", "RPCSessionTimeoutError: "));
  CHECK(!sup::StartsWith("RPC", "RPCSession"));
  CHECK(sup::Split("a,b,,c", ',').size() == 4);
}

int main(int argc, char** argv) {
  TestSerializer();
  TestBase64();
  TestRingBuffer();
  TestArena();
  TestUtils();
  uint16_t one_half = __truncXfYf2__<float, uint32_t, 23, uint16_t, uint16_t, 10>(1.0f);
  float one = __extendXfYf2__<uint16_t, uint16_t, 10, float, uint32_t, 23>(0x3c00);
  CHECK(one_half == 0x3c00);
  CHECK(one == 1.0f);
  if (argc > 1) {
    FILE* f = std::fopen(argv[1], "wb");
    if (f == nullptr) return 2;
    // float -> half over a deterministic spread of bit patterns
    for (uint32_t i = 0; i < (1u << 20); ++i) {
      uint32_t bits = i * 4099u + (i >> 7);
      float x;
      std::memcpy(&x, &bits, 4);
      uint16_t h = __truncXfYf2__<float, uint32_t, 23, uint16_t, uint16_t, 10>(x);
      std::fwrite(&bits, 4, 1, f);
      std::fwrite(&h, 2, 1, f);
    }
    // every half -> float
    for (uint32_t h = 0; h < 65536; ++h) {
      float x = __extendXfYf2__<uint16_t, uint16_t, 10, float, uint32_t, 23>(static_cast<uint16_t>(h));
      std::fwrite(&x, 4, 1, f);
    }
    std::fclose(f);
  }
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
