"""The native side of the no-Python C bundle: TVM runtime libraries for a device, the model library
in static form, the metadata file the C API reads, and C programs built against them.

Nothing here runs on the device; it produces files that do. The device runs a C program linked
with ``runtimes/c/src/edgepack.c`` and the TVM runtime (``libtvm_runtime`` + ``libtvm_ffi``).

Where the runtime comes from (``ensure_target_runtime``):

* ``aarch64-linux-gnu`` shared libraries: the official ``apache-tvm`` / ``apache-tvm-ffi`` aarch64
  wheels of the pinned releases, downloaded once and checked against the SHA-256 below. They are
  what TVM itself ships, so a bug there is TVM's, not ours.
* everything else (static archives for every triple; shared libraries for other triples): built
  from the runtime sources inside the installed x86 wheels with ``runtimes/tvm-runtime`` (CMake) and
  the headers the wheel forgot (``runtimes/tvm-compat``). About two minutes on two cores.

Results are cached under ``<cache>/runtime/<tvm-version>/<triple>-<key>/`` (``lib/``, ``include/``,
``manifest.json``); a directory only appears there complete (built aside, then renamed).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepack.errors import EdgepackError, ToolchainError
from edgepack.fileutil import file_lock, file_sha256
from edgepack.paths import cache_root

Log = Callable[[str], None]

TVM_VERSION = "0.27.0.post1"
TVM_FFI_VERSION = "0.1.14.post1"

#: Compiler flags a triple needs on top of the compiler's defaults. armhf: Debian's
#: arm-linux-gnueabihf-gcc defaults to ARMv7 + VFPv3-D16; the TVM targets edgepack uses for armv7
#: assume NEON + VFPv4 (Cortex-A7 and newer), so the runtime is built for the same.
DEFAULT_TARGET_FLAGS: dict[str, tuple[str, ...]] = {
    "arm-linux-gnueabihf": ("-march=armv7-a", "-mfpu=neon-vfpv4", "-mfloat-abi=hard"),
    "armv7a-linux-gnueabihf": ("-march=armv7-a", "-mfpu=neon-vfpv4", "-mfloat-abi=hard"),
}

#: Debian package that provides the cross compilers for a triple (for error hints).
DEBIAN_COMPILER_PACKAGES: dict[str, str] = {
    "aarch64-linux-gnu": "g++-aarch64-linux-gnu",
    "arm-linux-gnueabihf": "g++-arm-linux-gnueabihf",
    "armv7a-linux-gnueabihf": "g++-arm-linux-gnueabihf",
    "riscv64-linux-gnu": "g++-riscv64-linux-gnu",
    "x86_64-linux-gnu": "g++",
}

_HOST_TRIPLE = "x86_64-linux-gnu"
_SHARED_NAMES = ("libtvm_ffi.so", "libtvm_runtime.so")
# link order: libtvm_runtime needs libtvm_ffi
_STATIC_NAMES = ("libtvm_runtime.a", "libtvm_ffi.a")


@dataclass(frozen=True)
class OfficialWheel:
    """One wheel of a pinned TVM release and the runtime library it contributes."""

    requirement: str
    filename: str
    sha256: str
    member: str  # path of the library inside the wheel


#: The official aarch64 runtime. Recorded from the wheels on PyPI; a mismatch means the download
#: is not what was tested, and is refused.
OFFICIAL_RUNTIME_WHEELS: dict[str, tuple[OfficialWheel, ...]] = {
    "aarch64-linux-gnu": (
        OfficialWheel(
            requirement=f"apache-tvm-ffi=={TVM_FFI_VERSION}",
            filename="apache_tvm_ffi-0.1.14.post1-cp311-cp311-manylinux_2_24_aarch64.manylinux_2_28_aarch64.whl",
            sha256="c7a759781d4fbf2b99fa12f2741f250b882b06acc2747bb02831d491d1ac7d3c",
            member="tvm_ffi/lib/libtvm_ffi.so",
        ),
        OfficialWheel(
            requirement=f"apache-tvm=={TVM_VERSION}",
            filename="apache_tvm-0.27.0.post1-py3-none-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl",
            sha256="4acfdb7653e4e1ba7a707bdf2833db72eb8fda7d04d99141f2a4e1da43171fb7",
            member="tvm/lib/libtvm_runtime.so",
        ),
    ),
}
_OFFICIAL_PLATFORM = "manylinux_2_28_aarch64"
_OFFICIAL_PYTHON = "3.11"


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


@dataclass(frozen=True)
class TensorMeta:
    """One model input or output as the C API sees it."""

    name: str
    dtype: str
    shape: tuple[int, ...]


# ----------------------------------------------------------------------------------------------
# locations


def runtimes_dir() -> Path:
    """``runtimes/`` of the source tree, or the copy an installed wheel carries inside the package."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "runtimes", here / "runtimes"):
        if (candidate / "c" / "include" / "edgepack.h").is_file():
            return candidate
    raise EdgepackError(
        "edgepack's native sources (runtimes/) are missing from this installation.",
        "Reinstall edgepack; the wheel must include the runtimes/ directory.",
    )


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


def _installed_versions() -> tuple[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("apache-tvm"), version("apache-tvm-ffi")
    except PackageNotFoundError:
        return "missing", "missing"


def host_runtime() -> TargetRuntime:
    """The x86 runtime of the installed wheels (shared only): what host-side C tests link against."""
    tvm_dir, ffi_dir = tvm_source_dirs()
    includes = [ffi_dir / "include", tvm_dir / "include"]
    if (ffi_dir / "3rdparty" / "dlpack" / "include").is_dir():
        includes.append(ffi_dir / "3rdparty" / "dlpack" / "include")
    return TargetRuntime(
        triple=_HOST_TRIPLE,
        root=tvm_dir,
        include_dirs=tuple(includes),
        shared_libs=(ffi_dir / "lib" / "libtvm_ffi.so", tvm_dir / "lib" / "libtvm_runtime.so"),
        static_libs=(),
        origin="official-wheel",
    )


# ----------------------------------------------------------------------------------------------
# small process helpers


def _run(cmd: Sequence[str], *, log: Log | None, log_file: Path | None = None, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    if log:
        log("$ " + " ".join(str(c) for c in cmd))
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if log_file is not None:
        with log_file.open("a") as f:
            f.write("$ " + " ".join(str(c) for c in cmd) + "\n" + result.stdout + result.stderr)
    return result


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _require_tool(tool: str, triple: str | None = None) -> str:
    path = shutil.which(tool)
    if path:
        return path
    package = DEBIAN_COMPILER_PACKAGES.get(triple or "", "") if triple else ""
    if tool == "cmake":
        hint = "Install CMake >= 3.16: `apt-get install cmake` or `pip install cmake`."
    elif package:
        hint = f"Install the cross compiler with `apt-get install {package}`."
    else:
        hint = "Install it, or pass the full path of the compiler."
    raise ToolchainError(f"{tool} is not installed (needed to build for {triple or 'this machine'}).", hint)


def _compiler_identity(cc: str) -> dict[str, str]:
    """What makes two compilers produce different code: resolved path, version and target."""
    path = os.path.realpath(shutil.which(cc) or cc)
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
        machine = subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True, timeout=30,
                                 check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = machine = ""
    return {"path": path, "version": (version.splitlines() or [""])[0], "machine": machine.strip()}


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


def _sources_digest() -> str:
    # cmake: shared with the GPU plug-ins
    return sources_digest(("tvm-runtime", "tvm-compat", "cmake"), (".h", ".txt", ".cmake"))


@contextmanager
def _staging(final: Path) -> Iterator[Path]:
    """A temp dir beside ``final``, renamed to it when the block succeeds (removed otherwise)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
    try:
        yield tmp
        tmp.chmod(0o755)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ----------------------------------------------------------------------------------------------
# the runtime


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


def _download_official(triple: str, downloads: Path, log: Log | None) -> list[tuple[OfficialWheel, Path]]:
    """The official wheels for ``triple`` in ``downloads``, fetched with pip if needed, SHA-256 checked."""
    wheels = OFFICIAL_RUNTIME_WHEELS[triple]
    downloads.mkdir(parents=True, exist_ok=True)
    found = []
    for wheel in wheels:
        path = downloads / wheel.filename
        if not path.is_file() or file_sha256(path) != wheel.sha256:
            if log:
                log(f"Downloading the official {triple} runtime: {wheel.requirement}")
            with tempfile.TemporaryDirectory(dir=downloads) as tmp:
                result = _run(
                    [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                     "--platform", _OFFICIAL_PLATFORM, "--python-version", _OFFICIAL_PYTHON,
                     "--disable-pip-version-check", "-d", tmp, wheel.requirement],
                    log=log,
                )
                got = Path(tmp) / wheel.filename
                if result.returncode != 0 or not got.is_file():
                    raise ToolchainError(
                        f"Downloading {wheel.requirement} for {triple} from PyPI failed.",
                        "It needs access to PyPI (or a pip index configured in pip.conf).\n"
                        + _tail(result.stdout + result.stderr, 8),
                    )
                os.replace(got, path)
        digest = file_sha256(path)
        if digest != wheel.sha256:
            path.unlink(missing_ok=True)
            raise ToolchainError(
                f"{wheel.filename} has SHA-256 {digest}, expected {wheel.sha256}.",
                "The download is not the release edgepack was tested with; it was deleted. Check your pip index.",
            )
        found.append((wheel, path))
    return found


def _ensure_official(triple: str, base: Path, log: Log | None) -> Path:
    """``<base>/<triple>-official``: the official shared libraries + headers (no compiler needed)."""
    root = base / f"{triple}-official"
    if _is_complete(root, need_static=False):
        return root
    with file_lock(base / f".{root.name}.lock"):
        if _is_complete(root, need_static=False):
            return root
        shutil.rmtree(root, ignore_errors=True)
        downloads = base / "downloads"
        wheels = _download_official(triple, downloads, log)
        with _staging(root) as tmp:
            (tmp / "lib").mkdir()
            libs = {}
            for wheel, path in wheels:
                name = Path(wheel.member).name
                with zipfile.ZipFile(path) as z, z.open(wheel.member) as src, (tmp / "lib" / name).open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                (tmp / "lib" / name).chmod(0o755)
                libs[name] = {"wheel": wheel.filename, "wheel_sha256": wheel.sha256,
                              "sha256": file_sha256(tmp / "lib" / name)}
            _copy_headers(tmp / "include")
            _write_manifest(tmp, triple=triple, origin="official-wheel", libs=libs)
        # the wheels are large (the compiler is inside); only the two libraries are kept
        for _wheel, path in wheels:
            path.unlink(missing_ok=True)
    return root


def _write_manifest(root: Path, **fields: Any) -> None:
    data = {"tvm_version": TVM_VERSION, "tvm_ffi_version": TVM_FFI_VERSION, "created": time.time(), **fields}
    (root / "manifest.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _cmake_build(triple: str, cc: str, cxx: str, flags: Sequence[str], *, shared: bool, prefix: Path,
                 work: Path, log: Log | None) -> float:
    """Configure, build and install runtimes/tvm-runtime into ``prefix``. Returns seconds taken."""
    cmake = _require_tool("cmake")
    tvm_dir, ffi_dir = tvm_source_dirs()
    build = work / "build"
    log_file = work / "build.log"
    started = time.perf_counter()
    flag_str = " ".join(flags)
    configure = [
        cmake, "-S", runtimes_dir() / "tvm-runtime", "-B", build,
        f"-DTVM_SOURCE_DIR={tvm_dir}", f"-DTVM_FFI_SOURCE_DIR={ffi_dir}",
        f"-DCMAKE_C_COMPILER={cc}", f"-DCMAKE_CXX_COMPILER={cxx}",
        f"-DCMAKE_C_FLAGS={flag_str}", f"-DCMAKE_CXX_FLAGS={flag_str}",
        "-DCMAKE_BUILD_TYPE=MinSizeRel",
        f"-DEDGEPACK_RUNTIME_SHARED={'ON' if shared else 'OFF'}", "-DEDGEPACK_RUNTIME_STATIC=ON",
        f"-DCMAKE_INSTALL_PREFIX={prefix}",
    ]
    if triple != _HOST_TRIPLE:
        configure += ["-DCMAKE_SYSTEM_NAME=Linux", f"-DCMAKE_SYSTEM_PROCESSOR={triple.split('-')[0]}"]
    jobs = str(max(1, os.cpu_count() or 1))
    for step in (configure, [cmake, "--build", build, "-j", jobs], [cmake, "--install", build]):
        result = _run(step, log=log, log_file=log_file)
        if result.returncode != 0:
            raise ToolchainError(
                f"Building the TVM runtime for {triple} with {Path(cxx).name} failed.",
                "The last lines of the build log:\n" + _tail(result.stdout + result.stderr),
            )
    return time.perf_counter() - started


def ensure_target_runtime(
    triple: str,
    cc: str,
    cxx: str,
    *,
    cache_dir: Path | None = None,
    need_static: bool = True,
    extra_flags: Sequence[str] | None = None,
    prefer_official: bool = True,
    log: Log | None = None,
) -> TargetRuntime:
    """The TVM runtime for ``triple``, from the cache or made now (see the module docstring).

    ``cc``/``cxx`` are only used when something must be built. ``extra_flags`` replaces the
    triple's ``DEFAULT_TARGET_FLAGS``. Without ``need_static`` an official-wheel triple needs no
    compiler at all. The cache key covers the TVM version, the triple, the compilers (path,
    version, target), the flags and our build files, so a second call returns at once.
    """
    base = Path(cache_dir if cache_dir is not None else cache_root()) / "runtime" / TVM_VERSION
    flags = tuple(extra_flags) if extra_flags is not None else DEFAULT_TARGET_FLAGS.get(triple, ())
    installed = _installed_versions()
    if installed != (TVM_VERSION, TVM_FFI_VERSION):
        raise ToolchainError(
            f"edgepack needs apache-tvm {TVM_VERSION} and apache-tvm-ffi {TVM_FFI_VERSION}, "
            f"found {installed[0]} and {installed[1]}.",
            f"pip install apache-tvm=={TVM_VERSION} apache-tvm-ffi=={TVM_FFI_VERSION}",
        )
    official = prefer_official and triple in OFFICIAL_RUNTIME_WHEELS

    if prefer_official and triple == _HOST_TRIPLE and not need_static and extra_flags is None:
        return host_runtime()  # the installed wheel is the official runtime for this machine
    if official and not need_static:
        try:
            return _runtime_from_dir(_ensure_official(triple, base, log))
        except ToolchainError as exc:  # offline, or a download that fails its checksum
            if log:
                log(f"{exc.message} Building the runtime from source instead.")
            official = False

    _require_tool(cc, triple)
    _require_tool(cxx, triple)
    key_data = {
        "tvm": TVM_VERSION, "ffi": TVM_FFI_VERSION, "triple": triple, "flags": list(flags),
        "cc": _compiler_identity(cc), "cxx": _compiler_identity(cxx), "official": official,
        "sources": _sources_digest(),
    }
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:12]
    root = base / f"{triple}-{key}"
    if _is_complete(root, need_static=True):
        return _runtime_from_dir(root)

    official_root = None
    if official:
        try:
            official_root = _ensure_official(triple, base, log)
        except ToolchainError as exc:
            if log:
                log(f"{exc.message} Building the shared libraries from source instead.")
            root = base / f"{triple}-{key}-source"  # not the entry an online call would make
            if _is_complete(root, need_static=True):
                return _runtime_from_dir(root)

    with file_lock(base / f".{root.name}.lock"):
        if _is_complete(root, need_static=True):
            return _runtime_from_dir(root)
        shutil.rmtree(root, ignore_errors=True)
        if log:
            log(f"Building the TVM runtime for {triple} from source (about 2 minutes on 2 cores)")
        with _staging(root) as tmp, tempfile.TemporaryDirectory(prefix="edgepack-runtime-") as work:
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
    return _runtime_from_dir(root)


# ----------------------------------------------------------------------------------------------
# model metadata


def _meta_name(name: str) -> str:
    """Percent-encode what would break the whitespace-separated format (see edgepack.h)."""
    out = []
    for byte in name.encode("utf-8"):
        out.append(chr(byte) if 0x21 <= byte <= 0x7E and byte != 0x25 else f"%{byte:02X}")
    return "".join(out)


_META_DTYPES = {"float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64",
                "uint8", "uint16", "uint32", "uint64", "bool"}


def _as_meta(t: Any) -> TensorMeta:
    if isinstance(t, TensorMeta):
        return t
    if isinstance(t, tuple | list) and len(t) == 3:
        name, dtype, shape = t
    else:
        name, dtype, shape = t.name, t.dtype, t.shape
    dims = tuple(shape)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise EdgepackError(f"Tensor {name!r} has a dynamic or invalid shape {dims}.",
                            "The C runtime needs static shapes: pass concrete input shapes when compiling.")
    if str(dtype) not in _META_DTYPES:
        raise EdgepackError(f"Tensor {name!r} has dtype {dtype}, which the C runtime does not support.",
                            "Supported: " + ", ".join(sorted(_META_DTYPES)) + ".")
    return TensorMeta(str(name), str(dtype), dims)


def model_meta_text(inputs: Iterable[Any], outputs: Iterable[Any]) -> str:
    """The metadata text for the C API: a header line, then ``input|output <name> <dtype> <d0,d1,..>``.

    ``inputs``/``outputs`` are ``(name, dtype, shape)`` tuples or objects with those attributes
    (e.g. ``importers.TensorSpec``), in the order of the model's parameters and results.
    """
    lines = ["edgepack-model-meta 1"]
    for kind, tensors in (("input", inputs), ("output", outputs)):
        for t in map(_as_meta, tensors):
            shape = ",".join(str(d) for d in t.shape) if t.shape else "-"
            lines.append(f"{kind} {_meta_name(t.name)} {t.dtype} {shape}")
    return "\n".join(lines) + "\n"


def write_model_meta(path: Path, inputs: Iterable[Any], outputs: Iterable[Any]) -> Path:
    """Write the metadata file next to a model library: ``model.so`` -> ``model.meta``.

    ``ep_model_open("dir/model.so", NULL, ...)`` reads ``dir/model.meta`` when the library has no
    metadata embedded. ``path`` is the .meta path itself.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = model_meta_text(inputs, outputs)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def parse_model_meta(text: str) -> tuple[tuple[TensorMeta, ...], tuple[TensorMeta, ...]]:
    """Inverse of ``model_meta_text`` (for tests and tools that read bundles)."""
    lines = [ln.split() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines or lines[0] != ["edgepack-model-meta", "1"]:
        raise EdgepackError("Not an edgepack metadata file (version 1).")
    found: dict[str, list[TensorMeta]] = {"input": [], "output": []}
    for kind, name, dtype, shape in lines[1:]:
        dims = () if shape == "-" else tuple(int(d) for d in shape.split(","))
        decoded = re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), name)
        found[kind].append(TensorMeta(decoded.encode("latin-1").decode("utf-8"), dtype, dims))
    return tuple(found["input"]), tuple(found["output"])


def _meta_c_source(text: str, prefix: str) -> str:
    """C source defining the library function ``edgepack_meta`` that returns the metadata text.

    The function follows TVM's packed-function C ABI so that the C API finds it through the
    model module (``__tvm_ffi_<prefix>edgepack_meta``); for a system library it registers
    itself, like TVM's own functions, from a constructor.
    """
    symbol = f"__tvm_ffi_{prefix}edgepack_meta"
    literal = "".join(
        c if c.isascii() and c.isprintable() and c not in '"\\?' else f"\\{ord(c):03o}"
        for c in text
    )
    return f"""/* generated by edgepack: the model metadata (see edgepack.h) */
#include <stdint.h>
#include <string.h>
#ifdef __cplusplus
extern "C" {{
#endif
typedef struct {{
  int32_t type_index;
  uint32_t zero_padding;
  union {{ int64_t v_int64; const void* v_ptr; }} v;
}} edgepack_any; /* layout of TVMFFIAny */
static const char edgepack_meta_text[] = "{literal}";
__attribute__((visibility("default"))) int {symbol}(void* self, const void* args, int32_t num_args,
                                                   edgepack_any* result) {{
  (void)self; (void)args; (void)num_args;
  memset(result, 0, sizeof(*result));
  result->type_index = 4; /* kTVMFFIOpaquePtr */
  result->v.v_ptr = edgepack_meta_text;
  return 0;
}}
#ifdef EDGEPACK_SYSTEM_LIB
int TVMFFIEnvModRegisterSystemLibSymbol(const char* name, void* ptr);
__attribute__((constructor)) static void edgepack_meta_register(void) {{
  TVMFFIEnvModRegisterSystemLibSymbol("{symbol}", (void*)&{symbol});
}}
#endif
#ifdef __cplusplus
}}
#endif
"""


def _compile_meta_object(meta_text: str, prefix: str, out: Path, cc: str, cflags: Sequence[str],
                         system_lib: bool, log: Log | None) -> Path:
    src = out.with_suffix(".c")
    src.write_text(_meta_c_source(meta_text, prefix))
    cmd = [cc, "-c", "-O2", "-fPIC", *cflags, *(["-DEDGEPACK_SYSTEM_LIB"] if system_lib else []), src, "-o", out]
    result = _run(cmd, log=log)
    if result.returncode != 0:
        raise ToolchainError(f"Compiling the model metadata with {cc} failed.", _tail(result.stderr))
    return out


# ----------------------------------------------------------------------------------------------
# model libraries


def _llvm_modules(executable) -> list:
    mod = executable.mod
    found, stack = [], [mod]
    while stack:
        m = stack.pop()
        if m.kind == "llvm":
            found.append(m)
        stack.extend(m.imports)
    return found


def system_lib_prefix(executable) -> str | None:
    """The system-lib symbol prefix of a compiled executable, or None if it is not a system lib."""
    for m in _llvm_modules(executable):
        if m.get_function("__tvm_is_system_module")():
            return str(m.get_function("__tvm_get_system_lib_prefix")())
    return None


def _archiver(cc: str) -> str:
    """The ``ar`` that matches ``cc`` (host ar cannot index foreign objects)."""
    name = Path(cc).name
    directory = Path(cc).parent if os.sep in cc else None
    candidates = []
    for suffix in ("gcc", "clang", "cc", "g++", "c++"):
        if name.endswith(suffix) and len(name) > len(suffix):
            stem = name[: -len(suffix)]
            candidates += [stem + "gcc-ar" if suffix == "gcc" else "", stem + "ar"]
            break
    candidates += ["llvm-ar"] if "clang" in name else []
    candidates.append("ar")
    for c in filter(None, candidates):
        found = shutil.which(c, path=str(directory)) if directory else None
        found = found or shutil.which(c)
        if found:
            return found
    raise ToolchainError(f"No archiver (ar) found for {cc}.", "Install binutils for the target triple.")


def export_model_static(
    executable,
    out_path: Path,
    cc: str,
    *,
    meta_text: str | None = None,
    cflags: Sequence[str] = (),
    log: Log | None = None,
) -> Path:
    """Write the model as a static archive (``libmodel.a``) for linking into a C program.

    ``executable`` must come from ``relax.build(mod, target, system_lib=True)`` (``tvm.compile``
    has no such switch): its functions then register themselves into TVM's system library at
    program start instead of being looked up with dlsym. Symbols are ``__tvm_ffi_<prefix><func>``
    plus ``<prefix>__tvm_ffi__library_bin`` (the VM bytecode and constants); the prefix is the
    IRModule attribute ``system_lib_prefix`` (default ``""``), so two models in one program need
    different prefixes (``mod.with_attr("system_lib_prefix", "model_one_")``; TVM 0.27 fails on
    prefixes shorter than 8 characters, which it stores as a small string). Link the archive
    inside ``-Wl,--whole-archive`` (nothing references it by name) and open it with
    ``ep_model_open_system_lib(prefix, NULL, &model)``. ``meta_text`` (from ``model_meta_text``)
    is embedded so the program needs no other file.
    """
    prefix = system_lib_prefix(executable)
    if prefix is None:
        raise EdgepackError(
            "The model was not built as a system library, so it cannot be linked statically.",
            "Build it with tvm.relax.build(mod, target, system_lib=True).",
        )
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    ar = _archiver(cc)
    with tempfile.TemporaryDirectory(prefix="edgepack-static-") as tmp_name:
        tmp = Path(tmp_name)
        executable.export_library(str(tmp / "model.tar"))
        objects_dir = tmp / "objects"
        objects_dir.mkdir()
        with tarfile.open(tmp / "model.tar") as tar:
            try:
                tar.extractall(objects_dir, filter="data")
            except TypeError:  # Python < 3.11.4 has no extraction filters; TVM wrote this tar
                tar.extractall(objects_dir)
        objects = sorted(p for p in objects_dir.rglob("*") if p.is_file())
        if meta_text is not None:
            objects.append(_compile_meta_object(meta_text, prefix, tmp / "edgepack_meta.o", cc, cflags, True, log))
        staged = tmp / out_path.name
        result = _run([ar, "rcs", staged, *objects], log=log)
        if result.returncode != 0:
            raise ToolchainError(f"Creating {out_path.name} with {ar} failed.", _tail(result.stderr))
        shutil.move(staged, out_path)
    return out_path


def export_model_shared(
    executable,
    out_path: Path,
    cxx: str,
    *,
    meta_text: str | None = None,
    cc: str | None = None,
    options: Sequence[str] = (),
    log: Log | None = None,
) -> Path:
    """Write the model as a shared library for ``ep_model_open``, with the metadata embedded.

    The same as ``executable.export_library(path, fcompile=cross_compiler(cxx))`` plus one small
    object holding ``meta_text``; with the metadata inside, the library is self-contained (it also
    works from memory with ``ep_model_open_memory``).

    The executable must NOT be built with ``system_lib=True``: such a library registers its
    symbols in TVM's process-wide system-library table when loaded and leaves them dangling when
    it is closed, so a later ``ep_model_open_system_lib`` in that process would crash. Build the
    shared and the static library from two builds (``tvm.compile`` and ``relax.build(...,
    system_lib=True)``).
    """
    from tvm.support import cc as tvm_cc

    if system_lib_prefix(executable) is not None:
        raise EdgepackError(
            "This model was built as a system library, which must not be exported as a shared library.",
            "Export the shared library from a build without system_lib=True (tvm.compile(mod, target)).",
        )
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgepack-shared-") as tmp_name:
        addons = []
        if meta_text is not None:
            meta_cc = cc or _c_compiler_for(cxx)
            addons.append(str(_compile_meta_object(meta_text, "", Path(tmp_name) / "edgepack_meta.o", meta_cc,
                                                   options, False, log)))
        try:
            executable.export_library(str(out_path), fcompile=tvm_cc.cross_compiler(cxx, options=list(options)),
                                      addons=addons)
        except Exception as exc:  # TVM raises RuntimeError with the linker output
            raise ToolchainError(f"Linking {out_path.name} with {cxx} failed.", _tail(str(exc))) from exc
    return out_path


def _c_compiler_for(cxx: str) -> str:
    for a, b in (("g++", "gcc"), ("clang++", "clang"), ("c++", "cc")):
        if cxx.endswith(a):
            return cxx[: -len(a)] + b
    return cxx


# ----------------------------------------------------------------------------------------------
# C programs


def build_c_program(
    runtime: TargetRuntime,
    out_path: Path,
    *,
    cc: str,
    source: Path | None = None,
    static: bool = False,
    model_archive: Path | None = None,
    extra_archives: Sequence[Path] = (),
    fully_static: bool = False,
    cflags: Sequence[str] | None = None,
    rpath: Sequence[str] | None = None,
    werror: bool = False,
    strip: bool = False,
    log: Log | None = None,
) -> Path:
    """Compile ``source`` (default: the example runner ``runtimes/c/examples/main.c``) with the C API.

    Shared (default): links ``libtvm_runtime.so``/``libtvm_ffi.so`` of ``runtime``; the program
    loads a model library at run time. RUNPATH: ``rpath`` if given, else ``$ORIGIN`` and the
    runtime's lib dir. Static: links ``model_archive`` (from ``export_model_static``; optional,
    e.g. for the API test program) and the runtime archives with ``--whole-archive`` and the C++
    runtime statically; only libc/libm/libpthread/libdl stay dynamic unless ``fully_static``.
    Only the C compiler is used. ``cflags`` default to the flags the runtime was built with.
    """
    c_dir = runtimes_dir() / "c"
    source = Path(source) if source is not None else c_dir / "examples" / "main.c"
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    _require_tool(cc, runtime.triple)
    flags = list(cflags) if cflags is not None else list(runtime.cflags)
    compile_flags = ["-std=c11", "-O2", "-Wall", "-Wextra", *(["-Werror"] if werror else []), *flags,
                     "-I", c_dir / "include"]
    for inc in runtime.include_dirs:
        compile_flags += ["-I", inc]
    if static:
        if len(runtime.static_libs) != 2:
            raise ToolchainError(f"The {runtime.triple} runtime in {runtime.root} has no static archives.",
                                 "Call ensure_target_runtime(..., need_static=True).")
        # extra_archives: GPU runtime plug-ins (libtvm_opencl.a), registered by static initialisers too
        archives = ([model_archive] if model_archive is not None else []) + list(extra_archives) + \
            list(runtime.static_libs)
        sys_libs = (["-static", "-lstdc++", "-lpthread", "-ldl", "-lm"] if fully_static else
                    ["-Wl,-Bstatic", "-lstdc++", "-Wl,-Bdynamic", "-static-libgcc", "-lpthread", "-ldl", "-lm"])
        link = ["-Wl,--gc-sections", "-Wl,--whole-archive", *archives, "-Wl,--no-whole-archive", *sys_libs]
    else:
        if len(runtime.shared_libs) != 2:
            raise ToolchainError(f"The {runtime.triple} runtime in {runtime.root} has no shared libraries.")
        lib_dirs = list(dict.fromkeys(str(p.parent) for p in runtime.shared_libs))  # the host wheel has two
        paths = list(rpath) if rpath is not None else ["$ORIGIN", *lib_dirs]
        link = [*(f"-L{d}" for d in lib_dirs), "-Wl,--no-as-needed", "-ltvm_runtime", "-ltvm_ffi",
                "-Wl,--as-needed", "-lm"]
        if paths:
            link.append("-Wl,-rpath," + ":".join(paths))
    if strip:
        link.append("-s")
    cmd = [cc, *compile_flags, source, c_dir / "src" / "edgepack.c", *link, "-o", out_path]
    result = _run(cmd, log=log)
    if result.returncode != 0:
        raise ToolchainError(f"Building {out_path.name} with {Path(cc).name} failed.",
                             "The last lines of the compiler output:\n" + _tail(result.stderr))
    if log and result.stderr.strip():
        log(result.stderr.strip())
    return out_path


def write_c_bundle(
    dest: Path,
    runtime: TargetRuntime,
    *,
    model_shared: Path | None = None,
    model_static: Path | None = None,
    meta_text: str | None = None,
) -> Path:
    """Lay out the C bundle in ``dest``: what a user copies to build a program for the device.

    ``include/`` (edgepack.h, tvm/ffi/c_api.h, dlpack/dlpack.h), ``src/edgepack.c``,
    ``examples/main.c``, ``CMakeLists.txt``, ``Makefile`` and ``lib/``: the runtime's shared
    libraries and static archives, ``model.so`` (+ ``model.meta``) and ``libmodel.a``.
    """
    dest = Path(dest)
    c_dir = runtimes_dir() / "c"
    (dest / "include" / "tvm" / "ffi").mkdir(parents=True, exist_ok=True)
    (dest / "include" / "dlpack").mkdir(parents=True, exist_ok=True)
    for sub in ("src", "examples", "lib"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy2(c_dir / "include" / "edgepack.h", dest / "include" / "edgepack.h")
    c_api = next(p for d in runtime.include_dirs if (p := d / "tvm" / "ffi" / "c_api.h").is_file())
    dlpack = next(p for d in runtime.include_dirs if (p := d / "dlpack" / "dlpack.h").is_file())
    shutil.copy2(c_api, dest / "include" / "tvm" / "ffi" / "c_api.h")
    shutil.copy2(dlpack, dest / "include" / "dlpack" / "dlpack.h")
    shutil.copy2(c_dir / "src" / "edgepack.c", dest / "src" / "edgepack.c")
    shutil.copy2(c_dir / "examples" / "main.c", dest / "examples" / "main.c")
    shutil.copy2(c_dir / "CMakeLists.txt", dest / "CMakeLists.txt")
    shutil.copy2(c_dir / "Makefile", dest / "Makefile")
    for lib in (*runtime.shared_libs, *runtime.static_libs):
        shutil.copy2(lib, dest / "lib" / lib.name)
    if model_shared is not None:
        shutil.copy2(model_shared, dest / "lib" / "model.so")
    if model_static is not None:
        shutil.copy2(model_static, dest / "lib" / "libmodel.a")
    if meta_text is not None:
        (dest / "lib" / "model.meta").write_text(meta_text)
    return dest
