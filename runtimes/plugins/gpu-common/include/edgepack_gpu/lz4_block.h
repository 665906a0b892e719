/*
 * edgepack_gpu/lz4_block.h - decoding one LZ4 block (the LZ4 block format: a sequence of a token, literal
 * bytes and a match, the last sequence literals only). edgepack stores a GPU build's kernel text this
 * way (edgepack/toolchain/packed_kernels.py: kind "<kind>_lz4", bytes "u64 length" + one block), as it
 * compresses 10-25x. Header-only; every read and write is bounds-checked.
 */
#ifndef EDGEPACK_GPU_LZ4_BLOCK_H_
#define EDGEPACK_GPU_LZ4_BLOCK_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace edgepack {
namespace gpu {

/*!
 * \brief Decode the block ``in[0, size)`` into ``out`` (resized to ``expected`` bytes).
 * \return "" on success, else what is wrong with the block.
 */
inline std::string Lz4DecodeBlock(const unsigned char* in, size_t size, size_t expected, std::string* out) {
  out->assign(expected, '\0');
  unsigned char* dst = reinterpret_cast<unsigned char*>(&(*out)[0]);
  size_t ip = 0, op = 0;
  auto length = [&](size_t base, size_t* n) {
    *n = base;
    if (base != 15) return true;
    unsigned char b = 255;
    while (b == 255) {
      if (ip >= size) return false;
      b = in[ip++];
      *n += b;
    }
    return true;
  };
  while (ip < size) {
    const unsigned char token = in[ip++];
    size_t literals = 0;
    if (!length(token >> 4, &literals) || literals > size - ip || literals > expected - op) {
      return "a literal run goes past the end of the block or of the output";
    }
    std::memcpy(dst + op, in + ip, literals);
    ip += literals;
    op += literals;
    if (ip == size) break;  // the last sequence has no match
    if (size - ip < 2) return "a match offset is cut off";
    const size_t offset = static_cast<size_t>(in[ip]) | (static_cast<size_t>(in[ip + 1]) << 8);
    ip += 2;
    if (offset == 0 || offset > op) return "a match refers before the start of the output";
    size_t match = 0;
    if (!length(token & 15, &match)) return "a match length is cut off";
    match += 4;
    if (match > expected - op) return "a match goes past the end of the output";
    for (size_t i = 0; i < match; ++i, ++op) dst[op] = dst[op - offset];  // may overlap itself
  }
  if (op != expected) return "the block decodes to fewer bytes than its header says";
  return "";
}

}  // namespace gpu
}  // namespace edgepack

#endif  // EDGEPACK_GPU_LZ4_BLOCK_H_
