"""The RPC server on a device: started bound to the device's loopback, reused while healthy, restarted
when it died, hangs or belongs to an older install, waited for while it serves someone else."""

from __future__ import annotations

import contextlib
import json
import shlex
import struct
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import paramiko

from edgepack.devices.deploy import (
    RemoteInstall,
    home_dir,
    python_server,
    read_remote_text,
    run_dir,
    say,
    write_remote_text,
)
from edgepack.devices.errors import DeviceBusyError, DeviceUnreachableError, RemoteError, RPCServerError
from edgepack.devices.inventory import Device, device_profile
from edgepack.devices.ssh import SSHSession
from edgepack.progress import Progress
from edgepack.text import short, tail, utc_timestamp
from edgepack.toolchain.rpc_server import SERVER_PROGRAM

PORT_RANGE = 10  # the server takes the first free port in [rpc_port, rpc_port + PORT_RANGE)
DEFAULT_BUSY_TIMEOUT = 120.0  # how long to wait for a device whose server serves someone else
SERVER_START_TIMEOUT = 90.0  # qemu-emulated devices take a while to load the runtime


@dataclass(frozen=True)
class ServerInfo:
    """The RPC server running on a device (bound to its loopback)."""

    pid: int
    port: int
    key: str
    install_dir: str
    started: str
    install_id: str = ""
    reused: bool = False  # it was already running and healthy
    restarted: str | None = None  # why an older server was replaced

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def server_key(device: Device, profile: Any) -> str:
    """The RPC key of the device's server: ``<profile rpc_key>:<device name>``.

    It is also the device's match key in the host's tracker (``tvm.rpc`` splits keys at the last
    ``:``), so a client handed this device by the tracker presents exactly this key.
    """
    return f"{profile.rpc_key}:{device.name}"


def server_files(device: Device, home: str) -> dict[str, str]:
    base = run_dir(device, home)
    return {"dir": base, "pid": f"{base}/rpc.pid", "port": f"{base}/rpc.port", "log": f"{base}/rpc.log",
            "info": f"{base}/rpc.json", "work": f"{base}/work"}


def server_log_tail(session: SSHSession, device: Device, lines: int = 15) -> str:
    """The last lines of the device's RPC server log (empty when there is none)."""
    try:
        text = read_remote_text(session, server_files(device, home_dir(session))["log"], limit=4 << 20)
    except (RemoteError, OSError):
        return ""
    return tail(text or "", lines)


def pid_alive(session: SSHSession, pid: int, marker: str) -> bool:
    """Whether ``pid`` runs on the device and is our server (its command line contains ``marker``)."""
    result = session.run(["cat", f"/proc/{pid}/cmdline"], timeout=30)
    return result.rc == 0 and marker in result.stdout.replace("\0", " ")


def _has_children(session: SSHSession, pid: int) -> bool:
    return session.run(["pgrep", "-P", str(pid)], timeout=30).rc == 0


def probe_server(session: SSHSession, port: int, timeout: float = 10.0) -> str:
    """Knock on the device's RPC port through an SSH channel, without starting a session.

    Sends four bytes that are not the RPC magic; a server that accepts connections closes at once.
    Returns ``"ok"``, ``"not-listening"`` or ``"unresponsive"`` (it accepts nothing: busy or hung).
    """
    try:
        transport = session._transport()
        channel = transport.open_channel("direct-tcpip", ("127.0.0.1", port), ("127.0.0.1", 0), timeout=timeout)
    except paramiko.ChannelException:
        return "not-listening"
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise DeviceUnreachableError(f"Cannot open an SSH channel to {session.endpoint.label} ({exc}).",
                                     "Check the connection to the device.") from None
    try:
        channel.settimeout(timeout)
        channel.sendall(struct.pack("<i", 0))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = channel.recv(64)
            if not data:
                return "ok"
        return "unresponsive"
    except TimeoutError:
        return "unresponsive"
    except (OSError, EOFError, paramiko.SSHException):
        return "ok"  # the server closed hard: it is alive and accepting
    finally:
        channel.close()


def stop_rpc_server(session: SSHSession, device: Device) -> bool:
    """Stop the device's RPC server (its whole process group); True if one was running."""
    home = home_dir(session)
    files = server_files(device, home)
    pid_text = (read_remote_text(session, files["pid"]) or "").strip()
    stopped = False
    if pid_text.isdigit():
        pid = int(pid_text)
        script = (
            f"kill -TERM -{pid} 2>/dev/null || kill -TERM {pid} 2>/dev/null; kill -CONT -{pid} 2>/dev/null; i=0; "
            f"while kill -0 {pid} 2>/dev/null && [ $i -lt 30 ]; do sleep 0.2; i=$((i+1)); done; "
            f"kill -KILL -{pid} 2>/dev/null; kill -KILL {pid} 2>/dev/null; true"
        )
        stopped = pid_alive(session, pid, "rpc_server")
        session.run(["sh", "-c", script], timeout=60)
    session.run(["rm", "-f", files["pid"], files["port"], files["info"]], timeout=30)
    return stopped


def _start_server(session: SSHSession, device: Device, profile: Any, install: RemoteInstall,
                  progress: Progress | None) -> ServerInfo:
    home = home_dir(session)
    files = server_files(device, home)
    key = server_key(device, profile)
    session.makedirs(files["work"], 0o700)
    port_end = min(device.rpc_port + PORT_RANGE, 65536)
    python = python_server(device)
    if python is None:
        argv = [f"{install.directory}/{SERVER_PROGRAM}", "--host", "127.0.0.1", "--port", str(device.rpc_port),
                "--port-end", str(port_end), "--key", key, "--workdir", files["work"], "--port-file", files["port"]]
        cd = install.directory
    else:
        argv = [python, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(device.rpc_port),
                "--port-end", str(port_end), "--key", key]
        cd = files["work"]
    command = " ".join(shlex.quote(a) for a in argv)
    script = (
        f"cd {shlex.quote(cd)} && rm -f {shlex.quote(files['port'])} {shlex.quote(files['info'])} && "
        f"{{ setsid {command} >{shlex.quote(files['log'])} 2>&1 </dev/null & echo $! >{shlex.quote(files['pid'])}; }}"
    )
    say(progress, f"Starting the RPC server on {device.name} (127.0.0.1:{device.rpc_port} on the device)")
    session.run(["sh", "-c", script], timeout=60, check=True)
    pid_text = (read_remote_text(session, files["pid"]) or "").strip()
    if not pid_text.isdigit():
        raise RPCServerError(f"The RPC server on {device.name} did not start (no pid).",
                             f"Run `{command}` on the device by hand to see why.")
    pid = int(pid_text)
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    port = None
    while time.monotonic() < deadline:
        if python is None:
            text = (read_remote_text(session, files["port"]) or "").strip()
            if text.isdigit():
                port = int(text)
                break
        else:
            log = read_remote_text(session, files["log"]) or ""
            found = [ln for ln in log.splitlines() if "bind to 127.0.0.1:" in ln]
            if found:
                port = int(found[-1].rsplit(":", 1)[1].strip())
                break
        if not pid_alive(session, pid, "rpc_server"):
            break
        time.sleep(0.5)
    if port is None:
        log = server_log_tail(session, device)
        stop_rpc_server(session, device)
        raise RPCServerError(
            f"The RPC server on {device.name} did not start listening within {SERVER_START_TIMEOUT:g} s"
            + (f"; its log ends with: {short(log, 600)}" if log else "."),
            f"Check that a port in {device.rpc_port}..{port_end - 1} is free on the device (or set another "
            "rpc_port for it in the inventory), and that the runtime runs there (`edgepack device check`).",
        )
    info = ServerInfo(pid, port, key, install.directory, utc_timestamp(), install.install_id)
    write_remote_text(session, files["info"], json.dumps(info.to_dict()) + "\n")
    return info


def ensure_rpc_server(session: SSHSession, device: Device, profile: Any, install: RemoteInstall, *,
                      busy_timeout: float = DEFAULT_BUSY_TIMEOUT, progress: Progress | None = None) -> ServerInfo:
    """A healthy RPC server on the device's loopback: the running one, or a fresh one.

    A server is reused when its process is alive, belongs to this install and key, and accepts
    connections. A dead, foreign or hung one is replaced; one that is busy serving another
    session (it has a session process) is waited for up to ``busy_timeout`` seconds.
    """
    profile = device_profile(device, profile)
    files = server_files(device, home_dir(session))
    key = server_key(device, profile)
    reason = None
    text = read_remote_text(session, files["info"])
    info = None
    if text:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            info = ServerInfo(**{k: v for k, v in json.loads(text).items()
                                 if k in ServerInfo.__dataclass_fields__ and k not in ("reused", "restarted")})
    if info is None:
        reason = None if text is None else "unreadable server state"
    elif not pid_alive(session, info.pid, "rpc_server"):
        reason = f"the previous server (pid {info.pid}) is gone"
    elif info.install_dir != install.directory or info.key != key:
        reason = "it belonged to another install"
    elif info.install_id != install.install_id:
        reason = "the runtime or server was updated"
    else:
        deadline = time.monotonic() + busy_timeout
        while True:
            state = probe_server(session, info.port)
            if state == "ok":
                return replace(info, reused=True)
            if state == "not-listening":
                reason = f"it no longer listens on port {info.port}"
                break
            if not _has_children(session, info.pid):
                reason = "it stopped answering (hung)"
                break
            if time.monotonic() > deadline:
                raise DeviceBusyError(
                    f"The RPC server on {device.name} is serving another session and stayed busy for "
                    f"{busy_timeout:g} s.",
                    "Wait for the other run (another edgepack, or the farm tracker) to finish and try again; "
                    "`edgepack farm status` shows who uses the farm.",
                )
            say(progress, f"{device.name} is busy with another session, waiting")
            time.sleep(2.0)
    if reason:
        say(progress, f"Restarting the RPC server on {device.name}: {reason}")
    stop_rpc_server(session, device)
    return replace(_start_server(session, device, profile, install, progress), restarted=reason)


