"""Build and cache edgepack's GPU runtime plug-ins (``runtimes/opencl``, ``runtimes/vulkan``) for a triple.

Both are CMake projects over the same TVM runtime headers and ``runtimes/gpu-common``; what differs
between them (extra CMake definitions, files placed beside the library) comes in as arguments.
Results are cached by everything that goes in: TVM version, triple, compiler, flags, sources, the
runtime linked against, and the caller's extra inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepack.errors import ToolchainError
from edgepack.fileutil import file_lock, file_sha256
from edgepack.paths import cache_root

HOST_TRIPLE = "x86_64-linux-gnu"

Log = Callable[[str], None]


def format_size(values: Sequence[int | str]) -> str:
    """``(64, 1, 1)`` -> ``64x1x1``: launch sizes in ``inspect --kernels``."""
    return "x".join(str(v) for v in values)


def summary_lines(extra: Mapping[str, Any], kernels_line: str) -> list[str]:
    """Compile-summary lines of a GPU build: its kernels, their schedules, and the CPU fallback (always
    stated, never silent)."""
    schedules = ", ".join(f"{n} {rule}" for rule, n in sorted(extra.get("schedules", {}).items()))
    fallback = extra.get("cpu_fallback") or []
    return [
        kernels_line,
        f"schedules: {schedules or 'none'}",
        "CPU fallback: none (every fused function runs on the GPU)" if not fallback
        else f"CPU fallback: {len(fallback)} function(s) without a GPU schedule: {', '.join(fallback)}",
    ]


@dataclass(frozen=True)
class PluginRecipe:
    """One plug-in: ``runtimes/<name>`` installs ``lib/<shared>`` (and a static archive)."""

    name: str  # "opencl": source dir, cache dir, -DEDGEPACK_<NAME>_VERSION
    label: str  # "OpenCL", for messages
    shared: str  # e.g. libtvm_opencl.so
    version: str


def sources_digest(name: str) -> str:
    """The plug-in's sources, the headers it shares with the other one (``runtimes/gpu-common``) and the
    CMake code it shares with the TVM runtime build (``runtimes/cmake``)."""
    from edgepack import native

    return native.sources_digest((name, "gpu-common", "cmake"), (".h", ".cc", ".txt", ".cmake"))


def host_compilers() -> tuple[str, str]:
    """(cc, cxx) of this machine, for the host plug-ins and host programs."""
    for cc, cxx in (("gcc", "g++"), ("cc", "c++"), ("clang", "clang++")):
        if shutil.which(cxx):
            return cc, cxx
    raise ToolchainError("No C++ compiler found to build edgepack's GPU runtimes for this machine.",
                         "Install one: `apt-get install g++ cmake`.")


def build(
    recipe: PluginRecipe,
    triple: str,
    cxx: str,
    runtime,
    *,
    flags: Sequence[str] = (),
    defines: Sequence[str] = (),
    key_extra: Mapping[str, Any] | None = None,
    beside: Mapping[str, Path] | None = None,
    manifest_extra: Mapping[str, Any] | None = None,
    cache_dir: Path | None = None,
    log: Log | None = None,
) -> Path:
    """Build ``recipe`` for ``triple`` with ``cxx`` against ``runtime`` (a ``native.TargetRuntime``);
    return the cached directory (``lib/``, ``manifest.json``).

    ``defines``: extra ``-D`` CMake arguments; ``key_extra``: what else the result depends on;
    ``beside``: files copied into ``lib/`` next to the plug-in (names -> sources).
    """
    from edgepack import native

    cmake = native._require_tool("cmake")
    native._require_tool(cxx, triple)
    tvm_dir, ffi_dir = native.tvm_source_dirs()
    shared = {p.name: p for p in runtime.shared_libs}
    if "libtvm_runtime.so" not in shared or "libtvm_ffi.so" not in shared:
        raise ToolchainError(f"The {triple} TVM runtime in {runtime.root} has no shared libraries to link against.")
    key_data = {
        "tvm": native.TVM_VERSION, "ffi": native.TVM_FFI_VERSION, "triple": triple, "flags": list(flags),
        "cxx": native._compiler_identity(cxx), "sources": sources_digest(recipe.name),
        "runtime": {name: file_sha256(path) for name, path in sorted(shared.items())}, **(key_extra or {}),
    }
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:12]
    base = Path(cache_dir if cache_dir is not None else cache_root()) / recipe.name / native.TVM_VERSION
    root = base / f"{triple}-{key}"
    if (root / "manifest.json").is_file():
        return root
    with file_lock(base / f".{root.name}.lock"):
        if (root / "manifest.json").is_file():
            return root
        if log:
            log(f"Building edgepack's {recipe.label} runtime for {triple} (about a minute)")
        started = time.perf_counter()
        with native._staging(root) as tmp, tempfile.TemporaryDirectory(prefix=f"edgepack-{recipe.name}-") as work:
            build_dir, log_file = Path(work) / "build", Path(work) / "build.log"
            configure = [
                cmake, "-S", native.runtimes_dir() / recipe.name, "-B", build_dir,
                f"-DTVM_SOURCE_DIR={tvm_dir}", f"-DTVM_FFI_SOURCE_DIR={ffi_dir}",
                f"-DTVM_RUNTIME_LIBRARY={shared['libtvm_runtime.so']}", f"-DTVM_FFI_LIBRARY={shared['libtvm_ffi.so']}",
                *defines,
                f"-DCMAKE_CXX_COMPILER={cxx}", f"-DCMAKE_CXX_FLAGS={' '.join(flags)}", "-DCMAKE_BUILD_TYPE=Release",
                f"-DEDGEPACK_{recipe.name.upper()}_VERSION={recipe.version}", f"-DCMAKE_INSTALL_PREFIX={tmp}",
            ]
            if triple != HOST_TRIPLE:
                configure += ["-DCMAKE_SYSTEM_NAME=Linux", f"-DCMAKE_SYSTEM_PROCESSOR={triple.split('-')[0]}"]
            jobs = str(min(2, os.cpu_count() or 1))
            for step in (configure, [cmake, "--build", build_dir, "-j", jobs], [cmake, "--install", build_dir]):
                result = native._run(step, log=None, log_file=log_file)
                if result.returncode != 0:
                    raise ToolchainError(
                        f"Building edgepack's {recipe.label} runtime for {triple} with {Path(cxx).name} failed.",
                        "The last lines of the build log:\n" + native._tail(result.stdout + result.stderr),
                    )
            (tmp / "lib" / recipe.shared).chmod(0o755)
            for name, source in (beside or {}).items():
                shutil.copy2(source, tmp / "lib" / name)
            data = {
                "triple": triple, "key": key, "created": time.time(), "runtime_origin": runtime.origin,
                "build_seconds": round(time.perf_counter() - started, 1), "plugin_version": recipe.version,
                "libs": {p.name: {"sha256": file_sha256(p), "size": p.stat().st_size}
                         for p in sorted((tmp / "lib").iterdir()) if p.is_file()},
                **{k: key_data[k] for k in ("tvm", "ffi", "flags", "cxx")}, **(manifest_extra or {}),
            }
            (tmp / "manifest.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return root
