"""Where edgepack's native sources (``runtimes/``) are, and digests of them for cache keys.

``runtimes/`` is grouped by who uses what::

    api/c/          the C API and example runner shipped in C bundles
    api/android/    the Java API and JNI layer shipped in AARs
    plugins/        TVM runtime modules for the GPUs (opencl/, vulkan/, and gpu-common/ they share)
    rpc-server/     the RPC server installed on devices (no Python there)
    tvm/            recipes for TVM's own runtime: runtime/ (CMake), compat/ (headers the wheel lacks), cmake/
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from edgepack.errors import EdgepackError

C_API = "api/c"
ANDROID_API = "api/android"
RPC_SERVER = "rpc-server"
GPU_COMMON = "plugins/gpu-common"
TVM_RUNTIME = "tvm/runtime"
TVM_COMPAT = "tvm/compat"
TVM_CMAKE = "tvm/cmake"


#: the C API's implementation (runtimes/api/c/src), compiled into every program and library that uses it
C_API_SOURCES = ("edgepack.c", "ep_parallel.c", "ep_program.c")
C_API_PRIVATE_HEADERS = ("ep_parallel.h", "ep_program.h")


def runtimes_dir() -> Path:
    """``runtimes/`` of the source tree, or the copy an installed wheel carries inside the package."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "runtimes", here / "runtimes"):
        if (candidate / C_API / "include" / "edgepack.h").is_file():
            return candidate
    raise EdgepackError(
        "edgepack's native sources (runtimes/) are missing from this installation.",
        "Reinstall edgepack; the wheel must include the runtimes/ directory.",
    )


def source_dir(name: str) -> Path:
    """``runtimes/<name>``, e.g. ``source_dir(C_API)`` or ``source_dir("plugins/opencl")``."""
    return runtimes_dir() / name


def c_api_sources() -> list[Path]:
    """The C API's source files (``C_API_SOURCES``)."""
    return [source_dir(C_API) / "src" / name for name in C_API_SOURCES]


def c_api_files() -> list[Path]:
    """What a build of the C API reads: its sources, its private headers and ``edgepack.h``."""
    src = source_dir(C_API) / "src"
    return [*c_api_sources(), *(src / h for h in C_API_PRIVATE_HEADERS), source_dir(C_API) / "include" / "edgepack.h"]


def sources_digest(subdirs: Sequence[str], suffixes: Sequence[str]) -> str:
    """A cache key for what a build reads from ``runtimes/<subdir>``: every file with one of
    ``suffixes``, outside ``tests/`` (documentation and self-tests do not change what is built)."""
    root = runtimes_dir()
    h = hashlib.sha256()
    for base in (root / d for d in subdirs):
        for path in sorted(p for p in base.rglob("*") if p.is_file() and p.suffix in suffixes
                           and "tests" not in p.relative_to(base).parts):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()
