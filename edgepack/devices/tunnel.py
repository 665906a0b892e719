"""The port forwarder behind :class:`edgepack.devices.ssh.LocalTunnel` (runs as its own process).

Protocol with the parent: one JSON line on stdin with the configuration; the process answers
``READY <local_port>`` or ``ERROR <json>`` on stdout, then forwards until its stdin closes (the
parent exited or called close()). Logs go to stderr.

Each connection accepted on 127.0.0.1:<local_port> gets its own SSH ``direct-tcpip`` channel to
``remote_host:remote_port`` as seen from the device. While that port is not listening yet (the
device answers "Connect failed"), opening the channel is retried until ``connect_deadline``.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import threading
import time
from typing import Any

import paramiko

from edgepack.devices.ssh import SSHEndpoint, SSHSession, connect
from edgepack.errors import EdgepackError


def _log(message: str) -> None:
    sys.stderr.write(f"{time.strftime('%H:%M:%S')} edgepack-tunnel[{os.getpid()}]: {message}\n")
    sys.stderr.flush()


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Forwarder:
    def __init__(self, endpoint: SSHEndpoint, remote_host: str, remote_port: int, connect_deadline: float) -> None:
        self.endpoint = endpoint
        self.remote_host = remote_host
        self.remote_port = remote_port
        self.connect_deadline = connect_deadline
        self._lock = threading.Lock()
        self._session: SSHSession | None = None

    def session(self) -> SSHSession:
        with self._lock:
            if self._session is None or not self._session.alive:
                if self._session is not None:
                    _log("SSH connection lost, reconnecting")
                    self._session.close()
                self._session = connect(self.endpoint)
            return self._session

    def open_channel(self, origin: tuple[str, int]) -> paramiko.Channel:
        deadline = time.monotonic() + self.connect_deadline
        delay = 0.1
        while True:
            session = self.session()
            transport = session._transport()
            try:
                return transport.open_channel("direct-tcpip", (self.remote_host, self.remote_port), origin,
                                              timeout=self.endpoint.connect_timeout)
            except paramiko.ChannelException as exc:
                # "Connect failed": nothing listens on the device's port (yet)
                if time.monotonic() + delay > deadline:
                    raise
                _log(f"{self.remote_host}:{self.remote_port} on the device not ready ({exc}), retrying")
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if time.monotonic() + delay > deadline:
                    raise
                _log(f"opening the channel failed ({exc}), retrying")
                with self._lock:
                    if self._session is not None and not self._session.alive:
                        self._session.close()
                        self._session = None
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def handle(self, conn: socket.socket, origin: tuple[str, int]) -> None:
        try:
            channel = self.open_channel(origin)
        except Exception as exc:  # noqa: BLE001 - report and drop this connection only
            _log(f"cannot forward {origin[0]}:{origin[1]} to {self.remote_host}:{self.remote_port}: {exc}")
            conn.close()
            return
        try:
            pump(conn, channel)
        except Exception as exc:  # noqa: BLE001
            _log(f"forwarding ended: {exc}")
        finally:
            channel.close()
            conn.close()


def pump(conn: socket.socket, channel: paramiko.Channel) -> None:
    conn.setblocking(True)
    local_open = remote_open = True
    while local_open or remote_open:
        watch: list[Any] = []
        if local_open:
            watch.append(conn)
        if remote_open:
            watch.append(channel)
        ready, _, _ = select.select(watch, [], [], 5.0)
        if not ready:
            if channel.closed or not channel.get_transport().is_active():
                return
            continue
        if conn in ready:
            data = conn.recv(262144)
            if data:
                channel.sendall(data)
            else:
                local_open = False
                channel.shutdown_write()
        if channel in ready:
            data = channel.recv(262144)
            if data:
                conn.sendall(data)
            else:
                remote_open = False
                try:
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    return
        if not remote_open and channel.closed:
            return


def _watch_stdin() -> None:
    """Exit when the parent goes away (stdin closes)."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    finally:
        os._exit(0)


def main() -> int:
    line = sys.stdin.readline()
    try:
        config = json.loads(line)
        endpoint = SSHEndpoint.from_dict(config["endpoint"])
        forwarder = Forwarder(endpoint, config.get("remote_host", "127.0.0.1"), int(config["remote_port"]),
                              float(config.get("connect_deadline", 30.0)))
    except (ValueError, KeyError, TypeError) as exc:
        _emit("ERROR " + json.dumps({"type": "TunnelError", "message": f"bad tunnel configuration: {exc}",
                                     "hint": ""}))
        return 2
    try:
        forwarder.session()  # fail early (host key, auth, reachability) with the real error
    except EdgepackError as exc:
        attrs = {k: v for k, v in vars(exc).items() if k not in ("message", "hint") and isinstance(v, (str, int))}
        _emit("ERROR " + json.dumps({"type": type(exc).__name__, "message": exc.message, "hint": exc.hint,
                                     "attrs": attrs}))
        return 1
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", int(config.get("local_port", 0))))
    except OSError as exc:
        _emit("ERROR " + json.dumps({"type": "TunnelError",
                                     "message": f"cannot listen on 127.0.0.1:{config.get('local_port')}: {exc}",
                                     "hint": "Choose another local port, or 0 for any free one."}))
        return 1
    listener.listen(16)
    port = listener.getsockname()[1]
    threading.Thread(target=_watch_stdin, daemon=True).start()
    _log(f"forwarding 127.0.0.1:{port} -> {endpoint.label} {forwarder.remote_host}:{forwarder.remote_port}")
    _emit(f"READY {port}")
    while True:
        conn, origin = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=forwarder.handle, args=(conn, origin), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
