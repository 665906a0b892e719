"""Where tuning candidates are measured: built here, timed on this machine, on a device through its RPC
server (SSH tunnel), on this machine's GPU through a local RPC server, or on a farm through its tracker."""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgepack.backends import Backend, backend_for, get_backend
from edgepack.devices.deploy import endpoint_for
from edgepack.devices.farm import read_state
from edgepack.devices.local_server import LocalRPCServer
from edgepack.devices.session import bring_up
from edgepack.profiles import Profile
from edgepack.progress import Progress
from edgepack.run.parallel import set_pool_threads
from edgepack.run.places import OnDevice, OnFarm, Place, ThisMachine
from edgepack.toolchain.compilers import HOST_TRIPLE, Compilers, find_compilers, host_compilers
from edgepack.toolchain.rpc_server import server_bundle
from edgepack.toolchain.tvm_runtime import host_runtime
from edgepack.tuning.records import TuningError

BUILDER_TIMEOUT_S = 180.0  # see docs: a cold builder worker may take ~30 s before it builds anything


# ---------------------------------------------------------------------------------------------
# where candidates are measured


def build_candidate(backend: str, mod, target, _params):
    """MetaSchedule builder function (runs in the builder's worker processes), lowering with the TIR
    pipeline of the backend named ``backend`` (``Backend.tir_pipeline``), as its builds do.

    Unlike MetaSchedule's default it does not import ``tvm.s_tir.tensor_intrin`` (about 25 s in every
    fresh worker, for every batch): tensorized candidates already carry the intrinsic's body.
    """
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target, pipeline=get_backend(backend).tir_pipeline())


def export_candidate(cxx: str | None, rt_mod) -> str:
    """MetaSchedule export function: a shared library, linked with the cross compiler ``cxx``."""
    from tvm.support import cc

    path = os.path.join(tempfile.mkdtemp(prefix="edgepack-ms-"), "candidate.so")
    if cxx:
        rt_mod.export_library(path, fcompile=cc.cross_compiler(cxx))
    else:
        rt_mod.export_library(path)
    return path


def alloc_arguments(session, device, args_info, alloc_repeat: int):
    """MetaSchedule RPC argument allocation that needs nothing but the runtime on the device.

    (The default asks the device for ``tvm.contrib.random.random_fill_for_measure``, which the plain
    runtime library does not have.) Random data is made here and copied over.
    """
    import numpy as np
    import tvm

    rng = np.random.default_rng(0)
    repeated = []
    for _ in range(alloc_repeat):
        args = []
        for info in args_info:
            kind, dtype, shape = info[0], info[1], info[2]
            if kind != "TENSOR":
                raise NotImplementedError(f"Unsupported argument kind {kind}")
            np_dtype = np.dtype(dtype)
            if np.issubdtype(np_dtype, np.floating):
                value = rng.random(shape, dtype=np.float32).astype(np_dtype)
            elif np_dtype == np.bool_:
                value = rng.random(shape) < 0.5
            else:
                value = rng.integers(0, 8, size=shape).astype(np_dtype)
            array = tvm.runtime.empty(shape, dtype, device)
            array.copyfrom(value)
            args.append(array)
        repeated.append(args)
    return repeated


def cleanup_remote(session, remote_path: str | None) -> None:
    """MetaSchedule RPC cleanup: remove the uploaded candidate.

    (The default also removes ``""``, the work directory itself, which edgepack's device server
    refuses: the error would discard a finished measurement.) The server drops the session's work
    directory when the session ends anyway.
    """
    if session is not None and remote_path:
        with contextlib.suppress(Exception):
            session.remove(remote_path)


def connect_forwarded(port: int, key: str, session_timeout: float, _rpc_config):
    """MetaSchedule RPC session factory: the device's server through a local forwarded port."""
    from tvm import rpc

    return rpc.connect("127.0.0.1", port, key=key, session_timeout=session_timeout)


def _evaluator_config(remote: bool, cold_weights: bool = False):
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig

    # remote devices (and emulated ones) are slow: fewer repetitions, the same minimum run time
    if remote:
        return EvaluatorConfig(number=1, repeat=3, min_repeat_ms=50, enable_cpu_cache_flush=False)
    if cold_weights:
        # every timed run starts with all arguments but the first (the input activation, which the
        # previous kernel has just written) flushed from the cache: kernels timed warm, weights and
        # all, ran ~20% slower inside the model than their timings said
        return EvaluatorConfig(number=1, repeat=16, min_repeat_ms=0, enable_cpu_cache_flush=True)
    return EvaluatorConfig(number=3, repeat=3, min_repeat_ms=40, enable_cpu_cache_flush=False)


@dataclass
class Measurer:
    """MetaSchedule's builder and runner for one place, and how to release what they hold."""

    builder: Any
    runner: Any
    on: str
    remote: bool  # measured over RPC (records of lost devices are told apart from failed candidates)
    close: Callable[[], None] = lambda: None


def _local_builder(backend: Backend, cxx: str | None = None, *, export: bool = False):
    from tvm.s_tir.meta_schedule.builder import LocalBuilder

    extra = {"f_export": functools.partial(export_candidate, cxx)} if export else {}
    return LocalBuilder(max_workers=max(1, os.cpu_count() or 1), timeout_sec=BUILDER_TIMEOUT_S,
                        f_build=functools.partial(build_candidate, backend.name), **extra)


def _rpc_runner(key: str, session_timeout: float, *, port: int | None = None, tracker_port: int | None = None,
                workers: int = 1):
    """An RPC runner: through a local forwarded port (``port``), or the farm's tracker."""
    from tvm.s_tir.meta_schedule.runner import RPCConfig, RPCRunner

    # no tracker for a forwarded port: the config only carries the session timeout (connect_forwarded connects)
    config = RPCConfig(tracker_host="127.0.0.1", tracker_port=tracker_port or 1, tracker_key=key,
                       session_timeout_sec=int(session_timeout))
    factory = {} if port is None else {"f_create_session": functools.partial(connect_forwarded, port, key,
                                                                            session_timeout)}
    return RPCRunner(rpc_config=config, evaluator_config=_evaluator_config(remote=True), f_alloc_argument=alloc_arguments,
                     f_cleanup=cleanup_remote, max_workers=workers, **factory)


def pool_in_runner() -> None:
    """The local runner's worker process: candidates' parallel loops on edgepack's thread pool, at the
    thread count the tuning measures with (``TVM_NUM_THREADS``), as a build runs them (``run.parallel``)."""
    threads = os.environ.get("TVM_NUM_THREADS", "").strip()
    set_pool_threads(int(threads) if threads.isdigit() else 0)


def _host_measurer(profile: Profile, say: Progress, cold_weights: bool) -> Measurer:
    from tvm.s_tir.meta_schedule.runner import LocalRunner

    say("Measuring on this machine")
    runner = LocalRunner(timeout_sec=60.0, evaluator_config=_evaluator_config(remote=False, cold_weights=cold_weights),
                         initializer=pool_in_runner)
    return Measurer(_local_builder(backend_for(profile)), runner, "host", remote=False)


def _local_server_measurer(profile: Profile, place: ThisMachine, session_timeout: float, say: Progress) -> Measurer:
    """This machine's GPU (e.g. PoCL) as the device: edgepack's RPC server built for this machine with the
    backend's plug-ins next to it, measured over RPC exactly like a device; candidates built here."""
    backend = backend_for(profile)
    device = backend.host_device(log=say)  # a missing driver fails now, clearly
    cc, cxx = host_compilers()
    compilers = Compilers(cc, cxx, "")
    bundle = server_bundle(HOST_TRIPLE, cc, host_runtime(), backend.rpc_server_files(HOST_TRIPLE, compilers, log=say),
                           log=say)
    server = LocalRPCServer.start(bundle, place.on, log=say)
    say(f"Measuring on this machine's {backend.label} device ({device.device_name}) through edgepack's RPC "
        f"server on port {server.port}")
    return Measurer(_local_builder(backend, export=True), _rpc_runner(server.key, session_timeout, port=server.port),
                    place.on, remote=True, close=server.stop)


def _cross_builder(profile: Profile):
    return _local_builder(backend_for(profile), find_compilers(profile).cxx, export=True)


def _farm_measurer(profile: Profile, place: OnFarm, session_timeout: float, say: Progress) -> Measurer:
    devices = place.inventory.farm(place.profile)
    if devices[0].profile != profile.name:
        raise TuningError(f"The farm {place.on} is made of {devices[0].profile} devices, not {profile.name}.",
                          f"Tune with --profile {devices[0].profile}, or use --on farm:{profile.name}.")
    state = read_state(place.inventory)
    if state is None:
        raise TuningError(f"The farm is not running, so {place.on} cannot measure anything.",
                          "Start it with `edgepack farm start` (it keeps the devices on an RPC tracker), "
                          "or measure on one device with --on NAME.")
    say(f"Measuring on the {len(devices)} {profile.name} device(s) of the farm (tracker port {state.tracker_port})")
    runner = _rpc_runner(profile.rpc_key, session_timeout, tracker_port=state.tracker_port, workers=len(devices))
    return Measurer(_cross_builder(profile), runner, place.on, remote=True)


def _device_measurer(profile: Profile, place: OnDevice, session_timeout: float, say: Progress) -> Measurer:
    """One device of the inventory: its RPC server through an SSH tunnel run in its own process."""
    device = place.device
    if device.profile != profile.name:
        raise TuningError(f"Device {device.name} has profile {device.profile}, not {profile.name}.",
                          f"Tune with --profile {device.profile}, or pick a {profile.name} device.")
    builder = _cross_builder(profile)
    served = bring_up(device, profile, endpoint_for(device), tunnel=True, progress=say)
    say(f"Measuring on {device.name} through local port {served.tunnel.local_port}")
    runner = _rpc_runner(served.server.key, session_timeout, port=served.tunnel.local_port)
    return Measurer(builder, runner, device.name, remote=True, close=served.close)


def measurer_for(profile: Profile, place: Place, session_timeout: float, say: Progress, cold_weights: bool) -> Measurer:
    """Where ``place`` measures ``profile``'s kernels (``check_place`` said it can)."""
    if isinstance(place, ThisMachine):
        if place.backend is None:
            return _host_measurer(profile, say, cold_weights)
        return _local_server_measurer(profile, place, session_timeout, say)
    if isinstance(place, OnFarm):
        return _farm_measurer(profile, place, session_timeout, say)
    if isinstance(place, OnDevice):
        return _device_measurer(profile, place, session_timeout, say)
    raise TuningError(f"Kernels cannot be measured on {place.on!r}: timings under emulation mean nothing.",
                      "Measure on this machine (--on host, or its GPU), a device (--on NAME) or a farm (farm:PROFILE).")


def check_place(profile: Profile, place: Place) -> None:
    """Refuse, with the fix, a place that cannot measure ``profile``'s kernels."""
    backend = backend_for(profile)
    if not backend.tunable:
        raise backend.not_tunable(profile)
    if not isinstance(place, ThisMachine):
        return
    here = backend.tuning_place(profile)
    if place.backend is not None and place.backend is not backend:
        raise TuningError(
            f"--on {place.on} measures {place.backend.label} kernels; {profile.name!r} is a {backend.label} profile.",
            f"Use --on {here or 'DEVICE'} for it, or a device / farm:{profile.name}.")
    if place.on == here:
        return
    if place.on == "host" and here is not None:
        raise TuningError(
            f"Profile {profile.name!r} runs on {backend.device_noun}, so its kernels are not measured with --on host.",
            f"Measure on this machine's device with --on {here}, or on a device (--on DEVICE or --on farm:{profile.name}).")
    raise TuningError(
        f"Profile {profile.name!r} is for {profile.triple}; its kernels cannot be measured on this machine.",
        f"Measure on a device: --on DEVICE (see `edgepack device list`) or --on farm:{profile.name}.",
    )
