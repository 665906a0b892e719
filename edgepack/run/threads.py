"""How many threads a run uses: ``--threads N``, else ``TVM_NUM_THREADS``, else every physical core.

TVM's own default is wrong for small machines: on x86 it halves the logical CPU count to skip
hyper-threads even where there are none (a 2-core VM runs every model single-threaded). Its thread
pool is sized once per calling thread, when the first parallel kernel runs: a count is set before
that, and a pool already made can only use fewer threads than it has.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edgepack.errors import EdgepackError
from edgepack.run.parallel import set_pool_threads

ENV = "TVM_NUM_THREADS"
_BIG_CORES = 1  # TVM's ThreadGroup::kBig affinity mode


def physical_cores() -> int:
    """This process's CPUs, hyper-threads of one core counted once."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in allowed:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topology.joinpath("physical_package_id").read_text().strip(),
                       topology.joinpath("core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))


def resolve_threads(threads: int | None) -> int:
    """``threads``, else ``$TVM_NUM_THREADS``, else every physical core; a clear error for nonsense."""
    if threads is None:
        text = os.environ.get(ENV, "").strip()
        if not text:
            return physical_cores()
        try:
            threads = int(text)
        except ValueError:
            raise EdgepackError(f"{ENV}={text!r} is not a number of threads.",
                                f"Set {ENV} to a positive integer, or unset it to use every core.") from None
    if threads < 1:
        raise EdgepackError(f"Cannot run with {threads} threads.", "Pass --threads 1 or more.")
    return threads


def use_threads_here(threads: int | None) -> int:
    """Make models in this process run parallel kernels on ``resolve_threads(threads)`` threads: edgepack's
    pool (``edgepack.run.parallel``), and TVM's own for what it still runs."""
    import tvm

    count = resolve_threads(threads)
    os.environ[ENV] = str(count)  # sizes the pools TVM makes from now on
    tvm.get_global_func("runtime.config_threadpool")(_BIG_CORES, count)
    set_pool_threads(count)
    return count


@contextmanager
def threads_here(threads: int | None) -> Iterator[int]:
    """``use_threads_here`` for a block: afterwards the process runs on what it ran on before."""
    before = os.environ.get(ENV)
    try:
        yield use_threads_here(threads)
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before
        use_threads_here(resolve_threads(None))


def use_threads_remote(session: Any, threads: int | None) -> int | None:
    """The same in an RPC session's server (a device); None keeps the server's own setting."""
    if threads is None:
        return None
    count = resolve_threads(threads)
    try:  # edgepack's RPC server: its thread pool (and TVM's); a plain TVM server: TVM's pool
        session.get_function("edgepack.set_num_threads")(count)
    except Exception:  # noqa: BLE001 - TVM's RPC raises its own error for a function the server lacks
        session.get_function("runtime.config_threadpool")(_BIG_CORES, count)
    return count
