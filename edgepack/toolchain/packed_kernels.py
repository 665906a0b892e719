"""GPU kernel text stored compressed in a model library.

A library TVM exports holds its imported modules in one blob (``__tvm_ffi__library_bin``, tvm-ffi's
``ProcessLibraryBin`` format: ``u64 nbytes``, the import tree, then per module its kind and bytes). A GPU
build's device module is the kernels' source text (OpenCL C, WGSL) with their launch information: TVM's
dlight schedules unroll their tiles, and the OpenCL generator repeats every kernel's declaration in every
kernel's section, so the text was 2-5x the model's weights (PP-OCR's classifier: 2.3 MB of OpenCL C for
0.5 MB of weights). It compresses 10-25x.

``pack_imports(compiler, options, packed)`` is an ``fpack_imports`` for ``export_library``: it serializes the
imports as TVM would, stores each module of a kind ``packed`` names (the backend's: ``Backend.packed_modules``,
with what the module's bytes lose first, e.g. the OpenCL sections' declarations of other kernels) as kind
``<kind>_lz4`` with bytes ``u64 length`` + one LZ4 block, and assembles the blob into an object with
``.incbin`` (a C array of a few MB would take the compiler longer than the model). edgepack's GPU runtimes register ``ffi.Module.load_from_bytes.<kind>_lz4``, which
decompresses and loads the module as before (``runtimes/plugins/gpu-common``: ``lz4_block.h``).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable, Mapping
from pathlib import Path

from edgepack.errors import ToolchainError
from edgepack.toolchain.process import run, tail

#: The suffix of a compressed module's kind.
SUFFIX = "_lz4"
#: The Relax program (bytecode and constants): stored compressed only where that saves ``PROGRAM_MIN_SAVING``
#: of its bytes (mostly-zero weights: a pruned model's). edgepack's runtimes decode it at load
#: (``runtimes/api/c/src/ep_program.c``; Python: ``register_program_loader``).
PROGRAM_KIND = "relax.VMExecutable"
PROGRAM_MIN_SAVING = 0.2
BLOB_SYMBOL = "__tvm_ffi__library_bin"

#: The modules to compress, by kind, each with what its bytes lose first (``Backend.packed_modules``).
Packed = Mapping[str, Callable[[bytes], bytes]]


class ModuleReader:
    """Little-endian reader of TVM's stream format (``u64`` values, ``str`` = ``u64 length`` + bytes)."""

    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def u64(self) -> int:
        (value,) = struct.unpack_from("<Q", self.data, self.at)
        self.at += 8
        return value

    def skip(self, size: int) -> None:
        """Skip ``u64 n`` elements of ``size`` bytes (read ``n`` first: ``self.at += ...`` would not)."""
        n = self.u64()
        self.at += n * size

    def raw(self) -> bytes:
        n = self.u64()
        value = self.data[self.at:self.at + n]
        self.at += n
        return value


def encode_str(value: bytes) -> bytes:
    return struct.pack("<Q", len(value)) + value


def compress_kernels(blob: bytes, packed: Packed) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """``blob`` (without its leading ``u64 nbytes``) with its modules of the kinds ``packed`` names compressed,
    and per module kind (bytes before, bytes after)."""
    import lz4.block

    r = ModuleReader(blob)
    indptr = [r.u64() for _ in range(r.u64())]
    children = [r.u64() for _ in range(r.u64())]
    out = [struct.pack("<Q", len(indptr)), *(struct.pack("<Q", v) for v in indptr),
           struct.pack("<Q", len(children)), *(struct.pack("<Q", v) for v in children)]
    sizes: dict[str, tuple[int, int]] = {}
    for _ in range(len(indptr) - 1):
        kind = r.raw().decode()
        if kind == "_lib":
            out.append(encode_str(b"_lib"))
            continue
        data = r.raw()
        if kind in packed:
            plain = packed[kind](data)
            block = struct.pack("<Q", len(plain)) + lz4.block.compress(
                plain, mode="high_compression", compression=12, store_size=False)
            if kind != PROGRAM_KIND or len(block) <= (1 - PROGRAM_MIN_SAVING) * len(data):
                sizes[kind] = (len(data), len(block))
                kind, data = kind + SUFFIX, block
        out += [encode_str(kind.encode()), encode_str(data)]
    if r.at != len(blob):
        raise ToolchainError(f"The library blob TVM wrote has {len(blob) - r.at} bytes after its last module.",
                             "This edgepack does not know the TVM version's format; report it.")
    return b"".join(out), sizes


def _blob_of(c_source: str) -> bytes:
    """The bytes of the array TVM's ``ModulePackImportsToC`` writes."""
    body = c_source[c_source.index("= {") + 3:c_source.index("};")]
    return bytes(int(v, 16) for v in re.findall(r"0x([0-9a-fA-F]{2})", body))


def _assembly(symbol: str, blob: Path) -> str:
    return (f'__asm__(".section .rodata\\n.globl {symbol}\\n.type {symbol}, %object\\n.p2align 4\\n{symbol}:\\n'
            f'.incbin \\"{blob}\\"\\n.size {symbol}, .-{symbol}\\n.previous\\n");\n')


def program_bytes(data: bytes) -> bytes:
    """What a program's bytes lose before they are stored compressed: nothing (a test makes it lose more)."""
    return data


def pack_imports(compiler: str, options: list[str] | None, packed: Packed, sizes: dict | None = None):
    """An ``fpack_imports`` for ``export_library``: the imports' blob with the modules of the kinds ``packed``
    names compressed, as an object made by ``compiler`` (the library's own C or C++ compiler, with
    ``options``). ``sizes`` receives per module kind (bytes before, bytes after)."""
    import tvm_ffi

    def fpack(module, is_system_lib: bool, prefix: str, workspace_dir: str) -> str:
        tvm_c = tvm_ffi.get_global_func("runtime.ModulePackImportsToC")(module, is_system_lib, prefix)
        blob = _blob_of(tvm_c)
        repacked, found = compress_kernels(blob[8:], {PROGRAM_KIND: program_bytes, **packed})
        if sizes is not None:
            sizes.update(found)
        work = Path(workspace_dir)
        blob_path = work / f"{prefix}devc.bin"
        blob_path.write_bytes(struct.pack("<Q", len(repacked)) + repacked)
        symbol = f"{prefix}{BLOB_SYMBOL}"
        source = ['#ifdef __cplusplus\nextern "C" {\n#endif\n', _assembly(symbol, blob_path.resolve())]
        if is_system_lib:  # as TVM's: the program's system library finds the blob by name
            source.append(f"extern const unsigned char {symbol}[];\n"
                          "extern int TVMFFIEnvModRegisterSystemLibSymbol(const char*, void*);\n"
                          f'static int {symbol}_reg_ = TVMFFIEnvModRegisterSystemLibSymbol("{symbol}", '
                          f"(void*){symbol});\n")
        source.append("#ifdef __cplusplus\n}\n#endif\n")
        c_path, obj_path = work / f"{prefix}devc.cc", work / f"{prefix}devc.o"
        c_path.write_text("".join(source))
        result = run([compiler, *(options or []), "-fPIC", "-c", str(c_path), "-o", str(obj_path)])
        if result.returncode != 0:
            raise ToolchainError(f"Assembling the library's kernels with {compiler} failed.", tail(result.stderr))
        return str(obj_path)

    return fpack


#: Set to 1 to keep the kernel text and the program plain in libraries (to read them with ``strings``, or
#: patch them in a test).
PLAIN_ENV = "EDGEPACK_PLAIN_KERNELS"


def packing(compiler: str, options: list[str] | None, packed: Packed) -> dict:
    """``export_library``'s keyword arguments that store an executable's modules of the kinds ``packed`` names
    compressed, and its Relax program where that pays (``PROGRAM_MIN_SAVING``): none where
    ``$EDGEPACK_PLAIN_KERNELS`` is 1."""
    if os.environ.get(PLAIN_ENV) == "1":
        return {}
    return {"fpack_imports": pack_imports(compiler, options, packed)}


def register_program_loader() -> None:
    """The loader of a compressed program (``PROGRAM_KIND`` + ``SUFFIX``) in this process's TVM, as the C API
    registers it (``runtimes/api/c/src/ep_program.c``): before a library whose program is stored so loads."""
    import lz4.block
    import tvm_ffi

    name = f"ffi.Module.load_from_bytes.{PROGRAM_KIND}{SUFFIX}"
    if tvm_ffi.get_global_func(name, allow_missing=True) is not None:
        return
    plain = tvm_ffi.get_global_func(f"ffi.Module.load_from_bytes.{PROGRAM_KIND}")

    def load(data):
        data = bytes(data)
        (length,) = struct.unpack_from("<Q", data)
        return plain(lz4.block.decompress(data[8:], uncompressed_size=length))

    tvm_ffi.register_global_func(name, load)

