"""Running and timing a build on a real device over RPC (through an SSH tunnel), or on a device of a farm
(handed out by the farm's tracker, or the first that answers). The model runs on the device the build's
backend names in the RPC session: its CPU, or its OpenCL / Vulkan GPU through the plug-in installed
next to the RPC server."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from edgepack.backends import backend_for, describe_device
from edgepack.devices.deploy import say
from edgepack.devices.errors import BuildMismatchError, DeviceUnreachableError
from edgepack.devices.farm import FarmError, on_tracker_device, read_state
from edgepack.devices.inventory import Device, Inventory, device_profile
from edgepack.devices.session import (
    DEFAULT_ATTEMPTS,
    DEFAULT_RECONNECT_WINDOW,
    DEFAULT_SESSION_TIMEOUT,
    run_with_retries,
)
from edgepack.dims import dims_from_dict, largest
from edgepack.errors import EdgepackError
from edgepack.files import file_sha256
from edgepack.manifest import BuildManifest, read_manifest
from edgepack.profiles import Profile
from edgepack.progress import Progress
from edgepack.run.host import flatten_outputs
from edgepack.run.results import BenchResult
from edgepack.run.threads import use_threads_remote
from edgepack.tensors import contiguous, random_inputs
from edgepack.text import short
from edgepack.toolchain.packed_kernels import PROGRAM_KIND, SUFFIX

T = TypeVar("T")


def _device_library(build_dir: Path, manifest) -> Path:
    artifact = manifest.artifacts.get("device_library")
    if artifact is None:
        raise BuildMismatchError(f"{build_dir} has no device library (device/model.so).",
                                 "Compile again with `edgepack compile MODEL --profile PROFILE`.")
    path = Path(build_dir) / artifact.path
    if not path.is_file():
        raise BuildMismatchError(f"{path} is missing from the build directory.",
                                 "Compile again (`edgepack compile ... --force`).")
    return path


def check_build_matches(manifest, device: Device, profile: Any) -> None:
    """Refuse a build made for another triple than the device's profile."""
    built_for = manifest.profile.get("triple")
    if built_for and built_for != profile.triple:
        raise BuildMismatchError(
            f"The build is for {manifest.profile_name} ({built_for}), but {device.name} is a {profile.name} "
            f"device ({profile.triple}).",
            f"Compile the model with `--profile {device.profile}`, or pick a device of profile "
            f"{manifest.profile_name}.",
        )


def _load_remote(remote: Any, library: Path, manifest: BuildManifest):
    """Upload the model library into the RPC session's work directory, load it, and open a Relax VM on the
    device the build's backend runs on in that session (the CPU, or the GPU through its plug-in)."""
    from tvm import relax

    name = f"model-{file_sha256(library)[:12]}.so"
    remote.upload(bytearray(library.read_bytes()), name)
    try:
        lib = remote.load_module(name)
    except Exception as exc:
        if PROGRAM_KIND + SUFFIX not in str(exc):
            raise
        raise EdgepackError(
            f"The device's RPC server cannot load {library.name}: its program is stored compressed (its weights "
            "are mostly zeros), which edgepack's RPC server decodes and TVM's Python RPC server does not.",
            "Use edgepack's RPC server on the device (rpc_server = \"edgepack\" in its entry, then `edgepack "
            "device check NAME`), or compile with EDGEPACK_PLAIN_KERNELS=1 to store the program plain.",
        ) from exc
    dev = backend_for(manifest).remote_device(remote)
    if not dev.exist:
        raise EdgepackError(
            f"The device has no {describe_device(dev)} in its RPC session: the runtime plug-in for "
            f"{manifest.profile_name} did not load next to the RPC server, or the device has no driver for it.",
            "Check the device with `edgepack device check NAME` (it reinstalls the plug-in), and that its "
            "driver works there (e.g. `clinfo -l` for OpenCL).",
        )
    return relax.VirtualMachine(lib, dev), dev


def model_runner(build_dir: Path, manifest: BuildManifest, inputs: dict[str, np.ndarray], *,
                 label: str = "the device", threads: int | None = None,
                 progress: Progress | None = None) -> Callable[[Any], tuple[list[np.ndarray], str]]:
    """The operation that runs a build once in an RPC session: its outputs (manifest order) and the device
    that ran them."""
    import tvm

    library = _device_library(Path(build_dir), manifest)

    def op(remote: Any) -> tuple[list[np.ndarray], str]:
        say(progress, f"Running {Path(build_dir).name} on {label}")
        use_threads_remote(remote, threads)
        vm, dev = _load_remote(remote, library, manifest)
        args = [tvm.runtime.tensor(contiguous(inputs[spec.name]), dev) for spec in manifest.inputs]
        # the stateful interface, not vm["main"](*args): a tuple result comes back from a remote VM as an
        # opaque reference, while get_outputs walks it on the device (get_output_arity / get_output)
        vm.set_input("main", *args)
        vm.invoke_stateful("main")
        outputs = [np.array(o, copy=True) for o in flatten_outputs(vm.get_outputs("main"))]
        where = describe_device(dev)
        del vm, args
        return outputs, where

    return op


def model_timer(build_dir: Path, manifest: BuildManifest, *, repeat: int, number: int, warmup: int,
                label: str = "the device", threads: int | None = None,
                progress: Progress | None = None) -> Callable[[Any], tuple[list[float], str]]:
    """The operation that times ``main`` of a build in an RPC session: ``repeat`` samples in ms, and the
    device that ran them."""
    import tvm

    if repeat < 1 or number < 1 or warmup < 0:
        raise EdgepackError("--repeat and --number must be at least 1, and --warmup at least 0.")
    library = _device_library(Path(build_dir), manifest)
    feeds = random_inputs(largest(manifest.inputs, dims_from_dict(manifest.dims)))  # a --dim at its largest

    def op(remote: Any) -> tuple[list[float], str]:
        say(progress, f"Loading {Path(build_dir).name} on {label}")
        use_threads_remote(remote, threads)
        vm, dev = _load_remote(remote, library, manifest)
        args = [tvm.runtime.tensor(feeds[spec.name], dev) for spec in manifest.inputs]
        if warmup:
            say(progress, f"Warming up on {label} ({warmup} run{'s' * (warmup != 1)})")
            for _ in range(warmup):
                vm["main"](*args)
            dev.sync()
        say(progress, f"Timing on {label}: {repeat} x {number} run{'s' * (number != 1)}")
        vm.set_input("main", *args)
        timer = vm.time_evaluator("invoke_stateful", dev, number=number, repeat=repeat)
        result = timer("main")
        samples = [float(s) * 1000.0 for s in result.results]
        where = describe_device(dev)
        del vm, args, timer, result
        return samples, where

    return op


def run_on_device(build_dir: Path, manifest: BuildManifest, inputs: dict[str, np.ndarray], device: Device, *,
                  threads: int | None = None, known_hosts: Path | None = None, attempts: int = DEFAULT_ATTEMPTS,
                  reconnect_window: float = DEFAULT_RECONNECT_WINDOW, session_timeout: float = DEFAULT_SESSION_TIMEOUT,
                  progress: Progress | None = None) -> tuple[list[np.ndarray], str]:
    """Run ``device/model.so`` on a real device: upload it over RPC, load it into the device's Relax VM on
    the device its backend names, send the inputs, run ``main`` and bring the outputs back (manifest
    order). Returns the outputs and what ran them (``"<device>: opencl(0)"``)."""
    build_dir = Path(build_dir)
    profile = device_profile(device)
    check_build_matches(manifest, device, profile)
    op = model_runner(build_dir, manifest, inputs, label=device.name, threads=threads, progress=progress)
    outputs, where = run_with_retries(device, op, what="Running the model", profile=profile, known_hosts=known_hosts,
                                      attempts=attempts, reconnect_window=reconnect_window,
                                      session_timeout=session_timeout, progress=progress)
    return outputs, f"{device.name}: {where}"


def bench_on_device(build_dir: Path | str, device: Device, repeat: int = 50, number: int = 1, warmup: int = 1, *,
                    threads: int | None = None, known_hosts: Path | None = None, attempts: int = DEFAULT_ATTEMPTS,
                    reconnect_window: float = DEFAULT_RECONNECT_WINDOW, session_timeout: float = DEFAULT_SESSION_TIMEOUT,
                    progress: Progress | None = None) -> BenchResult:
    """Time ``main`` of a build on the device: ``repeat`` samples, each the mean of ``number`` runs.

    Inputs are seeded random tensors sent to the device once; ``warmup`` untimed runs come first.
    Timing happens on the device (TVM's ``time_evaluator``), so the link's latency is not in it.
    """
    build_dir = Path(build_dir)
    manifest = read_manifest(build_dir)
    profile = device_profile(device)
    check_build_matches(manifest, device, profile)
    op = model_timer(build_dir, manifest, repeat=repeat, number=number, warmup=warmup, label=device.name,
                     threads=threads, progress=progress)
    started = time.monotonic()
    samples, where = run_with_retries(device, op, what="Benchmarking", profile=profile, known_hosts=known_hosts,
                                      attempts=attempts, reconnect_window=reconnect_window,
                                      session_timeout=session_timeout, progress=progress)
    return BenchResult(str(build_dir), device.name, profile.name, device.host, repeat, number, warmup,
                       tuple(samples), time.monotonic() - started, ran_on=where, threads=threads)


def _farm_devices(inventory: Inventory, profile_name: str) -> tuple[Profile, list[Device]]:
    devices = inventory.farm(profile_name)
    return device_profile(devices[0]), devices


def _first_working(devices: list[Device], fn: Callable[[Device], T], progress: Progress | None) -> T:
    """Without a tracker: the first device of the farm that can be reached does the work."""
    failures = []
    for device in devices:
        try:
            return fn(device)
        except (DeviceUnreachableError, FarmError) as exc:
            failures.append(f"{device.name}: {exc.message}")
            say(progress, f"{device.name} cannot be used ({short(exc.message, 120)}); trying the next device")
    raise DeviceUnreachableError(
        f"No device of the farm could be used: {' '.join(failures)}",
        "Check the devices with `edgepack device check NAME`.",
    )


def run_on_farm(build_dir: Path, manifest: BuildManifest, inputs: dict[str, np.ndarray], profile_name: str,
                inventory: Inventory, *, threads: int | None = None, known_hosts: Path | None = None,
                progress: Progress | None = None) -> tuple[list[np.ndarray], str]:
    """Run a build on the first free device of the farm's ``profile_name`` devices (through the tracker
    when the farm runs, else the first device that answers)."""
    profile, devices = _farm_devices(inventory, profile_name)
    check_build_matches(manifest, devices[0], profile)
    state = read_state(inventory)
    if state is not None:
        op = model_runner(build_dir, manifest, inputs, label="the farm device", threads=threads, progress=progress)
        device, (outputs, where) = on_tracker_device(
            state, inventory, profile, op, what="Running the model", known_hosts=known_hosts,
            attempts=DEFAULT_ATTEMPTS, session_timeout=DEFAULT_SESSION_TIMEOUT, wait=300.0, progress=progress)
        return outputs, f"{device.name}: {where}"
    return _first_working(devices, lambda d: run_on_device(build_dir, manifest, inputs, d, threads=threads,
                                                           known_hosts=known_hosts, attempts=1, progress=progress),
                          progress)


def bench_on_farm(build_dir: Path | str, profile_name: str, inventory: Inventory, *, repeat: int = 50,
                  number: int = 1, warmup: int = 1, all_devices: bool = False, threads: int | None = None,
                  known_hosts: Path | None = None,
                  session_timeout: float = DEFAULT_SESSION_TIMEOUT, reconnect_window: float = DEFAULT_RECONNECT_WINDOW,
                  progress: Progress | None = None) -> list[BenchResult | EdgepackError]:
    """Benchmark on the first free device of the farm (through its tracker when it runs), or with
    ``all_devices`` on each device of the profile in turn (a failed device gives its error)."""
    build_dir = Path(build_dir)
    manifest = read_manifest(build_dir)
    profile, devices = _farm_devices(inventory, profile_name)
    check_build_matches(manifest, devices[0], profile)
    if all_devices:
        results: list[BenchResult | EdgepackError] = []
        for device in devices:
            try:
                results.append(bench_on_device(build_dir, device, repeat, number, warmup, threads=threads,
                                               known_hosts=known_hosts,
                                               session_timeout=session_timeout, reconnect_window=reconnect_window,
                                               progress=progress))
            except EdgepackError as exc:
                exc.device = device.name  # type: ignore[attr-defined]
                results.append(exc)
        return results
    state = read_state(inventory)
    if state is None:
        return [_first_working(devices, lambda d: bench_on_device(build_dir, d, repeat, number, warmup,
                                                                  threads=threads, known_hosts=known_hosts, attempts=1,
                                                                  session_timeout=session_timeout,
                                                                  progress=progress), progress)]
    op = model_timer(build_dir, manifest, repeat=repeat, number=number, warmup=warmup, label="the farm device",
                     threads=threads, progress=progress)
    started = time.monotonic()
    device, (samples, where) = on_tracker_device(
        state, inventory, profile, op, what="Benchmarking", known_hosts=known_hosts, attempts=DEFAULT_ATTEMPTS,
        session_timeout=session_timeout, wait=300.0, progress=progress)
    return [BenchResult(str(build_dir), device.name, profile.name, device.host, repeat, number, warmup,
                        tuple(samples), time.monotonic() - started, via="tracker", ran_on=where, threads=threads)]
