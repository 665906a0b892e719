"""A TVM RPC session with a device through an SSH tunnel: connect, deploy, start (or reuse) the server,
forward a local port to it from a separate process; and operations run in such a session, retried when
the link drops (a rebooting device gets a window to come back)."""

from __future__ import annotations

import contextlib
import gc
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from edgepack.devices.deploy import RemoteInstall, deploy, endpoint_for, say
from edgepack.devices.errors import (
    AuthenticationError,
    ConnectionLostError,
    DeployError,
    DeviceBusyError,
    DeviceUnreachableError,
    HostKeyError,
    RemoteCommandError,
    RemoteRunError,
    RemoteTimeoutError,
    RPCServerError,
)
from edgepack.devices.inventory import Device, device_profile
from edgepack.devices.server import DEFAULT_BUSY_TIMEOUT, ServerInfo, ensure_rpc_server, pid_alive, server_log_tail
from edgepack.devices.ssh import DEFAULT_CONNECT_TIMEOUT, LocalTunnel, SSHEndpoint, SSHSession, connect
from edgepack.errors import EdgepackError, ToolchainError
from edgepack.progress import Progress
from edgepack.text import short

T = TypeVar("T")

DEFAULT_SESSION_TIMEOUT = 900.0  # the device ends an RPC session after this many seconds
DEFAULT_ATTEMPTS = 3  # tries of an operation whose connection dropped
DEFAULT_RECONNECT_WINDOW = 30.0  # how long a device that dropped out may take to come back


class DeadlineExceeded(Exception):
    """Raised by SIGALRM inside a blocking TVM call that ran past its deadline."""


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Interrupt blocking TVM RPC calls after ``seconds`` (main thread only; TVM checks signals on EINTR)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise DeadlineExceeded()

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
            return pid_alive(self.ssh(), self.server.pid, "rpc_server")
        except EdgepackError:
            return False


def _tvm_connect(port: int, key: str, session_timeout: float, timeout: float):
    from tvm import rpc

    with deadline(timeout):
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
    profile = device_profile(device, profile)
    endpoint = endpoint_for(device, known_hosts, connect_timeout=connect_timeout)
    conn = _open_connection(device, profile, endpoint, session_timeout=session_timeout, attempts=attempts,
                            busy_timeout=busy_timeout, progress=progress)
    try:
        yield conn
    finally:
        _close_connection(conn)


@dataclass
class ServedDevice:
    """An SSH session with a device whose RPC server is installed and running (on the device's loopback)."""

    session: SSHSession
    install: RemoteInstall
    server: ServerInfo
    tunnel: LocalTunnel | None = None  # a local port forwarded to the server, when asked for

    def close(self) -> None:
        _close_quietly(self.session, self.tunnel)


def bring_up(device: Device, profile: Any, endpoint: SSHEndpoint, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
             tunnel: bool = False, progress: Progress | None = None) -> ServedDevice:
    """Connect over SSH, deploy the runtime and server if needed, start (or reuse) the server, and with
    ``tunnel`` forward a local port to it from a separate process. One attempt; the caller retries."""
    session = forwarder = None
    try:
        say(progress, f"Connecting to {device.name} ({device.host}:{device.port})")
        session = connect(endpoint)
        install = deploy(session, device, profile, progress=progress)
        server = ensure_rpc_server(session, device, profile, install, busy_timeout=busy_timeout, progress=progress)
        if tunnel:
            forwarder = LocalTunnel(endpoint, server.port, connect_deadline=20.0)
            forwarder.start()
        return ServedDevice(session, install, server, forwarder)
    except BaseException:
        _close_quietly(session, forwarder)
        raise


def _open_connection(device: Device, profile: Any, endpoint: SSHEndpoint, *, session_timeout: float, attempts: int,
                     busy_timeout: float, progress: Progress | None) -> DeviceConnection:
    last: EdgepackError | None = None
    for attempt in range(1, max(1, attempts) + 1):
        served = None
        try:
            served = bring_up(device, profile, endpoint, busy_timeout=busy_timeout, tunnel=True, progress=progress)
            try:
                remote = _tvm_connect(served.tunnel.local_port, served.server.key, session_timeout, timeout=60.0)
            except DeadlineExceeded:
                raise ConnectionLostError(
                    f"The RPC handshake with {device.name} did not finish within 60 s.",
                    "The device may be overloaded; try again.",
                ) from None
            except Exception as exc:  # noqa: BLE001 - TVM raises plain errors for refused handshakes
                raise ConnectionLostError(
                    f"Connecting TVM's RPC client to the server on {device.name} failed: {short(exc)}",
                    "The connection dropped during the handshake; try again, and check `edgepack device check "
                    f"{device.name}`.",
                ) from None
            return DeviceConnection(device, profile, endpoint, served.install, served.server, served.tunnel, remote,
                                    served.session)
        except (HostKeyError, DeviceBusyError, DeployError, RPCServerError, ToolchainError):
            if served is not None:
                served.close()
            raise  # retrying does not help
        except DeviceUnreachableError as exc:
            if served is not None:
                served.close()
            if isinstance(exc, AuthenticationError):
                raise
            last = exc
        except RemoteCommandError as exc:
            if served is not None:
                served.close()
            last = exc
        if attempt < attempts:
            delay = min(2.0 * attempt, 8.0)
            say(progress, f"{device.name}: {last.message.rstrip('.') if last else 'failed'}; retrying in "
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


class LinkDropped(Exception):
    """The connection died under an operation (internal: retried by the callers)."""


def run_remote_op(remote: Any, op: Callable[[Any], T], *, what: str, device_name: str, session_timeout: float,
                  healthy: Callable[[], bool], log_tail: Callable[[], str] = lambda: "") -> T:
    """Run ``op(remote)`` and turn what can go wrong into clear errors.

    A hang past the session timeout is a :class:`RemoteTimeoutError`; a TVM error while the device
    and its server are still up (``healthy()``) is the model's own (:class:`RemoteRunError`);
    anything else means the link dropped (``LinkDropped``, for the caller to retry).
    """
    try:
        with deadline(session_timeout + 60.0):
            return op(remote)
    except EdgepackError:
        raise
    except DeadlineExceeded:
        raise RemoteTimeoutError(
            f"{what} on {device_name} did not finish within {session_timeout + 60:g} s.",
            "The device may hang or be far slower than expected; raise --timeout, or check it "
            f"with `edgepack device check {device_name}`.",
        ) from None
    except Exception as exc:  # noqa: BLE001 - TVM errors: tell a drop from a real failure
        message = short(exc, 500)
        if "RPCSessionTimeoutError" in message:
            raise RemoteTimeoutError(
                f"{what} on {device_name} ran past the session timeout of {session_timeout:g} s.",
                "Raise --timeout (benchmarks under emulation are slow), or use fewer --repeat.",
            ) from None
        if healthy():
            log = log_tail()
            raise RemoteRunError(
                f"{what} failed on {device_name}: {message}"
                + (f" The RPC server log on the device ends with: {short(log, 600)}" if log else ""),
                "The device and its RPC server are up, so this is the model or the runtime failing "
                "there; check that the build's profile matches the device (`edgepack device check`).",
            ) from None
        raise LinkDropped(_drop_reason(message)) from None


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
    profile = device_profile(device, profile)
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
        except LinkDropped as exc:
            drops.append(str(exc))
            if len(drops) >= max(1, attempts):
                raise ConnectionLostError(
                    f"The connection to {device.name} dropped {len(drops)} times during {what.lower()}; giving up "
                    f"(last: {short(drops[-1], 300)}).",
                    f"Check the device's network and power, and its RPC server with `edgepack device check "
                    f"{device.name}`.",
                ) from None
            window_end = time.monotonic() + reconnect_window
            delay = 1.0
            say(progress, f"Lost the connection to {device.name} during {what.lower()} ({drops[-1]}); "
                           f"reconnecting for up to {reconnect_window:g} s")
        except (DeviceUnreachableError, RemoteCommandError) as exc:
            if not drops or isinstance(exc, AuthenticationError):
                raise
            if time.monotonic() + delay > window_end:
                raise ConnectionLostError(
                    f"{device.name} dropped out during {what.lower()} ({short(drops[-1], 200)}) and could not be "
                    f"reached again within {reconnect_window:g} s: {exc.message.rstrip('.')}.",
                    f"The device may have rebooted, lost power or left the network. Check it with `edgepack device "
                    f"check {device.name}` and run the command again (--reconnect-window gives a rebooting device "
                    "more time).",
                ) from None
            say(progress, f"{device.name} is not back yet ({short(exc.message, 120).rstrip('.')}); retrying")
        time.sleep(delay)
        delay = min(delay * 2, 8.0)


