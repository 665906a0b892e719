"""GPU kernel text stored compressed in model libraries (issue 42, small libraries): the LZ4 blocks
``edgepack/toolchain/packed_kernels.py`` writes, the decoder edgepack's GPU runtimes read them with
(``runtimes/plugins/gpu-common/include/edgepack_gpu/lz4_block.h``), and real GPU builds that load them on
PoCL and lavapipe."""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

import lz4.block
import numpy as np
import pytest
from gpu_common import plugin_with_a_device

import edgepack
from edgepack.backends.opencl import KERNEL_DECLARATION
from edgepack.compiling import compile_model
from edgepack.errors import EdgepackError
from edgepack.toolchain.packed_kernels import SUFFIX

ROOT = Path(__file__).resolve().parent.parent
HEADERS = ROOT / "runtimes" / "plugins" / "gpu-common" / "include"

DECODER = r"""
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include "edgepack_gpu/lz4_block.h"
// decode FILE (u64 length + one block) and write the result to OUT; exit 1 with the decoder's reason
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  std::ifstream in(argv[1], std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  unsigned long long expected = 0;
  for (int i = 0; i < 8; ++i) expected |= (unsigned long long)(unsigned char)data[i] << (8 * i);
  std::string out;
  std::string why = edgepack::gpu::Lz4DecodeBlock((const unsigned char*)data.data() + 8, data.size() - 8,
                                                  (size_t)expected, &out);
  if (!why.empty()) { std::printf("%s\n", why.c_str()); return 1; }
  std::ofstream(argv[2], std::ios::binary) << out;
  return 0;
}
"""


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> Path:
    """The runtimes' LZ4 decoder in a small program, built warning-free under AddressSanitizer."""
    work = tmp_path_factory.mktemp("lz4")
    (work / "decode.cc").write_text(DECODER)
    exe = work / "decode"
    result = subprocess.run(["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
                             "-g", f"-I{HEADERS}", str(work / "decode.cc"), "-o", str(exe)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return exe


def _decode(decoder: Path, packed: bytes, tmp_path: Path) -> subprocess.CompletedProcess:
    (tmp_path / "in.bin").write_bytes(packed)
    return subprocess.run([str(decoder), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")],
                          capture_output=True, text=True, check=False)


def _pack(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + lz4.block.compress(data, mode="high_compression", compression=12,
                                                             store_size=False)


@pytest.mark.parametrize("case", ["text", "random", "runs", "empty", "one"])
def test_the_decoder_reads_what_lz4_writes(decoder, tmp_path, case):
    """Literal runs and matches longer than 15 + 255 (their extra length bytes), matches that overlap their own
    output (a run of one byte), incompressible data, the empty and the one-byte block."""
    rng = np.random.default_rng(3)
    data = {"text": b"".join(b"__kernel void k%d(__global float* restrict a);\n" % (i % 40) for i in range(3000)),
            "random": rng.integers(0, 256, 70000, dtype=np.uint8).tobytes(),
            "runs": b"a" * 5000 + rng.integers(0, 256, 600, dtype=np.uint8).tobytes() + b"ab" * 3000,
            "empty": b"", "one": b"x"}[case]
    result = _decode(decoder, _pack(data), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "out.bin").read_bytes() == data


@pytest.mark.parametrize(("damage", "reason"), [
    ("longer", "decodes to fewer bytes than its header says"),
    ("shorter", "goes past the end of the output"),
    ("cut", "past the end of the block"),
    ("offset", "refers before the start of the output"),
])
def test_a_damaged_block_is_an_error_not_a_bad_read(decoder, tmp_path, damage, reason):
    """Every way a block can lie is refused with its reason; AddressSanitizer sees no read or write out of
    bounds."""
    data = b"".join(b"kernel %d;\n" % (i % 7) for i in range(400))
    packed = bytearray(_pack(data))
    if damage == "longer":
        packed[:8] = struct.pack("<Q", len(data) + 1)
    elif damage == "shorter":
        packed[:8] = struct.pack("<Q", len(data) - 20)
    elif damage == "cut":
        packed = packed[:8] + bytes([0xF0, 0xFF, 0xFF]) + b"abc"  # a 15 + 510 + ... literal run of 3 bytes
    else:  # the first match made to point 60000 bytes back
        token_literals = packed[8] >> 4
        at = 8 + 1 + token_literals
        packed[at:at + 2] = struct.pack("<H", 60000)
    result = _decode(decoder, bytes(packed), tmp_path)
    assert result.returncode == 1 and reason in result.stdout, result.stdout + result.stderr


# ----------------------------------------------------------------------------------------------
# real GPU builds


def _packed_module(library: Path, kind: str) -> tuple[int, int, int]:
    """Of the ``<kind>_lz4`` module in a library file: the offset of its ``u64 length`` header, that length
    (of the text it decompresses to) and its compressed size."""
    data = library.read_bytes()
    name = (kind + SUFFIX).encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)  # the module's u64 byte count
    (size,) = struct.unpack_from("<Q", data, at)
    return at + 8, struct.unpack_from("<Q", data, at + 8)[0], size - 8


@pytest.mark.slow
@pytest.mark.parametrize(("profile", "place", "kind"), [("mali-g610", "host-opencl", "opencl"),
                                                      ("vulkan-generic", "host-vulkan", "webgpu")])
def test_gpu_libraries_store_their_kernels_compressed(models, tmp_path, profile, place, kind):
    """PP-OCR's classifier: the kernel text in the libraries is compressed (the OpenCL C without its repeated
    declarations), the device library is under 1.6x the model (it was 3.2x on Vulkan, 5x on OpenCL), and the
    host library, which loads the same way, matches ONNX Runtime; a library whose compressed module lies about
    its length fails with the runtime's reason, not a crash."""
    plugin_with_a_device("opencl" if kind == "opencl" else "vulkan")
    cls = models["ppocr_cls"]
    build = compile_model(cls.path, profile, tmp_path / "b", input_shapes=cls.input_shapes)
    source = next(p for p in (build.output_dir / "device").glob("kernels.*") if p.suffix != ".json").read_text()
    assert build.device_library.stat().st_size < 1.6 * cls.path.stat().st_size
    for library in (build.device_library, build.host_library):
        _at, _length, packed = _packed_module(library, kind)
        assert packed < len(source) / 8, (library, packed, len(source))
    if kind == "opencl":
        assert KERNEL_DECLARATION.search(source)  # TVM's text has them; the library's does not
    assert edgepack.validate(build.output_dir, place).passed

    host = build.host_library
    data = bytearray(host.read_bytes())
    at, length, _packed = _packed_module(host, kind)
    data[at:at + 8] = struct.pack("<Q", length + 1)
    host.write_bytes(bytes(data))
    with pytest.raises(EdgepackError, match=r"module of this library is damaged: the block decodes to fewer bytes"):
        edgepack.validate(build.output_dir, place)


def test_cpu_libraries_are_packed_as_tvm_packs_them(models, tmp_path):
    """Only GPU modules are repacked: a CPU build's library has no compressed module."""
    cls = models["ppocr_cls"]
    build = compile_model(cls.path, "host", tmp_path / "b", input_shapes=cls.input_shapes)
    assert not re.search(rb"(opencl|webgpu)" + SUFFIX.encode(), build.device_library.read_bytes())
