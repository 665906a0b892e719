"""A farm of devices behind a TVM RPC tracker on the host's loopback.

``edgepack farm start`` runs one background process (its own process group) that

* runs TVM's RPC tracker on ``127.0.0.1`` (``tvm.rpc.tracker.Tracker``), and
* keeps one *agent* per device: an SSH connection to the device, the device's RPC server (installed
  and started as for ``edgepack bench --on NAME``), a loopback port here whose connections are
  forwarded to that server through SSH ``direct-tcpip`` channels, and the tracker registration of
  that port under the profile's RPC key.

Devices never reach the host: no reverse forward and nothing listening beyond loopback, here or on
the device. To the tracker an agent looks like an RPC server (it speaks the server side of the
tracker protocol); a client that ``request``\\ s a key is handed the loopback port of a free device
and connects through the agent. A device that drops out is taken off the tracker's queue until
its agent reaches it again.

State (pid, tracker port, each device's agent port and state) is kept beside the inventory in
``<inventory>.farm.json`` so that ``farm status|stop`` and ``bench --on farm:PROFILE`` find it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from edgepack.devices.deploy import endpoint_for, home_dir, read_remote_text, say
from edgepack.devices.errors import ConnectionLostError, RemoteError
from edgepack.devices.inventory import Device, Inventory, InventoryError, device_profile
from edgepack.devices.server import pid_alive, server_files, server_key
from edgepack.devices.session import LinkDropped, bring_up, deadline, run_remote_op
from edgepack.devices.ssh import connect
from edgepack.devices.tunnel import pump
from edgepack.errors import EdgepackError
from edgepack.files import write_text_atomic
from edgepack.progress import Progress
from edgepack.text import short, utc_timestamp

T = TypeVar("T")

RPC_TRACKER_MAGIC = 0x2F271
CODE_SUCCESS, CODE_PUT, CODE_REQUEST, CODE_UPDATE_INFO, CODE_SUMMARY, CODE_GET_PENDING = 0, 3, 4, 5, 6, 7
DEFAULT_TRACKER_PORT = 9190
START_TIMEOUT = 180.0
HEALTH_INTERVAL = 5.0
UNCLAIMED_TIMEOUT = 6.0  # a device handed out by the tracker whose client never came is offered again

log = logging.getLogger("edgepack.farm")


class FarmError(RemoteError):
    """The farm (tracker + device agents) is not running, or cannot do what was asked."""


# ---------------------------------------------------------------------------------------------
# state shared between the daemon and the CLI


@dataclass
class AgentState:
    name: str
    profile: str
    key: str  # the tracker key (the profile's rpc_key)
    port: int = 0  # loopback port here, forwarded to the device's RPC server
    state: str = "starting"  # starting | free | busy | down
    message: str = ""
    sessions: int = 0  # sessions served since the farm started
    updated: str = ""


@dataclass
class FarmState:
    pid: int
    tracker_port: int
    inventory: str
    log: str
    started: str
    devices: dict[str, AgentState] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FarmState:
        devices = {k: AgentState(**v) for k, v in (data.get("devices") or {}).items()}
        return cls(int(data["pid"]), int(data["tracker_port"]), data["inventory"], data["log"], data["started"],
                   devices)


def state_path(inventory: Inventory) -> Path:
    return inventory.path.with_name(inventory.path.stem + ".farm.json")


def log_path(inventory: Inventory) -> Path:
    return inventory.path.with_name(inventory.path.stem + ".farm.log")


def _daemon_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return True
    return b"edgepack.devices.farm" in cmdline


def read_state(inventory: Inventory) -> FarmState | None:
    """The running farm's state, or None when no farm runs for this inventory."""
    path = state_path(inventory)
    try:
        state = FarmState.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if _daemon_alive(state.pid) else None


# ---------------------------------------------------------------------------------------------
# the tracker protocol (int32 magic, then int32-length-prefixed JSON), with timeouts


def _send_json(sock: socket.socket, data: Any) -> None:
    payload = json.dumps(data).encode()
    sock.sendall(struct.pack("<i", len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the tracker closed the connection")
        buf += chunk
    return buf


def _recv_json(sock: socket.socket) -> Any:
    (size,) = struct.unpack("<i", _recv_exact(sock, 4))
    return json.loads(_recv_exact(sock, size).decode())


def tracker_connect(port: int, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(struct.pack("<i", RPC_TRACKER_MAGIC))
    (magic,) = struct.unpack("<i", _recv_exact(sock, 4))
    if magic != RPC_TRACKER_MAGIC:
        sock.close()
        raise ConnectionError(f"127.0.0.1:{port} is not a TVM RPC tracker")
    return sock


def tracker_summary(port: int, timeout: float = 5.0) -> dict[str, Any]:
    """The tracker's ``summary()``: ``{"queue_info": {key: {free, pending}}, "server_info": [...]}``."""
    with tracker_connect(port, timeout) as sock:
        _send_json(sock, [CODE_SUMMARY])
        reply = _recv_json(sock)
    if not isinstance(reply, list) or reply[0] != CODE_SUCCESS:
        raise ConnectionError(f"unexpected tracker reply {reply!r}")
    return reply[1]


# ---------------------------------------------------------------------------------------------
# the daemon: tracker + one agent per device


class _DeviceLost(Exception):
    pass


class Agent(threading.Thread):
    """Keeps one device registered with the tracker while it is healthy (see the module docstring)."""

    def __init__(self, daemon: FarmDaemon, device: Device, known_hosts: Path | None) -> None:
        super().__init__(name=f"agent-{device.name}", daemon=True)
        self.farm = daemon
        self.device = device
        self.profile = device_profile(device)
        self.endpoint = endpoint_for(device, known_hosts, connect_timeout=10.0, keepalive=5)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.session = None
        self.server = None
        self.active = 0
        self.ended = threading.Event()  # a forwarded session finished
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.state = AgentState(device.name, device.profile, self.profile.rpc_key, self.port)

    def set_state(self, state: str, message: str = "") -> None:
        self.state.state, self.state.message, self.state.updated = state, message, utc_timestamp()
        log.info("%s: %s %s", self.device.name, state, message)
        self.farm.save()

    def run(self) -> None:
        backoff = 2.0
        while not self.stop.is_set():
            tracker = None
            try:
                self._bring_up()
                tracker = tracker_connect(self.farm.tracker_port)
                info = {"key": f"server:{self.profile.rpc_key}", "addr": ["127.0.0.1", self.port],
                        "device": self.device.name, "host": self.device.host}
                _send_json(tracker, [CODE_UPDATE_INFO, info])
                if _recv_json(tracker) != CODE_SUCCESS:
                    raise ConnectionError("the tracker refused UPDATE_INFO")
                backoff = 2.0
                self._serve(tracker)
            except _DeviceLost as exc:
                self.set_state("down", str(exc))
            except EdgepackError as exc:
                self.set_state("down", exc.message)
            except Exception as exc:  # noqa: BLE001 - an agent never dies; it reports and retries
                self.set_state("down", f"{type(exc).__name__}: {exc}")
            finally:
                if tracker is not None:
                    with contextlib.suppress(OSError):
                        tracker.close()  # the tracker drops this device from its queue
                self._close_session()
            self.stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)

    def _close_session(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            with contextlib.suppress(Exception):
                session.close()

    def _bring_up(self) -> None:
        served = bring_up(self.device, self.profile, self.endpoint, busy_timeout=30.0)
        self.session, self.server = served.session, served.server

    def _healthy(self) -> bool:
        return (self.session is not None and self.session.alive
                and pid_alive(self.session, self.server.pid, "rpc_server"))

    def _serve(self, tracker: socket.socket) -> None:
        matchkey = server_key(self.device, self.profile)

        def pending() -> bool:
            _send_json(tracker, [CODE_GET_PENDING])
            return matchkey in _recv_json(tracker)

        def put() -> None:
            _send_json(tracker, [CODE_PUT, self.profile.rpc_key, [self.port, matchkey], "127.0.0.1"])
            if _recv_json(tracker) != CODE_SUCCESS:
                raise ConnectionError("the tracker refused PUT")

        put()
        self.set_state("free")
        last_health = time.monotonic()
        unclaimed_since: float | None = None
        while not self.stop.is_set():
            ready, _, _ = select.select([self.listener], [], [], 1.0)
            if ready:
                conn, origin = self.listener.accept()
                with self.lock:
                    self.active += 1
                self.state.sessions += 1
                self.set_state("busy")
                threading.Thread(target=self._forward, args=(conn, origin), daemon=True).start()
                unclaimed_since = None
            if self.ended.is_set():
                self.ended.clear()
                if not self._healthy():
                    raise _DeviceLost("lost the device during a session")
            with self.lock:
                active = self.active
            now = time.monotonic()
            if active == 0:
                if not pending():  # handed out (or its session ended): offer the device again
                    if self.state.state == "busy" or (unclaimed_since and now - unclaimed_since > UNCLAIMED_TIMEOUT):
                        put()
                        unclaimed_since = None
                        self.set_state("free")
                    elif unclaimed_since is None:
                        unclaimed_since = now
                elif self.state.state != "free":
                    self.set_state("free")
            if now - last_health > HEALTH_INTERVAL and active == 0:
                last_health = now
                if not self._healthy():
                    raise _DeviceLost("the device or its RPC server stopped answering")

    def _forward(self, conn: socket.socket, origin: tuple[str, int]) -> None:
        import paramiko

        try:
            channel = self.session._transport().open_channel(
                "direct-tcpip", ("127.0.0.1", self.server.port), origin, timeout=10.0)
        except (paramiko.SSHException, EOFError, OSError, EdgepackError, AttributeError) as exc:
            log.warning("%s: cannot forward a session: %s", self.device.name, exc)
            conn.close()
        else:
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                pump(conn, channel)
            except Exception as exc:  # noqa: BLE001
                log.info("%s: session ended: %s", self.device.name, exc)
            finally:
                channel.close()
                conn.close()
        with self.lock:
            self.active -= 1
        self.ended.set()


class FarmDaemon:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.state_file = Path(config["state_path"])
        self.known_hosts = Path(config["known_hosts"]) if config.get("known_hosts") else None
        self.devices = [Device(**d) for d in config["devices"]]
        self.tracker = None
        self.tracker_port = 0
        self.agents: list[Agent] = []
        self.lock = threading.Lock()
        self.started = utc_timestamp()

    def save(self) -> None:
        with self.lock:
            state = FarmState(os.getpid(), self.tracker_port, self.config["inventory"], self.config["log"],
                              self.started, {a.device.name: a.state for a in self.agents})
            write_text_atomic(self.state_file, json.dumps(state.to_dict(), indent=2) + "\n")

    def run(self) -> int:
        from tvm.rpc.tracker import Tracker

        port = int(self.config.get("tracker_port") or DEFAULT_TRACKER_PORT)
        self.tracker = Tracker("127.0.0.1", port=port, port_end=port + 100, silent=True)
        self.tracker_port = self.tracker.port
        log.info("tracker on 127.0.0.1:%d", self.tracker_port)
        self.agents = [Agent(self, d, self.known_hosts) for d in self.devices]
        self.save()
        for agent in self.agents:
            agent.start()
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.wait(5.0):
            if not _tracker_alive(self.tracker):
                log.error("the tracker process died")
                break
        for agent in self.agents:
            agent.stop.set()
        with contextlib.suppress(Exception):
            self.tracker.terminate()
        return 0


def _tracker_alive(tracker) -> bool:
    try:
        with tracker_connect(tracker.port, timeout=2.0):
            return True
    except OSError:
        return False


def _serve_main(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("paramiko").setLevel(logging.WARNING)
    return FarmDaemon(config).run()


# ---------------------------------------------------------------------------------------------
# the CLI side


def start_farm(inventory: Inventory, *, known_hosts: Path | None = None, tracker_port: int = DEFAULT_TRACKER_PORT,
               profile: str | None = None, wait: float = START_TIMEOUT, progress: Progress | None = None) -> FarmState:
    """Start the tracker and the device agents in the background (idempotent), wait for the devices."""
    running = read_state(inventory)
    if running is not None:
        say(progress, f"The farm already runs (pid {running.pid}, tracker 127.0.0.1:{running.tracker_port})")
        return running
    devices = [d for d in inventory.devices.values() if profile is None or d.profile == profile]
    if not devices:
        raise InventoryError(f"No devices{' of profile ' + profile if profile else ''} in {inventory.path}.",
                             "Add some with `edgepack device add NAME --host HOST --user USER --profile PROFILE`.")
    for device in devices:
        device_profile(device)  # an unknown profile is a clear error now, not in the background
    import importlib.util

    missing = [m for m in ("tornado", "psutil", "cloudpickle") if importlib.util.find_spec(m) is None]
    if missing:
        raise FarmError(f"TVM's RPC tracker needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
                        "not installed.", "pip install 'edgepack[rpc]' (or: pip install tornado psutil cloudpickle).")
    state_file, log_file = state_path(inventory), log_path(inventory)
    state_file.unlink(missing_ok=True)
    config = {
        "state_path": str(state_file), "log": str(log_file), "inventory": str(inventory.path),
        "known_hosts": str(endpoint_for(devices[0], known_hosts).known_hosts), "tracker_port": tracker_port,
        "devices": [asdict(d) for d in sorted(devices, key=lambda d: d.name)],
    }
    config_file = state_file.with_name(state_file.stem + ".config.json")
    write_text_atomic(config_file, json.dumps(config, indent=2) + "\n")
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    say(progress, "Starting the RPC tracker on 127.0.0.1 and the device agents")
    with open(log_file, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "edgepack.devices.farm", "serve", str(config_file)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, close_fds=True,
                                start_new_session=True)
    deadline = time.monotonic() + wait
    state = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FarmError(f"The farm process exited at once (code {proc.returncode}).",
                            f"See its log: {log_file}\n{_tail_file(log_file)}")
        state = read_state(inventory)
        if state is not None and state.devices and all(a.state != "starting" for a in state.devices.values()):
            return state
        time.sleep(0.5)
    if state is None:
        _kill_group(proc.pid)
        raise FarmError(f"The farm did not come up within {wait:g} s.", f"See its log: {log_file}")
    return state  # some devices still starting: status shows them


def _tail_file(path: Path, lines: int = 10) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").rstrip().splitlines()[-lines:])
    except OSError:
        return ""


def _kill_group(pid: int, timeout: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def stop_farm(inventory: Inventory) -> bool:
    """Stop the tracker and the agents (the devices' RPC servers keep running). True if one ran."""
    state = read_state(inventory)
    if state is not None:
        _kill_group(state.pid)
    state_path(inventory).unlink(missing_ok=True)
    state_path(inventory).with_name(state_path(inventory).stem + ".config.json").unlink(missing_ok=True)
    return state is not None


@dataclass(frozen=True)
class FarmStatus:
    running: bool
    pid: int | None = None
    tracker: str | None = None  # 127.0.0.1:PORT
    queue: dict[str, dict[str, int]] = field(default_factory=dict)  # key -> {free, pending}
    servers: tuple[dict[str, Any], ...] = ()  # what the tracker knows of each registered device
    devices: tuple[AgentState, ...] = ()
    log: str | None = None
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"running": self.running, "pid": self.pid, "tracker": self.tracker, "queue": self.queue,
                "servers": list(self.servers), "devices": [asdict(d) for d in self.devices], "log": self.log,
                "message": self.message}


def farm_status(inventory: Inventory) -> FarmStatus:
    """The tracker's queue (free / pending per key) and each device agent's state."""
    state = read_state(inventory)
    if state is None:
        return FarmStatus(False, message="The farm is not running (start it with `edgepack farm start`).")
    devices = tuple(sorted(state.devices.values(), key=lambda a: a.name))
    try:
        summary = tracker_summary(state.tracker_port)
    except (OSError, ValueError) as exc:
        return FarmStatus(True, state.pid, f"127.0.0.1:{state.tracker_port}", devices=devices, log=state.log,
                          message=f"The tracker does not answer: {exc}")
    return FarmStatus(True, state.pid, f"127.0.0.1:{state.tracker_port}", summary.get("queue_info", {}),
                      tuple(summary.get("server_info", [])), devices, state.log)


# ---------------------------------------------------------------------------------------------
# running on a farm


def _request_device(state: FarmState, key: str, timeout: float) -> tuple[int, str]:
    """Ask the tracker for a free device of ``key``; returns (agent port, match key)."""
    sock = tracker_connect(state.tracker_port)
    try:
        _send_json(sock, [CODE_REQUEST, key, "", 1])
        sock.settimeout(timeout)
        reply = _recv_json(sock)
    except TimeoutError:
        raise FarmError(f"No {key} device of the farm became free within {timeout:g} s.",
                        "`edgepack farm status` shows the queue and which devices are down.") from None
    finally:
        sock.close()
    if not isinstance(reply, list) or reply[0] != CODE_SUCCESS:
        raise FarmError(f"The tracker answered {reply!r} to a request for {key}.")
    _url, port, matchkey = reply[1]
    return int(port), str(matchkey)


def on_tracker_device(state: FarmState, inventory: Inventory, profile: Any, op: Callable[[Any], T], *, what: str,
                       known_hosts: Path | None, attempts: int, session_timeout: float, wait: float,
                       progress: Progress | None) -> tuple[Device, T]:
    from tvm import rpc

    drops: list[str] = []
    for attempt in range(1, attempts + 1):
        say(progress, f"Asking the farm's tracker for a free {profile.name} device")
        port, matchkey = _request_device(state, profile.rpc_key, wait)
        name = matchkey.rsplit(":", 1)[-1] if ":" in matchkey else ""
        device = inventory.devices.get(name) or next(
            (inventory.devices[a.name] for a in state.devices.values() if a.port == port and a.name in inventory.devices),
            None)
        if device is None:
            raise FarmError(f"The tracker handed out {matchkey}, which is not in {inventory.path}.",
                            "Restart the farm (`edgepack farm stop` then `start`) after editing the inventory.")
        say(progress, f"The tracker picked {device.name}")

        def healthy(device: Device = device) -> bool:
            return _device_healthy(device, profile, known_hosts)

        try:
            try:
                with deadline(60.0):
                    remote = rpc.connect("127.0.0.1", port, key=matchkey, session_timeout=session_timeout)
            except Exception as exc:  # noqa: BLE001
                raise LinkDropped(f"connecting through the farm failed: {short(exc)}") from None
            try:
                return device, run_remote_op(remote, op, what=what, device_name=device.name,
                                             session_timeout=session_timeout, healthy=healthy)
            finally:
                del remote
        except LinkDropped as exc:
            drops.append(f"{device.name}: {exc}")
            say(progress, f"Lost {device.name} during {what.lower()}; asking the tracker for another device "
                           f"({attempt}/{attempts})")
            time.sleep(1.0)
    raise ConnectionLostError(
        f"{what} on the {profile.name} farm failed {len(drops)} times because devices dropped out "
        f"({'; '.join(short(d, 150) for d in drops)}).",
        "`edgepack farm status` shows which devices are down; `edgepack device check NAME` tells why.",
    )


def _device_healthy(device: Device, profile: Any, known_hosts: Path | None) -> bool:
    try:
        with connect(endpoint_for(device, known_hosts, connect_timeout=5.0)) as session:
            text = read_remote_text(session, server_files(device, home_dir(session))["info"])
            pid = json.loads(text or "{}").get("pid")
            return bool(pid) and pid_alive(session, int(pid), "rpc_server")
    except (EdgepackError, ValueError, OSError):
        return False


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "serve":
        return _serve_main(args[1])
    sys.stderr.write("usage: python -m edgepack.devices.farm serve CONFIG.json (started by `edgepack farm start`)\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
