"""Ctrl-C during tuning: finish and record the batch in flight, then stop; a second Ctrl-C stops at once.

Why a relay. TVM's arithmetic prover runs Z3, whose solver installs a SIGINT handler of its own while it
checks a formula (Z3's ``scoped_ctrl_c``: tens of milliseconds at a time, every second or so, during
MetaSchedule's candidate generation) and puts the previous one back afterwards. A SIGINT that lands then
cancels that one proof and never reaches edgepack: a Ctrl-C was lost now and then. Z3's switch for it
(its global parameter ``ctrl_c``) is not reachable through TVM, and no thread of the tuning process can
take the signal first (a process-wide handler, whichever thread it lands on).

So ``edgepack tune`` runs as two processes (:func:`relay`): the command the user started waits, takes
SIGINT and passes each press on as SIGUSR1, which Z3 leaves alone, to a copy of itself that tunes
(:func:`enter_relayed`). That copy ignores SIGINT (in the same process group, a terminal's Ctrl-C reaches
it too) and dies with the first process (``PR_SET_PDEATHSIG``): a SIGKILL of the command stops the tuning
as it did before. Where the relay cannot run (not Linux), the tuning process takes SIGINT itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator

from edgepack.tuning.search import Control

RELAY_ENV = "EDGEPACK_TUNE_RELAY"  # set for the tuning process: the pid of the process that relays to it
PRESS = signal.SIGUSR1  # a relayed Ctrl-C
_PR_SET_PDEATHSIG = 1
_press = signal.SIGINT  # what a Ctrl-C arrives as in this process (PRESS once enter_relayed has run)


def can_relay() -> bool:
    """Whether this process can tune through a relay: Linux, and not itself the relay's tuning process."""
    return sys.platform.startswith("linux") and RELAY_ENV not in os.environ


def relay(argv: list[str], say: Callable[[str], None] = lambda _line: None) -> int:
    """Run ``python -m edgepack ARGV`` as the tuning process and relay Ctrl-C to it; its exit code.

    A first SIGINT becomes SIGUSR1 for the child (a first SIGTERM is passed on as it is): it finishes the
    batch in flight and stops. A second one of either kills the child at once: Python runs a handler only
    once the child's main thread is back from C++ (MetaSchedule's search holds it for seconds), so a second
    press sent on would be merged with the first. This process does not die of either while the child
    runs; once the child is gone, a press makes it die of the signal the user sent, as a shell expects."""
    child: subprocess.Popen | None = None
    sent: list[int] = []

    def pass_on(signum, _frame) -> None:
        sent.append(signum)
        if child is not None:
            _forward(child, sent)

    saved = {sig: signal.signal(sig, pass_on) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        child = subprocess.Popen([sys.executable, "-m", "edgepack", *argv],
                                 env=dict(os.environ, **{RELAY_ENV: str(os.getpid())}))
        if sent:  # pressed while the child was being started
            _forward(child, sent)
        code = child.wait()
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)
    if code < 0 and sent:
        if len(sent) > 1:
            say("Stopped at once: the batch in flight is lost, the records of finished batches are kept; "
                "rerun the same command to resume")
        signal.signal(sent[-1], signal.SIG_DFL)
        os.kill(os.getpid(), sent[-1])
    return code if code >= 0 else 128 - code


def _forward(child: subprocess.Popen, sent: list[int]) -> None:
    with contextlib.suppress(ProcessLookupError):
        if len(sent) > 1:
            child.kill()
        else:
            child.send_signal(PRESS if sent[0] == signal.SIGINT else sent[0])


def enter_relayed() -> bool:
    """In a tuning process that a relay started: die with the relay, and take a Ctrl-C only as the relay's
    SIGUSR1 (a ``KeyboardInterrupt`` outside :func:`stop_on_signals`, as SIGINT is by default). Returns
    whether this process is one; the mark is not passed on to the processes it starts."""
    global _press
    relay_pid = os.environ.pop(RELAY_ENV, None)
    if relay_pid is None:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if str(os.getppid()) != relay_pid:  # the relay died before prctl took effect
        os._exit(128 + signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(PRESS, signal.default_int_handler)
    _press = PRESS
    return True


_STOPPING = {"preparing": "Stopping: tuning has not started",
             "tuning": "Stopping after the batch in flight (its results are recorded)",
             "checking": "Stopping after the check of the tuned kernels inside the model"}


@contextlib.contextmanager
def stop_on_signals(control: Control, say: Callable[[str], None]) -> Iterator[None]:
    """First Ctrl-C (or SIGTERM): mark ``control`` interrupted. Before tuning starts, also raise
    KeyboardInterrupt (nothing is measured yet; ``Control.checkpoint`` raises it again where TVM turned it
    into another exception or swallowed it); while tuning, the search finishes and records the batch in
    flight, then stops; the check inside the model that ends a run goes on. Second: stop at once.
    Ctrl-C arrives as SIGUSR1 in a relayed process (see the module docstring), as SIGINT elsewhere."""
    press = _press

    def handler(_signum, _frame) -> None:
        control.interrupted = True
        say(_STOPPING.get(control.phase, "Stopping")
            + ("" if control.phase == "preparing" else "; interrupt again to stop at once"))
        for sig in (press, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        control.checkpoint()

    saved = {}
    try:
        for sig in (press, signal.SIGTERM):
            saved[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: leave signals alone
        saved = {}
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)
