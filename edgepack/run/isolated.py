"""Runs on this machine's GPU in a child process, so that a driver that aborts cannot take the caller with it.

A GPU driver may end the process that calls it: PoCL asserts (SIGABRT) on a kernel whose local memory it
cannot set up, a Vulkan driver may fault (SIGSEGV). In edgepack's process that would end ``validate`` or
``bench`` (and a user's Python program) with no edgepack error at all. A backend that says so
(``Backend.isolated_runs``) has its runs here made in a child process, which loads the driver: a fork
of the caller where no GPU driver is loaded in it (the command line: fast, everything imported), else
a fork of a forkserver started once per process with TVM imported (a fork of a caller that had loaded
a driver would inherit it without its threads). The child's result (outputs, timings or an
EdgepackError) comes back through a pipe; its death by a signal becomes a ValidationError (exit 1) naming
the build, the signal, the kernel it was running (``traced``: the child writes each kernel's name to a file
before calling it, and waits for the device after) and the driver's last words on stderr.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgepack.errors import EdgepackError, ValidationError

_FORKSERVER: Any = None


def _context(fork: bool) -> Any:
    global _FORKSERVER
    if fork:
        return multiprocessing.get_context("fork")
    if _FORKSERVER is None:
        _FORKSERVER = multiprocessing.get_context("forkserver")
        _FORKSERVER.set_forkserver_preload(["tvm", "edgepack.run.places"])
    return _FORKSERVER


def _child(conn: Any, stderr_path: str, function: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """In the child: the driver's stderr to a file the parent reads, then ``function``; its result or error
    sent back."""
    fd = os.open(stderr_path, os.O_WRONLY | os.O_TRUNC)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        conn.send(("ok", function(*args, **kwargs)))
    except EdgepackError as exc:
        conn.send(("edgepack", (type(exc), exc.message, exc.hint)))
    except BaseException as exc:  # noqa: BLE001  re-raised in the parent with its text
        conn.send(("exception", (type(exc).__name__, str(exc))))
    finally:
        conn.close()


def _tail(path: Path, lines: int = 4) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    return " | ".join(text.splitlines()[-lines:])


def run_isolated(function: Callable[..., Any], *args: Any, what: str, build_dir: Path, label: str,
                 fork: bool = False, traced: bool = False, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` (a module-level function: it is pickled) in a child process; its
    result, or its EdgepackError raised again here. ``what``: what the child does, for the error when a
    signal ends it ("running", "timing"); ``label``: the backend's, for the error. ``fork``: the child is a
    fork of this process (fast; only where no driver is loaded here), else of the forkserver. ``traced``:
    ``function`` also takes ``trace``, a file to name each kernel in as it calls it (not for timings: the
    VM then calls back into Python around each kernel, and waits for the device after it)."""
    if multiprocessing.current_process().daemon:
        # a daemonic process (a worker of a pool: the conformance sweeps') may have no children; whoever
        # started it stands in for the child, as its death is theirs to see
        return function(*args, **kwargs)
    ctx = _context(fork)
    receive, send = ctx.Pipe(duplex=False)
    with tempfile.NamedTemporaryFile(prefix="edgepack-driver-", suffix=".log", delete=False) as log:
        stderr_path = Path(log.name)
    trace_path = stderr_path.with_suffix(".kernel")
    if traced:
        kwargs = {**kwargs, "trace": str(trace_path)}
    try:
        child = ctx.Process(target=_child, args=(send, str(stderr_path), function, args, kwargs), daemon=True)
        child.start()
        send.close()
        try:
            status, payload = receive.recv()
        except EOFError:
            status, payload = None, None
        child.join()
        said = _tail(stderr_path)
        if status is None:
            code = child.exitcode or 0
            how = f"signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() \
                else f"exit status {code}"
            kernel = _tail(trace_path, 1) if traced else ""
            raise ValidationError(
                f"{build_dir}: the {label} driver ended the process {what} the build ({how}) before it "
                "returned; edgepack ran it in a child process, so only that run was lost."
                + (f" It was running the kernel {kernel}." if kernel else "")
                + (f" The driver said: {said}" if said else ""),
                "A kernel of the build asks for something this driver cannot give (e.g. more local or "
                "workgroup memory than the device has): run `edgepack inspect BUILD --kernels` to see its "
                "kernels, compile for a profile whose [limits] are this device's, or validate on the "
                "device itself.")
        if said and status == "ok":
            os.write(2, (stderr_path.read_text(errors="replace")).encode())
        if status == "edgepack":
            kind, message, hint = payload
            raise kind(message, hint)
        if status == "exception":
            name, text = payload
            raise RuntimeError(f"{name}: {text}")
        return payload
    finally:
        receive.close()
        stderr_path.unlink(missing_ok=True)
        trace_path.unlink(missing_ok=True)
