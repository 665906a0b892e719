"""Where a build runs: the one parser for ``--on`` and the places it names.

    host               this machine, on the device the build's backend runs on (CPU, or its GPU)
    host-opencl, ...   this machine's GPU of one backend (each backend names its own: ``Backend.host_place``)
    emulator           the device library, run by the C runner under qemu-user
    NAME               a device of the inventory, over SSH (``edgepack device add``)
    farm:PROFILE       the first free device of a profile in the farm (``edgepack farm start``)

``validate``, ``bench`` and ``tune`` all read ``--on`` through :func:`parse_place`; each says which kinds
it accepts.
"""

from __future__ import annotations

import platform
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgepack.backends import Backend, backend_for, backends, describe_device
from edgepack.devices.inventory import Device, Inventory, load_inventory
from edgepack.devices.session import DEFAULT_RECONNECT_WINDOW, DEFAULT_SESSION_TIMEOUT
from edgepack.dims import dims_from_dict, largest
from edgepack.errors import EdgepackError
from edgepack.manifest import BuildManifest, read_manifest
from edgepack.progress import Progress
from edgepack.run.emulator import run_on_emulator
from edgepack.run.host import load_host_library, run_host_library
from edgepack.run.isolated import run_isolated
from edgepack.run.remote import bench_on_device, bench_on_farm, run_on_device, run_on_farm
from edgepack.run.results import BenchResult, RunOutputs
from edgepack.run.threads import use_threads_here
from edgepack.tensors import contiguous, random_inputs

EMULATOR = "emulator"
FARM_PREFIX = "farm:"


@dataclass(frozen=True)
class Place(ABC):
    """A place named by ``--on``."""

    on: str  # as written

    @abstractmethod
    def run(self, build_dir: Path, manifest: BuildManifest, inputs: dict[str, np.ndarray], *,
            threads: int | None = None, progress: Progress | None = None) -> RunOutputs:
        """Run the build once on ``inputs``: its outputs (manifest order), what ran them and, where the running
        side reports them, their names (``validate`` checks count and names before comparing).
        ``threads``: CPU threads for parallel kernels (None: ``$TVM_NUM_THREADS``, else every core)."""

    def bench(self, build_dir: Path, *, repeat: int = 50, number: int = 1, warmup: int = 1, all_devices: bool = False,
              threads: int | None = None,
              session_timeout: float = DEFAULT_SESSION_TIMEOUT, reconnect_window: float = DEFAULT_RECONNECT_WINDOW,
              progress: Progress | None = None) -> list[BenchResult | EdgepackError]:
        """Time the build here: one result per device (``all_devices``: each device of a farm)."""
        raise EdgepackError(f"edgepack cannot benchmark on {self.on!r}: timings under emulation mean nothing.",
                            "Benchmark with --on host, --on NAME (a device) or --on farm:PROFILE.")


@dataclass(frozen=True)
class ThisMachine(Place):
    """This machine; ``backend`` None: the build's own backend ("host"), else that backend's device only."""

    backend: Backend | None = None

    def _backend(self, build_dir: Path, manifest: BuildManifest) -> Backend:
        built = backend_for(manifest)
        if self.backend is not None and self.backend is not built:
            raise EdgepackError(
                f"{build_dir} was compiled for {manifest.profile_name} ({built.name}), not for "
                f"{self.backend.device_noun}: --on {self.on} runs {self.backend.label} builds.",
                f"Use --on {built.host_place} (or --on host), or compile for a {self.backend.label} profile.",
            )
        return built

    def run(self, build_dir: Path, manifest: BuildManifest, inputs: dict[str, np.ndarray], *,
            threads: int | None = None, progress: Progress | None = None) -> RunOutputs:
        backend = self._backend(build_dir, manifest)
        if backend.isolated_runs:  # a driver's abort must not end this process (``run/isolated.py``)
            backend.ready_here(log=progress)  # built here, with its progress; loaded in the child
            return run_isolated(_run_here, build_dir, manifest, inputs, threads, what="running", build_dir=build_dir,
                                label=backend.label, fork=_no_driver_here(), traced=True)
        return _run_here(build_dir, manifest, inputs, threads, progress)

    def bench(self, build_dir: Path, *, repeat: int = 50, number: int = 1, warmup: int = 1, all_devices: bool = False,
              threads: int | None = None,
              session_timeout: float = DEFAULT_SESSION_TIMEOUT, reconnect_window: float = DEFAULT_RECONNECT_WINDOW,
              progress: Progress | None = None) -> list[BenchResult | EdgepackError]:
        """Time ``host/model.so`` here with TVM's ``time_evaluator``."""
        manifest = read_manifest(build_dir)
        backend = self._backend(build_dir, manifest)
        if backend.isolated_runs:  # a driver's abort must not end this process (``run/isolated.py``)
            backend.ready_here(log=progress)  # built here, with its progress; loaded in the child
            if progress:
                progress(f"Timing {build_dir.name} on this machine: {repeat} x {number} run{'s' * (number != 1)}")
            return run_isolated(_bench_here, build_dir, repeat, number, warmup, threads, what="timing",
                                build_dir=build_dir, label=backend.label, fork=_no_driver_here())
        return _bench_here(build_dir, repeat, number, warmup, threads, progress)


def _no_driver_here() -> bool:
    """Whether no GPU driver is loaded in this process: a child forked from it then starts clean (no driver
    threads that a fork would not copy), and fast (everything imported already)."""
    return not any(b.driver_loaded() for b in backends().values())


def _run_here(build_dir: Path, manifest: BuildManifest, inputs: dict[str, np.ndarray], threads: int | None,
              progress: Progress | None = None, trace: str | None = None) -> RunOutputs:
    """``ThisMachine.run`` in this process (a child's, for a backend with ``isolated_runs``, which names each
    kernel in the file ``trace`` as it calls it)."""
    backend = backend_for(manifest)
    device = backend.host_device(log=progress)
    backend.check_runs_here(build_dir, manifest)
    use_threads_here(threads)
    try:
        return RunOutputs(run_host_library(build_dir, manifest, inputs, device, trace=trace),
                          f"this machine: {describe_device(device)}")
    except EdgepackError:
        raise
    except Exception as exc:  # TVM raises RuntimeError/ValueError/... with the runtime's message
        raise backend.run_error(exc, build_dir, "this machine") from exc


def _bench_here(build_dir: Path, repeat: int, number: int, warmup: int, threads: int | None,
                progress: Progress | None = None) -> list[BenchResult | EdgepackError]:
    """``ThisMachine.bench`` in this process (a child's, for a backend with ``isolated_runs``)."""
    import tvm

    manifest = read_manifest(build_dir)
    backend = backend_for(manifest)
    device = backend.host_device(log=progress)
    backend.check_runs_here(build_dir, manifest)
    count = use_threads_here(threads)
    started = time.monotonic()
    vm = load_host_library(build_dir / manifest.artifacts["host_library"].path, device)
    feeds = random_inputs(largest(manifest.inputs, dims_from_dict(manifest.dims)))  # a --dim at its largest
    args = [tvm.runtime.tensor(contiguous(feeds[s.name]), device=device) for s in manifest.inputs]
    if progress:
        progress(f"Timing {build_dir.name} on this machine: {repeat} x {number} run{'s' * (number != 1)}")
    for _ in range(warmup):
        vm["main"](*args)
    device.sync()
    vm.set_input("main", *args)
    result = vm.time_evaluator("invoke_stateful", device, number=number, repeat=repeat)("main")
    samples = tuple(float(s) * 1000.0 for s in result.results)
    return [BenchResult(str(build_dir), "this machine", manifest.profile_name, platform.node(), repeat, number,
                        warmup, samples, time.monotonic() - started, via="local",
                        ran_on=describe_device(device), threads=count)]


@dataclass(frozen=True)
class Emulator(Place):
    """The device library under qemu-user (the C runner; no Python involved)."""

    def run(self, build_dir: Path, manifest: BuildManifest, inputs: dict[str, np.ndarray], *,
            threads: int | None = None, progress: Progress | None = None) -> RunOutputs:
        return run_on_emulator(build_dir, manifest, inputs, threads=threads)


@dataclass(frozen=True)
class OnDevice(Place):
    device: Device
    inventory: Inventory

    def run(self, build_dir: Path, manifest: BuildManifest, inputs: dict[str, np.ndarray], *,
            threads: int | None = None, progress: Progress | None = None) -> RunOutputs:
        return RunOutputs(*run_on_device(build_dir, manifest, inputs, self.device, threads=threads, progress=progress))

    def bench(self, build_dir: Path, *, repeat: int = 50, number: int = 1, warmup: int = 1, all_devices: bool = False,
              threads: int | None = None,
              session_timeout: float = DEFAULT_SESSION_TIMEOUT, reconnect_window: float = DEFAULT_RECONNECT_WINDOW,
              progress: Progress | None = None) -> list[BenchResult | EdgepackError]:
        return [bench_on_device(build_dir, self.device, repeat, number, warmup, threads=threads,
                                session_timeout=session_timeout, reconnect_window=reconnect_window,
                                progress=progress)]


@dataclass(frozen=True)
class OnFarm(Place):
    profile: str
    inventory: Inventory

    def run(self, build_dir: Path, manifest: BuildManifest, inputs: dict[str, np.ndarray], *,
            threads: int | None = None, progress: Progress | None = None) -> RunOutputs:
        return RunOutputs(*run_on_farm(build_dir, manifest, inputs, self.profile, self.inventory, threads=threads,
                                       progress=progress))

    def bench(self, build_dir: Path, *, repeat: int = 50, number: int = 1, warmup: int = 1, all_devices: bool = False,
              threads: int | None = None,
              session_timeout: float = DEFAULT_SESSION_TIMEOUT, reconnect_window: float = DEFAULT_RECONNECT_WINDOW,
              progress: Progress | None = None) -> list[BenchResult | EdgepackError]:
        return bench_on_farm(build_dir, self.profile, self.inventory, repeat=repeat, number=number, warmup=warmup,
                             all_devices=all_devices, threads=threads, session_timeout=session_timeout,
                             reconnect_window=reconnect_window, progress=progress)


def host_places() -> dict[str, Backend | None]:
    """``--on`` values for this machine: ``host`` (the build's own backend) and each backend's own."""
    places: dict[str, Backend | None] = {"host": None}
    for backend in backends().values():
        if backend.host_place != "host":
            places[backend.host_place] = backend
    return places


def parse_place(on: str, inventory: Inventory | Path | str | None = None) -> Place:
    """The place ``on`` names (see the module docstring), or a clear error listing what exists.

    ``inventory`` (an Inventory or its path) defaults to ``$EDGEPACK_INVENTORY``, else
    ``~/.config/edgepack/devices.toml``; it is only read for device and farm names.
    """
    here = host_places()
    if on in here:
        return ThisMachine(on, here[on])
    if on == EMULATOR:
        return Emulator(on)
    devices = inventory if isinstance(inventory, Inventory) else load_inventory(Path(inventory) if inventory else None)
    if on.startswith(FARM_PREFIX):
        devices.resolve(on)  # an empty farm is a clear error now
        return OnFarm(on, on.removeprefix(FARM_PREFIX), devices)
    if on in devices.devices:
        return OnDevice(on, devices.get(on), devices)
    known = ", ".join(sorted(devices.devices)) or f"none in {devices.path}"
    raise EdgepackError(
        f"Unknown place to run on: {on!r}.",
        f"Use --on {', --on '.join(here)} (this machine), --on emulator (qemu-user), a device name (known: {known}) "
        "or farm:PROFILE; add devices with `edgepack device add`.",
    )
