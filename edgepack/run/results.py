"""What a benchmark returns, wherever it ran."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class RunOutputs:
    """What one run of a build gave back, wherever it ran."""

    arrays: list[np.ndarray]  # in the order the running side returned them (the build's: the manifest's)
    ran_on: str  # what computed them: "this machine: cpu(0)", "pi4: opencl(0)", "C runner under qemu-arm ..."
    names: tuple[str, ...] | None = None  # the names the running side gave them, where it reports any


@dataclass(frozen=True)
class BenchResult:
    """Latency of a build on one device (TVM's ``time_evaluator``, on the device itself)."""

    build_dir: str
    device: str
    profile: str
    host: str
    repeat: int
    number: int  # runs averaged into each sample
    warmup: int
    samples_ms: tuple[float, ...]
    seconds: float  # wall time of the whole benchmark, connection included
    via: str = "ssh"  # "ssh": a direct tunnel; "tracker": a device handed out by the farm's tracker; "local"
    ran_on: str = ""  # the device that ran it: "cpu(0)", "opencl(0)", ...
    threads: int | None = None  # TVM_NUM_THREADS of the run, where edgepack set it

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
            "via": self.via, "ran_on": self.ran_on, "threads": self.threads, "repeat": self.repeat, "number": self.number, "warmup": self.warmup, **stats,
            "samples_ms": [round(s, 4) for s in self.samples_ms], "seconds": round(self.seconds, 3),
        }
