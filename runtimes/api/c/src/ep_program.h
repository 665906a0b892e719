/* ep_program.h - the loader of a compressed Relax program (ep_program.c); private to the C API. */
#ifndef EDGEPACK_EP_PROGRAM_H_
#define EDGEPACK_EP_PROGRAM_H_

#include <stdint.h>
#include <tvm/ffi/c_api.h>

/*! \brief The global function TVM looks up to load a module of that kind. */
#define EP_PACKED_PROGRAM_LOADER "ffi.Module.load_from_bytes.relax.VMExecutable_lz4"

/*! \brief EP_PACKED_PROGRAM_LOADER(bytes) -> Module, as a tvm-ffi safe call. */
int ep_load_packed_program(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);

#endif  /* EDGEPACK_EP_PROGRAM_H_ */
