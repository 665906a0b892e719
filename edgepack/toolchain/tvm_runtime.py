"""The TVM runtime for a device's target triple, ready to compile and link C programs against.

A device runs C programs linked with the C API (``runtimes/api/c``) and TVM's runtime
(``libtvm_runtime`` + ``libtvm_ffi``). Where that runtime comes from (``ensure_target_runtime``):

* ``aarch64-linux-gnu`` shared libraries: the official ``apache-tvm`` / ``apache-tvm-ffi`` aarch64
  wheels of the pinned releases, downloaded once and checked against the SHA-256 below. They are
  what TVM itself ships, so a bug there is TVM's, not ours.
* this machine (``x86_64-linux-gnu``, shared): the installed wheels' own libraries.
* everything else (static archives for every triple; shared libraries for other triples): built
  from the runtime sources inside the installed x86 wheels with ``runtimes/tvm/runtime`` (CMake) and
  the headers the wheel forgot (``runtimes/tvm/compat``). About two minutes on two cores.

Results are cached under ``<cache>/runtime/<tvm-version>/<triple>-<key>/`` (``lib/``, ``include/``,
``manifest.json``); a directory only appears there complete (``files.cached_directory``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepack.errors import ToolchainError
from edgepack.files import cached_directory, file_sha256
from edgepack.paths import cache_root
from edgepack.progress import Progress
from edgepack.toolchain.compilers import HOST_TRIPLE, compiler_identity, require_tool, target_flags
from edgepack.toolchain.process import run, tail
from edgepack.toolchain.sources import TVM_CMAKE, TVM_COMPAT, TVM_RUNTIME, source_dir, sources_digest
from edgepack.toolchain.wheels import PinnedWheel, fetch_wheel
from edgepack.versions import TVM_FFI_VERSION, TVM_VERSION, installed_tvm

_SHARED_NAMES = ("libtvm_ffi.so", "libtvm_runtime.so")
# link order: libtvm_runtime needs libtvm_ffi
_STATIC_NAMES = ("libtvm_runtime.a", "libtvm_ffi.a")


@dataclass(frozen=True)
class OfficialLibrary:
    """One wheel of a pinned TVM release and the runtime library it contributes."""

    wheel: PinnedWheel
    member: str  # path of the library inside the wheel


_AARCH64 = "manylinux_2_28_aarch64"

#: The official aarch64 runtime. Recorded from the wheels on PyPI; a mismatch means the download
#: is not what was tested, and is refused.
OFFICIAL_RUNTIME_WHEELS: dict[str, tuple[OfficialLibrary, ...]] = {
    "aarch64-linux-gnu": (
        OfficialLibrary(PinnedWheel(
            requirement=f"apache-tvm-ffi=={TVM_FFI_VERSION}",
            filename="apache_tvm_ffi-0.1.14.post1-cp311-cp311-manylinux_2_24_aarch64.manylinux_2_28_aarch64.whl",
            sha256="c7a759781d4fbf2b99fa12f2741f250b882b06acc2747bb02831d491d1ac7d3c",
            platform=_AARCH64, python_version="3.11"), member="tvm_ffi/lib/libtvm_ffi.so"),
        OfficialLibrary(PinnedWheel(
            requirement=f"apache-tvm=={TVM_VERSION}",
            filename="apache_tvm-0.27.0.post1-py3-none-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl",
            sha256="4acfdb7653e4e1ba7a707bdf2833db72eb8fda7d04d99141f2a4e1da43171fb7",
            platform=_AARCH64, python_version="3.11"), member="tvm/lib/libtvm_runtime.so"),
    ),
}


@dataclass(frozen=True)
class TargetRuntime:
    """The TVM runtime for one target triple, ready to compile and link C programs against."""

    triple: str
    root: Path  # cache dir holding lib/ and include/
    include_dirs: tuple[Path, ...]
    shared_libs: tuple[Path, ...]  # libtvm_ffi.so, libtvm_runtime.so
    static_libs: tuple[Path, ...]  # libtvm_runtime.a, libtvm_ffi.a (link order), may be empty
    origin: str  # where the shared libraries come from: "official-wheel" or "built-from-source"
    cflags: tuple[str, ...] = ()  # target flags the static archives were built with

    @property
    def lib_dir(self) -> Path:
        return self.shared_libs[0].parent if self.shared_libs else self.root / "lib"


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # no import: importing tvm takes seconds
    if spec is None or spec.origin is None:
        raise ToolchainError(f"The Python package {name} is not installed.",
                             f"pip install apache-tvm=={TVM_VERSION} apache-tvm-ffi=={TVM_FFI_VERSION}")
    return Path(spec.origin).parent


def tvm_source_dirs() -> tuple[Path, Path]:
    """``site-packages/tvm`` and ``site-packages/tvm_ffi``: the runtime sources the wheels ship."""
    tvm_dir, ffi_dir = _package_dir("tvm"), _package_dir("tvm_ffi")
    if not (tvm_dir / "src" / "runtime" / "module.cc").is_file() or not (ffi_dir / "src" / "ffi").is_dir():
        raise ToolchainError(
            "The installed apache-tvm wheel has no runtime sources (tvm/src/runtime).",
            f"Install the pinned wheels: pip install apache-tvm=={TVM_VERSION} apache-tvm-ffi=={TVM_FFI_VERSION}",
        )
    return tvm_dir, ffi_dir


def host_runtime() -> TargetRuntime:
    """The x86 runtime of the installed wheels (shared only): what host-side C tests link against."""
    tvm_dir, ffi_dir = tvm_source_dirs()
    includes = [ffi_dir / "include", tvm_dir / "include"]
    if (ffi_dir / "3rdparty" / "dlpack" / "include").is_dir():
        includes.append(ffi_dir / "3rdparty" / "dlpack" / "include")
    return TargetRuntime(
        triple=HOST_TRIPLE,
        root=tvm_dir,
        include_dirs=tuple(includes),
        shared_libs=(ffi_dir / "lib" / "libtvm_ffi.so", tvm_dir / "lib" / "libtvm_runtime.so"),
        static_libs=(),
        origin="official-wheel",
    )


def _runtime_from_dir(root: Path) -> TargetRuntime:
    manifest = json.loads((root / "manifest.json").read_text())
    lib = root / "lib"
    shared = tuple(lib / n for n in _SHARED_NAMES if (lib / n).is_file())
    static = tuple(lib / n for n in _STATIC_NAMES if (lib / n).is_file())
    return TargetRuntime(
        triple=manifest["triple"],
        root=root,
        include_dirs=(root / "include",),
        shared_libs=shared,
        static_libs=static,
        origin=manifest["origin"],
        cflags=tuple(manifest.get("cflags", ())),
    )


def _is_complete(root: Path, need_static: bool) -> bool:
    if not (root / "manifest.json").is_file():
        return False
    rt = _runtime_from_dir(root)
    return len(rt.shared_libs) == 2 and (not need_static or len(rt.static_libs) == 2)


def _copy_headers(dest: Path) -> None:
    """Headers a C program needs (tvm/ffi, dlpack, tvm/runtime), from the installed wheels."""
    tvm_dir, ffi_dir = tvm_source_dirs()
    shutil.copytree(ffi_dir / "include" / "tvm", dest / "tvm", dirs_exist_ok=True)
    dlpack = ffi_dir / "include" / "dlpack"
    if not dlpack.is_dir():
        dlpack = ffi_dir / "3rdparty" / "dlpack" / "include" / "dlpack"
    shutil.copytree(dlpack, dest / "dlpack", dirs_exist_ok=True)
    shutil.copytree(tvm_dir / "include" / "tvm" / "runtime", dest / "tvm" / "runtime", dirs_exist_ok=True)


def _ensure_official(triple: str, base: Path, log: Progress | None) -> Path:
    """``<base>/<triple>-official``: the official shared libraries + headers (no compiler needed)."""

    def make(tmp: Path) -> None:
        downloads = base / "downloads"
        fetched = [(lib, fetch_wheel(lib.wheel, downloads, purpose=f"the official {triple} TVM runtime", log=log))
                   for lib in OFFICIAL_RUNTIME_WHEELS[triple]]
        (tmp / "lib").mkdir()
        libs = {}
        for lib, path in fetched:
            name = Path(lib.member).name
            with zipfile.ZipFile(path) as z, z.open(lib.member) as src, (tmp / "lib" / name).open("wb") as dst:
                shutil.copyfileobj(src, dst)
            (tmp / "lib" / name).chmod(0o755)
            libs[name] = {"wheel": lib.wheel.filename, "wheel_sha256": lib.wheel.sha256,
                          "sha256": file_sha256(tmp / "lib" / name)}
        _copy_headers(tmp / "include")
        _write_manifest(tmp, triple=triple, origin="official-wheel", libs=libs)
        # the wheels are large (the compiler is inside); only the two libraries are kept
        for _lib, path in fetched:
            path.unlink(missing_ok=True)

    return cached_directory(base / f"{triple}-official", make, complete=lambda p: _is_complete(p, need_static=False))


def _write_manifest(root: Path, **fields: Any) -> None:
    data = {"tvm_version": TVM_VERSION, "tvm_ffi_version": TVM_FFI_VERSION, "created": time.time(), **fields}
    (root / "manifest.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _cmake_build(triple: str, cc: str, cxx: str, flags: Sequence[str], *, shared: bool, prefix: Path,
                 work: Path, log: Progress | None) -> float:
    """Configure, build and install runtimes/tvm/runtime into ``prefix``. Returns seconds taken."""
    cmake = require_tool("cmake")
    tvm_dir, ffi_dir = tvm_source_dirs()
    build = work / "build"
    log_file = work / "build.log"
    started = time.perf_counter()
    flag_str = " ".join(flags)
    configure = [
        cmake, "-S", source_dir(TVM_RUNTIME), "-B", build,
        f"-DTVM_SOURCE_DIR={tvm_dir}", f"-DTVM_FFI_SOURCE_DIR={ffi_dir}",
        f"-DCMAKE_C_COMPILER={cc}", f"-DCMAKE_CXX_COMPILER={cxx}",
        f"-DCMAKE_C_FLAGS={flag_str}", f"-DCMAKE_CXX_FLAGS={flag_str}",
        "-DCMAKE_BUILD_TYPE=MinSizeRel",
        f"-DEDGEPACK_RUNTIME_SHARED={'ON' if shared else 'OFF'}", "-DEDGEPACK_RUNTIME_STATIC=ON",
        f"-DCMAKE_INSTALL_PREFIX={prefix}",
    ]
    if triple != HOST_TRIPLE:
        configure += ["-DCMAKE_SYSTEM_NAME=Linux", f"-DCMAKE_SYSTEM_PROCESSOR={triple.split('-')[0]}"]
    jobs = str(max(1, os.cpu_count() or 1))
    for step in (configure, [cmake, "--build", build, "-j", jobs], [cmake, "--install", build]):
        result = run(step, log=log, log_file=log_file)
        if result.returncode != 0:
            raise ToolchainError(
                f"Building the TVM runtime for {triple} with {Path(cxx).name} failed.",
                "The last lines of the build log:\n" + tail(result.stdout + result.stderr),
            )
    return time.perf_counter() - started


def _sources_digest() -> str:
    # tvm/cmake: shared with the GPU plug-ins
    return sources_digest((TVM_RUNTIME, TVM_COMPAT, TVM_CMAKE), (".h", ".txt", ".cmake"))


def ensure_target_runtime(
    triple: str,
    cc: str,
    cxx: str,
    *,
    cache_dir: Path | None = None,
    need_static: bool = True,
    extra_flags: Sequence[str] | None = None,
    prefer_official: bool = True,
    log: Progress | None = None,
) -> TargetRuntime:
    """The TVM runtime for ``triple``, from the cache or made now (see the module docstring).

    ``cc``/``cxx`` are only used when something must be built. ``extra_flags`` replaces the
    triple's ``compilers.target_flags``. Without ``need_static`` an official-wheel triple needs no
    compiler at all. The cache key covers the TVM version, the triple, the compilers (path,
    version, target), the flags and our build files, so a second call returns at once.
    """
    base = Path(cache_dir if cache_dir is not None else cache_root()) / "runtime" / TVM_VERSION
    flags = tuple(extra_flags) if extra_flags is not None else target_flags(triple)
    installed = installed_tvm()
    if installed != (TVM_VERSION, TVM_FFI_VERSION):
        raise ToolchainError(
            f"edgepack needs apache-tvm {TVM_VERSION} and apache-tvm-ffi {TVM_FFI_VERSION}, "
            f"found {installed[0]} and {installed[1]}.",
            f"pip install apache-tvm=={TVM_VERSION} apache-tvm-ffi=={TVM_FFI_VERSION}",
        )
    official = prefer_official and triple in OFFICIAL_RUNTIME_WHEELS

    if prefer_official and triple == HOST_TRIPLE and not need_static and extra_flags is None:
        return host_runtime()  # the installed wheel is the official runtime for this machine
    if official and not need_static:
        try:
            return _runtime_from_dir(_ensure_official(triple, base, log))
        except ToolchainError as exc:  # offline, or a download that fails its checksum
            if log:
                log(f"{exc.message} Building the runtime from source instead.")
            official = False

    require_tool(cc, triple)
    require_tool(cxx, triple)
    key_data = {
        "tvm": TVM_VERSION, "ffi": TVM_FFI_VERSION, "triple": triple, "flags": list(flags),
        "cc": compiler_identity(cc), "cxx": compiler_identity(cxx), "official": official,
        "sources": _sources_digest(),
    }
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:12]
    root = base / f"{triple}-{key}"
    complete = lambda p: _is_complete(p, need_static=True)
    if complete(root):
        return _runtime_from_dir(root)

    official_root = None
    if official:
        try:
            official_root = _ensure_official(triple, base, log)
        except ToolchainError as exc:
            if log:
                log(f"{exc.message} Building the shared libraries from source instead.")
            root = base / f"{triple}-{key}-source"  # not the entry an online call would make

    def make(tmp: Path) -> None:
        if log:
            log(f"Building the TVM runtime for {triple} from source (about 2 minutes on 2 cores)")
        with tempfile.TemporaryDirectory(prefix="edgepack-runtime-") as work:
            seconds = _cmake_build(triple, cc, cxx, flags, shared=official_root is None, prefix=tmp,
                                   work=Path(work), log=log)
        for so in (tmp / "lib").glob("*.so"):
            so.chmod(0o755)
        libs = {}
        if official_root is not None:
            for name in _SHARED_NAMES:
                shutil.copy2(official_root / "lib" / name, tmp / "lib" / name)
            libs = json.loads((official_root / "manifest.json").read_text()).get("libs", {})
        for name in _STATIC_NAMES + (() if official_root else _SHARED_NAMES):
            libs[name] = {"sha256": file_sha256(tmp / "lib" / name)}
        _write_manifest(tmp, triple=triple, origin="official-wheel" if official_root else "built-from-source",
                        cflags=list(flags), cc=key_data["cc"], cxx=key_data["cxx"], key=key,
                        build_seconds=round(seconds, 1), libs=libs)
        if log:
            log(f"TVM runtime for {triple} ready in {root}")

    return _runtime_from_dir(cached_directory(root, make, complete=complete))
