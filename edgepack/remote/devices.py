"""Real devices: check them, install the TVM runtime + RPC server on them, run and time builds there.

How a device is used (nothing on the device listens on its network)::

    host                                              device (SSH only)
    ----                                              -----------------
    deploy()       -- SFTP -->  ~/.edgepack/<tvm-version>/<triple>/{libtvm_runtime.so, libtvm_ffi.so,
                                                                     edgepack_rpc_server, install.json}
    ensure_rpc_server() -- ssh: setsid ./edgepack_rpc_server --host 127.0.0.1 --port P ... -->
    LocalTunnel (own process) 127.0.0.1:L  == SSH direct-tcpip ==>  127.0.0.1:P on the device
    tvm.rpc.connect("127.0.0.1", L)  -> upload model.so, load it, Relax VM, time_evaluator

* The RPC server is ours (``runtimes/rpc-server``, plain C over the official runtime): the device needs
  no Python. It is cross-built once per triple with the profile's cross compiler and cached under
  ``cache_root()/rpc-server/``. A device with TVM's Python can use ``rpc_server = "python"`` (inventory)
  to run ``python3 -m tvm.exec.rpc_server`` instead; then nothing is installed.
* The server keeps running between edgepack invocations (bound to the device's loopback). A server
  that died, answers nothing, or belongs to another install is restarted; a busy one is waited for.
* Connection problems (a dropped link, a rebooting device, a stale server) are retried a bounded
  number of times, then reported as one clear :class:`~edgepack.errors.EdgepackError`.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import posixpath
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import paramiko

from edgepack.errors import EdgepackError, ToolchainError
from edgepack.fileutil import file_lock, file_sha256
from edgepack.paths import cache_root
from edgepack.remote.errors import (
    AuthenticationError,
    DeviceUnreachableError,
    HostKeyError,
    RemoteCommandError,
    RemoteError,
    RemoteTimeoutError,
)
from edgepack.remote.inventory import Device, DeviceStatus
from edgepack.remote.ssh import (
    DEFAULT_CONNECT_TIMEOUT,
    HostKey,
    LocalTunnel,
    SSHEndpoint,
    SSHSession,
    connect,
    default_known_hosts_path,
    known_host_keys,
    scan_host_key,
    trust_host_key,
)

Progress = Callable[[str], None]
T = TypeVar("T")

TVM_VERSION = "0.27.0.post1"  # the runtime installed on devices (edgepack.native pins the same)
SERVER_SOURCE_NAME = "edgepack_rpc_server.c"
SERVER_PROGRAM = "edgepack_rpc_server"
RUNTIME_LIBS = ("libtvm_ffi.so", "libtvm_runtime.so")
INSTALL_MANIFEST = "install.json"
RUN_DIR = "run"  # below device.remote_dir: pid/port/log of the running server, session work dirs
PORT_RANGE = 10  # the server takes the first free port in [rpc_port, rpc_port + PORT_RANGE)

DEFAULT_SESSION_TIMEOUT = 900.0  # the device ends an RPC session after this many seconds
DEFAULT_ATTEMPTS = 3  # tries of an operation whose connection dropped
DEFAULT_RECONNECT_WINDOW = 30.0  # how long a device that dropped out may take to come back
DEFAULT_BUSY_TIMEOUT = 120.0  # how long to wait for a device whose server serves someone else
SERVER_START_TIMEOUT = 90.0  # qemu-emulated devices take a while to load the runtime


# ---------------------------------------------------------------------------------------------
# errors


class DeviceError(RemoteError):
    """A device is reachable but cannot do what was asked."""


class ArchMismatchError(DeviceError):
    """``uname -m`` on the device does not match the profile's triple."""


class DeployError(DeviceError):
    """Installing the runtime and RPC server on the device failed."""


class RPCServerError(DeviceError):
    """The RPC server on the device does not start, or died."""


class DeviceBusyError(DeviceError):
    """The device's RPC server is serving another session."""


class ConnectionLostError(DeviceUnreachableError):
    """The connection to the device dropped during an operation, and retrying did not help."""


class RemoteRunError(DeviceError):
    """The model failed on the device (load or run)."""


class BuildMismatchError(DeviceError):
    """The build was made for another kind of device."""


# ---------------------------------------------------------------------------------------------
# small helpers


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


def _q(arg: str) -> str:
    return shlex.quote(arg)


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _profile_for(device: Device, profile: Any = None):
    from edgepack.profiles import get_profile

    if profile is None:
        return get_profile(device.profile)
    if isinstance(profile, str):
        return get_profile(profile)
    return profile


#: ``uname -m`` values a triple's binaries run on
_ARCH_NAMES: dict[str, tuple[str, ...]] = {
    "aarch64": ("aarch64", "arm64", "armv8b"),
    "arm": ("armv7l", "armv7", "armv8l", "armhf"),
    "armv7a": ("armv7l", "armv7", "armv8l", "armhf"),
    "armv7": ("armv7l", "armv7", "armv8l", "armhf"),
    "x86_64": ("x86_64", "amd64"),
    "riscv64": ("riscv64",),
}


def expected_arches(triple: str) -> tuple[str, ...]:
    """The ``uname -m`` values of machines that run binaries for ``triple``."""
    cpu = triple.split("-")[0]
    return _ARCH_NAMES.get(cpu, (cpu,))


# ---------------------------------------------------------------------------------------------
# SSH identity


def endpoint_for(device: Device, known_hosts: Path | None = None, *,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, keepalive: int = 10) -> SSHEndpoint:
    """How to reach ``device`` over SSH; ``known_hosts`` defaults to edgepack's own file."""
    return SSHEndpoint(
        host=device.host, port=device.port, user=device.user, key_path=device.key_path(),
        known_hosts=Path(known_hosts) if known_hosts else default_known_hosts_path(), name=device.name,
        connect_timeout=connect_timeout, keepalive=keepalive,
    )


def scan_device_key(device: Device, timeout: float = DEFAULT_CONNECT_TIMEOUT) -> HostKey:
    """The SSH host key the device presents now (no authentication; like ``ssh-keyscan``)."""
    try:
        return scan_host_key(device.host, device.port, timeout=timeout)
    except DeviceUnreachableError as exc:
        raise DeviceUnreachableError(exc.message.replace(f"{device.host}:{device.port}",
                                                         f"{device.name} ({device.host}:{device.port})", 1),
                                     exc.hint) from None


def trusted_device_keys(device: Device, known_hosts: Path | None = None) -> list[HostKey]:
    """The host keys trusted for the device (empty: never trusted)."""
    return known_host_keys(endpoint_for(device, known_hosts).known_hosts, device.host, device.port)


def trust_device(device: Device, key: HostKey, known_hosts: Path | None = None) -> Path:
    """Record ``key`` as the device's one trusted host key; returns the known hosts file."""
    return trust_host_key(endpoint_for(device, known_hosts), key)


def probe_reachable(device: Device, timeout: float = 3.0) -> bool:
    """Whether something answers with an SSH banner on the device's SSH port (no login)."""
    try:
        with socket.create_connection((device.host, device.port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(4) == b"SSH-"
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# the server bundle (built here, once per triple and compiler)


@dataclass(frozen=True)
class ServerBundle:
    """The files installed on a device: the official runtime libraries and our RPC server."""

    triple: str
    directory: Path
    manifest: dict[str, Any]  # tvm_version, server_version, triple, files {name: sha256}

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(self.directory / name for name in self.manifest["files"])


def _server_source() -> Path:
    from edgepack.native import runtimes_dir

    return runtimes_dir() / "rpc-server" / SERVER_SOURCE_NAME


def _server_version(source: Path) -> str:
    for line in source.read_text().splitlines():
        if line.startswith("#define EP_VERSION"):
            return line.split('"')[1]
    return "unknown"


def ensure_server_bundle(profile: Any, *, log: Progress | None = None) -> ServerBundle:
    """The runtime + RPC server for ``profile``'s triple, cross-built once and cached.

    The runtime comes from :func:`edgepack.native.ensure_target_runtime` (official aarch64 wheels,
    or built from source for other triples); the server is compiled with the profile's C cross
    compiler against it, ``rpath $ORIGIN``.
    """
    from edgepack import native
    from edgepack.toolchain import find_compilers

    if isinstance(profile, str):
        from edgepack.profiles import get_profile

        profile = get_profile(profile)
    compilers = find_compilers(profile)
    runtime = native.ensure_target_runtime(profile.triple, compilers.cc, compilers.cxx, need_static=False, log=log)
    source = _server_source()
    libs = {lib.name: lib for lib in runtime.shared_libs}
    missing = [name for name in RUNTIME_LIBS if name not in libs]
    if missing:
        raise ToolchainError(f"The {profile.triple} TVM runtime in {runtime.root} lacks {', '.join(missing)}.",
                             "Remove that directory so that edgepack fetches or builds it again.")
    plugins: dict[str, Path] = {}
    if getattr(profile, "backend", "cpu") == "opencl":  # the server loads it from its own directory
        from edgepack import opencl

        plugin, _plugin_runtime = opencl.target_plugin(profile.triple, compilers.cc, compilers.cxx, log=log)
        plugins[opencl.PLUGIN_SHARED] = plugin.shared
    key_data = {
        "source": file_sha256(source),
        "libs": {name: file_sha256(libs[name]) for name in RUNTIME_LIBS},
        "plugins": {name: file_sha256(path) for name, path in plugins.items()},
        "cc": compilers.version,
        "cc_path": os.path.realpath(compilers.cc),
        "cflags": list(runtime.cflags),
    }
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:12]
    base = cache_root() / "rpc-server" / TVM_VERSION
    final = base / f"{profile.triple}-{key}"
    if (final / INSTALL_MANIFEST).is_file():
        return ServerBundle(profile.triple, final, json.loads((final / INSTALL_MANIFEST).read_text()))
    with file_lock(base / f".{final.name}.lock"):
        if (final / INSTALL_MANIFEST).is_file():
            return ServerBundle(profile.triple, final, json.loads((final / INSTALL_MANIFEST).read_text()))
        _say(log, f"Building the RPC server for {profile.triple}")
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=base))
        try:
            for name, path in [*((n, libs[n]) for n in RUNTIME_LIBS), *plugins.items()]:
                shutil.copy2(path, staging / name)
                (staging / name).chmod(0o755)
            exe = staging / SERVER_PROGRAM
            cmd = [compilers.cc, "-std=c11", "-O2", "-Wall", "-Wextra", *runtime.cflags,
                   *[f"-I{d}" for d in runtime.include_dirs], "-o", str(exe), str(source), f"-L{staging}",
                   "-Wl,--no-as-needed", "-ltvm_runtime", "-ltvm_ffi", "-Wl,--as-needed", "-ldl",
                   "-Wl,-rpath,$ORIGIN", "-s"]
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
            if result.returncode != 0:
                raise ToolchainError(
                    f"Building the RPC server for {profile.triple} with {Path(compilers.cc).name} failed.",
                    "The last lines of the compiler output:\n" + _tail(result.stderr or result.stdout),
                )
            manifest = {
                "tvm_version": TVM_VERSION,
                "server_version": _server_version(source),
                "triple": profile.triple,
                "runtime_origin": runtime.origin,
                "files": {name: file_sha256(staging / name) for name in (*RUNTIME_LIBS, SERVER_PROGRAM, *plugins)},
            }
            (staging / INSTALL_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            staging.chmod(0o755)
            os.rename(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return ServerBundle(profile.triple, final, manifest)


# ---------------------------------------------------------------------------------------------
# install on the device


@dataclass(frozen=True)
class RemoteInstall:
    """What is installed on a device, and where."""

    device: str
    directory: str  # absolute path on the device
    triple: str
    tvm_version: str
    server_version: str
    uploaded: tuple[str, ...] = ()  # files sent by this deploy (empty: it was already there)
    kind: str = "edgepack"  # or "python" (TVM's own server, nothing installed)
    seconds: float = 0.0
    install_id: str = ""  # digest of install.json: a server started from older files is restarted

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"uploaded": list(self.uploaded)}


def _home(session: SSHSession) -> str:
    try:
        return session.sftp().normalize(".")
    except (OSError, paramiko.SSHException) as exc:
        raise DeviceUnreachableError(f"Cannot read the home directory of {session.endpoint.label} over SFTP ({exc}).",
                                     "Check that the device's sshd has the sftp subsystem enabled.") from None


def _abs(home: str, path: str) -> str:
    return path if path.startswith("/") else posixpath.normpath(posixpath.join(home, path))


def install_dir(device: Device, triple: str, home: str) -> str:
    """``~/.edgepack/<tvm-version>/<triple>`` on the device (absolute)."""
    return _abs(home, posixpath.join(device.remote_dir, TVM_VERSION, triple))


def run_dir(device: Device, home: str) -> str:
    return _abs(home, posixpath.join(device.remote_dir, RUN_DIR))


def _read_remote_text(session: SSHSession, path: str, limit: int = 1 << 20) -> str | None:
    try:
        with session.sftp().open(path, "r") as handle:
            return handle.read(limit).decode(errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        if getattr(exc, "errno", None) == 2 or "No such file" in str(exc):
            return None
        raise
    except (paramiko.SSHException, EOFError) as exc:
        raise DeviceUnreachableError(f"Reading {path} on {session.endpoint.label} failed ({exc}).",
                                     "Check the connection to the device.") from None


def _write_remote_text(session: SSHSession, path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    sftp = session.sftp()
    try:
        with sftp.open(tmp, "w") as handle:
            handle.write(text.encode())
        sftp.posix_rename(tmp, path)
    except (OSError, paramiko.SSHException, EOFError) as exc:
        raise DeployError(f"Cannot write {path} on {session.endpoint.label}: {exc}.",
                          "Check that the device's disk is not full and the directory is writable.") from None


def installed_manifest(session: SSHSession, device: Device, triple: str) -> dict[str, Any] | None:
    """The ``install.json`` of the device's install for ``triple`` (None: nothing installed)."""
    text = _read_remote_text(session, posixpath.join(install_dir(device, triple, _home(session)), INSTALL_MANIFEST))
    if text is None:
        return None
    try:
        data = json.loads(text)
        return data if isinstance(data, dict) else None
    except ValueError:
        return None


def _install_id(manifest: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]


def _install_complete(session: SSHSession, directory: str, manifest: dict[str, Any], bundle: ServerBundle) -> bool:
    if manifest != bundle.manifest:
        return False
    sftp = session.sftp()
    for name in bundle.manifest["files"]:
        try:
            remote = sftp.stat(posixpath.join(directory, name))
        except OSError:
            return False
        if remote.st_size != (bundle.directory / name).stat().st_size:
            return False
    return True


def deploy(session: SSHSession, device: Device, profile: Any = None, *, bundle: ServerBundle | None = None,
           progress: Progress | None = None) -> RemoteInstall:
    """Install the TVM runtime and the RPC server in ``~/.edgepack/<tvm-version>/<triple>/`` (idempotent).

    A second deploy uploads nothing: ``install.json`` (written last) and the file sizes say the
    install is complete. Files that differ are replaced atomically (temporary name + rename).
    """
    profile = _profile_for(device, profile)
    started = time.monotonic()
    home = _home(session)
    directory = install_dir(device, profile.triple, home)
    if _python_server(device) is not None:
        version = _python_tvm_version(session, device)
        return RemoteInstall(device.name, directory, profile.triple, version, "tvm.exec.rpc_server", (),
                             "python", time.monotonic() - started, f"python-{version}")
    bundle = bundle or ensure_server_bundle(profile, log=progress)
    current = installed_manifest(session, device, profile.triple)
    if current is not None and _install_complete(session, directory, current, bundle):
        return RemoteInstall(device.name, directory, profile.triple, bundle.manifest["tvm_version"],
                             bundle.manifest["server_version"], (), "edgepack", time.monotonic() - started,
                             _install_id(bundle.manifest))
    _say(progress, f"Installing the TVM runtime and RPC server on {device.name} ({directory})")
    uploaded = []
    try:
        session.makedirs(directory, 0o755)
        sftp = session.sftp()
        with contextlib.suppress(OSError):
            sftp.remove(posixpath.join(directory, INSTALL_MANIFEST))  # incomplete until rewritten
        for path in bundle.files:
            if session.upload(path, posixpath.join(directory, path.name), mode=0o755):
                uploaded.append(path.name)
    except RemoteCommandError as exc:
        raise DeployError(f"Installing on {device.name} failed: {exc.message}", exc.hint) from None
    except OSError as exc:
        raise DeployError(f"Installing on {device.name} failed: {exc}.",
                          f"Check that {directory} on the device is writable and the disk is not full.") from None
    _write_remote_text(session, posixpath.join(directory, INSTALL_MANIFEST),
                       json.dumps(bundle.manifest, indent=2, sort_keys=True) + "\n")
    return RemoteInstall(device.name, directory, profile.triple, bundle.manifest["tvm_version"],
                         bundle.manifest["server_version"], tuple(uploaded) or (INSTALL_MANIFEST,), "edgepack",
                         time.monotonic() - started, _install_id(bundle.manifest))


def _python_server(device: Device) -> str | None:
    """The Python interpreter of a device that runs TVM's own RPC server (``rpc_server = "python[:PATH]"``)."""
    kind = getattr(device, "rpc_server", "edgepack") or "edgepack"
    if kind == "edgepack":
        return None
    if kind == "python":
        return "python3"
    if kind.startswith("python:") and len(kind) > len("python:"):
        return kind[len("python:"):]
    raise DeviceError(f"Device {device.name} has rpc_server = {kind!r}, which edgepack does not know.",
                      'Use "edgepack" (the default, no Python needed on the device) or "python" / "python:/path/to/python".')


def _python_tvm_version(session: SSHSession, device: Device) -> str:
    python = _python_server(device)
    result = session.run([python, "-c", "import tvm; print(tvm.__version__)"], timeout=120)
    if result.rc != 0:
        raise DeployError(
            f"{device.name} is set to use TVM's Python RPC server, but `{python} -c 'import tvm'` fails there: "
            f"{_short(result.stderr or result.stdout)}",
            f"Install apache-tvm=={TVM_VERSION} for {python} on the device, or remove rpc_server from the inventory "
            "entry to use edgepack's own server (no Python needed).",
        )
    return result.stdout.strip()


# ---------------------------------------------------------------------------------------------
# the RPC server on the device


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


def _server_files(device: Device, home: str) -> dict[str, str]:
    base = run_dir(device, home)
    return {"dir": base, "pid": f"{base}/rpc.pid", "port": f"{base}/rpc.port", "log": f"{base}/rpc.log",
            "info": f"{base}/rpc.json", "work": f"{base}/work"}


def server_log_tail(session: SSHSession, device: Device, lines: int = 15) -> str:
    """The last lines of the device's RPC server log (empty when there is none)."""
    try:
        text = _read_remote_text(session, _server_files(device, _home(session))["log"], limit=4 << 20)
    except (RemoteError, OSError):
        return ""
    return _tail(text or "", lines)


def _pid_alive(session: SSHSession, pid: int, marker: str) -> bool:
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
    home = _home(session)
    files = _server_files(device, home)
    pid_text = (_read_remote_text(session, files["pid"]) or "").strip()
    stopped = False
    if pid_text.isdigit():
        pid = int(pid_text)
        script = (
            f"kill -TERM -{pid} 2>/dev/null || kill -TERM {pid} 2>/dev/null; kill -CONT -{pid} 2>/dev/null; i=0; "
            f"while kill -0 {pid} 2>/dev/null && [ $i -lt 30 ]; do sleep 0.2; i=$((i+1)); done; "
            f"kill -KILL -{pid} 2>/dev/null; kill -KILL {pid} 2>/dev/null; true"
        )
        stopped = _pid_alive(session, pid, "rpc_server")
        session.run(["sh", "-c", script], timeout=60)
    session.run(["rm", "-f", files["pid"], files["port"], files["info"]], timeout=30)
    return stopped


def _start_server(session: SSHSession, device: Device, profile: Any, install: RemoteInstall,
                  progress: Progress | None) -> ServerInfo:
    home = _home(session)
    files = _server_files(device, home)
    key = server_key(device, profile)
    session.makedirs(files["work"], 0o700)
    port_end = min(device.rpc_port + PORT_RANGE, 65536)
    python = _python_server(device)
    if python is None:
        argv = [f"{install.directory}/{SERVER_PROGRAM}", "--host", "127.0.0.1", "--port", str(device.rpc_port),
                "--port-end", str(port_end), "--key", key, "--workdir", files["work"], "--port-file", files["port"]]
        cd = install.directory
    else:
        argv = [python, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(device.rpc_port),
                "--port-end", str(port_end), "--key", key]
        cd = files["work"]
    command = " ".join(_q(a) for a in argv)
    script = (
        f"cd {_q(cd)} && rm -f {_q(files['port'])} {_q(files['info'])} && "
        f"{{ setsid {command} >{_q(files['log'])} 2>&1 </dev/null & echo $! >{_q(files['pid'])}; }}"
    )
    _say(progress, f"Starting the RPC server on {device.name} (127.0.0.1:{device.rpc_port} on the device)")
    session.run(["sh", "-c", script], timeout=60, check=True)
    pid_text = (_read_remote_text(session, files["pid"]) or "").strip()
    if not pid_text.isdigit():
        raise RPCServerError(f"The RPC server on {device.name} did not start (no pid).",
                             f"Run `{command}` on the device by hand to see why.")
    pid = int(pid_text)
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    port = None
    while time.monotonic() < deadline:
        if python is None:
            text = (_read_remote_text(session, files["port"]) or "").strip()
            if text.isdigit():
                port = int(text)
                break
        else:
            log = _read_remote_text(session, files["log"]) or ""
            found = [ln for ln in log.splitlines() if "bind to 127.0.0.1:" in ln]
            if found:
                port = int(found[-1].rsplit(":", 1)[1].strip())
                break
        if not _pid_alive(session, pid, "rpc_server"):
            break
        time.sleep(0.5)
    if port is None:
        log = server_log_tail(session, device)
        stop_rpc_server(session, device)
        raise RPCServerError(
            f"The RPC server on {device.name} did not start listening within {SERVER_START_TIMEOUT:g} s"
            + (f"; its log ends with: {_short(log, 600)}" if log else "."),
            f"Check that a port in {device.rpc_port}..{port_end - 1} is free on the device (or set another "
            "rpc_port for it in the inventory), and that the runtime runs there (`edgepack device check`).",
        )
    info = ServerInfo(pid, port, key, install.directory, _now(), install.install_id)
    _write_remote_text(session, files["info"], json.dumps(info.to_dict()) + "\n")
    return info


def ensure_rpc_server(session: SSHSession, device: Device, profile: Any, install: RemoteInstall, *,
                      busy_timeout: float = DEFAULT_BUSY_TIMEOUT, progress: Progress | None = None) -> ServerInfo:
    """A healthy RPC server on the device's loopback: the running one, or a fresh one.

    A server is reused when its process is alive, belongs to this install and key, and accepts
    connections. A dead, foreign or hung one is replaced; one that is busy serving another
    session (it has a session process) is waited for up to ``busy_timeout`` seconds.
    """
    profile = _profile_for(device, profile)
    files = _server_files(device, _home(session))
    key = server_key(device, profile)
    reason = None
    text = _read_remote_text(session, files["info"])
    info = None
    if text:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            info = ServerInfo(**{k: v for k, v in json.loads(text).items()
                                 if k in ServerInfo.__dataclass_fields__ and k not in ("reused", "restarted")})
    if info is None:
        reason = None if text is None else "unreadable server state"
    elif not _pid_alive(session, info.pid, "rpc_server"):
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
            _say(progress, f"{device.name} is busy with another session, waiting")
            time.sleep(2.0)
    if reason:
        _say(progress, f"Restarting the RPC server on {device.name}: {reason}")
    stop_rpc_server(session, device)
    return replace(_start_server(session, device, profile, install, progress), restarted=reason)


# ---------------------------------------------------------------------------------------------
# RPC sessions through a tunnel


class _Deadline(Exception):
    """Raised by SIGALRM inside a blocking TVM call that ran past its deadline."""


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Interrupt blocking TVM RPC calls after ``seconds`` (main thread only; TVM checks signals on EINTR)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise _Deadline()

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class DeviceConnection:
    """An open TVM RPC session with a device (from :func:`rpc_session`)."""

    device: Device
    profile: Any
    endpoint: SSHEndpoint
    install: RemoteInstall
    server: ServerInfo
    tunnel: LocalTunnel
    remote: Any  # tvm.rpc.RPCSession
    _ssh: SSHSession | None = field(default=None, repr=False)

    def ssh(self) -> SSHSession:
        """The SSH session to the device (reconnected if it dropped)."""
        if self._ssh is None or not self._ssh.alive:
            if self._ssh is not None:
                self._ssh.close()
            self._ssh = connect(self.endpoint)
        return self._ssh

    def log_tail(self, lines: int = 15) -> str:
        try:
            return server_log_tail(self.ssh(), self.device, lines)
        except EdgepackError:
            return ""

    def healthy(self) -> bool:
        """Whether the link and the server still stand (after an error, to tell a drop from a failure)."""
        if not self.tunnel.alive:
            return False
        try:
            return _pid_alive(self.ssh(), self.server.pid, "rpc_server")
        except EdgepackError:
            return False


def _tvm_connect(port: int, key: str, session_timeout: float, timeout: float):
    from tvm import rpc

    with _deadline(timeout):
        return rpc.connect("127.0.0.1", port, key=key, session_timeout=session_timeout)


@contextlib.contextmanager
def rpc_session(device: Device, profile: Any = None, *, known_hosts: Path | None = None,
                session_timeout: float = DEFAULT_SESSION_TIMEOUT, attempts: int = DEFAULT_ATTEMPTS,
                busy_timeout: float = DEFAULT_BUSY_TIMEOUT, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                progress: Progress | None = None) -> Iterator[DeviceConnection]:
    """Connect to the device's TVM RPC server through an SSH tunnel, setting everything up as needed.

    Deploys the runtime if needed, starts (or reuses, or restarts) the server on the device's
    loopback, forwards a local loopback port to it from a separate process, and connects TVM's
    RPC client. Setting up is retried ``attempts`` times when the connection drops. On exit the
    RPC session, the tunnel and the SSH connection are closed; the server keeps running.
    """
    profile = _profile_for(device, profile)
    endpoint = endpoint_for(device, known_hosts, connect_timeout=connect_timeout)
    conn = _open_connection(device, profile, endpoint, session_timeout=session_timeout, attempts=attempts,
                            busy_timeout=busy_timeout, progress=progress)
    try:
        yield conn
    finally:
        _close_connection(conn)


def _open_connection(device: Device, profile: Any, endpoint: SSHEndpoint, *, session_timeout: float, attempts: int,
                     busy_timeout: float, progress: Progress | None) -> DeviceConnection:
    last: EdgepackError | None = None
    for attempt in range(1, max(1, attempts) + 1):
        session = tunnel = None
        try:
            _say(progress, f"Connecting to {device.name} ({device.host}:{device.port})")
            session = connect(endpoint)
            install = deploy(session, device, profile, progress=progress)
            server = ensure_rpc_server(session, device, profile, install, busy_timeout=busy_timeout,
                                       progress=progress)
            tunnel = LocalTunnel(endpoint, server.port, connect_deadline=20.0)
            tunnel.start()
            try:
                remote = _tvm_connect(tunnel.local_port, server.key, session_timeout, timeout=60.0)
            except _Deadline:
                raise ConnectionLostError(
                    f"The RPC handshake with {device.name} did not finish within 60 s.",
                    "The device may be overloaded; try again.",
                ) from None
            except Exception as exc:  # noqa: BLE001 - TVM raises plain errors for refused handshakes
                raise ConnectionLostError(
                    f"Connecting TVM's RPC client to the server on {device.name} failed: {_short(exc)}",
                    "The connection dropped during the handshake; try again, and check `edgepack device check "
                    f"{device.name}`.",
                ) from None
            return DeviceConnection(device, profile, endpoint, install, server, tunnel, remote, session)
        except (HostKeyError, DeviceBusyError, DeployError, RPCServerError, ToolchainError):
            _close_quietly(session, tunnel)
            raise  # retrying does not help
        except DeviceUnreachableError as exc:
            _close_quietly(session, tunnel)
            if isinstance(exc, AuthenticationError):
                raise
            last = exc
        except RemoteCommandError as exc:
            _close_quietly(session, tunnel)
            last = exc
        if attempt < attempts:
            delay = min(2.0 * attempt, 8.0)
            _say(progress, f"{device.name}: {last.message.rstrip('.') if last else 'failed'}; retrying in "
                           f"{delay:g} s ({attempt}/{attempts})")
            time.sleep(delay)
    assert last is not None
    raise last


def _close_quietly(session: SSHSession | None, tunnel: LocalTunnel | None) -> None:
    if tunnel is not None:
        with contextlib.suppress(Exception):
            tunnel.close()
    if session is not None:
        with contextlib.suppress(Exception):
            session.close()


def _close_connection(conn: DeviceConnection) -> None:
    remote, conn.remote = conn.remote, None
    del remote
    with contextlib.suppress(Exception):
        gc.collect()  # remote objects hold the session's socket: free them while it still works
    _close_quietly(conn._ssh, conn.tunnel)
    conn._ssh = None


class _Dropped(Exception):
    """The connection died under an operation (internal: retried by the callers)."""


def run_remote_op(remote: Any, op: Callable[[Any], T], *, what: str, device_name: str, session_timeout: float,
                  healthy: Callable[[], bool], log_tail: Callable[[], str] = lambda: "") -> T:
    """Run ``op(remote)`` and turn what can go wrong into clear errors.

    A hang past the session timeout is a :class:`RemoteTimeoutError`; a TVM error while the device
    and its server are still up (``healthy()``) is the model's own (:class:`RemoteRunError`);
    anything else means the link dropped (``_Dropped``, for the caller to retry).
    """
    try:
        with _deadline(session_timeout + 60.0):
            return op(remote)
    except EdgepackError:
        raise
    except _Deadline:
        raise RemoteTimeoutError(
            f"{what} on {device_name} did not finish within {session_timeout + 60:g} s.",
            "The device may hang or be far slower than expected; raise --timeout, or check it "
            f"with `edgepack device check {device_name}`.",
        ) from None
    except Exception as exc:  # noqa: BLE001 - TVM errors: tell a drop from a real failure
        message = _short(exc, 500)
        if "RPCSessionTimeoutError" in message:
            raise RemoteTimeoutError(
                f"{what} on {device_name} ran past the session timeout of {session_timeout:g} s.",
                "Raise --timeout (benchmarks under emulation are slow), or use fewer --repeat.",
            ) from None
        if healthy():
            log = log_tail()
            raise RemoteRunError(
                f"{what} failed on {device_name}: {message}"
                + (f" The RPC server log on the device ends with: {_short(log, 600)}" if log else ""),
                "The device and its RPC server are up, so this is the model or the runtime failing "
                "there; check that the build's profile matches the device (`edgepack device check`).",
            ) from None
        raise _Dropped(_drop_reason(message)) from None


def _drop_reason(message: str) -> str:
    """TVM's words for a dead RPC link, in ours."""
    lowered = message.lower()
    if "kshutdown" in lowered or "closed" in lowered or "broken pipe" in lowered or "reset by peer" in lowered \
            or "eof" in lowered:
        return "the RPC connection closed unexpectedly"
    return message


def run_with_retries(device: Device, op: Callable[[Any], T], *, what: str, profile: Any = None,
                     known_hosts: Path | None = None, attempts: int = DEFAULT_ATTEMPTS,
                     reconnect_window: float = DEFAULT_RECONNECT_WINDOW,
                     session_timeout: float = DEFAULT_SESSION_TIMEOUT, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
                     progress: Progress | None = None) -> T:
    """Run ``op(remote)`` in a fresh :func:`rpc_session`; when the connection drops, reconnect and run it again.

    ``op`` gets TVM's ``RPCSession`` and must be repeatable (upload, load, run). Setting up the first
    connection is tried ``attempts`` times. After a drop (link lost, device rebooting, server killed)
    the device gets ``reconnect_window`` seconds to come back, and ``op`` runs again from the start;
    at most ``attempts`` drops are tolerated. A failure while the device and its server stay up is
    the model's own (:class:`RemoteRunError`, not retried). Giving up raises a
    :class:`ConnectionLostError` that says what happened.
    """
    profile = _profile_for(device, profile)
    drops: list[str] = []
    window_end = 0.0
    delay = 1.0
    while True:
        try:
            with rpc_session(device, profile, known_hosts=known_hosts, session_timeout=session_timeout,
                             attempts=1 if drops else attempts, busy_timeout=busy_timeout,
                             progress=progress) as conn:
                return run_remote_op(conn.remote, op, what=what, device_name=device.name,
                                     session_timeout=session_timeout, healthy=conn.healthy, log_tail=conn.log_tail)
        except _Dropped as exc:
            drops.append(str(exc))
            if len(drops) >= max(1, attempts):
                raise ConnectionLostError(
                    f"The connection to {device.name} dropped {len(drops)} times during {what.lower()}; giving up "
                    f"(last: {_short(drops[-1], 300)}).",
                    f"Check the device's network and power, and its RPC server with `edgepack device check "
                    f"{device.name}`.",
                ) from None
            window_end = time.monotonic() + reconnect_window
            delay = 1.0
            _say(progress, f"Lost the connection to {device.name} during {what.lower()} ({drops[-1]}); "
                           f"reconnecting for up to {reconnect_window:g} s")
        except (DeviceUnreachableError, RemoteCommandError) as exc:
            if not drops or isinstance(exc, AuthenticationError):
                raise
            if time.monotonic() + delay > window_end:
                raise ConnectionLostError(
                    f"{device.name} dropped out during {what.lower()} ({_short(drops[-1], 200)}) and could not be "
                    f"reached again within {reconnect_window:g} s: {exc.message.rstrip('.')}.",
                    f"The device may have rebooted, lost power or left the network. Check it with `edgepack device "
                    f"check {device.name}` and run the command again (--reconnect-window gives a rebooting device "
                    "more time).",
                ) from None
            _say(progress, f"{device.name} is not back yet ({_short(exc.message, 120).rstrip('.')}); retrying")
        time.sleep(delay)
        delay = min(delay * 2, 8.0)


# ---------------------------------------------------------------------------------------------
# running and timing builds


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


def _load_remote(remote: Any, library: Path):
    """Upload the model library into the RPC session's work directory, load it, open a Relax VM on it."""
    from tvm import relax

    name = f"model-{file_sha256(library)[:12]}.so"
    remote.upload(bytearray(library.read_bytes()), name)
    lib = remote.load_module(name)
    dev = remote.cpu()
    return relax.VirtualMachine(lib, dev), dev


def model_runner(build_dir: Path, manifest, inputs: dict[str, np.ndarray], *, label: str = "the device",
                 progress: Progress | None = None) -> Callable[[Any], list[np.ndarray]]:
    """The operation that runs a build once in an RPC session and returns its outputs (manifest order)."""
    import tvm

    from edgepack.validation import flatten_outputs

    library = _device_library(Path(build_dir), manifest)

    def op(remote: Any) -> list[np.ndarray]:
        _say(progress, f"Running {Path(build_dir).name} on {label}")
        vm, dev = _load_remote(remote, library)
        args = [tvm.runtime.tensor(np.ascontiguousarray(inputs[spec.name]), dev) for spec in manifest.inputs]
        outputs = [np.array(o, copy=True) for o in flatten_outputs(vm["main"](*args))]
        del vm, args
        return outputs

    return op


def model_timer(build_dir: Path, manifest, *, repeat: int, number: int, warmup: int, label: str = "the device",
                progress: Progress | None = None) -> Callable[[Any], list[float]]:
    """The operation that times ``main`` of a build in an RPC session; returns ``repeat`` samples in ms."""
    import tvm

    from edgepack.validation import random_inputs

    if repeat < 1 or number < 1 or warmup < 0:
        raise EdgepackError("--repeat and --number must be at least 1, and --warmup at least 0.")
    library = _device_library(Path(build_dir), manifest)
    feeds = random_inputs(manifest.inputs)

    def op(remote: Any) -> list[float]:
        _say(progress, f"Loading {Path(build_dir).name} on {label}")
        vm, dev = _load_remote(remote, library)
        args = [tvm.runtime.tensor(feeds[spec.name], dev) for spec in manifest.inputs]
        if warmup:
            _say(progress, f"Warming up on {label} ({warmup} run{'s' * (warmup != 1)})")
            for _ in range(warmup):
                vm["main"](*args)
            dev.sync()
        _say(progress, f"Timing on {label}: {repeat} x {number} run{'s' * (number != 1)}")
        vm.set_input("main", *args)
        timer = vm.time_evaluator("invoke_stateful", dev, number=number, repeat=repeat)
        result = timer("main")
        samples = [float(s) * 1000.0 for s in result.results]
        del vm, args, timer, result
        return samples

    return op


def run_on_device(build_dir: Path, manifest, inputs: dict[str, np.ndarray], device: Device, *,
                  known_hosts: Path | None = None, attempts: int = DEFAULT_ATTEMPTS,
                  reconnect_window: float = DEFAULT_RECONNECT_WINDOW, session_timeout: float = DEFAULT_SESSION_TIMEOUT,
                  progress: Progress | None = None) -> list[np.ndarray]:
    """A :data:`~edgepack.validation.BuildRunner` for a real device: run ``device/model.so`` there.

    Uploads the library over RPC, loads it into the device's Relax VM, sends the inputs, runs
    ``main`` and brings the outputs back (in manifest order).
    """
    build_dir = Path(build_dir)
    profile = _profile_for(device)
    check_build_matches(manifest, device, profile)
    op = model_runner(build_dir, manifest, inputs, label=device.name, progress=progress)
    return run_with_retries(device, op, what="Running the model", profile=profile, known_hosts=known_hosts,
                            attempts=attempts, reconnect_window=reconnect_window, session_timeout=session_timeout,
                            progress=progress)


@dataclass(frozen=True)
class BenchResult:
    """Latency of a build on one device (TVM's remote ``time_evaluator``)."""

    build_dir: str
    device: str
    profile: str
    host: str
    repeat: int
    number: int  # runs averaged into each sample
    warmup: int
    samples_ms: tuple[float, ...]
    seconds: float  # wall time of the whole benchmark, connection included
    via: str = "ssh"  # "ssh": a direct tunnel; "tracker": a device handed out by the farm's tracker

    def _stat(self, fn) -> float:
        return float(fn(np.asarray(self.samples_ms))) if self.samples_ms else float("nan")

    @property
    def mean_ms(self) -> float:
        return self._stat(np.mean)

    @property
    def median_ms(self) -> float:
        return self._stat(np.median)

    @property
    def p90_ms(self) -> float:
        return self._stat(lambda a: np.percentile(a, 90))

    @property
    def p99_ms(self) -> float:
        return self._stat(lambda a: np.percentile(a, 99))

    @property
    def min_ms(self) -> float:
        return self._stat(np.min)

    @property
    def max_ms(self) -> float:
        return self._stat(np.max)

    @property
    def std_ms(self) -> float:
        return self._stat(np.std)

    def to_dict(self) -> dict[str, Any]:
        stats = {k: round(getattr(self, k), 4) for k in
                 ("mean_ms", "median_ms", "p90_ms", "p99_ms", "min_ms", "max_ms", "std_ms")}
        return {
            "build_dir": self.build_dir, "device": self.device, "profile": self.profile, "host": self.host,
            "via": self.via, "repeat": self.repeat, "number": self.number, "warmup": self.warmup, **stats,
            "samples_ms": [round(s, 4) for s in self.samples_ms], "seconds": round(self.seconds, 3),
        }


def bench_on_device(build_dir: Path | str, device: Device, repeat: int = 50, number: int = 1, warmup: int = 1, *,
                    known_hosts: Path | None = None, attempts: int = DEFAULT_ATTEMPTS,
                    reconnect_window: float = DEFAULT_RECONNECT_WINDOW, session_timeout: float = DEFAULT_SESSION_TIMEOUT,
                    progress: Progress | None = None) -> BenchResult:
    """Time ``main`` of a build on the device: ``repeat`` samples, each the mean of ``number`` runs.

    Inputs are seeded random tensors sent to the device once; ``warmup`` untimed runs come first.
    Timing happens on the device (TVM's ``time_evaluator``), so the link's latency is not in it.
    """
    from edgepack.manifest import read_manifest

    build_dir = Path(build_dir)
    manifest = read_manifest(build_dir)
    profile = _profile_for(device)
    check_build_matches(manifest, device, profile)
    op = model_timer(build_dir, manifest, repeat=repeat, number=number, warmup=warmup, label=device.name,
                     progress=progress)
    started = time.monotonic()
    samples = run_with_retries(device, op, what="Benchmarking", profile=profile, known_hosts=known_hosts,
                               attempts=attempts, reconnect_window=reconnect_window, session_timeout=session_timeout,
                               progress=progress)
    return BenchResult(str(build_dir), device.name, profile.name, device.host, repeat, number, warmup,
                       tuple(samples), time.monotonic() - started)


# ---------------------------------------------------------------------------------------------
# checking a device


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
    profile = _profile_for(device, profile)
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
        _say(progress, f"Connecting to {device.name} ({device.host}:{device.port})")
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
            fail("arch", DeviceError(f"`uname -m` failed on {device.name}: {_short(uname.stderr)}",
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
            current = None if _python_server(device) else installed_manifest(session, device, profile.triple)
            if install or _python_server(device):
                _say(progress, f"Checking the runtime on {device.name}")
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
                result = RemoteInstall(device.name, install_dir(device, profile.triple, _home(session)),
                                       profile.triple, current.get("tvm_version", "?"),
                                       current.get("server_version", "?"))
        except EdgepackError as exc:
            fail("runtime", exc)
            return _finish(device, profile, items, found, problem, started)
        session.close()
        session = None

        _say(progress, f"RPC round trip with {device.name}")
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
    """Send a tensor to the device, compute on it there, bring it back."""
    import tvm

    with _deadline(120.0):
        dev = conn.remote.cpu()
        if not dev.exist:
            raise RPCServerError(f"The RPC server on {conn.device.name} has no CPU device.", "")
        data = np.arange(4096, dtype=np.float32)
        remote_tensor = tvm.runtime.tensor(data, dev)
        back = remote_tensor.numpy()
        del remote_tensor, dev
    if not np.array_equal(back, data):
        raise RPCServerError(f"A tensor sent to {conn.device.name} came back different.",
                             "The RPC server or the link corrupts data; reinstall with `edgepack device check`.")
    return "16 KiB tensor sent and read back"


def _finish(device: Device, profile: Any, items: dict[str, CheckItem], found: dict[str, str | None],
            problem: list[EdgepackError], started: float) -> DeviceCheck:
    ordered = []
    for name in _CHECK_ORDER:
        ordered.append(items.get(name) or CheckItem(name, None, "not checked"))
    first = problem[0] if problem else None
    return DeviceCheck(device.name, profile.name, tuple(ordered), found["arch"], found["runtime"], found["rpc"],
                       first.message if first else "", first.hint if first else "", _now(),
                       time.monotonic() - started)
