"""``edgepack device check``: SSH reachable with a trusted key, the CPU the profile expects, the runtime
installed, and an RPC round trip through the tunnel."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgepack.backends import backend_for, describe_device
from edgepack.devices.deploy import (
    RemoteInstall,
    deploy,
    endpoint_for,
    home_dir,
    install_dir,
    installed_manifest,
    python_server,
    say,
)
from edgepack.devices.errors import ArchMismatchError, DeployError, DeviceError, RPCServerError
from edgepack.devices.inventory import Device, DeviceStatus, device_profile, expected_arches
from edgepack.devices.session import DeviceConnection, deadline, rpc_session
from edgepack.devices.ssh import connect
from edgepack.errors import EdgepackError
from edgepack.progress import Progress
from edgepack.text import short, utc_timestamp


@dataclass(frozen=True)
class CheckItem:
    name: str  # ssh, host key, arch, runtime, rpc
    ok: bool | None  # None: not checked (an earlier step failed)
    detail: str


@dataclass(frozen=True)
class DeviceCheck:
    """What ``edgepack device check`` found on one device."""

    device: str
    profile: str
    items: tuple[CheckItem, ...]
    arch: str | None = None
    runtime: str | None = None
    rpc: str | None = None
    message: str = ""  # the first problem, as a sentence
    hint: str = ""
    checked_at: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(item.ok for item in self.items)

    @property
    def reachable(self) -> bool:
        return any(item.name == "ssh" and item.ok for item in self.items)

    def to_status(self) -> DeviceStatus:
        return DeviceStatus(reachable=self.reachable, arch=self.arch, runtime=self.runtime, rpc=self.rpc,
                            last_check=self.checked_at, message=self.message)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device, "profile": self.profile, "ok": self.ok, "reachable": self.reachable,
            "arch": self.arch, "runtime": self.runtime, "rpc": self.rpc, "message": self.message,
            "hint": self.hint, "checked_at": self.checked_at, "seconds": round(self.seconds, 3),
            "items": [asdict(i) for i in self.items],
        }


_CHECK_ORDER = ("ssh", "arch", "runtime", "rpc")


def check_device(device: Device, profile: Any = None, *, known_hosts: Path | None = None, install: bool = True,
                 connect_timeout: float = 10.0, progress: Progress | None = None) -> DeviceCheck:
    """SSH reachable (strict host key), ``uname -m`` vs the profile, runtime installed, RPC round trip.

    With ``install`` (the default) a missing or outdated runtime is installed first. Never raises
    for a problem of the device itself: the result says what failed, and why.
    """
    profile = device_profile(device, profile)
    started = time.monotonic()
    items: dict[str, CheckItem] = {}
    found: dict[str, str | None] = {"arch": None, "runtime": None, "rpc": None}
    problem: list[EdgepackError] = []

    def fail(name: str, exc: EdgepackError) -> None:
        items[name] = CheckItem(name, False, exc.message)
        problem.append(exc)

    endpoint = endpoint_for(device, known_hosts, connect_timeout=connect_timeout)
    session = None
    try:
        say(progress, f"Connecting to {device.name} ({device.host}:{device.port})")
        try:
            session = connect(endpoint)
            items["ssh"] = CheckItem("ssh", True, f"{device.user}@{device.host}:{device.port}, host key trusted")
        except EdgepackError as exc:
            fail("ssh", exc)
            return _finish(device, profile, items, found, problem, started)

        uname = session.run(["uname", "-m"], timeout=30)
        arch = uname.stdout.strip()
        found["arch"] = arch or None
        wanted = expected_arches(profile.triple)
        if uname.rc != 0 or not arch:
            fail("arch", DeviceError(f"`uname -m` failed on {device.name}: {short(uname.stderr)}",
                                     "Is this a Linux device?"))
            return _finish(device, profile, items, found, problem, started)
        if arch not in wanted:
            fail("arch", ArchMismatchError(
                f"`uname -m` on {device.name} says {arch}, but its profile {profile.name} builds for "
                f"{profile.triple} (expects {' or '.join(wanted)}).",
                f"Fix the device's profile: `edgepack device add {device.name} ... --profile PROFILE --replace` "
                "with a profile for this CPU (`edgepack profiles`).",
            ))
            return _finish(device, profile, items, found, problem, started)
        items["arch"] = CheckItem("arch", True, f"{arch} (profile {profile.name}: {profile.triple})")

        try:
            current = None if python_server(device) else installed_manifest(session, device, profile.triple)
            if install or python_server(device):
                say(progress, f"Checking the runtime on {device.name}")
                result = deploy(session, device, profile, progress=progress)
                state = "installed now" if result.uploaded else "up to date"
                if result.kind == "python":
                    state = "TVM Python"
                found["runtime"] = f"TVM {result.tvm_version}"
                items["runtime"] = CheckItem("runtime", True,
                                             f"TVM {result.tvm_version}, server {result.server_version} ({state}) "
                                             f"in {result.directory}")
            elif current is None:
                raise DeployError(f"The TVM runtime is not installed on {device.name}.",
                                  f"Run `edgepack device check {device.name}` without --no-install to install it.")
            else:
                found["runtime"] = f"TVM {current.get('tvm_version')}"
                items["runtime"] = CheckItem("runtime", True, f"TVM {current.get('tvm_version')} (installed)")
                result = RemoteInstall(device.name, install_dir(device, profile.triple, home_dir(session)),
                                       profile.triple, current.get("tvm_version", "?"),
                                       current.get("server_version", "?"))
        except EdgepackError as exc:
            fail("runtime", exc)
            return _finish(device, profile, items, found, problem, started)
        session.close()
        session = None

        say(progress, f"RPC round trip with {device.name}")
        try:
            rpc_started = time.monotonic()
            with rpc_session(device, profile, known_hosts=known_hosts, session_timeout=120, attempts=2,
                             connect_timeout=connect_timeout, progress=progress) as conn:
                detail = _round_trip(conn)
            found["rpc"] = "ok"
            reuse = "running" if conn.server.reused else "started"
            if conn.server.restarted:
                reuse = f"restarted: {conn.server.restarted}"
            items["rpc"] = CheckItem("rpc", True, f"{detail} in {time.monotonic() - rpc_started:.1f} s "
                                                  f"(server {reuse}, 127.0.0.1:{conn.server.port} on the device)")
        except EdgepackError as exc:
            found["rpc"] = "failed"
            fail("rpc", exc)
    finally:
        if session is not None:
            session.close()
    return _finish(device, profile, items, found, problem, started)


def _round_trip(conn: DeviceConnection) -> str:
    """Send a tensor to the device, compute on it there, bring it back; then make sure the device the
    profile's backend runs on (e.g. its OpenCL GPU through the plug-in) exists in the RPC session."""
    import tvm

    with deadline(120.0):
        dev = conn.remote.cpu()
        if not dev.exist:
            raise RPCServerError(f"The RPC server on {conn.device.name} has no CPU device.", "")
        data = np.arange(4096, dtype=np.float32)
        remote_tensor = tvm.runtime.tensor(data, dev)
        back = remote_tensor.numpy()
        del remote_tensor, dev
        backend = backend_for(conn.profile)
        kernels_on = backend.remote_device(conn.remote)
        where = describe_device(kernels_on)
        if not kernels_on.exist:
            raise RPCServerError(
                f"The RPC server on {conn.device.name} has no {where}: {backend.label} kernels of profile "
                f"{conn.profile.name} cannot run there (the runtime plug-in did not load, or the device has no "
                "driver for it).",
                "Check the driver on the device (e.g. `clinfo -l` for OpenCL, `vulkaninfo --summary` for Vulkan) and "
                "the RPC server's log (~/.edgepack/run/rpc.log on the device).",
            )
        del kernels_on
    if not np.array_equal(back, data):
        raise RPCServerError(f"A tensor sent to {conn.device.name} came back different.",
                             "The RPC server or the link corrupts data; reinstall with `edgepack device check`.")
    return f"16 KiB tensor sent and read back; kernels run on {where}"


def _finish(device: Device, profile: Any, items: dict[str, CheckItem], found: dict[str, str | None],
            problem: list[EdgepackError], started: float) -> DeviceCheck:
    ordered = []
    for name in _CHECK_ORDER:
        ordered.append(items.get(name) or CheckItem(name, None, "not checked"))
    first = problem[0] if problem else None
    return DeviceCheck(device.name, profile.name, tuple(ordered), found["arch"], found["runtime"], found["rpc"],
                       first.message if first else "", first.hint if first else "", utc_timestamp(),
                       time.monotonic() - started)
