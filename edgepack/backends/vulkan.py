"""Vulkan GPUs: WGSL from TVM's webgpu target, run by wgpu-native on Vulkan through edgepack's runtime.

The pinned TVM has no SPIR-V code generator, but its ``webgpu`` target emits WGSL compute shaders,
and wgpu-native (``toolchain.wgpu_native``) runs WGSL on Vulkan. TVM ships no runtime for those
shaders outside a browser, so edgepack carries one: ``runtimes/plugins/vulkan`` (C++ over the
tvm-ffi/TVM runtime headers and wgpu-native's C API) builds a plug-in, ``libtvm_vulkan.so``, that
registers ``device_api.webgpu`` (TVM's device type 15) and ``ffi.Module.load_from_bytes.webgpu``. It
dlopen()s ``libwgpu_native.so`` (next to itself first) when the device is first used.

WGSL has no 64-bit integers: ``VulkanBackend.prepare`` narrows the model's int64 tensors to int32 where
that is provably exact, and refuses by ONNX node name what really needs 64 bits (``backends.int64``). Nor
8-bit integers or bools in buffers: those tensors are held in int32 (``wgsl_bytes.py``, ``wgsl_bools.py``).
"""

from __future__ import annotations

import ctypes
import math
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgepack.backends.base import register
from edgepack.backends.gpu import GpuBackend, Kernel, format_size, function_of, unwrapped_refusal, with_module
from edgepack.backends.int64 import Int64Refused, int64_kernels, narrow_int64, simplify_int64, target_lacks_int64
from edgepack.backends.placement import cone, dtype_bindings, operator_bindings, place_on_cpu, readers, writers
from edgepack.backends.relax_exprs import call_rewrite_pass, op_name, static_shape
from edgepack.backends.wgsl_bools import hold_bools_in_32, unwidened_buffers
from edgepack.backends.wgsl_bytes import WRAPPING_CAST, hold_8_bits_in_32
from edgepack.backends.wgsl_words import refuse_unaligned_8_bit_boundary
from edgepack.errors import CompileError, EdgepackError, ValidationError
from edgepack.files import file_sha256
from edgepack.frontends.types import ImportedModel
from edgepack.manifest import BuildManifest
from edgepack.profiles import GpuLimits, Profile
from edgepack.progress import Progress
from edgepack.toolchain.plugins import PluginRecipe
from edgepack.toolchain.wgpu_native import WGPU_LIBRARY, WGPU_NATIVE_VERSION, wgpu_native

NARROW_TYPES = ("bool", "int8", "uint8", "int16", "uint16")
UINT64_ON_CPU = "64-bit unsigned integers, which WGSL does not have (the int64 pass narrows only int64)"
#: operators whose TVM kernels compute in int64 inside, whatever their operands (the int64 pass sees only tensors)
INT64_INSIDE = ("relax.vision.all_class_non_max_suppression",)
INT64_INSIDE_ON_CPU = "TVM's kernel for it computes in 64-bit integers, which WGSL does not have"
DEVICE_TYPE = 15  # kDLWebGPU: what TVM's webgpu host code allocates on

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



def driver_status() -> tuple[bool, str, str]:
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



# Mesa's llvmpipe, and so lavapipe, ends every loop of a shader invocation once all its loops together have
# run 65535 iterations (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS, one counter per invocation), silently: the
# shader goes on with what it has. TVM's GPU schedules reduce a whole tensor (R.max / R.min / R.sum to one
# value, as DynamicQuantizeLinear does) in one thread, one iteration per element: a 1x64x16x160 tensor's
# maximum was that of its first ~64600 elements.
REDUCTION_SPAN = 4096
_SPLIT_REDUCTIONS = {"relax.max": "max", "relax.min": "min", "relax.sum": "sum"}


def _chunk(n: int, span: int) -> int:
    """The largest divisor of ``n`` that is at most ``span`` (1 for a prime ``n`` above it)."""
    return next(d for d in range(min(n, span), 0, -1) if n % d == 0)


def split_long_reductions(span: int = REDUCTION_SPAN):
    """A Relax pass: a reduction of a whole tensor of more than ``span`` elements (``R.max``, ``R.min``,
    ``R.sum`` over every axis) as one over its trailing axes that hold at most ``span`` elements together
    (over rows of a reshaped copy where the last axis alone is longer), then of its result, until at most
    ``span`` remain: no invocation of its kernels loops much more than ``span`` times (lavapipe stops a
    shader's loops after 65535 iterations, ``REDUCTION_SPAN``'s note). Max and min are exact; a sum is
    reassociated (by rows, as a parallel sum is)."""
    from tvm import relax

    def rewrite(call, builder):
        op = op_name(call)
        if op not in _SPLIT_REDUCTIONS or call.attrs is None:
            return None
        shape = static_shape(call.args[0])
        if shape is None:  # unknown rank or a symbolic dimension
            return None
        axes = None if call.attrs.axis is None else {int(a) % max(len(shape), 1) for a in call.attrs.axis}
        if axes is not None and axes != set(range(len(shape))):
            return None
        if math.prod(shape) <= span:
            return None
        make = getattr(relax.op, _SPLIT_REDUCTIONS[op])
        rest, dims = call.args[0], list(shape)
        while math.prod(dims) > span:
            k = len(dims)  # dims[k:]: the most trailing axes that together hold at most ``span`` elements
            while math.prod(dims[k - 1:]) <= span:
                k -= 1
            if k < len(dims):  # over those axes: no copy of the tensor
                rest = builder.emit(make(rest, axis=list(range(k, len(dims)))))
                dims = dims[:k]
                continue
            m = math.prod(dims)  # the last axis alone is longer: over rows of it
            d = _chunk(m, span)
            if d == 1:  # a prime number of elements
                break
            rest = builder.emit(make(relax.op.reshape(rest, (m // d, d)), axis=[1]))
            dims = [m // d]
        if rest.same_as(call.args[0]):
            return None
        out = make(rest, axis=None, keepdims=False)
        if bool(call.attrs.keepdims):
            out = relax.op.reshape(builder.emit(out), [1] * len(shape))
        return out

    return call_rewrite_pass("EdgepackSplitLongReductions", rewrite)


class VulkanBackend(GpuBackend):
    name = "vulkan"
    label = "Vulkan (WGSL on wgpu-native)"
    device_noun = "a Vulkan GPU"
    host_place = "host-vulkan"
    static_bundle = False  # wgpu-native is a shared library only
    no_byte_tensors = "WGSL has no 8-bit integer type"
    module_kind = "webgpu"
    language = "WGSL"
    kernel_noun = "shaders"
    kernels_source = "device/kernels.wgsl"
    recipe = PluginRecipe("vulkan", "Vulkan", "libtvm_vulkan.so", "libtvm_vulkan.a", "0.1.0")
    loader_function = "ffi.Module.load_from_bytes.webgpu"
    info_function = "edgepack.vulkan.runtime_info"
    driver_hint = ("Install a Vulkan driver; on Debian/Ubuntu the CPU one (lavapipe) is enough: "
                   "`apt-get install mesa-vulkan-drivers libvulkan1` (check with `vulkaninfo --summary`).")
    # Where a profile states no [limits] (threads and workgroup memory then follow the TVM target): WebGPU's
    # defaults, which wgpu-native guarantees on every adapter (maxStorageBuffersPerShaderStage 8: lavapipe
    # allows 32, the Vulkan minimum is 4; maxStorageBufferBindingSize 128 MiB)
    default_limits = GpuLimits(storage_buffers=8, buffer_size=128 << 20, fp64=False)  # WGSL has no f64
    no_doubles = "WGSL (TVM's webgpu target) does not have"
    topi_scans = False  # wrong in WGSL on lavapipe (``gpu_scans.py``)
    scaled_sums = "opaque"  # naga marks nothing exact: lavapipe reassociated a bias (separate_products.py)

    half_feature = "shader-f16 (Vulkan's shaderFloat16)"

    def split_source(self, source: str) -> dict[str, str]:
        return split_shaders(source)

    def half_arithmetic(self, device: dict[str, Any]) -> bool:
        return bool(device.get("shader_f16"))

    def preflight(self, profile: Profile, *, log: Progress | None = None) -> None:
        wgpu_native(profile.triple, log=log)  # no wgpu-native for the triple (Android): say so before any build

    def plugin_options(self, triple: str, *, log: Progress | None = None) -> dict[str, Any]:
        """wgpu-native's headers to build against, and its library beside the plug-in (loaded from there)."""
        wgpu = wgpu_native(triple, log=log)
        return {"defines": [f"-DWGPU_INCLUDE_DIR={wgpu.include_dir}"],
                "key_extra": {"wgpu": file_sha256(wgpu.library)},
                "beside": {WGPU_LIBRARY: wgpu.library},
                "manifest_extra": {"wgpu_origin": wgpu.origin, "wgpu_native": WGPU_NATIVE_VERSION}}

    def relax_passes(self, model: str) -> list[Any]:
        # WGSL has no bool in buffers (``wgsl_bools.py``) nor 8-bit integers (``wgsl_bytes.py``); lavapipe stops
        # long loops (``split_long_reductions``)
        return [hold_bools_in_32(), hold_8_bits_in_32(model), split_long_reductions(), *super().relax_passes(model)]

    def check_limits(self, name: str, kernels: dict[str, dict[str, Any]], limits: GpuLimits,
                     record: dict[str, str]) -> None:
        """The profile's limits (``GpuBackend.check_limits``), and no shader with a bool or 8/16-bit integer storage buffer,
        which wgpu would refuse only when it compiles the shader, at run time (``wgsl_bools.py``)."""
        super().check_limits(name, kernels, limits, record)
        odd = unwidened_buffers(kernels)
        if odd:
            where = [f"{k} ({', '.join(t)}; from {function_of(k, record) or k})" for k, t in sorted(odd.items())]
            raise CompileError(
                f"{name} needs {len(odd)} WGSL shader(s) with bool, 8-bit or 16-bit integer storage buffers, which "
                f"WGSL does not have: {'; '.join(where[:6])}. A Vulkan build holds bool and 8-bit tensors in int32 "
                "(backends/wgsl_bools.py, wgsl_bytes.py), but not those that operator reads or writes.",
                "Compile it for an OpenCL profile (mali-g610) or a CPU profile (rpi4), or export the model so that "
                "operator takes and gives int32 or float tensors.")

    def report_details(self) -> dict[str, Any]:
        return {"language": "wgsl", "runtime": f"wgpu-native {WGPU_NATIVE_VERSION} (Vulkan)"}

    def prepare(self, imported: ImportedModel, target: Any, limits: GpuLimits, *,
                gpu_only: bool = False) -> ImportedModel:
        """WGSL has no int64: narrow what provably fits to int32 (``backends.int64``); what does not runs on the
        device's CPU in int64 (``placement.py``: each refused tensor with the int64 values it is computed from,
        until the rest narrows), or with ``gpu_only`` is refused by name. So do the scans (``cpu_operators``).
        Nor 8-bit integers or bools in buffers: 8-bit and bool inputs and outputs are read and written as 32-bit
        words of the caller's buffer, so one that is not a whole number of words is refused by name
        (``wgsl_words.py``)."""
        name = imported.info.path.name
        if gpu_only:  # else such an input or output crosses through the CPU (wgsl_words.py)
            refuse_unaligned_8_bit_boundary(imported.mod, name)
        if not target_lacks_int64(target):
            return super().prepare(imported, target, limits, gpu_only=gpu_only)
        mod = simplify_int64(imported.mod)  # constants folded first: a folded value has no device to follow
        if gpu_only:
            self.refuse_cpu_operators(name, mod, limits)
        where = {} if gpu_only else self.cpu_operators(mod, limits)
        while True:
            # a value WGSL cannot store (bool, 8- and 16-bit) computed on the CPU: its readers too; read there: its
            # producers too
            where = readers(mod["main"], where, NARROW_TYPES, "it reads a value the CPU computes in a type WGSL "
                            "cannot store") if where else where
            where = writers(mod["main"], where, NARROW_TYPES, "it computes a value the CPU reads in a type WGSL "
                            "cannot store") if where else where
            placed = place_on_cpu(mod, where, target) if where else mod
            try:
                return with_module(imported, narrow_int64(placed, model=name, simplified=True))
            except Int64Refused as refused:
                more = None if gpu_only else cone(mod["main"], set(refused.names))
                if not more or more <= where.keys():
                    raise
                for var in sorted(more - where.keys()):
                    where[var] = refused.reasons.get(var, "it computes an int64 value an operator on the CPU reads")

    def cpu_operators(self, mod, limits: GpuLimits) -> dict[str, str]:
        """The GPU backends' (scans, float64), and uint64 operators: the int64 pass narrows only int64."""
        return (super().cpu_operators(mod, limits) | dtype_bindings(mod, "uint64", UINT64_ON_CPU)
                | operator_bindings(mod, INT64_INSIDE, INT64_INSIDE_ON_CPU))

    def translate_compile_error(self, exc: CompileError, imported: ImportedModel, target: Any) -> CompileError:
        text = f"{exc.__cause__ or ''} {exc.message}"
        refusal = unwrapped_refusal(exc, imported.info.path.name, WRAPPING_CAST, " casts")  # hold_8_bits_in_32's
        if refusal is not None:
            return refusal
        if "do not support i64" in text or "do not support u64" in text:
            try:  # name the kernels that still hold 64-bit buffers (e.g. an operator without a 32-bit rule)
                where = int64_kernels(imported.mod, target)
            except Exception:  # noqa: BLE001  the message stands without them
                where = []
            return CompileError(
                f"{imported.info.path.name} uses 64-bit integers on the GPU, which WGSL (and so TVM's webgpu "
                "code generator) does not have: TVM stops with 'CodeGenWebGPU: do not support i64'"
                + (f" in {'; '.join(where[:6])}" if where else "") + ".",
                "Compile it for an OpenCL profile (mali-g610) or a CPU profile (rpi4), or export the model "
                "with int32 indices (e.g. Gather/ScatterElements/ArgMax on int32).",
            )
        return super().translate_compile_error(exc, imported, target)

    def prepare_process(self) -> None:
        # Mesa's Vulkan loader warns on stderr when there is no runtime directory; give it a private one
        if not os.environ.get("XDG_RUNTIME_DIR"):
            runtime_dir = Path(tempfile.gettempdir()) / f"edgepack-xdg-{os.getuid()}"
            runtime_dir.mkdir(mode=0o700, exist_ok=True)
            os.environ["XDG_RUNTIME_DIR"] = str(runtime_dir)

    def tvm_device(self) -> Any:
        import tvm

        return tvm.device("webgpu", 0)

    def remote_device(self, session: Any) -> Any:
        return session.device(DEVICE_TYPE, 0)

    def render_kernels(self, kernels: Sequence[Kernel], *, with_source: bool = True) -> str:
        """One line per shader (dispatch = workgroups per dimension, the workgroup size compiled into
        the shader), then its WGSL."""
        lines = [f"{len(kernels)} WGSL shader(s) (Vulkan via wgpu-native)"]
        width = max((len(k.name) for k in kernels), default=10)
        for k in kernels:
            buffers = sum(1 for t in k.arg_types if t == "handle")
            scalars = [t for t in k.arg_types if t != "handle"]
            lines.append(f"{k.name:<{width}}  dispatch {format_size(k.grid):<12} workgroup_size "
                         f"{format_size(k.block):<10} from {k.function}  bindings: {buffers} storage + uniform"
                         + (f" ({', '.join(scalars)})" if scalars else ""))
            if with_source and k.source:
                lines.append(k.source.rstrip())
                lines.append("")
        return "\n".join(lines)

    def run_error(self, exc: Exception, build_dir: Path, where: str) -> EdgepackError:
        text = str(exc).strip()
        if re.search(r"WebGPU shader '([^']+)' failed to compile", text):
            return ValidationError(
                f"{build_dir}: " + text[text.find("WebGPU shader"):],
                f"The shader source is in {self.kernels_source}; compile again to regenerate it, or report wgpu's "
                "message with the model attached.",
            )
        return ValidationError(f"Running {build_dir} through Vulkan (wgpu-native) on {where} failed: {text}",
                               "Run with EDGEPACK_WGPU_SYNC=1 to find the failing shader.")

    def emulation_refusal(self, build_dir: Path, manifest: BuildManifest) -> EdgepackError:
        """``validate --on emulator`` of a Vulkan build: a clear error instead of a run that cannot work.

        qemu-user runs the aarch64 C runner and wgpu-native, but the Vulkan driver they need is aarch64
        too: Debian's arm64 lavapipe in a chroot works (runtimes/plugins/vulkan/tests/aarch64_lavapipe.py) but
        needs root, the arm64 packages and several minutes per model: a manual check, not a validation."""
        return EdgepackError(
            f"{build_dir} is a Vulkan build ({manifest.profile_name}); --on emulator cannot run it: qemu-user runs "
            "the device's CPU code, but there is no emulated Vulkan GPU (an aarch64 driver under qemu needs an arm64 "
            "root file system, root, and minutes per model: runtimes/plugins/vulkan/tests/aarch64_lavapipe.py).",
            "Validate the same shaders on this machine with --on host-vulkan (any Vulkan driver, e.g. lavapipe: "
            "`apt-get install mesa-vulkan-drivers`), or on the device itself.",
        )

    def driver_status(self) -> tuple[bool, str, str]:
        return driver_status()


register(VulkanBackend())
