"""SSH to devices: strict host keys, quoted commands, atomic uploads, and local port forwards.

Everything is explicit: an :class:`SSHEndpoint` says where to go, which key to use and which
known-hosts file to trust; there is no global state and no ``~/.ssh/known_hosts`` fallback.

* Host keys are checked strictly (paramiko ``RejectPolicy`` semantics): an unknown key raises
  :class:`UnknownHostKeyError` (with its ``SHA256:`` fingerprint), a changed key raises
  :class:`ChangedHostKeyError`. :func:`scan_host_key` + :func:`trust_host_key` add a key on purpose.
* :meth:`SSHSession.run` takes an argument list and quotes every argument with :func:`shlex.quote`:
  nothing in an argument is interpreted by the device's shell.
* :meth:`SSHSession.upload` is atomic (temporary name + rename) and skips files already there.
* :class:`LocalTunnel` forwards a loopback port here to a port on the device's loopback through an
  SSH ``direct-tcpip`` channel, from a separate process: TVM's RPC client does blocking I/O that
  holds the GIL, so a forwarder in the same process deadlocks.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import logging
import os
import posixpath
import select
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple, Self

import paramiko

from edgepack.devices.errors import (
    ERROR_TYPES,
    AuthenticationError,
    ChangedHostKeyError,
    DeviceUnreachableError,
    HostKeyError,
    RemoteCommandError,
    RemoteTimeoutError,
    TunnelError,
    UnknownHostKeyError,
)
from edgepack.errors import EdgepackError
from edgepack.files import file_sha256
from edgepack.paths import config_root

# paramiko logs failed handshakes with tracebacks from its transport thread; without a handler of
# its own they reach stderr through logging's last resort. Our errors say it better; an application
# that configures logging still receives paramiko's records.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

DEFAULT_CONNECT_TIMEOUT = 15.0
DEFAULT_COMMAND_TIMEOUT = 120.0
DEFAULT_KEEPALIVE = 15


def default_known_hosts_path() -> Path:
    """edgepack's own known hosts file (``$XDG_CONFIG_HOME/edgepack/known_hosts``)."""
    return config_root() / "known_hosts"


# ---------------------------------------------------------------------------------------------
# endpoints and keys


@dataclass(frozen=True)
class SSHEndpoint:
    """Where a device is and how we trust it."""

    host: str
    port: int
    user: str
    key_path: Path | None
    known_hosts: Path
    name: str | None = None  # the device's name in the inventory, for messages
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    keepalive: int = DEFAULT_KEEPALIVE  # seconds between SSH keepalives; 0 disables

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def label(self) -> str:
        return self.name or f"{self.user}@{self.address}"

    @property
    def described(self) -> str:
        """``name (host:port)``, or ``user@host:port`` for an unnamed endpoint (for messages)."""
        return f"{self.name} ({self.address})" if self.name else f"{self.user}@{self.address}"

    @property
    def known_hosts_name(self) -> str:
        return known_hosts_name(self.host, self.port)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["key_path"] = str(self.key_path) if self.key_path else None
        data["known_hosts"] = str(self.known_hosts)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SSHEndpoint:
        fields = dict(data)
        fields["key_path"] = Path(fields["key_path"]) if fields.get("key_path") else None
        fields["known_hosts"] = Path(fields["known_hosts"])
        return cls(**fields)


class HostKey(NamedTuple):
    """A host public key: ``(key_type, base64, sha256_fingerprint)``."""

    key_type: str
    base64: str
    fingerprint: str

    @classmethod
    def from_pkey(cls, key: paramiko.PKey) -> HostKey:
        return cls(key.get_name(), key.get_base64(), fingerprint_sha256(key))

    @classmethod
    def from_line(cls, line: str) -> HostKey:
        """Parse ``"key_type base64"`` (as in a .pub file or farm.json)."""
        parts = line.split()
        if len(parts) < 2:
            raise ValueError(f"not a public key line: {line!r}")
        return cls.from_pkey(paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1])))

    def to_pkey(self) -> paramiko.PKey:
        return paramiko.PKey.from_type_string(self.key_type, base64.b64decode(self.base64))


class CommandResult(NamedTuple):
    rc: int
    stdout: str
    stderr: str


def fingerprint_sha256(key: paramiko.PKey) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    """The host field OpenSSH (and paramiko) use: ``host`` for port 22, else ``[host]:port``."""
    return host if port == 22 else f"[{host}]:{port}"


def quote_argv(argv: Sequence[str | os.PathLike[str]]) -> str:
    """One shell command line in which every argument arrives verbatim."""
    if isinstance(argv, (str, bytes)):
        raise TypeError("argv must be a list of arguments, not one string")
    if len(argv) == 0:
        raise ValueError("argv is empty")
    parts = []
    for arg in argv:
        if isinstance(arg, os.PathLike):
            arg = os.fspath(arg)
        if not isinstance(arg, str):
            raise TypeError(f"arguments must be str or paths, got {type(arg).__name__}: {arg!r}")
        if "\0" in arg:
            raise ValueError("arguments cannot contain NUL characters")
        parts.append(shlex.quote(arg))
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------
# known hosts


def _load_known_hosts(path: Path) -> paramiko.HostKeys:
    keys = paramiko.HostKeys()
    if path.exists():
        try:
            keys.load(str(path))
        except (OSError, paramiko.SSHException, paramiko.hostkeys.InvalidHostKey, ValueError) as exc:
            raise HostKeyError(f"Cannot read the known hosts file {path}: {exc}.",
                               "Fix or remove the malformed line (each line: HOST KEYTYPE BASE64).") from exc
    return keys


def known_host_keys(known_hosts: Path, host: str, port: int = 22) -> list[HostKey]:
    """The keys trusted for ``host:port`` in ``known_hosts`` (empty when none)."""
    entry = _load_known_hosts(Path(known_hosts)).lookup(known_hosts_name(host, port))
    if entry is None:
        return []
    return [HostKey.from_pkey(key) for key in entry.values()]


def _line_matches(line: str, name: str) -> bool:
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return False
    fields = stripped.split()
    if fields[0].startswith("@"):  # @cert-authority / @revoked markers
        fields = fields[1:]
        if not fields:
            return False
    for pattern in fields[0].split(","):
        if pattern.startswith("|1|"):
            try:
                salt = pattern.split("|")[2]
                if paramiko.HostKeys.hash_host(name, salt) == pattern:
                    return True
            except (IndexError, ValueError):
                continue
        elif pattern == name:
            return True
    return False


def _write_known_hosts(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write("".join(line if line.endswith("\n") else line + "\n" for line in lines))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def trust_host_key(endpoint: SSHEndpoint, key: HostKey) -> Path:
    """Record ``key`` as the one key of ``endpoint`` in its known hosts file (atomically).

    Older entries for the same host and port are replaced; other hosts' lines are kept as they are.
    """
    path = Path(endpoint.known_hosts)
    name = endpoint.known_hosts_name
    lines = path.read_text().splitlines() if path.exists() else []
    kept = [line for line in lines if not _line_matches(line, name)]
    kept.append(f"{name} {key.key_type} {key.base64}")
    _write_known_hosts(path, kept)
    return path


def forget_host_key(known_hosts: Path, host: str, port: int = 22) -> int:
    """Remove every entry for ``host:port``; returns how many lines were removed."""
    path = Path(known_hosts)
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    name = known_hosts_name(host, port)
    kept = [line for line in lines if not _line_matches(line, name)]
    if len(kept) != len(lines):
        _write_known_hosts(path, kept)
    return len(lines) - len(kept)


def _trust_command(endpoint: SSHEndpoint) -> str:
    return f"edgepack device trust {endpoint.name or endpoint.host}"


def _unknown_key_error(endpoint: SSHEndpoint, key: HostKey) -> UnknownHostKeyError:
    return UnknownHostKeyError(
        f"The SSH host key of {endpoint.described} is not trusted yet: "
        f"{key.key_type} {key.fingerprint}.",
        f"Compare that fingerprint with the device's own (on the device: `ssh-keygen -lf "
        f"/etc/ssh/ssh_host_{key.key_type.removeprefix('ssh-').split('-')[0]}_key.pub`), then trust it with "
        f"`{_trust_command(endpoint)}` (known hosts file: {endpoint.known_hosts}).",
        fingerprint=key.fingerprint, key_type=key.key_type,
    )


def _changed_key_error(endpoint: SSHEndpoint, got: HostKey, expected: list[HostKey]) -> ChangedHostKeyError:
    expected_fp = ", ".join(k.fingerprint for k in expected) or "?"
    return ChangedHostKeyError(
        f"The SSH host key of {endpoint.described} has CHANGED: {endpoint.known_hosts} trusts "
        f"{expected_fp}, the device now presents {got.key_type} {got.fingerprint}. Refusing to connect.",
        "Someone may be intercepting the connection (a man-in-the-middle attack), or the device was reinstalled "
        "or re-keyed. Only if you know why it changed: remove the old key with `ssh-keygen -R "
        f"'{endpoint.known_hosts_name}' -f {endpoint.known_hosts}` and trust the new one with "
        f"`{_trust_command(endpoint)}`.",
        fingerprint=got.fingerprint, expected_fingerprint=expected_fp,
    )


def _unreachable(endpoint: SSHEndpoint, what: str, exc: BaseException | None = None) -> DeviceUnreachableError:
    detail = f" ({exc})" if exc is not None and str(exc) else ""
    return DeviceUnreachableError(
        f"Cannot reach {endpoint.described}: {what}{detail}.",
        f"Check that the device is powered on and on the network, that sshd listens on port {endpoint.port} "
        f"(try `ssh -p {endpoint.port} {endpoint.user}@{endpoint.host}`), and that host and port in the device "
        f"inventory are right.",
    )


def _map_socket_error(endpoint: SSHEndpoint, exc: BaseException) -> DeviceUnreachableError:
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        exc = next(iter(exc.errors.values()))  # one error per address tried; the first tells
    if isinstance(exc, socket.gaierror):
        return _unreachable(endpoint, f"the host name {endpoint.host!r} does not resolve", exc)
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return _unreachable(endpoint, f"no answer within {endpoint.connect_timeout:g} s")
    if isinstance(exc, ConnectionRefusedError):
        return _unreachable(endpoint, "connection refused (nothing listens there: is sshd running?)")
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return _unreachable(endpoint, "no route to the host", exc)
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return _unreachable(endpoint, "connection refused (nothing listens there: is sshd running?)")
    return _unreachable(endpoint, type(exc).__name__, exc)


def scan_host_key(host: str, port: int = 22, timeout: float = DEFAULT_CONNECT_TIMEOUT,
                  key_type: str | None = None) -> HostKey:
    """Ask ``host:port`` for its SSH host key without authenticating (like ``ssh-keyscan``)."""
    endpoint = SSHEndpoint(host, port, "", None, Path(os.devnull), connect_timeout=timeout)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise _map_socket_error(endpoint, exc) from None
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = timeout
        transport.handshake_timeout = timeout
        if key_type:
            transport.get_security_options().key_types = [key_type]
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
        return HostKey.from_pkey(key)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise _unreachable(endpoint, "SSH handshake failed", exc) from None
    finally:
        transport.close()
        sock.close()


# ---------------------------------------------------------------------------------------------
# sessions


class _StrictPolicy(paramiko.MissingHostKeyPolicy):
    """RejectPolicy that says which key was refused."""

    def __init__(self, endpoint: SSHEndpoint) -> None:
        self.endpoint = endpoint

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise _unknown_key_error(self.endpoint, HostKey.from_pkey(key))


def connect(endpoint: SSHEndpoint) -> SSHSession:
    """Open an SSH session with strict host key checking; errors are :class:`RemoteError` subclasses."""
    known_hosts = Path(endpoint.known_hosts)
    _load_known_hosts(known_hosts)  # a malformed file is a clear error, not a paramiko traceback
    client = paramiko.SSHClient()
    # only the endpoint's known hosts file counts: no system host keys; the policy never saves keys
    if known_hosts.exists():
        client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(_StrictPolicy(endpoint))
    key_filename = str(Path(endpoint.key_path).expanduser()) if endpoint.key_path else None
    pkey = _load_private_key(endpoint, key_filename) if key_filename else None
    try:
        client.connect(
            hostname=endpoint.host, port=endpoint.port, username=endpoint.user, pkey=pkey,
            timeout=endpoint.connect_timeout, banner_timeout=endpoint.connect_timeout,
            auth_timeout=endpoint.connect_timeout, channel_timeout=endpoint.connect_timeout,
            allow_agent=key_filename is None, look_for_keys=key_filename is None,
        )
    except EdgepackError:
        client.close()
        raise
    except paramiko.BadHostKeyException as exc:
        client.close()
        expected = known_host_keys(endpoint.known_hosts, endpoint.host, endpoint.port)
        raise _changed_key_error(endpoint, HostKey.from_pkey(exc.key), expected) from None
    except paramiko.AuthenticationException as exc:
        client.close()
        raise AuthenticationError(
            f"{endpoint.described} refused our SSH key for user {endpoint.user!r} ({exc}).",
            f"Add the public key of {key_filename or 'your SSH agent key'} to ~{endpoint.user}/.ssh/authorized_keys "
            f"on the device (e.g. `ssh-copy-id -i {key_filename or '~/.ssh/id_ed25519'} -p {endpoint.port} "
            f"{endpoint.user}@{endpoint.host}`), and check the user name.",
        ) from None
    except (OSError, paramiko.ssh_exception.NoValidConnectionsError) as exc:
        client.close()
        raise _map_socket_error(endpoint, exc) from None
    except (paramiko.SSHException, EOFError) as exc:
        client.close()
        raise _unreachable(endpoint, "SSH handshake failed", exc) from None
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        client.close()
        raise _unreachable(endpoint, "the SSH connection closed right after login")
    if endpoint.keepalive > 0:
        transport.set_keepalive(endpoint.keepalive)
    return SSHSession(endpoint, client)


def _load_private_key(endpoint: SSHEndpoint, path: str) -> paramiko.PKey:
    if not Path(path).is_file():
        raise AuthenticationError(f"The SSH key {path} for {endpoint.label} does not exist.",
                                  "Point the device's `key` to an existing private key file.")
    try:
        return paramiko.PKey.from_path(path)
    except paramiko.PasswordRequiredException:
        raise AuthenticationError(
            f"The SSH key {path} for {endpoint.label} is protected by a passphrase.",
            "Use a key without a passphrase for devices, or load it into ssh-agent and leave `key` unset.",
        ) from None
    except (paramiko.SSHException, OSError, ValueError, TypeError) as exc:
        raise AuthenticationError(f"Cannot read the SSH key {path} for {endpoint.label}: {exc}.",
                                  "Use an OpenSSH or PEM private key (ed25519, ecdsa or rsa).") from None


class SSHSession:
    """An authenticated SSH connection to one device (see :func:`connect`)."""

    def __init__(self, endpoint: SSHEndpoint, client: paramiko.SSHClient) -> None:
        self.endpoint = endpoint
        self._client = client
        self._sftp: paramiko.SFTPClient | None = None

    # --- lifecycle

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sftp is not None:
            with contextlib.suppress(Exception):  # closing a dead connection
                self._sftp.close()
            self._sftp = None
        self._client.close()

    @property
    def alive(self) -> bool:
        transport = self._client.get_transport()
        return transport is not None and transport.is_active()

    def _transport(self) -> paramiko.Transport:
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise _unreachable(self.endpoint, "the SSH connection was lost")
        return transport

    # --- commands

    def run(self, argv: Sequence[str | os.PathLike[str]], timeout: float = DEFAULT_COMMAND_TIMEOUT, *,
            check: bool = False, input: bytes | str | None = None) -> CommandResult:
        """Run ``argv`` on the device (every argument quoted); wait at most ``timeout`` seconds.

        Returns ``CommandResult(rc, stdout, stderr)``; with ``check=True`` a non-zero exit raises
        :class:`RemoteCommandError`. A command past its timeout raises :class:`RemoteTimeoutError`
        (its channel is closed; a process that ignores the hang-up may keep running on the device).
        """
        command = quote_argv(argv)
        transport = self._transport()
        try:
            channel = transport.open_session(timeout=self.endpoint.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise _unreachable(self.endpoint, "cannot open an SSH channel", exc) from None
        out, err = bytearray(), bytearray()
        try:
            channel.exec_command(command)
            if input is not None:
                channel.sendall(input.encode() if isinstance(input, str) else input)
            channel.shutdown_write()
            deadline = time.monotonic() + timeout
            exit_seen_at: float | None = None
            while True:
                while channel.recv_ready():
                    out += channel.recv(65536)
                while channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
                if channel.exit_status_ready():
                    now = time.monotonic()
                    exit_seen_at = exit_seen_at or now
                    # wait for EOF, but not for background processes that keep stdout open
                    if (channel.eof_received and not channel.recv_ready() and not channel.recv_stderr_ready()) \
                            or now - exit_seen_at > 1.0:
                        break
                if time.monotonic() > deadline:
                    raise RemoteTimeoutError(
                        f"`{_short(command)}` on {self.endpoint.label} did not finish within {timeout:g} s.",
                        "Raise the timeout, or check whether the device is overloaded or the command waits for input.",
                        stdout=out.decode(errors="replace"), stderr=err.decode(errors="replace"),
                    )
                if not transport.is_active():
                    raise _unreachable(self.endpoint, f"the connection dropped while running `{_short(command)}`")
                select.select([channel], [], [], 0.05)
            rc = channel.recv_exit_status()
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise _unreachable(self.endpoint, f"the connection failed while running `{_short(command)}`",
                               exc) from None
        finally:
            channel.close()
        result = CommandResult(rc, out.decode(errors="replace"), err.decode(errors="replace"))
        if check and rc != 0:
            raise RemoteCommandError(
                f"`{_short(command)}` failed on {self.endpoint.label} with exit code {rc}: "
                f"{_short(result.stderr.strip() or result.stdout.strip(), 400)}",
                "See the command's output above.", rc=rc, stdout=result.stdout, stderr=result.stderr,
            )
        return result

    # --- files

    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            transport = self._transport()
            try:
                self._sftp = paramiko.SFTPClient.from_transport(transport)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise _unreachable(self.endpoint, "cannot start SFTP (is the sftp subsystem enabled?)", exc) from None
            if self._sftp is None:
                raise _unreachable(self.endpoint, "cannot start SFTP")
            self._sftp.get_channel().settimeout(max(self.endpoint.connect_timeout, 60.0))
        return self._sftp

    def makedirs(self, remote_dir: str, mode: int = 0o755) -> None:
        """``mkdir -p`` over SFTP (relative paths are relative to the login directory)."""
        sftp = self.sftp()
        path = posixpath.normpath(remote_dir)
        if path in (".", "/", ""):
            return
        parts = path.split("/")
        current = "/" if path.startswith("/") else ""
        for part in parts:
            if not part:
                continue
            current = posixpath.join(current, part) if current else part
            try:
                sftp.stat(current)
            except FileNotFoundError:
                try:
                    sftp.mkdir(current, mode)
                except OSError:
                    sftp.stat(current)  # created concurrently is fine; anything else raises

    def remote_sha256(self, remote_path: str) -> str | None:
        """sha256 of a device file (``sha256sum`` on the device), or None if it cannot be computed."""
        path = remote_path if not remote_path.startswith("-") else "./" + remote_path
        result = self.run(["sha256sum", path], timeout=120)
        if result.rc != 0 or not result.stdout:
            return None
        digest = result.stdout.split()[0]
        return digest if len(digest) == 64 else None

    def upload(self, local: str | os.PathLike[str], remote_path: str, mode: int = 0o644) -> bool:
        """Copy a file to the device atomically; returns False when an identical file was already there.

        "Identical" means same size and same sha256 (computed on the device with ``sha256sum``; on a
        device without it, same size and modification time). The new file is written under a temporary
        name in the same directory and renamed over ``remote_path``, so readers never see half a file.
        """
        local = Path(local)
        if not local.is_file():
            raise FileNotFoundError(f"{local} does not exist or is not a file")
        size = local.stat().st_size
        mtime = int(local.stat().st_mtime)
        sftp = self.sftp()
        try:
            try:
                st = sftp.stat(remote_path)
            except FileNotFoundError:
                st = None
            if st is not None and st.st_size == size:
                remote_digest = self.remote_sha256(remote_path)
                same = (remote_digest == file_sha256(local)) if remote_digest is not None else st.st_mtime == mtime
                if same:
                    if st.st_mode is not None and (st.st_mode & 0o7777) != mode:
                        sftp.chmod(remote_path, mode)
                    return False
            parent = posixpath.dirname(remote_path)
            if parent:
                self.makedirs(parent)
            tmp = posixpath.join(parent, f".{posixpath.basename(remote_path)}.{uuid.uuid4().hex[:12]}.tmp")
            try:
                sftp.put(str(local), tmp, confirm=True)
                sftp.chmod(tmp, mode)
                sftp.utime(tmp, (mtime, mtime))
                try:
                    sftp.posix_rename(tmp, remote_path)
                except OSError:
                    # servers without posix-rename@openssh.com: plain SFTP rename refuses to overwrite
                    try:
                        sftp.remove(remote_path)
                    except FileNotFoundError:
                        pass
                    sftp.rename(tmp, remote_path)
            except BaseException:
                with contextlib.suppress(Exception):  # best effort cleanup
                    sftp.remove(tmp)
                raise
            return True
        except EdgepackError:
            raise
        except (TimeoutError, paramiko.SSHException, EOFError) as exc:
            raise _unreachable(self.endpoint, f"upload of {local.name} failed", exc) from None
        except OSError as exc:
            if not self.alive:
                raise _unreachable(self.endpoint, f"upload of {local.name} failed", exc) from None
            raise RemoteCommandError(f"Cannot upload {local} to {self.endpoint.label}:{remote_path}: {exc}.",
                                     "Check the remote directory exists and is writable, and that the disk "
                                     "is not full.") from None

    def download(self, remote_path: str, local: str | os.PathLike[str]) -> Path:
        """Copy a device file here (through a temporary name)."""
        local = Path(local)
        tmp = local.with_name(f".{local.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            self.sftp().get(remote_path, str(tmp))
            tmp.replace(local)
        except (TimeoutError, paramiko.SSHException, EOFError) as exc:
            raise _unreachable(self.endpoint, f"download of {remote_path} failed", exc) from None
        finally:
            tmp.unlink(missing_ok=True)
        return local


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# local port forwarding (in its own process)


class LocalTunnel:
    """Forward ``127.0.0.1:local_port`` here to ``remote_host:remote_port`` as seen from the device.

    The forwarder is a separate process (``python -m edgepack.devices.tunnel``) with its own SSH
    connection and the same strict host key checking. A connection to the local port waits (up to
    ``connect_deadline`` seconds) for the remote port to start listening. Use as a context manager::

        with LocalTunnel(endpoint, 9090) as tunnel:
            remote = tvm.rpc.connect("127.0.0.1", tunnel.local_port)
    """

    def __init__(self, endpoint: SSHEndpoint, remote_port: int, *, remote_host: str = "127.0.0.1",
                 local_port: int = 0, connect_deadline: float = 30.0, start_timeout: float | None = None) -> None:
        self.endpoint = endpoint
        self.remote_host = remote_host
        self.remote_port = remote_port
        self.local_host = "127.0.0.1"
        self.local_port = local_port
        self.connect_deadline = connect_deadline
        self.start_timeout = start_timeout if start_timeout is not None else endpoint.connect_timeout + 30.0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_text(self) -> str:
        """What the forwarder process logged (for diagnostics)."""
        if self._log is None:
            return ""
        try:
            return Path(self._log.name).read_text(errors="replace")
        except OSError:
            return ""

    def start(self) -> int:
        if self.alive:
            return self.local_port
        config = {
            "endpoint": self.endpoint.to_dict(),
            "remote_host": self.remote_host,
            "remote_port": self.remote_port,
            "local_port": self.local_port,
            "connect_deadline": self.connect_deadline,
        }
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._log = tempfile.NamedTemporaryFile(prefix="edgepack-tunnel-", suffix=".log", delete=False)  # noqa: SIM115
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "edgepack.devices.tunnel"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, env=env, close_fds=True,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write((json.dumps(config) + "\n").encode())
        self._proc.stdin.flush()
        line = self._read_line(self.start_timeout)
        if line.startswith("READY "):
            self.local_port = int(line.split()[1])
            return self.local_port
        log = self.log_text()
        self.close()
        if line.startswith("ERROR "):
            info = json.loads(line[len("ERROR "):])
            cls = ERROR_TYPES.get(info.get("type", ""), TunnelError)
            error = cls(info.get("message", "tunnel failed"), info.get("hint", ""))
            for attr, value in (info.get("attrs") or {}).items():
                setattr(error, attr, value)
            raise error
        raise TunnelError(
            f"The SSH port forward to {self.endpoint.label} ({self.remote_host}:{self.remote_port} on the device) "
            f"did not start{': ' + _short(log, 600) if log.strip() else ''}.",
            "Check that the device is reachable (`edgepack device check`) and that its sshd allows TCP forwarding "
            "(AllowTcpForwarding yes or local).",
        )

    def _read_line(self, timeout: float) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + timeout
        buf = b""
        fd = self._proc.stdout.fileno()
        while b"\n" not in buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return ""
            ready, _, _ = select.select([fd], [], [], min(remaining, 0.5))
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                buf += chunk
            elif self._proc.poll() is not None:
                break
        return buf.decode(errors="replace").strip()

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()  # the forwarder exits when its stdin closes
            except OSError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
            if proc.stdout is not None:
                proc.stdout.close()
        if self._log is not None:
            self._log.close()
            Path(self._log.name).unlink(missing_ok=True)
            self._log = None
