"""Build and cache edgepack's GPU runtime plug-ins (``runtimes/plugins/<name>``) for a triple.

A plug-in is a CMake project over the TVM runtime headers and ``runtimes/plugins/gpu-common``; it is
linked against the triple's TVM runtime and registers a TVM device API and module loader when it is
loaded. What differs between plug-ins (extra CMake definitions, files placed beside the library) comes
in as arguments. Results are cached by everything that goes in: TVM version, triple, compiler, flags,
sources, the runtime linked against, and the caller's extra inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgepack.errors import ToolchainError
from edgepack.files import cached_directory, file_sha256
from edgepack.paths import cache_root
from edgepack.progress import Progress
from edgepack.toolchain.compilers import HOST_TRIPLE, compiler_identity, host_compilers, require_tool, target_flags
from edgepack.toolchain.process import run, tail
from edgepack.toolchain.sources import GPU_COMMON, TVM_CMAKE, source_dir, sources_digest
from edgepack.toolchain.tvm_runtime import TargetRuntime, ensure_target_runtime, host_runtime, tvm_source_dirs
from edgepack.versions import TVM_FFI_VERSION, TVM_VERSION


@dataclass(frozen=True)
class PluginRecipe:
    """One plug-in: ``runtimes/plugins/<name>`` installs ``lib/<shared>`` and ``lib/<static>``."""

    name: str  # e.g. the OpenCL plug-in's: its source dir, cache dir, -DEDGEPACK_<NAME>_VERSION
    label: str  # "OpenCL", for messages
    shared: str  # e.g. libtvm_opencl.so
    static: str  # e.g. libtvm_opencl.a
    version: str

    @property
    def source(self) -> str:
        return f"plugins/{self.name}"


@dataclass(frozen=True)
class Plugin:
    """A plug-in built for one triple, with the files it loads from its own directory beside it."""

    recipe: PluginRecipe
    triple: str
    root: Path
    runtime_origin: str  # the TVM runtime it was linked against
    beside: tuple[str, ...] = ()  # names of the files in lib/ next to it (e.g. libwgpu_native.so)
    manifest: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def shared(self) -> Path:
        return self.root / "lib" / self.recipe.shared

    @property
    def static(self) -> Path | None:
        path = self.root / "lib" / self.recipe.static
        return path if path.is_file() else None

    def files(self, *, static: bool = True) -> dict[str, Path]:
        """{bundle-relative path: file}: what a C bundle or an install must carry for this plug-in."""
        found = {f"lib/{self.recipe.shared}": self.shared}
        found.update({f"lib/{name}": self.root / "lib" / name for name in self.beside})
        if static and self.static is not None:
            found[f"lib/{self.recipe.static}"] = self.static
        return found


def plugin_digest(recipe: PluginRecipe) -> str:
    """The plug-in's sources, the headers it shares with the other ones (gpu-common) and the CMake code
    it shares with the TVM runtime build (tvm/cmake)."""
    return sources_digest((recipe.source, GPU_COMMON, TVM_CMAKE), (".h", ".cc", ".txt", ".cmake"))


def build_plugin(
    recipe: PluginRecipe,
    triple: str,
    cxx: str,
    runtime: TargetRuntime,
    *,
    flags: Sequence[str] = (),
    defines: Sequence[str] = (),
    key_extra: Mapping[str, Any] | None = None,
    beside: Mapping[str, Path] | None = None,
    manifest_extra: Mapping[str, Any] | None = None,
    cache_dir: Path | None = None,
    log: Progress | None = None,
) -> Plugin:
    """Build ``recipe`` for ``triple`` with ``cxx`` against ``runtime``, cached.

    ``defines``: extra ``-D`` CMake arguments; ``key_extra``: what else the result depends on;
    ``beside``: files copied into ``lib/`` next to the plug-in (names -> sources).
    """
    cmake = require_tool("cmake")
    require_tool(cxx, triple)
    tvm_dir, ffi_dir = tvm_source_dirs()
    shared = {p.name: p for p in runtime.shared_libs}
    if "libtvm_runtime.so" not in shared or "libtvm_ffi.so" not in shared:
        raise ToolchainError(f"The {triple} TVM runtime in {runtime.root} has no shared libraries to link against.")
    key_data = {
        "tvm": TVM_VERSION, "ffi": TVM_FFI_VERSION, "triple": triple, "flags": list(flags),
        "cxx": compiler_identity(cxx), "sources": plugin_digest(recipe),
        "runtime": {name: file_sha256(path) for name, path in sorted(shared.items())}, **(key_extra or {}),
    }
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:12]
    base = Path(cache_dir if cache_dir is not None else cache_root()) / recipe.name / TVM_VERSION
    base.mkdir(parents=True, exist_ok=True)

    def make(tmp: Path) -> None:
        if log:
            log(f"Building edgepack's {recipe.label} runtime for {triple} (about a minute)")
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"edgepack-{recipe.name}-") as work:
            build_dir, log_file = Path(work) / "build", Path(work) / "build.log"
            configure = [
                cmake, "-S", source_dir(recipe.source), "-B", build_dir,
                f"-DTVM_SOURCE_DIR={tvm_dir}", f"-DTVM_FFI_SOURCE_DIR={ffi_dir}",
                f"-DTVM_RUNTIME_LIBRARY={shared['libtvm_runtime.so']}", f"-DTVM_FFI_LIBRARY={shared['libtvm_ffi.so']}",
                f"-DEDGEPACK_GPU_COMMON_DIR={source_dir(GPU_COMMON) / 'include'}", *defines,
                f"-DCMAKE_CXX_COMPILER={cxx}", f"-DCMAKE_CXX_FLAGS={' '.join(flags)}", "-DCMAKE_BUILD_TYPE=Release",
                f"-DEDGEPACK_{recipe.name.upper()}_VERSION={recipe.version}", f"-DCMAKE_INSTALL_PREFIX={tmp}",
            ]
            if triple != HOST_TRIPLE:
                configure += ["-DCMAKE_SYSTEM_NAME=Linux", f"-DCMAKE_SYSTEM_PROCESSOR={triple.split('-')[0]}"]
            jobs = str(min(2, os.cpu_count() or 1))
            for step in (configure, [cmake, "--build", build_dir, "-j", jobs], [cmake, "--install", build_dir]):
                result = run(step, log_file=log_file)
                if result.returncode != 0:
                    raise ToolchainError(
                        f"Building edgepack's {recipe.label} runtime for {triple} with {Path(cxx).name} failed.",
                        "The last lines of the build log:\n" + tail(result.stdout + result.stderr),
                    )
        (tmp / "lib" / recipe.shared).chmod(0o755)
        for name, source in (beside or {}).items():
            shutil.copy2(source, tmp / "lib" / name)
        data = {
            "triple": triple, "key": key, "created": time.time(), "runtime_origin": runtime.origin,
            "build_seconds": round(time.perf_counter() - started, 1), "plugin_version": recipe.version,
            "beside": sorted(beside or {}),
            "libs": {p.name: {"sha256": file_sha256(p), "size": p.stat().st_size}
                     for p in sorted((tmp / "lib").iterdir()) if p.is_file()},
            **{k: key_data[k] for k in ("tvm", "ffi", "flags", "cxx")}, **(manifest_extra or {}),
        }
        (tmp / "manifest.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

    root = cached_directory(base / f"{triple}-{key}", make, complete=lambda p: (p / "manifest.json").is_file())
    data = json.loads((root / "manifest.json").read_text())
    return Plugin(recipe, triple, root, data.get("runtime_origin", ""), tuple(data.get("beside", ())), data)


def host_plugin(recipe: PluginRecipe, *, cache_dir: Path | None = None, log: Progress | None = None,
                **extra: Any) -> Plugin:
    """The plug-in for this machine, linked against the installed wheels' runtime."""
    _cc, cxx = host_compilers()
    return build_plugin(recipe, HOST_TRIPLE, cxx, host_runtime(), cache_dir=cache_dir, log=log, **extra)


def target_plugin(recipe: PluginRecipe, triple: str, cc: str, cxx: str, *, cache_dir: Path | None = None,
                  log: Progress | None = None, **extra: Any) -> tuple[Plugin, TargetRuntime]:
    """The plug-in cross-built for ``triple`` and the TVM runtime it links against (shared and static: the
    runtime a C bundle ships)."""
    runtime = ensure_target_runtime(triple, cc, cxx, need_static=True, cache_dir=cache_dir, log=log)
    return build_plugin(recipe, triple, cxx, runtime, flags=runtime.cflags or target_flags(triple), cache_dir=cache_dir, log=log,
                        **extra), runtime
