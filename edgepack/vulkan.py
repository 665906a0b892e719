"""Vulkan GPUs: WGSL from TVM's webgpu target, run by wgpu-native on Vulkan through edgepack's runtime.

The pinned TVM has no SPIR-V code generator, but its ``webgpu`` target emits WGSL compute shaders,
and wgpu-native (the C library inside the PyPI ``wgpu`` wheel) runs WGSL on Vulkan. TVM ships no
runtime for those shaders outside a browser, so edgepack carries one: ``runtimes/vulkan`` (C++ over
the tvm-ffi/TVM runtime headers and wgpu-native's C API) builds a plug-in, ``libtvm_vulkan.so``,
that registers ``device_api.webgpu`` (TVM's device type 15) and ``ffi.Module.load_from_bytes.webgpu``.
It dlopen()s ``libwgpu_native.so`` (next to itself first) when the device is first used.

What lives here (the same shape as :mod:`edgepack.opencl`, whose GPU pipeline is reused):

* ``build_gpu(imported, target)``: TVM's default GPU pipeline (dlight) with every schedule decision
  recorded and no silent CPU fallback; returns the executable and an ``opencl.GpuReport`` whose
  kernels carry their WGSL.
* ``wgpu_native(triple)``: the pinned wgpu-native for a triple, from the ``wgpu`` wheel of PyPI
  (x86_64 / aarch64 Linux; SHA-256 checked, cached under ``<cache>/wgpu/<version>/``), or from
  ``$EDGEPACK_WGPU_NATIVE`` (Android: the user supplies it).
* ``host_plugin()`` / ``target_plugin(triple, cc, cxx)``: the plug-in for this machine or a device
  triple, cached under ``<cache>/vulkan/<tvm-version>/`` with ``libwgpu_native.so`` beside it.
* ``load_plugin()`` / ``runtime_info()`` / ``require_device()``; ``run_on_host_vulkan`` (a
  ``validation.BuildRunner``: ``host/model.so`` on ``tvm.device("webgpu", 0)`` in TVM's Relax VM).
* ``kernels(build_dir)`` / ``render_kernels``: the shaders with their dispatch sizes (``inspect --kernels``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgepack import gpu_plugins
from edgepack.errors import CompileError, EdgepackError, ToolchainError, ValidationError
from edgepack.fileutil import file_lock, file_sha256
from edgepack.paths import cache_root

Log = Callable[[str], None]

PLUGIN_SHARED = "libtvm_vulkan.so"
PLUGIN_STATIC = "libtvm_vulkan.a"
WGPU_LIBRARY = "libwgpu_native.so"
KERNELS_SOURCE = "device/kernels.wgsl"
KERNELS_INDEX = "device/kernels.json"
EXTRA_KEY = "vulkan"  # manifest.extra[EXTRA_KEY]: the GPU report
DEVICE_TYPE = 15  # kDLWebGPU: what TVM's webgpu host code allocates on
_HOST_TRIPLE = gpu_plugins.HOST_TRIPLE
_PLUGIN_VERSION = "0.1.0"

#: The PyPI ``wgpu`` release whose wgpu-native (C library + webgpu.h/wgpu.h) edgepack builds against.
#: The C API changes between wgpu-native releases: keep the version pinned.
WGPU_VERSION = "0.32.0"
WGPU_NATIVE_VERSION = "29.0.1.1"


@dataclass(frozen=True)
class WgpuWheel:
    platform: str
    filename: str
    sha256: str


#: Recorded from PyPI; a download with another digest is refused.
WGPU_WHEELS: dict[str, WgpuWheel] = {
    "x86_64-linux-gnu": WgpuWheel(
        "manylinux_2_28_x86_64", f"wgpu-{WGPU_VERSION}-py3-none-manylinux_2_28_x86_64.whl",
        "6499a31b5a29a10b4f1089fea4a0806411f42605fa86b6c0b543a07ca0de8568"),
    "aarch64-linux-gnu": WgpuWheel(
        "manylinux_2_28_aarch64", f"wgpu-{WGPU_VERSION}-py3-none-manylinux_2_28_aarch64.whl",
        "00454ba1bc794d38c8365f4ad29f381b88ce0a7f115133bfaa6f1dfad7eb2764"),
}
_WHEEL_LIBRARY = "wgpu/resources/libwgpu_native-release.so"
_WHEEL_HEADERS = ("wgpu/resources/webgpu.h", "wgpu/resources/wgpu.h")
_ELF_MACHINES = {"x86_64": 0x3E, "aarch64": 0xB7, "arm": 0x28, "armv7a": 0x28}

ANDROID_HINT = (
    "wgpu-native is not on PyPI for Android. Build it for the device (wgpu-native "
    f"v{WGPU_NATIVE_VERSION}: `cargo ndk -t arm64-v8a build --release` in a checkout of "
    "github.com/gfx-rs/wgpu-native at that tag), or take libwgpu_native.so from that release's Android "
    "asset, and point EDGEPACK_WGPU_NATIVE at it: `export EDGEPACK_WGPU_NATIVE=/path/to/libwgpu_native.so`. "
    "The version must match: the C API changes between releases. See runtimes/vulkan/README.md."
)


# ----------------------------------------------------------------------------------------------
# compiling: the dlight GPU pipeline of edgepack.opencl, WGSL sources


def build_gpu(imported, target, *, relax_pipeline=None):
    """Compile for a ``webgpu`` target (with its host); returns ``(executable, opencl.GpuReport)``.

    The pipeline, the schedule report and the refusal of unscheduled functions (no silent CPU
    fallback) are the OpenCL ones (``opencl.build_gpu``); the kernels carry their WGSL here.
    """
    from edgepack import opencl

    try:
        executable, report = opencl.build_gpu(imported, target, relax_pipeline=relax_pipeline)
    except CompileError as exc:
        cause = str(exc.__cause__ or "")
        if "do not support i64" in cause or "do not support i64" in exc.message:
            raise CompileError(
                f"{imported.info.path.name} uses 64-bit integers on the GPU, which WGSL (and so TVM's webgpu "
                "code generator) does not have: TVM stops with 'CodeGenWebGPU: do not support i64'.",
                "Compile it for an OpenCL profile (mali-g610) or a CPU profile (rpi4), or export the model "
                "with int32 indices (e.g. Gather/ScatterElements/ArgMax on int32).",
            ) from exc
        raise
    shaders = wgsl_shaders(executable)
    report = dataclasses.replace(
        report, kernels=[dataclasses.replace(k, source=shaders.get(k.name, "")) for k in report.kernels])
    return executable, report


def wgsl_source(executable) -> str:
    """All WGSL of a compiled (or loaded) executable: its ``webgpu`` module's text."""
    stack, found = [executable.mod if hasattr(executable, "mod") else executable], []
    while stack:
        m = stack.pop()
        if m.kind == "webgpu":
            found.append(m.inspect_source())
        stack.extend(m.imports)
    return "\n".join(found)


_MARKER = re.compile(r"(?m)^// Function: (\S+)\s*$")


def split_shaders(source: str) -> dict[str, str]:
    """Per-kernel shaders of TVM's WGSL text. Each shader is introduced by one or more
    ``// Function: <name>`` lines; a shader runs until the next marker with another name."""
    sections: dict[str, str] = {}
    marks = list(_MARKER.finditer(source))
    i = 0
    while i < len(marks):
        name, start = marks[i].group(1), marks[i].start()
        j = i + 1
        while j < len(marks) and marks[j].group(1) == name:
            j += 1
        end = marks[j].start() if j < len(marks) else len(source)
        text = source[start:end]
        # TVM frames the name with "//----" lines; drop a trailing one that belongs to the next shader
        text = re.sub(r"(?s)\n//-+\s*$", "\n", text.rstrip()) + "\n"
        sections[name] = text
        i = j
    return sections


def wgsl_shaders(executable) -> dict[str, str]:
    return split_shaders(wgsl_source(executable))


def write_kernel_files(root: Path, executable, report) -> dict[str, str]:
    """``device/kernels.wgsl`` (every shader) and ``device/kernels.json`` (dispatch sizes, schedules)
    into a build directory; returns {artifact name: relative path}."""
    source = wgsl_source(executable)
    (root / KERNELS_SOURCE).parent.mkdir(parents=True, exist_ok=True)
    (root / KERNELS_SOURCE).write_text(source)
    index = report_dict(report) | {"kernels": [k.to_dict(with_source=False) for k in report.kernels]}
    (root / KERNELS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return {"vulkan_kernels": KERNELS_SOURCE, "vulkan_kernel_index": KERNELS_INDEX}


def report_dict(report) -> dict[str, Any]:
    """manifest.extra["vulkan"]: the OpenCL report's fields plus what runs the shaders."""
    return report.to_dict() | {"language": "wgsl", "runtime": f"wgpu-native {WGPU_NATIVE_VERSION} (Vulkan)"}


def is_vulkan_build(build_dir: Path | str) -> bool:
    from edgepack.manifest import read_manifest

    try:
        return read_manifest(Path(build_dir)).profile.get("backend") == "vulkan"
    except EdgepackError:
        return False


def kernels(build_dir: Path | str) -> list:
    """The WGSL shaders of a build with their dispatch sizes and source (``inspect --kernels``)."""
    from edgepack.opencl import Kernel

    build_dir = Path(build_dir)
    index_path, source_path = build_dir / KERNELS_INDEX, build_dir / KERNELS_SOURCE
    if not index_path.is_file() or not source_path.is_file():
        from edgepack.manifest import read_manifest

        manifest = read_manifest(build_dir)
        raise EdgepackError(
            f"{build_dir} has no WGSL shaders: it was compiled for {manifest.profile_name} "
            f"({manifest.profile.get('backend', 'cpu')}).",
            "Shaders exist for Vulkan profiles: compile with --profile vulkan-generic or --profile mali-g610-vulkan.",
        )
    index = json.loads(index_path.read_text())
    sections = split_shaders(source_path.read_text())
    return [Kernel(k["name"], k["function"], tuple(k["arg_types"]), tuple(k["launch_params"]), tuple(k["grid"]),
                   tuple(k["block"]), sections.get(k["name"], "")) for k in index["kernels"]]


def render_kernels(found: Sequence, *, with_source: bool = True) -> str:
    """Plain text for ``inspect BUILD --kernels``: one line per shader (dispatch = workgroups per
    dimension, the workgroup size compiled into the shader), then its WGSL."""
    lines = [f"{len(found)} WGSL shader(s) (Vulkan via wgpu-native)"]
    width = max((len(k.name) for k in found), default=10)
    size = gpu_plugins.format_size
    for k in found:
        buffers = sum(1 for t in k.arg_types if t == "handle")
        scalars = [t for t in k.arg_types if t != "handle"]
        lines.append(f"{k.name:<{width}}  dispatch {size(k.grid):<12} workgroup_size {size(k.block):<10}"
                     f" from {k.function}  bindings: {buffers} storage + uniform"
                     + (f" ({', '.join(scalars)})" if scalars else ""))
        if with_source and k.source:
            lines.append(k.source.rstrip())
            lines.append("")
    return "\n".join(lines)


def summary_lines(extra: dict[str, Any]) -> list[str]:
    """Lines for the compile summary: shaders, schedules, and the CPU fallback (always stated)."""
    return gpu_plugins.summary_lines(
        extra, f"GPU: {extra.get('num_kernels', 0)} WGSL shaders from {extra.get('num_functions', 0)} fused "
               f"functions ({extra.get('pipeline')} pipeline; {extra.get('memory', 'buffers')}; "
               f"{extra.get('runtime', 'wgpu-native')})")


# ----------------------------------------------------------------------------------------------
# wgpu-native: the pinned library (and its headers) per triple


@dataclass(frozen=True)
class WgpuNative:
    triple: str
    library: Path  # libwgpu_native.so for the triple
    include_dir: Path  # webgpu.h, wgpu.h
    origin: str  # "pypi:wgpu==<v>" or "EDGEPACK_WGPU_NATIVE"


def _elf_machine(path: Path) -> int | None:
    head = path.read_bytes()[:20]
    return int.from_bytes(head[18:20], "little") if head[:4] == b"\x7fELF" else None


def _fetch_wheel(triple: str, base: Path, log: Log | None) -> Path:
    """The wgpu wheel for ``triple`` (pip download once, SHA-256 checked), kept in ``base/downloads``."""
    from edgepack import native

    wheel = WGPU_WHEELS[triple]
    downloads = base / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    path = downloads / wheel.filename
    if not path.is_file() or file_sha256(path) != wheel.sha256:
        if log:
            log(f"Downloading wgpu-native {WGPU_NATIVE_VERSION} for {triple} (PyPI wgpu=={WGPU_VERSION})")
        with tempfile.TemporaryDirectory(dir=downloads) as tmp:
            result = native._run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                                  "--platform", wheel.platform, "--disable-pip-version-check", "-d", tmp,
                                  f"wgpu=={WGPU_VERSION}"], log=None)
            got = Path(tmp) / wheel.filename
            if result.returncode != 0 or not got.is_file():
                raise ToolchainError(
                    f"Downloading wgpu=={WGPU_VERSION} ({wheel.platform}) from PyPI for wgpu-native failed.",
                    "It needs access to PyPI (or a pip index in pip.conf); or run scripts/setup.sh once online.\n"
                    + native._tail(result.stdout + result.stderr, 8),
                )
            os.replace(got, path)
    digest = file_sha256(path)
    if digest != wheel.sha256:
        path.unlink(missing_ok=True)
        raise ToolchainError(f"{wheel.filename} has SHA-256 {digest}, expected {wheel.sha256}.",
                             "The download is not the release edgepack was tested with; it was deleted. "
                             "Check your pip index.")
    return path


def _extract(triple: str, base: Path, log: Log | None) -> Path:
    from edgepack import native

    root = base / triple
    if (root / "manifest.json").is_file():
        return root
    with file_lock(base / f".{triple}.lock"):
        if (root / "manifest.json").is_file():
            return root
        wheel_path = _fetch_wheel(triple, base, log)
        with native._staging(root) as tmp, zipfile.ZipFile(wheel_path) as wheel:
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
    return root


def wgpu_native(triple: str, *, cache_dir: Path | None = None, log: Log | None = None) -> WgpuNative:
    """The pinned wgpu-native for ``triple``: the PyPI wheel's library for the Linux triples it exists
    for (x86_64, aarch64), else ``$EDGEPACK_WGPU_NATIVE`` (a libwgpu_native.so the user built for the
    triple: how Android gets one)."""
    base = Path(cache_dir if cache_dir is not None else cache_root()) / "wgpu" / WGPU_VERSION
    headers = _extract(_HOST_TRIPLE, base, log) / "include"  # the headers are the same on every platform
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


# ----------------------------------------------------------------------------------------------
# the plug-in: build (host or cross), cache, load


@dataclass(frozen=True)
class VulkanPlugin:
    """edgepack's Vulkan runtime built for one triple, with the wgpu-native it loads beside it."""

    triple: str
    root: Path
    shared: Path  # lib/libtvm_vulkan.so
    static: Path | None  # lib/libtvm_vulkan.a (link with --whole-archive)
    wgpu: Path  # lib/libwgpu_native.so
    runtime_origin: str


_RECIPE = gpu_plugins.PluginRecipe("vulkan", "Vulkan", PLUGIN_SHARED, _PLUGIN_VERSION)


def _plugin_from_dir(root: Path) -> VulkanPlugin:
    data = json.loads((root / "manifest.json").read_text())
    static = root / "lib" / PLUGIN_STATIC
    return VulkanPlugin(data["triple"], root, root / "lib" / PLUGIN_SHARED, static if static.is_file() else None,
                        root / "lib" / WGPU_LIBRARY, data.get("runtime_origin", ""))


def build_plugin(triple: str, cc: str, cxx: str, runtime, *, flags: Sequence[str] = (),
                 cache_dir: Path | None = None, log: Log | None = None) -> VulkanPlugin:
    """Build ``runtimes/vulkan`` for ``triple`` with ``cxx`` against ``runtime`` (a ``native.TargetRuntime``)
    and put the triple's ``libwgpu_native.so`` beside it; cached by everything that goes in."""
    from edgepack import native

    wgpu = wgpu_native(triple, cache_dir=cache_dir, log=log)
    root = gpu_plugins.build(
        _RECIPE, triple, cxx, runtime, flags=flags, cache_dir=cache_dir, log=log,
        defines=[f"-DWGPU_INCLUDE_DIR={wgpu.include_dir}",
                 f"-DEDGEPACK_GPU_COMMON_DIR={native.runtimes_dir() / 'gpu-common' / 'include'}"],
        key_extra={"wgpu": file_sha256(wgpu.library)},
        beside={WGPU_LIBRARY: wgpu.library},  # the plug-in loads it from its own directory
        manifest_extra={"wgpu_origin": wgpu.origin, "wgpu_native": WGPU_NATIVE_VERSION},
    )
    return _plugin_from_dir(root)


def host_plugin(*, cache_dir: Path | None = None, log: Log | None = None) -> VulkanPlugin:
    """The plug-in for this machine, linked against the installed wheels' runtime."""
    from edgepack import native

    cc, cxx = gpu_plugins.host_compilers()
    return build_plugin(_HOST_TRIPLE, cc, cxx, native.host_runtime(), cache_dir=cache_dir, log=log)


def target_plugin(triple: str, cc: str, cxx: str, *, cache_dir: Path | None = None,
                  log: Log | None = None) -> tuple[VulkanPlugin, Any]:
    """The plug-in cross-built for ``triple`` and the TVM runtime it links against."""
    from edgepack import native

    wgpu_native(triple, cache_dir=cache_dir, log=log)  # a missing wgpu-native fails before a runtime build
    runtime = native.ensure_target_runtime(triple, cc, cxx, need_static=True, cache_dir=cache_dir, log=log)
    flags = runtime.cflags or native.DEFAULT_TARGET_FLAGS.get(triple, ())
    return build_plugin(triple, cc, cxx, runtime, flags=flags, cache_dir=cache_dir, log=log), runtime


def bundle_files(triple: str, cc: str, cxx: str, *, log: Log | None = None) -> dict[str, Path]:
    """For ``package_c`` of a Vulkan build: {bundle-relative path: file}: the runtime module
    (shared + static) and the wgpu-native library it loads from the same directory."""
    plugin, _runtime = target_plugin(triple, cc, cxx, log=log)
    files = {f"lib/{PLUGIN_SHARED}": plugin.shared, f"lib/{WGPU_LIBRARY}": plugin.wgpu}
    if plugin.static is not None:
        files[f"lib/{PLUGIN_STATIC}"] = plugin.static
    return files


_loaded_plugin: ctypes.CDLL | None = None


def load_plugin(path: Path | str | None = None, *, log: Log | None = None) -> dict[str, Any]:
    """Load the plug-in into this process (once) and return ``runtime_info()``."""
    global _loaded_plugin
    import tvm  # noqa: F401  (the runtime must be loaded, RTLD_GLOBAL, before the plug-in)
    import tvm_ffi

    # Mesa's Vulkan loader warns on stderr when there is no runtime directory; give it a private one
    if not os.environ.get("XDG_RUNTIME_DIR"):
        runtime_dir = Path(tempfile.gettempdir()) / f"edgepack-xdg-{os.getuid()}"
        runtime_dir.mkdir(mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime_dir)
    if tvm_ffi.get_global_func("ffi.Module.load_from_bytes.webgpu", allow_missing=True) is None:
        lib = Path(path) if path is not None else host_plugin(log=log).shared
        try:
            _loaded_plugin = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise ToolchainError(f"Cannot load edgepack's Vulkan runtime {lib}: {exc}.",
                                 "Rebuild it: delete the directory and run again.") from exc
        if tvm_ffi.get_global_func("ffi.Module.load_from_bytes.webgpu", allow_missing=True) is None:
            raise ToolchainError(f"{lib} loaded but registered no WebGPU module loader.",
                                 "It is not edgepack's Vulkan runtime for this TVM version; rebuild it.")
    return runtime_info()


def runtime_info() -> dict[str, Any]:
    """The wgpu-native library the plug-in loaded and the adapter ``tvm.device("webgpu", 0)`` is."""
    import tvm_ffi

    f = tvm_ffi.get_global_func("edgepack.vulkan.runtime_info", allow_missing=True)
    if f is None:
        return {"runtime": None, "available": False, "error": "edgepack's Vulkan runtime is not loaded",
                "devices": []}
    return json.loads(str(f()))


VULKAN_DRIVER_HINT = ("Install a Vulkan driver; on Debian/Ubuntu the CPU one (lavapipe) is enough: "
                      "`apt-get install mesa-vulkan-drivers libvulkan1` (check with `vulkaninfo --summary`).")


def require_device(log: Log | None = None) -> dict[str, Any]:
    """Load the plug-in and make sure there is a Vulkan adapter; returns ``runtime_info()``."""
    info = load_plugin(log=log)
    if not info.get("available") or not info.get("devices"):
        raise EdgepackError(f"No Vulkan device on this machine: {info.get('error') or 'none found'}.",
                            VULKAN_DRIVER_HINT)
    return info


def host_vulkan_status() -> tuple[bool, str, str]:
    """(ok, what was found, how to fix) for ``edgepack doctor``: a Vulkan loader and driver (ICD)
    manifests on this machine (no TVM, no plug-in build)."""
    try:
        ctypes.CDLL("libvulkan.so.1")
    except OSError:
        return False, "no libvulkan.so.1", "apt-get install libvulkan1 mesa-vulkan-drivers"
    icds = [p for d in ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")
            for p in sorted(Path(d).glob("*.json"))]
    if not icds:
        return False, "Vulkan loader but no driver (ICD)", "apt-get install mesa-vulkan-drivers   (lavapipe)"
    return True, f"{len(icds)} driver manifest(s): {', '.join(p.stem for p in icds)}", ""


# ----------------------------------------------------------------------------------------------
# running: validate --on host-vulkan


def refuse_emulator(build_dir: Path, manifest) -> None:
    """``validate --on emulator`` of a Vulkan build: a clear error instead of a run that cannot work.

    qemu-user runs the aarch64 C runner and wgpu-native, but the Vulkan driver they need is aarch64
    too: Debian's arm64 lavapipe in a chroot works (runtimes/vulkan/tests/aarch64_lavapipe.py) but
    needs root, the arm64 packages and several minutes per model: a manual check, not a validation."""
    raise EdgepackError(
        f"{build_dir} is a Vulkan build ({manifest.profile_name}); --on emulator cannot run it: qemu-user runs the "
        "device's CPU code, but there is no emulated Vulkan GPU (an aarch64 driver under qemu needs an arm64 root "
        "file system, root, and minutes per model: runtimes/vulkan/tests/aarch64_lavapipe.py).",
        "Validate the same shaders on this machine with --on host-vulkan (any Vulkan driver, e.g. lavapipe: "
        "`apt-get install mesa-vulkan-drivers`), or on the device itself.",
    )


def run_on_host_vulkan(build_dir: Path, manifest, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """A BuildRunner: ``host/model.so`` (x86 host code + the build's WGSL) on ``webgpu(0)`` (wgpu-native
    on this machine's Vulkan driver) through TVM's Relax VM, with edgepack's Vulkan runtime."""
    import tvm

    from edgepack.validation import run_host_library

    if manifest.profile.get("backend") != "vulkan":
        raise EdgepackError(
            f"{build_dir} was compiled for {manifest.profile_name} ({manifest.profile.get('backend')}), "
            "not for a Vulkan GPU.",
            "Validate it with --on host (CPU builds) or --on host-opencl (OpenCL builds), or compile for "
            "vulkan-generic / mali-g610-vulkan.",
        )
    info = require_device()
    device = tvm.device("webgpu", 0)
    try:
        return run_host_library(build_dir, manifest, inputs, device)
    except EdgepackError:
        raise
    except Exception as exc:  # TVM raises RuntimeError/ValueError/... with the runtime's message
        text = str(exc).strip()
        where = info["devices"][0]["name"]
        match = re.search(r"WebGPU shader '([^']+)' failed to compile", text)
        if match:
            raise ValidationError(
                f"{build_dir}: " + text[text.find("WebGPU shader"):],
                f"The shader source is in {KERNELS_SOURCE}; compile again to regenerate it, or report wgpu's "
                "message with the model attached.",
            ) from exc
        raise ValidationError(f"Running {build_dir} through Vulkan (wgpu-native) on {where} failed: {text}",
                              "Run with EDGEPACK_WGPU_SYNC=1 to find the failing shader.") from exc
