/*
 * unpack_program.cc - compiled into a model library whose Relax program (TVM's "relax.VMExecutable"
 * module: the VM's bytecode and every constant, the weights among them) is stored compressed.
 *
 * edgepack stores that module as kind "relax.VMExecutable_lz4" with bytes "u64 length" + one LZ4 block
 * where LZ4 saves enough (edgepack/toolchain/packed_kernels.py): weights that are mostly zeros, such as a
 * pruned model's, take half their bytes or less. When the library is loaded (dlopen, or the program's
 * system library), this file's static initialiser registers the global function TVM's loader looks up for
 * that kind, "ffi.Module.load_from_bytes.relax.VMExecutable_lz4": it decodes the block and hands the bytes
 * to TVM's own loader for "relax.VMExecutable". So any TVM runtime loads the library (edgepack's C
 * runner, C bundles, the JNI layer, RPC servers, TVM's Python package): the decoder travels with the
 * model. The weights are decoded once, at load; inference reads them as before.
 *
 * Only tvm-ffi's C ABI is used (tvm/ffi/c_api.h). Every read and write of the decoder is bounds-checked.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <tvm/ffi/c_api.h>

namespace {

const char kPackedKind[] = "ffi.Module.load_from_bytes.relax.VMExecutable_lz4";
const char kPlainKind[] = "ffi.Module.load_from_bytes.relax.VMExecutable";

/* Decode the LZ4 block in[0, size) into out[0, expected); NULL on success, else what is wrong. */
const char* DecodeBlock(const unsigned char* in, size_t size, unsigned char* out, size_t expected) {
  size_t ip = 0, op = 0;
  while (ip < size) {
    const unsigned token = in[ip++];
    size_t literals = token >> 4;
    if (literals == 15) {
      unsigned char b = 255;
      while (b == 255) {
        if (ip >= size) return "a literal length is cut off";
        b = in[ip++];
        literals += b;
      }
    }
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
    if (match == 15) {
      unsigned char b = 255;
      while (b == 255) {
        if (ip >= size) return "a match length is cut off";
        b = in[ip++];
        match += b;
      }
    }
    match += 4;
    if (match > expected - op) return "a match goes past the end of the output";
    for (size_t i = 0; i < match; ++i, ++op) out[op] = out[op - offset]; /* may overlap itself */
  }
  return op == expected ? NULL : "the block decodes to fewer bytes than its header says";
}

int Fail(const char* why) {
  TVMFFIErrorSetRaisedFromCStr("RuntimeError", why);
  return -1;
}

/* ffi.Module.load_from_bytes.relax.VMExecutable_lz4(bytes) -> Module */
int LoadPacked(void*, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  if (num_args != 1) return Fail("the compressed Relax program's loader takes one argument");
  const TVMFFIByteArray* packed = NULL;
  if (args[0].type_index == kTVMFFIBytes) {
    packed = TVMFFIBytesGetByteArrayPtr(args[0].v_obj);
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

/* Registered at load, before the library's modules are; a later library's copy replaces an earlier one's
 * (the same function, and the earlier library may be unloaded by then). */
struct Register {
  Register() {
    TVMFFIObjectHandle f = NULL;
    if (TVMFFIFunctionCreate(NULL, LoadPacked, NULL, &f) != 0) return;
    const TVMFFIByteArray name = {kPackedKind, sizeof(kPackedKind) - 1};
    TVMFFIFunctionSetGlobal(&name, f, 1);
    TVMFFIObjectDecRef(f);
  }
} register_packed_loader;

}  // namespace
