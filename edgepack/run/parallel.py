"""edgepack's parallel runtime in this process, for what runs models here (``validate``, ``bench``,
tuning's measurements): the same pool the C API, C bundles, AARs and the RPC server use
(``runtimes/api/c/src/ep_parallel.c``: parts handed to whichever thread is free, the caller included,
bounded spinning), built once for this machine as a small shared library and registered with tvm-ffi,
so that every model library loaded afterwards runs its parallel loops on it.

``EDGEPACK_PARALLEL=tvm`` keeps TVM's own pool (one fixed part per thread), e.g. to compare them.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
from pathlib import Path

from edgepack.errors import ToolchainError
from edgepack.files import cached_directory, file_sha256
from edgepack.paths import cache_root
from edgepack.toolchain.process import run, tail
from edgepack.toolchain.sources import C_API, source_dir

ENV = "EDGEPACK_PARALLEL"
LIBRARY = "libedgepack_parallel.so"


def enabled() -> bool:
    """Whether models here run on edgepack's pool (``EDGEPACK_PARALLEL`` is not ``tvm``)."""
    return os.environ.get(ENV, "").strip().lower() != "tvm"


def parallel_library() -> Path:
    """``libedgepack_parallel.so`` for this machine, built with its C compiler once per source version."""
    src = source_dir(C_API) / "src"
    sources = [src / "ep_parallel.c", src / "ep_parallel.h"]
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise ToolchainError("No C compiler (cc or gcc) for edgepack's thread pool on this machine.",
                             "apt-get install gcc (or set EDGEPACK_PARALLEL=tvm to use TVM's own pool).")
    key = hashlib.sha256("\n".join([cc, *(file_sha256(p) for p in sources)]).encode()).hexdigest()[:12]
    base = cache_root() / "parallel"
    base.mkdir(parents=True, exist_ok=True)

    def make(staging: Path) -> None:
        result = run([cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-shared", "-fPIC", str(sources[0]),
                      "-lpthread", "-ldl", "-o", str(staging / LIBRARY)])
        if result.returncode != 0:
            raise ToolchainError("Building edgepack's thread pool for this machine failed.",
                                 "The last lines of the compiler output:\n" + tail(result.stderr))

    return cached_directory(base / key, make) / LIBRARY


@functools.cache
def pool() -> ctypes.CDLL | None:
    """The pool, loaded and registered with tvm-ffi (once per process); None with ``EDGEPACK_PARALLEL=tvm``."""
    if not enabled():
        return None
    import tvm_ffi

    library = ctypes.CDLL(str(parallel_library()))
    ffi = ctypes.CDLL(str(Path(tvm_ffi.__file__).parent / "lib" / "libtvm_ffi.so"))  # the copy already loaded
    library.ep_parallel_install.argtypes = [ctypes.c_void_p]
    library.ep_parallel_set_threads.argtypes = [ctypes.c_int]
    if library.ep_parallel_install(ctypes.cast(ffi.TVMFFIEnvModRegisterContextSymbol, ctypes.c_void_p)) != 0:
        raise ToolchainError("tvm-ffi refused edgepack's thread pool.", "Set EDGEPACK_PARALLEL=tvm to use TVM's own.")
    return library


def set_pool_threads(count: int) -> None:
    """Parallel loops of models loaded here run on ``count`` threads (the calling one included)."""
    library = pool()
    if library is not None:
        library.ep_parallel_set_threads(count)


def pool_threads() -> int | None:
    """The threads a parallel loop uses now (None: TVM's own pool is in use)."""
    library = pool()
    return None if library is None else int(library.ep_parallel_threads())


def pool_loops() -> int:
    """Parallel loops the pool has run in this process (0 where it is off or unused)."""
    library = pool()
    if library is None:
        return 0
    library.ep_parallel_loops.restype = ctypes.c_ulong
    return int(library.ep_parallel_loops())


def default_threads() -> int:
    """What the pool takes without a count: ``$TVM_NUM_THREADS``, else the big cores' physical count."""
    library = pool()
    if library is None:
        raise ToolchainError("edgepack's thread pool is off here (EDGEPACK_PARALLEL=tvm).", "Unset EDGEPACK_PARALLEL.")
    return int(library.ep_parallel_default_threads())
