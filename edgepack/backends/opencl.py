"""OpenCL GPUs (Mali, Adreno): TVM's GPU pipeline generates OpenCL C; edgepack's runtime runs it.

The pinned TVM wheel generates OpenCL C but has no OpenCL runtime, so edgepack carries one:
``runtimes/plugins/opencl`` (C++ over the tvm-ffi and TVM runtime headers) builds a plug-in,
``libtvm_opencl.so``, that registers ``device_api.opencl`` and ``ffi.Module.load_from_bytes.opencl``
when it is loaded into a process that already has the TVM runtime. It dlopen()s the OpenCL ICD
loader (``libOpenCL.so.1``) at run time, so one plug-in works with any vendor's driver. Memory is
OpenCL buffers only (no image/texture memory). Kernels are scheduled by dlight (``gpu_generic`` for
Mali, ``adreno`` for Adreno), or by tuning records (MetaSchedule, measured over RPC).
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgepack.backends.base import KernelForm, TuningLayout, register
from edgepack.backends.gpu import HOST_TARGET, GpuBackend, Kernel, format_size, gpu_tuning_passes
from edgepack.errors import EdgepackError, ValidationError
from edgepack.manifest import BuildManifest
from edgepack.profiles import GpuLimits, Profile
from edgepack.toolchain.packed_kernels import ModuleReader, encode_str
from edgepack.toolchain.plugins import PluginRecipe

_KERNEL_MARKER = "// Function: "


def driver_status() -> tuple[bool, str, str]:
    """(ok, what was found, how to fix) for ``edgepack doctor``: an OpenCL device on this machine,
    asked directly through libOpenCL (no TVM, no plug-in build)."""
    hint = "apt-get install ocl-icd-libopencl1 pocl-opencl-icd   (PoCL: OpenCL on this CPU)"
    try:
        lib = ctypes.CDLL("libOpenCL.so.1")
    except OSError:
        return False, "no libOpenCL.so.1", hint
    count = ctypes.c_uint(0)
    if lib.clGetPlatformIDs(0, None, ctypes.byref(count)) != 0 or count.value == 0:
        return False, "no OpenCL platform (driver)", hint
    platforms = (ctypes.c_void_p * count.value)()
    lib.clGetPlatformIDs(count.value, platforms, None)
    names = []
    for platform in platforms:
        n = ctypes.c_uint(0)
        if lib.clGetDeviceIDs(ctypes.c_void_p(platform), ctypes.c_uint64(0xFFFFFFFF), 0, None, ctypes.byref(n)) != 0:
            continue
        devices = (ctypes.c_void_p * n.value)()
        lib.clGetDeviceIDs(ctypes.c_void_p(platform), ctypes.c_uint64(0xFFFFFFFF), n.value, devices, None)
        for device in devices:
            buf = ctypes.create_string_buffer(256)
            lib.clGetDeviceInfo(ctypes.c_void_p(device), ctypes.c_uint(0x102B), ctypes.c_size_t(256), buf, None)
            names.append(buf.value.decode(errors="replace"))
    if not names:
        return False, "no OpenCL device", hint
    return True, f"{len(names)} device(s): {', '.join(names)}", ""



#: A kernel's declaration in TVM's OpenCL source (``before_packing`` drops them).
KERNEL_DECLARATION = re.compile(r"(?m)^__kernel void \w+\([^;{]*\);\n")


class OpenCLBackend(GpuBackend):
    name = "opencl"
    label = "OpenCL"
    device_noun = "an OpenCL GPU"
    host_place = "host-opencl"
    tunable = True
    module_kind = "opencl"
    language = "OpenCL"
    kernels_source = "device/kernels.cl"
    recipe = PluginRecipe("opencl", "OpenCL", "libtvm_opencl.so", "libtvm_opencl.a", "0.1.0")
    loader_function = "ffi.Module.load_from_bytes.opencl"
    info_function = "edgepack.opencl.runtime_info"
    driver_hint = ("Install an OpenCL driver; on Debian/Ubuntu the CPU one is enough: "
                   "`apt-get install pocl-opencl-icd ocl-icd-libopencl1` (check with `clinfo -l`).")

    def split_source(self, source: str) -> dict[str, str]:
        """Per-kernel sections of TVM's OpenCL source (each starts with ``// Function: <name>``)."""
        sections: dict[str, str] = {}
        starts = [m.start() for m in re.finditer(r"(?m)^// Function: ", source)]
        for i, start in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else len(source)
            text = source[start:end]
            name = text[len(_KERNEL_MARKER):].split("\n", 1)[0].strip()
            sections[name] = text.rstrip() + "\n"
        return sections

    half_feature = "cl_khr_fp16"

    def before_packing(self, module: bytes) -> bytes:
        """The OpenCL module's bytes (fmt str, fmap, source str) with the source's kernel declarations dropped:
        TVM repeats all of them in every kernel's section, and a kernel never calls another."""
        r = ModuleReader(module)
        fmt = r.raw()
        fmap_start = r.at
        for _ in range(r.u64()):  # the fmap: key, then FunctionInfo (name, arg types, launch tags, extra tags)
            r.raw()
            r.raw()
            r.skip(4)  # arg types: u8 code, u8 bits, u16 lanes
            for _ in range(r.u64()):
                r.raw()
            r.skip(4)  # arg extra tags: i32
        fmap = module[fmap_start:r.at]
        source = KERNEL_DECLARATION.sub("", r.raw().decode())
        return encode_str(fmt) + fmap + encode_str(source.encode())

    def half_arithmetic(self, device: dict[str, Any]) -> bool:
        return bool(device.get("fp16"))

    def tvm_device(self) -> Any:
        import tvm

        return tvm.opencl(0)

    def remote_device(self, session: Any) -> Any:
        return session.cl(0)

    def render_kernels(self, kernels: Sequence[Kernel], *, with_source: bool = True) -> str:
        """Plain text for ``inspect BUILD --kernels``: one header line per kernel, then its source."""
        lines = [f"{len(kernels)} OpenCL kernel(s)"]
        width = max((len(k.name) for k in kernels), default=10)
        for k in kernels:
            lines.append(f"{k.name:<{width}}  global {format_size(k.global_size):<14} local {format_size(k.block):<10}"
                         f" (grid {format_size(k.grid)})  from {k.function}  args: {', '.join(k.arg_types)}")
            if with_source and k.source:
                lines.append(k.source.rstrip())
                lines.append("")
        return "\n".join(lines)

    def run_error(self, exc: Exception, build_dir: Path, where: str) -> EdgepackError:
        text = str(exc).strip()
        if re.search(r"OpenCL kernel '([^']+)' failed to build", text):
            return ValidationError(
                f"{build_dir}: " + text[text.find("OpenCL kernel"):],
                "The kernel source is in device/kernels.cl; compile again to regenerate it, or report the "
                "driver's message with the model attached.",
            )
        return ValidationError(f"Running {build_dir} through OpenCL on {where} failed: {text}",
                               "Run with EDGEPACK_OPENCL_SYNC=1 to find the failing kernel.")

    def emulation_refusal(self, build_dir: Path, manifest: BuildManifest) -> EdgepackError:
        """``validate --on emulator`` of an OpenCL build: a clear error instead of a run that cannot work.

        qemu-user runs the aarch64 C runner, but the OpenCL driver it would need is aarch64 too: the
        only one reachable is Debian's arm64 PoCL, which compiles every kernel with LLVM under
        emulation (about 1.1 GB unpacked, root for a chroot with /proc, /sys and /dev, and 4 to 15
        minutes for a small model on 2 cores). That is a manual check (runtimes/plugins/opencl/tests/aarch64_pocl.py),
        not a validation step."""
        return EdgepackError(
            f"{build_dir} is an OpenCL build ({manifest.profile_name}); --on emulator cannot run it: qemu-user "
            "runs the device's CPU code, but no emulated OpenCL GPU exists (an aarch64 OpenCL driver under qemu, "
            "Debian's arm64 PoCL, needs a 1.1 GB root file system, root, and minutes per kernel set).",
            "Validate the same kernels on this machine with --on host-opencl (any OpenCL driver, e.g. PoCL: "
            "`apt-get install pocl-opencl-icd`), or on the device itself with --on DEVICE "
            f"(`edgepack device add ... --profile {manifest.profile_name}`).",
        )

    def driver_status(self) -> tuple[bool, str, str]:
        return driver_status()

    # --- tuning: GPU kernels measured over RPC (this machine's OpenCL device, or a device's)

    def tuning_layout(self) -> TuningLayout:
        return TuningLayout()

    def tuning_place(self, profile: Profile) -> str | None:
        return self.host_place

    def tuning_target(self, profile: Profile, *, num_cores: int | None, here: bool) -> Any:
        """The profile's kernels; their host code is this machine's when measured here, the device's
        otherwise. A kernel's records do not depend on it."""
        import tvm

        host = HOST_TARGET if here else profile.host_target
        return tvm.target.Target(dict(profile.target), host=host) if host else tvm.target.Target(dict(profile.target))

    def tuning_passes(self, target: Any, form: KernelForm, limits: GpuLimits | None = None) -> list[Any]:
        return gpu_tuning_passes(target, self.limits(limits, target).storage_buffers)


register(OpenCLBackend())
