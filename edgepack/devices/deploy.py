"""Installing on a device over SFTP: the TVM runtime, edgepack's RPC server and the plug-ins the profile's
backend needs, in ``~/.edgepack/<tvm-version>/<triple>/`` (idempotent: a second deploy uploads nothing).

How a device is reached, and what is installed where (nothing on the device listens on its network)::

    host                                              device (SSH only)
    ----                                              -----------------
    deploy()       -- SFTP -->  ~/.edgepack/<tvm-version>/<triple>/{libtvm_runtime.so, libtvm_ffi.so,
                                                 [libtvm_opencl.so ...], edgepack_rpc_server, install.json}
    server.ensure_rpc_server() -- ssh: setsid ./edgepack_rpc_server --host 127.0.0.1 --port P ... -->
    LocalTunnel (own process) 127.0.0.1:L  == SSH direct-tcpip ==>  127.0.0.1:P on the device
    tvm.rpc.connect("127.0.0.1", L)  -> upload model.so, load it, Relax VM, time_evaluator

The RPC server is ours (``runtimes/rpc-server``, plain C over the official runtime): the device needs no
Python. A device with TVM's Python can use ``rpc_server = "python"`` (inventory) to run
``python3 -m tvm.exec.rpc_server`` instead; then nothing is installed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import paramiko

from edgepack.backends import backend_for
from edgepack.devices.errors import DeployError, DeviceError, DeviceUnreachableError, RemoteCommandError
from edgepack.devices.inventory import Device, device_profile
from edgepack.devices.ssh import (
    DEFAULT_CONNECT_TIMEOUT,
    HostKey,
    SSHEndpoint,
    SSHSession,
    default_known_hosts_path,
    known_host_keys,
    scan_host_key,
    trust_host_key,
)
from edgepack.profiles import Profile, get_profile
from edgepack.progress import Progress
from edgepack.text import short
from edgepack.toolchain.compilers import find_compilers
from edgepack.toolchain.rpc_server import INSTALL_MANIFEST, ServerBundle, server_bundle
from edgepack.toolchain.tvm_runtime import ensure_target_runtime
from edgepack.versions import TVM_VERSION

RUN_DIR = "run"  # below device.remote_dir: pid/port/log of the running server, session work dirs


def say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


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



def ensure_server_bundle(profile: Profile | str, *, log: Progress | None = None) -> ServerBundle:
    """The runtime, RPC server and backend plug-ins for ``profile``'s triple, cross-built once and cached."""
    profile = get_profile(profile) if isinstance(profile, str) else profile
    compilers = find_compilers(profile)
    runtime = ensure_target_runtime(profile.triple, compilers.cc, compilers.cxx, need_static=False, log=log)
    plugins = backend_for(profile).rpc_server_files(profile.triple, compilers, log=log)
    return server_bundle(profile.triple, compilers.cc, runtime, plugins, log=log)


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


def home_dir(session: SSHSession) -> str:
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


def read_remote_text(session: SSHSession, path: str, limit: int = 1 << 20) -> str | None:
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


def write_remote_text(session: SSHSession, path: str, text: str) -> None:
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
    text = read_remote_text(session, posixpath.join(install_dir(device, triple, home_dir(session)), INSTALL_MANIFEST))
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
    profile = device_profile(device, profile)
    started = time.monotonic()
    home = home_dir(session)
    directory = install_dir(device, profile.triple, home)
    if python_server(device) is not None:
        version = _python_tvm_version(session, device)
        return RemoteInstall(device.name, directory, profile.triple, version, "tvm.exec.rpc_server", (),
                             "python", time.monotonic() - started, f"python-{version}")
    bundle = bundle or ensure_server_bundle(profile, log=progress)
    current = installed_manifest(session, device, profile.triple)
    if current is not None and _install_complete(session, directory, current, bundle):
        return RemoteInstall(device.name, directory, profile.triple, bundle.manifest["tvm_version"],
                             bundle.manifest["server_version"], (), "edgepack", time.monotonic() - started,
                             _install_id(bundle.manifest))
    say(progress, f"Installing the TVM runtime and RPC server on {device.name} ({directory})")
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
    write_remote_text(session, posixpath.join(directory, INSTALL_MANIFEST),
                       json.dumps(bundle.manifest, indent=2, sort_keys=True) + "\n")
    return RemoteInstall(device.name, directory, profile.triple, bundle.manifest["tvm_version"],
                         bundle.manifest["server_version"], tuple(uploaded) or (INSTALL_MANIFEST,), "edgepack",
                         time.monotonic() - started, _install_id(bundle.manifest))


def python_server(device: Device) -> str | None:
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
    python = python_server(device)
    result = session.run([python, "-c", "import tvm; print(tvm.__version__)"], timeout=120)
    if result.rc != 0:
        raise DeployError(
            f"{device.name} is set to use TVM's Python RPC server, but `{python} -c 'import tvm'` fails there: "
            f"{short(result.stderr or result.stdout)}",
            f"Install apache-tvm=={TVM_VERSION} for {python} on the device, or remove rpc_server from the inventory "
            "entry to use edgepack's own server (no Python needed).",
        )
    return result.stdout.strip()


