"""wgpu-native, the C library that runs WGSL compute shaders on Vulkan: the pinned release per triple.

It comes from the PyPI ``wgpu`` wheel (x86_64 / aarch64 Linux; SHA-256 checked, cached under
``<cache>/wgpu/<version>/``; the Python package is never installed), or from ``$EDGEPACK_WGPU_NATIVE``
for triples PyPI has no build for (Android: the user supplies it). The C API changes between
releases: the version is pinned.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from edgepack.errors import EdgepackError
from edgepack.files import cached_directory, file_sha256
from edgepack.paths import cache_root
from edgepack.progress import Progress
from edgepack.toolchain.compilers import HOST_TRIPLE
from edgepack.toolchain.wheels import PinnedWheel, fetch_wheel

WGPU_LIBRARY = "libwgpu_native.so"

#: The PyPI ``wgpu`` release whose wgpu-native (C library + webgpu.h/wgpu.h) edgepack builds against.
WGPU_VERSION = "0.32.0"
WGPU_NATIVE_VERSION = "29.0.1.1"

#: Recorded from PyPI; a download with another digest is refused.
WGPU_WHEELS: dict[str, PinnedWheel] = {
    "x86_64-linux-gnu": PinnedWheel(
        f"wgpu=={WGPU_VERSION}", f"wgpu-{WGPU_VERSION}-py3-none-manylinux_2_28_x86_64.whl",
        "6499a31b5a29a10b4f1089fea4a0806411f42605fa86b6c0b543a07ca0de8568", "manylinux_2_28_x86_64"),
    "aarch64-linux-gnu": PinnedWheel(
        f"wgpu=={WGPU_VERSION}", f"wgpu-{WGPU_VERSION}-py3-none-manylinux_2_28_aarch64.whl",
        "00454ba1bc794d38c8365f4ad29f381b88ce0a7f115133bfaa6f1dfad7eb2764", "manylinux_2_28_aarch64"),
}
_WHEEL_LIBRARY = "wgpu/resources/libwgpu_native-release.so"
_WHEEL_HEADERS = ("wgpu/resources/webgpu.h", "wgpu/resources/wgpu.h")
_ELF_MACHINES = {"x86_64": 0x3E, "aarch64": 0xB7, "arm": 0x28, "armv7a": 0x28}

ANDROID_HINT = (
    "wgpu-native is not on PyPI for Android. Build it for the device (wgpu-native "
    f"v{WGPU_NATIVE_VERSION}: `cargo ndk -t arm64-v8a build --release` in a checkout of "
    "github.com/gfx-rs/wgpu-native at that tag), or take libwgpu_native.so from that release's Android "
    "asset, and point EDGEPACK_WGPU_NATIVE at it: `export EDGEPACK_WGPU_NATIVE=/path/to/libwgpu_native.so`. "
    "The version must match: the C API changes between releases. See runtimes/plugins/vulkan/README.md."
)


@dataclass(frozen=True)
class WgpuNative:
    triple: str
    library: Path  # libwgpu_native.so for the triple
    include_dir: Path  # webgpu.h, wgpu.h
    origin: str  # "pypi:wgpu==<v>" or "EDGEPACK_WGPU_NATIVE"


def _elf_machine(path: Path) -> int | None:
    head = path.read_bytes()[:20]
    return int.from_bytes(head[18:20], "little") if head[:4] == b"\x7fELF" else None


def _extract(triple: str, base: Path, log: Progress | None) -> Path:
    def make(tmp: Path) -> None:
        wheel_path = fetch_wheel(WGPU_WHEELS[triple], base / "downloads",
                                 purpose=f"wgpu-native {WGPU_NATIVE_VERSION} for {triple}", log=log)
        with zipfile.ZipFile(wheel_path) as wheel:
            (tmp / "lib").mkdir()
            (tmp / "include").mkdir()
            (tmp / "lib" / WGPU_LIBRARY).write_bytes(wheel.read(_WHEEL_LIBRARY))
            (tmp / "lib" / WGPU_LIBRARY).chmod(0o755)
            for member in _WHEEL_HEADERS:
                (tmp / "include" / Path(member).name).write_bytes(wheel.read(member))
        data = {"triple": triple, "wgpu": WGPU_VERSION, "wgpu_native": WGPU_NATIVE_VERSION,
                "wheel": WGPU_WHEELS[triple].filename, "wheel_sha256": WGPU_WHEELS[triple].sha256,
                "library_sha256": file_sha256(tmp / "lib" / WGPU_LIBRARY)}
        (tmp / "manifest.json").write_text(json.dumps(data, indent=2) + "\n")

    base.mkdir(parents=True, exist_ok=True)
    return cached_directory(base / triple, make, complete=lambda p: (p / "manifest.json").is_file())


def wgpu_native(triple: str, *, cache_dir: Path | None = None, log: Progress | None = None) -> WgpuNative:
    """The pinned wgpu-native for ``triple``: the PyPI wheel's library for the Linux triples it exists
    for (x86_64, aarch64), else ``$EDGEPACK_WGPU_NATIVE`` (a libwgpu_native.so the user built for the
    triple: how Android gets one)."""
    base = Path(cache_dir if cache_dir is not None else cache_root()) / "wgpu" / WGPU_VERSION
    headers = _extract(HOST_TRIPLE, base, log) / "include"  # the headers are the same on every platform
    explicit = os.environ.get("EDGEPACK_WGPU_NATIVE")
    if explicit and triple not in WGPU_WHEELS:
        lib = Path(explicit).expanduser()
        if not lib.is_file():
            raise EdgepackError(f"EDGEPACK_WGPU_NATIVE={explicit} does not exist.",
                                "Point it at a libwgpu_native.so built for the device (or unset it).")
        want = _ELF_MACHINES.get(triple.split("-")[0])
        got = _elf_machine(lib)
        if want is not None and got != want:
            raise EdgepackError(f"EDGEPACK_WGPU_NATIVE={explicit} is not a shared library for {triple} "
                                f"(ELF machine {got}, expected {want}).",
                                "Use the libwgpu_native.so built for the device's architecture.")
        return WgpuNative(triple, lib, headers, "EDGEPACK_WGPU_NATIVE")
    if triple not in WGPU_WHEELS:
        raise EdgepackError(f"No wgpu-native library for {triple}: Vulkan bundles need one next to the runtime.",
                            ANDROID_HINT if "android" in triple else
                            "Build wgpu-native for it and set EDGEPACK_WGPU_NATIVE=/path/to/libwgpu_native.so.")
    root = _extract(triple, base, log)
    return WgpuNative(triple, root / "lib" / WGPU_LIBRARY, headers, f"pypi:wgpu=={WGPU_VERSION}")
