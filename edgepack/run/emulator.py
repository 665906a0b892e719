"""Running a build under emulation: the device library, run by the C runner for the profile's triple under
qemu-user. What the device would compute, without Python and without the device."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgepack.backends import backend_for
from edgepack.manifest import BuildManifest
from edgepack.profiles import profile_from_dict
from edgepack.run.c_runner import run_c_runner, runner_for_profile
from edgepack.run.results import RunOutputs
from edgepack.toolchain.compilers import emulator_command


def run_on_emulator(build_dir: Path, manifest: BuildManifest, inputs: dict[str, np.ndarray], *,
                    threads: int | None = None) -> RunOutputs:
    """Run the build's device library under qemu-user: its outputs, named as the library's metadata names them."""
    refusal = backend_for(manifest).emulation_refusal(build_dir, manifest)
    if refusal is not None:
        raise refusal
    profile = profile_from_dict(manifest.profile)
    prefix = emulator_command(profile)
    runner = runner_for_profile(profile)
    library = build_dir / manifest.artifacts["device_library"].path
    result = run_c_runner(prefix, runner, library, inputs, manifest.inputs, manifest.outputs, threads=threads)
    where = f"{prefix[0]} ({profile.triple})" if prefix else f"this machine ({profile.triple})"
    return RunOutputs(result.outputs, f"C runner under {where}", result.names)
