"""edgepack's RPC server run on this machine, as if this machine were a device: how tuning measures GPU
kernels on this machine's own GPU (e.g. PoCL for OpenCL), through the same server and plug-ins a device gets."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from edgepack.errors import ToolchainError
from edgepack.progress import Progress
from edgepack.toolchain.rpc_server import ServerBundle

_WORKDIR_PREFIX = "edgepack-rpc-local-"


def _remove_stale_workdirs() -> None:
    """Work directories of servers whose edgepack was killed (the server then exits by itself)."""
    for directory in Path(tempfile.gettempdir()).glob(_WORKDIR_PREFIX + "*"):
        try:
            os.kill(int((directory / "pid").read_text()), 0)
        except ProcessLookupError:
            shutil.rmtree(directory, ignore_errors=True)
        except (OSError, ValueError):  # no pid yet (being started), or not ours to signal
            continue


@dataclass
class LocalRPCServer:
    """A running ``edgepack_rpc_server`` on 127.0.0.1, in its own process group."""

    process: subprocess.Popen
    port: int
    key: str
    workdir: Path
    log_path: Path

    @classmethod
    def start(cls, bundle: ServerBundle, key: str, *, timeout: float = 30.0,
              log: Progress | None = None) -> LocalRPCServer:
        """Start the server of ``bundle`` (built for this machine) on a free loopback port."""
        _remove_stale_workdirs()
        workdir = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX))
        port_file, log_path = workdir / "port", workdir / "server.log"
        if log:
            log(f"Starting edgepack's RPC server on this machine ({key})")
        with open(log_path, "wb") as log_handle:
            # own session: stop() ends the server and every session process it forked;
            # --exit-with-parent: it also ends when this process is killed (nothing else would stop it)
            process = subprocess.Popen(
                [str(bundle.program), "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file), "--key",
                 key, "--workdir", str(workdir), "--exit-with-parent"],
                stdin=subprocess.DEVNULL, stdout=log_handle, stderr=subprocess.STDOUT, start_new_session=True)
        (workdir / "pid").write_text(str(process.pid))
        server = cls(process, 0, key, workdir, log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = port_file.read_text().strip() if port_file.is_file() else ""
            if text.isdigit():
                server.port = int(text)
                return server
            if process.poll() is not None:
                break
            time.sleep(0.05)
        output = log_path.read_text(errors="replace")
        server.stop()
        raise ToolchainError(f"edgepack's RPC server for this machine did not start: "
                             f"{output.strip().splitlines()[-1] if output.strip() else 'no output'}.",
                             "Check `edgepack doctor`, and rebuild the server: remove ~/.cache/edgepack/rpc-server.")

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except Exception:  # noqa: BLE001  a session stuck in the driver
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)
