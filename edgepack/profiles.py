"""Device profiles: what a kind of device is, as data.

A profile is a TOML file (``device_profiles/*.toml``) that names the TVM target, the target triple,
the cross compiler, how to run the device's binaries under emulation and the RPC key; a GPU profile also
states its GPU's limits (``[limits]``, :class:`GpuLimits`; docs/architecture.md, "GPU limits"). Adding a device
means adding a file: edgepack reads every ``*.toml`` in the search path below.

Search path, first match wins: ``$EDGEPACK_PROFILES_DIR`` (``:``-separated), the user's
``~/.config/edgepack/profiles/``, then the profiles shipped with edgepack.
"""

from __future__ import annotations

import functools
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from edgepack.errors import ProfileError
from edgepack.paths import config_root

Status = Literal["supported", "planned"]


@dataclass(frozen=True)
class Toolchain:
    """The compilers that build code for a profile's triple."""

    cc: str
    cxx: str
    apt_package: str | None = None
    sysroot: str | None = None
    ndk: bool = False  # the compilers come from a user-supplied Android NDK


@dataclass(frozen=True)
class Emulator:
    """How this machine runs the profile's binaries (qemu-user), as an argv prefix."""

    command: tuple[str, ...]
    apt_package: str | None = None


#: A profile's ``[limits]`` keys, what each limits, and the TVM target attribute it also sets (schedules
#: size thread blocks and shared-memory tiles to the target's values).
LIMIT_KEYS = {
    "storage_buffers": ("storage buffers one kernel binds (per shader stage)", None),
    "workgroup_memory": ("bytes of workgroup (OpenCL local, WGSL workgroup) memory one kernel allocates",
                         "max_shared_memory_per_block"),
    "invocations": ("invocations (threads) per workgroup", "max_num_threads"),
    "buffer_size": ("bytes of one buffer a kernel binds", None),
}


@dataclass(frozen=True)
class GpuLimits:
    """A GPU's hardware limits (a profile's ``[limits]`` table); None where the profile states none."""

    storage_buffers: int | None = None
    workgroup_memory: int | None = None
    invocations: int | None = None
    buffer_size: int | None = None
    #: whether the GPU computes in 64-bit floats (OpenCL's cl_khr_fp64, which Mali and Adreno lack; WGSL has
    #: none): where not, a build runs its float64 operators on the device's CPU (``backends/placement.py``)
    fp64: bool | None = None

    def to_dict(self) -> dict[str, int | bool]:
        return {k: getattr(self, k) for k in (*LIMIT_KEYS, "fp64") if getattr(self, k) is not None}


def parse_limits(data: dict[str, Any] | None, where: str = "") -> GpuLimits | None:
    """The ``[limits]`` table of a profile: positive integers, only the keys of ``LIMIT_KEYS``."""
    if data is None:
        return None
    unknown = sorted(set(data) - set(LIMIT_KEYS) - {"fp64"})
    bad = sorted(k for k, v in data.items() if k in LIMIT_KEYS and (isinstance(v, bool) or not isinstance(v, int) or v <= 0))
    if unknown or bad or ("fp64" in data and not isinstance(data["fp64"], bool)):
        raise ProfileError(
            f"The [limits] table{where} has " + (f"unknown keys {', '.join(unknown)}" if unknown else
                                                f"values that are not positive integers: {', '.join(bad)}" if bad
                                                else f"fp64 = {data['fp64']!r}, not true or false") + ".",
            "[limits] takes " + ", ".join(f"{k} ({what})" for k, (what, _) in LIMIT_KEYS.items())
            + " as positive integers, and fp64 (true or false: whether the GPU computes in 64-bit floats).")
    return GpuLimits(**data)


def _target_within(target: dict[str, Any], limits: GpuLimits | None, where: str) -> dict[str, Any]:
    """``target`` with the limits' thread and shared-memory values as TVM target attributes: set where the
    target does not state them, refused where it states more than the limit."""
    if limits is None:
        return target
    target = dict(target)
    for key, (_what, attr) in LIMIT_KEYS.items():
        value = getattr(limits, key)
        if attr is None or value is None:
            continue
        if attr not in target:
            target[attr] = value
        elif int(target[attr]) > value:
            raise ProfileError(f"The profile{where} sets [target] {attr} = {target[attr]}, more than its "
                               f"[limits] {key} = {value}.",
                               f"Lower {attr} to at most {value} (or leave it out: it follows [limits]).")
    return target


#: The precisions a build computes in (``compile --precision``): "fp32" everywhere; "fp16" where the
#: backend takes it (GPUs: half-precision storage and arithmetic, products accumulated as the profile says).
PRECISIONS = ("fp32", "fp16")
_FLOAT_TYPES = {"fp32": "float32", "fp16": "float16"}


@dataclass(frozen=True)
class Precision:
    """A profile's ``[precision]`` table: what a build computes in without ``--precision``, and what
    convolutions' and matrix products' sums accumulate in when it computes in fp16."""

    default: str = "fp32"
    accumulate: str = "fp32"

    @property
    def accumulate_dtype(self) -> str:
        return _FLOAT_TYPES[self.accumulate]

    def to_dict(self) -> dict[str, str]:
        return {"default": self.default, "accumulate": self.accumulate}


def parse_precision(data: dict[str, Any] | None, where: str = "") -> Precision:
    """The ``[precision]`` table of a profile: ``default`` and ``accumulate``, each one of ``PRECISIONS``."""
    data = dict(data or {})
    unknown = sorted(set(data) - {"default", "accumulate"})
    bad = sorted(k for k, v in data.items() if k not in unknown and v not in PRECISIONS)
    if unknown or bad:
        raise ProfileError(
            f"The [precision] table{where} has " + (f"unknown keys {', '.join(unknown)}" if unknown else
                                                     "values that are no precision: " + ", ".join(
                                                         f"{k} = {data[k]!r}" for k in bad)) + ".",
            f"[precision] takes default and accumulate, each one of {', '.join(PRECISIONS)}.")
    return Precision(**data)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    status: Status
    backend: str  # the name of a registered backend (edgepack.backends; a profile file picks one)
    triple: str
    rpc_key: str
    target: dict[str, Any]
    toolchain: Toolchain
    host_target: dict[str, Any] | None = None
    emulator: Emulator | None = None
    status_note: str = ""
    limits: GpuLimits | None = None  # a GPU's hardware limits ([limits]); None for CPUs
    precision: Precision = Precision()  # [precision]: the default of compile --precision, fp16's accumulator
    source: Path | None = field(default=None, compare=False)

    @property
    def is_host(self) -> bool:
        """True when binaries for this profile run natively on this machine."""
        return self.emulator is None and not self.toolchain.ndk and self.triple.startswith("x86_64")

    @property
    def target_spec(self) -> dict[str, Any]:
        """The target as TVM takes it, ``mcpu = "native"`` replaced by this machine's CPU (LLVM's name)."""
        spec = dict(self.target)
        if spec.get("mcpu") == NATIVE_CPU:
            spec["mcpu"] = host_cpu()
        return spec

    def tvm_target(self):  # -> tvm.target.Target (imported lazily: TVM takes a second to load)
        import tvm

        host = self.host_target
        return tvm.target.Target(self.target_spec, host=host) if host else tvm.target.Target(self.target_spec)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "status": self.status,
            "status_note": self.status_note,
            "backend": self.backend,
            "triple": self.triple,
            "rpc_key": self.rpc_key,
            "target": self.target,
            "host_target": self.host_target,
            "toolchain": {
                "cc": self.toolchain.cc,
                "cxx": self.toolchain.cxx,
                "apt_package": self.toolchain.apt_package,
                "sysroot": self.toolchain.sysroot,
                "ndk": self.toolchain.ndk,
            },
            "emulator": ({"command": list(self.emulator.command), "apt_package": self.emulator.apt_package}
                         if self.emulator else None),
            "limits": self.limits.to_dict() if self.limits is not None else None,
            "precision": self.precision.to_dict(),
        }


#: A profile's ``mcpu`` for "the CPU of the machine that compiles": a CPU target without ``mcpu`` gets
#: SSE2 code only from LLVM, a quarter of an AVX-512 core's vector width.
NATIVE_CPU = "native"


@functools.cache
def host_cpu() -> str:
    """This machine's CPU as LLVM names it (``znver4``, ``skylake-avx512``, ``cortex-a72``)."""
    from tvm.target import codegen

    return str(codegen.llvm_get_system_cpu())


def host_cpu_target() -> dict[str, Any]:
    """An LLVM target for this machine's CPU, all its SIMD included."""
    return {"kind": "llvm", "mcpu": host_cpu()}


#: LLVM options that every 32-bit ARM LLVM target needs with the LLVM inside apache-tvm 0.27 (LLVM 22):
#: its ARM load/store optimizer can move a base register that later stores still use when it merges
#: them into STM (the defect of LLVM issue #223630), which made rpi3 builds compute wrong outputs.
ARM32_LLVM_OPTIONS = ("-arm-load-store-opt=false",)


def with_llvm_workarounds(target: dict[str, Any] | None) -> dict[str, Any] | None:
    """``target`` as the pinned LLVM must see it, as a new dict (docs/armv7.md). 32-bit ARM only:

    * ``arch-linux-env`` triples get their vendor field (``arch-unknown-linux-env``): LLVM does not
      normalise triples, reads ``linux`` as the vendor and ``gnueabihf`` as the OS, and without the
      EABI environment calls libgcc's soft-float helpers with the hard-float convention;
    * ``ARM32_LLVM_OPTIONS`` are added unless the target names those options itself.

    The shipped rpi3 profile is written that way already; this covers users' profiles and the
    profiles recorded in the manifests of older builds."""
    if target is None or not target.get("mtriple"):  # only LLVM targets name a triple
        return target
    parts = str(target["mtriple"]).split("-")
    if not parts[0].lower().startswith(("arm", "thumb")) or parts[0].lower().startswith("arm64"):
        return target
    fixed = dict(target)
    if len(parts) == 3 and parts[1] == "linux":
        fixed["mtriple"] = "-".join([parts[0], "unknown", *parts[1:]])
    options = list(fixed.get("cl-opt", []))
    for option in ARM32_LLVM_OPTIONS:
        name = option.split("=")[0]
        if not any(str(o).split("=")[0].split(":")[0] == name for o in options):
            options.append(option)
    fixed["cl-opt"] = options
    return fixed


def shipped_profiles_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "device_profiles", here.parent / "device_profiles"):
        if candidate.is_dir():
            return candidate
    return here.parent / "device_profiles"


def profile_dirs() -> list[Path]:
    dirs = [Path(p).expanduser() for p in os.environ.get("EDGEPACK_PROFILES_DIR", "").split(":") if p]
    dirs.append(config_root() / "profiles")
    dirs.append(shipped_profiles_dir())
    return dirs


def parse_profile(data: dict[str, Any], source: Path | None = None) -> Profile:
    """Build a :class:`Profile` from the TOML data of one profile file."""
    where = f" in {source}" if source else ""
    try:
        toolchain = Toolchain(**data["toolchain"])
        emulator_data = data.get("emulator")
        emulator = (
            Emulator(tuple(emulator_data["command"]), emulator_data.get("apt_package"))
            if emulator_data
            else None
        )
        limits = parse_limits(data.get("limits"), where)
        profile = Profile(
            name=data["name"],
            description=data.get("description", ""),
            status=data.get("status", "supported"),
            status_note=data.get("status_note", ""),
            backend=data.get("backend", "cpu"),
            triple=data["triple"],
            rpc_key=data.get("rpc_key", data["name"]),
            target=with_llvm_workarounds(_target_within(dict(data["target"]), limits, where)),
            host_target=with_llvm_workarounds(dict(data["host_target"])) if "host_target" in data else None,
            toolchain=toolchain,
            emulator=emulator,
            limits=limits,
            precision=parse_precision(data.get("precision"), where),
            source=source,
        )
    except (KeyError, TypeError) as exc:
        raise ProfileError(
            f"The device profile{where} is malformed ({type(exc).__name__}: {exc}).",
            "A profile needs name, triple, [target] (a TVM target dict) and [toolchain] with cc and cxx;"
            " compare with the shipped device_profiles/rpi4.toml.",
        ) from exc
    if profile.status not in ("supported", "planned"):
        raise ProfileError(
            f"The device profile{where} has status {profile.status!r}.",
            "Use status = \"supported\" or \"planned\".",
        )
    return profile


def profile_from_dict(data: dict[str, Any]) -> Profile:
    """The inverse of ``Profile.to_dict``: a build records its profile whole, so a later edit of
    the profile's TOML cannot change what an existing build is packaged or validated for."""
    shaped = {k: v for k, v in data.items() if v is not None}
    if isinstance(shaped.get("emulator"), list):  # manifests of edgepack 0.1.0 dev builds
        shaped["emulator"] = {"command": shaped["emulator"]}
    shaped["toolchain"] = {k: v for k, v in data["toolchain"].items() if v is not None}
    return parse_profile(shaped)


def load_profile_file(path: Path) -> Profile:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ProfileError(f"Cannot read device profile {path}: {exc}.", "Fix the TOML syntax.") from exc
    return parse_profile(data, source=path)


def list_profiles() -> list[Profile]:
    """Every profile on the search path, by name; earlier directories override later ones."""
    found: dict[str, Profile] = {}
    for directory in reversed(profile_dirs()):
        if directory.is_dir():
            for path in sorted(directory.glob("*.toml")):
                profile = load_profile_file(path)
                found[profile.name] = profile
    return sorted(found.values(), key=lambda p: (p.name != "host", p.name))


def get_profile(name: str) -> Profile:
    """The profile called ``name``, or a path to a profile TOML file."""
    if name.endswith(".toml") and Path(name).is_file():
        return load_profile_file(Path(name))
    profiles = {p.name: p for p in list_profiles()}
    if name not in profiles:
        raise ProfileError(
            f"Unknown device profile {name!r}.",
            f"Known profiles: {', '.join(sorted(profiles))} (see `edgepack profiles`);"
            " or add your own TOML file to ~/.config/edgepack/profiles/.",
        )
    return profiles[name]


def require_supported(profile: Profile) -> None:
    """Refuse, clearly, to compile for a profile whose backend edgepack cannot build yet."""
    if profile.status != "supported":
        note = f" ({profile.status_note})" if profile.status_note else ""
        raise ProfileError(
            f"Profile {profile.name!r} ({profile.backend}) is not supported yet{note}.",
            "Pick a supported profile from `edgepack profiles`, e.g. rpi4 or rpi3.",
        )
