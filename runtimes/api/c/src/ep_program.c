/*
 * ep_program.c - loading a model library whose Relax program (TVM's "relax.VMExecutable" module: the VM's
 * bytecode and every constant, the weights among them) is stored compressed.
 *
 * edgepack stores that module as kind "relax.VMExecutable_lz4" with bytes "u64 length" + one LZ4 block
 * where LZ4 saves enough (edgepack/toolchain/packed_kernels.py): weights that are mostly zeros, such as a
 * pruned model's, take half their bytes or less. TVM's loader looks a kind's loader up as the global
 * function "ffi.Module.load_from_bytes.<kind>"; ep_load_packed_program is that function (registered by
 * ep_register_runtime_builtins, before the C API, the JNI layer or the RPC server loads a model): it decodes
 * the block and hands the bytes to TVM's own loader for "relax.VMExecutable". The weights are decoded once,
 * at load; inference reads them as before. (Python registers the same loader: edgepack/run/host.py.)
 *
 * Only tvm-ffi's C ABI is used. Every read and write of the decoder is bounds-checked.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <tvm/ffi/c_api.h>

#include "ep_program.h"

static const char kPlainKind[] = "ffi.Module.load_from_bytes.relax.VMExecutable";

/* A length of 15 goes on in the bytes after it, each added, until one is not 255; false if they are cut off. */
static int ExtendLength(const unsigned char* in, size_t size, size_t* ip, size_t* n) {
  if (*n != 15) return 1;
  unsigned char b = 255;
  while (b == 255) {
    if (*ip >= size) return 0;
    b = in[(*ip)++];
    *n += b;
  }
  return 1;
}

/* Decode the LZ4 block in[0, size) into out[0, expected); NULL on success, else what is wrong. */
static const char* DecodeBlock(const unsigned char* in, size_t size, unsigned char* out, size_t expected) {
  size_t ip = 0, op = 0;
  while (ip < size) {
    const unsigned token = in[ip++];
    size_t literals = token >> 4;
    if (!ExtendLength(in, size, &ip, &literals)) return "a literal length is cut off";
    if (literals > size - ip || literals > expected - op) return "a literal run goes past the end";
    memcpy(out + op, in + ip, literals);
    ip += literals;
    op += literals;
    if (ip == size) break; /* the last sequence has no match */
    if (size - ip < 2) return "a match offset is cut off";
    const size_t offset = (size_t)in[ip] | ((size_t)in[ip + 1] << 8);
    ip += 2;
    if (offset == 0 || offset > op) return "a match refers before the start of the output";
    size_t match = token & 15;
    if (!ExtendLength(in, size, &ip, &match)) return "a match length is cut off";
    match += 4;
    if (match > expected - op) return "a match goes past the end of the output";
    for (size_t i = 0; i < match; ++i, ++op) out[op] = out[op - offset]; /* may overlap itself */
  }
  return op == expected ? NULL : "the block decodes to fewer bytes than its header says";
}

static int Fail(const char* why) {
  TVMFFIErrorSetRaisedFromCStr("RuntimeError", why);
  return -1;
}

/* ffi.Module.load_from_bytes.relax.VMExecutable_lz4(bytes) -> Module */
int ep_load_packed_program(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  (void)self;
  if (num_args != 1) return Fail("the compressed Relax program's loader takes one argument");
  const TVMFFIByteArray* packed = NULL;
  if (args[0].type_index == kTVMFFIBytes) {
    packed = (const TVMFFIByteArray*)((const char*)args[0].v_obj + sizeof(TVMFFIObject)); /* after its header */
  } else if (args[0].type_index == kTVMFFIByteArrayPtr) {
    packed = (const TVMFFIByteArray*)args[0].v_ptr;
  } else {
    return Fail("the compressed Relax program's loader takes bytes");
  }
  const unsigned char* data = (const unsigned char*)packed->data;
  if (packed->size < 8) return Fail("the compressed Relax program is cut off");
  uint64_t expected = 0;
  for (int i = 0; i < 8; ++i) expected |= (uint64_t)data[i] << (8 * i);
  if (expected > (uint64_t)SIZE_MAX / 2) return Fail("the compressed Relax program's length is not plausible");
  unsigned char* plain = (unsigned char*)malloc(expected ? (size_t)expected : 1);
  if (plain == NULL) return Fail("out of memory decoding the compressed Relax program");
  const char* why = DecodeBlock(data + 8, packed->size - 8, plain, (size_t)expected);
  if (why != NULL) {
    free(plain);
    return Fail(why);
  }
  TVMFFIObjectHandle load = NULL;
  const TVMFFIByteArray name = {kPlainKind, sizeof(kPlainKind) - 1};
  if (TVMFFIFunctionGetGlobal(&name, &load) != 0 || load == NULL) {
    free(plain);
    return load == NULL ? Fail("this TVM runtime has no loader for Relax programs") : -1;
  }
  TVMFFIByteArray bytes = {(const char*)plain, (size_t)expected};
  TVMFFIAny arg;
  memset(&arg, 0, sizeof(arg));
  arg.type_index = kTVMFFIByteArrayPtr;
  arg.v_ptr = &bytes;
  const int status = TVMFFIFunctionCall(load, &arg, 1, result);
  TVMFFIObjectDecRef(load);
  free(plain);
  return status;
}
