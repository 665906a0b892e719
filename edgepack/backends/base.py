"""The Backend interface: everything that differs between running a model on a CPU, an OpenCL GPU or a
Vulkan GPU, behind one class, and the registry that maps a profile's ``backend`` name to it.

Code outside ``edgepack/backends/`` never compares backend names: it asks the profile's backend
(``backend_for(profile)``) to build, to name its host device, to list the runtime files a bundle needs,
and so on. Adding a backend is one module here that subclasses :class:`Backend` and calls
:func:`register`, plus profile files that name it (``backend = "..."``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from edgepack.backends.program_sizes import ConstantSizes
from edgepack.errors import EdgepackError, ProfileError
from edgepack.frontends.types import ImportedModel
from edgepack.manifest import BuildManifest
from edgepack.profiles import GpuLimits, Profile
from edgepack.progress import Progress
from edgepack.toolchain.compilers import Compilers

#: The pass configuration every backend builds with: no argument checks in the kernels' host functions
#: (``tirx.disable_assert``). Each checked every argument's type, rank, shape, strides and device, with a message
#: (PP-OCR's classifier on a GPU: 0.18 of its 0.21 MB of host code, for 113 kernels; BlazeFace for rpi4: 412 ->
#: 295 KB of library), but only the Relax VM calls them, with tensors it made to the program's shapes; a model's
#: inputs are checked where they enter (the VM's check_tensor_info and match_cast, the C API).
BUILD_CONFIG = {"tirx.disable_assert": True}


@dataclass(frozen=True)
class ScheduledFunction:
    """One fused kernel function of a build and what scheduled it."""

    name: str
    # the rule that scheduled it (e.g. "gpu.Matmul", "cpu.Conv2D"), "tuned" (a tuning record),
    # "pre-scheduled" (TVM's own), "own thread bindings" (a TOPI GPU kernel), or "none"
    schedule: str
    kernels: tuple[str, ...] = ()


@dataclass
class ScheduleReport:
    """What the backend's pipeline did with each fused function of a model (manifest ``extra``)."""

    target: str
    pipeline: str
    rules: tuple[str, ...]
    functions: list[ScheduledFunction] = field(default_factory=list)
    recomputed: dict[str, float] = field(default_factory=dict)  # kernels doing x more arithmetic than their parts

    @property
    def unscheduled(self) -> list[str]:
        """Fused functions no schedule rule took."""
        return [f.name for f in self.functions if f.schedule == "none"]

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for f in self.functions:
            counts[f.schedule] = counts.get(f.schedule, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "pipeline": self.pipeline,
            "rules": list(self.rules),
            "num_functions": len(self.functions),
            "schedules": self.counts(),
            "unscheduled": self.unscheduled,
            "recomputed": {name: round(factor, 2) for name, factor in sorted(self.recomputed.items())},
            "functions": [{"name": f.name, "schedule": f.schedule, "kernels": list(f.kernels)}
                          for f in self.functions],
        }


@dataclass(frozen=True)
class Build:
    """A model compiled for one target: TVM's executable and, where the backend keeps one, its report."""

    executable: Any  # tvm.relax.VMExecutable
    report: ScheduleReport | None = None
    constants: ConstantSizes | None = None  # the program's constant tensors (weights), as built
    run_memory: int | None = None  # bytes a run allocates (planned storage and outputs, at the largest sizes)


@dataclass(frozen=True)
class KernelForm:
    """How a backend forms its kernels from the model before scheduling them. A tuning record matches a
    kernel only when both were formed the same way, so a tuning directory keeps the form it was made
    with (``tuning.json``) and a build with its records uses that form."""

    weight_prepack: bool = False  # kernels may pick their weight layout; weights are rewritten at compile time
    channels_last: bool = False  # convolutions work on NHWC activations
    # 3x3 convolutions of stride 1 as Winograd transforms and matrix products, output tiles of at most this
    # many pixels a side (2: F(2x2, 3x3); 4: F(4x4, 3x3) where it multiplies less); 0: direct convolutions
    winograd: int = 0
    # tiles larger than F(2x2)'s only where each transformed weight serves at least this many output tiles
    # (0: wherever they multiply least)
    winograd_reuse: int = 0
    # the transformed weights add at most this share of the program's constant bytes (0: no limit)
    winograd_budget: float = 0.0
    # channels-last convolutions compute their output channels padded to whole SIMD vectors and crop them
    padded_channels: bool = False
    # a channels-last depthwise convolution and the 1x1 convolution that reads it are one kernel
    fused_depthwise: bool = False
    # a channels-last tensor scaled per channel (squeeze-and-excitation) and the 1x1 convolution that reads
    # it are one kernel
    fused_scale: bool = False
    # constant weights whose values are all float16 are stored as float16 and widened inside the kernel
    half_weights: bool = False


@dataclass(frozen=True)
class TuningRecords:
    """Tuning records to apply in a build: MetaSchedule's database of the best record per kernel, and
    the form of the kernels they were tuned on."""

    database: Any  # tvm.s_tir.meta_schedule.database.Database
    form: KernelForm = KernelForm()
    #: for a build whose sizes change at run time: the size the records were tuned at, as the value of each
    #: symbolic variable of its kernels (``sized_records.py`` applies them across the range)
    sizes: dict[str, int] | None = None


@dataclass(frozen=True)
class TuningLayout:
    """How a new tuning directory of a backend tunes: the kernels' form and how candidates are timed."""

    form: KernelForm = KernelForm()
    cold_weights: bool = False  # candidates timed on this machine with their weights out of the cache


@dataclass(frozen=True)
class DoctorCheck:
    """One line of ``edgepack doctor`` that a backend contributes."""

    name: str
    ok: bool
    found: str
    purpose: str
    hint: str = ""


class Backend(ABC):
    """What one kind of compute (CPU, OpenCL GPU, Vulkan GPU) needs from compile to deployment."""

    #: The profile's ``backend`` value.
    name: ClassVar[str]
    #: For messages: "CPU", "OpenCL", "Vulkan (WGSL on wgpu-native)".
    label: ClassVar[str]
    #: What runs the kernels, in a sentence: "a CPU", "an OpenCL GPU".
    device_noun: ClassVar[str] = "a CPU"
    #: ``--on`` value that runs a build of this backend on this machine ("host", "host-opencl", ...).
    host_place: ClassVar[str]
    #: Whether runs on this machine go to a child process (``run/isolated.py``): a GPU driver may abort the
    #: process that calls it (PoCL asserts, a Vulkan driver faults), which must not end the caller's.
    isolated_runs: ClassVar[bool] = False
    #: Whether ``package c`` makes a single-binary static runner for it.
    static_bundle: ClassVar[bool] = True
    #: Whether MetaSchedule can tune it.
    tunable: ClassVar[bool] = False
    #: Why its kernels cannot read 8-bit tensors, or None when they can. Compiled-in pre-processing
    #: then reads uint8 camera frames as 32-bit words (``edgepack.processing``).
    no_byte_tensors: ClassVar[str | None] = None
    #: Why it cannot compile inputs whose dimensions change at run time (``compile --dim``), or None when it can.
    no_symbolic_shapes: ClassVar[str | None] = "its kernel schedules need static shapes (so far only CPU builds take --dim)"
    #: Why it cannot compute in half precision (``compile --precision fp16``), or None when it can.
    no_half_precision: ClassVar[str | None] = "it computes in fp32 (fp16 is for GPU profiles)"

    # --- compiling -------------------------------------------------------------------------------

    def preflight(self, profile: Profile, *, log: Progress | None = None) -> None:
        """Fail early, before minutes of work, when something this backend needs for ``profile`` is missing."""

    @abstractmethod
    def build(self, imported: ImportedModel, target: Any, *, system_lib: bool = False,
              records: TuningRecords | None = None, limits: GpuLimits | None = None, gpu_only: bool = False) -> Build:
        """Run the backend's Relax pipeline (with ``records`` applied) and generate code for ``target``,
        its kernels within ``limits`` (the profile's GPU limits; None: the backend's defaults). A GPU backend
        runs what its device cannot on the device's CPU, in the same program, unless ``gpu_only``
        (``backends/placement.py``); it then refuses such a model by name."""

    def tir_pipeline(self) -> str:
        """The name of the TIR pipeline its kernels are lowered with, registered with TVM (builds and
        tuning candidates alike)."""
        return "default"

    def host_target(self, profile: Profile) -> Any:
        """The target of the build for this machine (``host/model.so``, used by host validation)."""
        import tvm

        return tvm.target.Target({"kind": "llvm"})

    def host_records(self, records: TuningRecords | None) -> TuningRecords | None:
        """The records that also apply to the host build (none: they were tuned for the device's CPU)."""
        return None

    def packed_modules(self) -> dict[str, Callable[[bytes], bytes]]:
        """The device-module kinds this backend's runtime loads compressed from a library
        (``toolchain/packed_kernels.py``), each with what its bytes lose first."""
        return {}

    def write_artifacts(self, root: Path, build: Build) -> dict[str, str]:
        """Files of the device build besides the model library ({artifact name: path in ``root``})."""
        return {}

    def manifest_extra(self, build: Build) -> dict[str, Any]:
        """What the build's manifest records for this backend (``extra``)."""
        return {}

    def summary_lines(self, manifest: BuildManifest) -> list[str]:
        """Lines for the compile summary of a build of this backend."""
        return []

    def kernels(self, build_dir: Path, manifest: BuildManifest) -> list[Any]:
        """The build's device kernels with their launch sizes (``inspect --kernels``)."""
        raise EdgepackError(
            f"{build_dir} has no GPU kernels: it was compiled for {manifest.profile_name} ({self.label}).",
            "Kernels exist for GPU builds: compile with an OpenCL profile (mali-g610, adreno-6xx) or a Vulkan "
            "profile (vulkan-generic, mali-g610-vulkan).",
        )

    def render_kernels(self, kernels: list[Any], *, with_source: bool = True) -> str:
        return ""

    # --- running ---------------------------------------------------------------------------------

    def ready_here(self, *, log: Progress | None = None) -> None:
        """Build (not load) what running a build on this machine needs, before a child process runs it
        (``isolated_runs``)."""

    def driver_loaded(self) -> bool:
        """Whether this process has loaded this backend's device driver (a fork would not copy its threads)."""
        return False

    def check_runs_here(self, build_dir: Path, manifest: BuildManifest) -> None:
        """Raise an EdgepackError where this machine's device (found by ``host_device``) cannot run the build."""

    @abstractmethod
    def host_device(self, *, log: Progress | None = None) -> Any:
        """The TVM device of this machine that runs ``host/model.so`` (loading runtime plug-ins first)."""

    @abstractmethod
    def remote_device(self, session: Any) -> Any:
        """The device of a TVM RPC session (a board or phone) that runs the build's kernels."""

    def run_error(self, exc: Exception, build_dir: Path, where: str) -> EdgepackError:
        """A run of a build through TVM on ``where`` raised ``exc``: the error to show."""
        return EdgepackError(f"Running {build_dir} on {where} failed: {str(exc).strip()}",
                             "Check that the build was made for this device (`edgepack inspect`).")

    def emulation_refusal(self, build_dir: Path, manifest: BuildManifest) -> EdgepackError | None:
        """Why ``validate --on emulator`` cannot run this backend's builds, or None when it can."""
        return None

    # --- shipping --------------------------------------------------------------------------------

    def runtime_files(self, triple: str, compilers: Compilers, *, static: bool = True,
                      log: Progress | None = None) -> dict[str, Path]:
        """Runtime files beyond TVM's own that a C bundle for ``triple`` carries ({``lib/...``: file})."""
        return {}

    def rpc_server_files(self, triple: str, compilers: Compilers, *, log: Progress | None = None) -> dict[str, Path]:
        """Plug-ins the RPC server loads from its own directory ({file name: file})."""
        return {}

    def android_files(self, triple: str, cc: str, cxx: str, *, log: Progress | None = None) -> list[Path]:
        """Libraries an AAR carries in each ABI's directory beyond TVM's runtime and the model."""
        return []

    # --- tuning ----------------------------------------------------------------------------------

    def tuning_layout(self) -> TuningLayout:
        return TuningLayout()

    def tuning_target(self, profile: Profile, *, num_cores: int | None, here: bool) -> Any:
        """The target tuning tasks are extracted and measured for (``here``: measured on this machine)."""
        raise self.not_tunable(profile)

    def tuning_place(self, profile: Profile) -> str | None:
        """The ``--on`` value that measures this backend's kernels on this machine, if any."""
        return None

    def tuning_passes(self, target: Any, form: KernelForm, limits: GpuLimits | None = None) -> list[Any]:
        """Relax passes up to the fused, unscheduled TIR kernels that tuning tasks are made of."""
        raise EdgepackError(f"{self.label} builds cannot be tuned.")

    def default_schedule(self, mod: Any, target: Any) -> tuple[str, Any] | None:
        """What an untuned build runs for a tuning task's kernel (``mod["main"]``): (the rule's name, the
        ``tvm.s_tir.Schedule``), measured first so that a tuned build never runs a slower kernel. None
        when the backend has no default schedules of its own."""
        return None

    def search_spaces(self, target: Any) -> list[tuple[str, Any]]:
        """MetaSchedule search spaces to try, in order, per tuning task: [(label, space generator)]."""
        return [("default", "post-order-apply")]

    def not_tunable(self, profile: Profile) -> EdgepackError:
        return EdgepackError(
            f"Tuning {self.label} profiles ({profile.name}) is not supported yet.",
            "Tune a CPU profile (host, rpi3, rpi4, rpi5, android-arm64) or an OpenCL one (mali-g610, adreno-6xx).",
        )

    # --- doctor ----------------------------------------------------------------------------------

    def doctor_check(self) -> DoctorCheck | None:
        """What ``edgepack doctor`` reports for this backend on this machine."""
        return None


def target_dict(target: Any) -> dict[str, Any]:
    """A TVM target as plain JSON values (what manifests and tuning directories record)."""
    return _jsonable(target.export())


def _jsonable(value: Any) -> Any:
    """TVM containers (Array, Map, nested Target) as plain JSON values."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "export"):
        return _jsonable(value.export())
    if hasattr(value, "items"):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if hasattr(value, "__iter__"):
        return [_jsonable(v) for v in value]
    return str(value)


def describe_device(device: Any) -> str:
    """``opencl(0)``, ``cpu(0)``, ``webgpu(0)``... for reports: what really ran the kernels."""
    import tvm

    kind = int(device.dlpack_device_type()) % 128  # an RPC session's devices carry it in the upper bits
    name = tvm.runtime.Device._DEVICE_TYPE_TO_NAME.get(kind, str(kind))
    return f"{name}({device.index})"


_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Make ``backend`` the one profiles name with ``backend = "<backend.name>"``."""
    _REGISTRY[backend.name] = backend
    return backend


def get_backend(name: str) -> Backend:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ProfileError(f"No backend called {name!r}.",
                           f"Known backends: {', '.join(sorted(_REGISTRY))}; fix the profile's `backend`.") from None


def backends() -> Mapping[str, Backend]:
    return dict(_REGISTRY)


def backend_for(what: Profile | BuildManifest) -> Backend:
    """The backend of a profile, or of the profile a build was made for."""
    name = what.backend if isinstance(what, Profile) else what.profile.get("backend", "cpu")
    return get_backend(name)
