"""Running a build on this machine: ``host/model.so`` in TVM's Relax VM, on the device the build's backend
names (the CPU, or this machine's OpenCL / Vulkan GPU through edgepack's runtime plug-in)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from edgepack.backends import backend_for, describe_device
from edgepack.errors import EdgepackError
from edgepack.frontends.reference import quiet_native_stderr
from edgepack.manifest import BuildManifest
from edgepack.run.huge_pages import model_memory_on_huge_pages
from edgepack.run.parallel import pool
from edgepack.tensors import contiguous
from edgepack.toolchain.packed_kernels import register_program_loader


def flatten_outputs(result) -> list[np.ndarray]:
    """The Relax VM's result (a tensor or nested tuples of them) as a flat list of arrays."""
    if hasattr(result, "numpy"):
        return [result.numpy()]
    flat: list[np.ndarray] = []
    for item in result:
        flat.extend(flatten_outputs(item))
    return flat


def load_host_library(library: Path, device: Any) -> Any:
    """A host model library (``host/model.so``) in TVM's Relax VM on ``device``, what loading it
    added to the process on huge pages (``edgepack.run.huge_pages``)."""
    import tvm
    from tvm import relax

    pool()  # edgepack's thread pool, before the library loads (it takes the pool's address then)
    register_program_loader()  # a program stored compressed (mostly-zero weights)
    with model_memory_on_huge_pages(), quiet_native_stderr():
        return relax.VirtualMachine(tvm.runtime.load_module(str(library)), device)


#: the Relax VM's own functions (allocation, shape checks): not kernels
VM_BUILTIN = "vm.builtin."


def trace_kernels(vm: Any, path: str, device: Any) -> None:
    """Before each kernel ``vm`` calls, its name written to the file ``path`` (only the last stays), and after
    it the device waited for (a GPU runs its queue behind the caller): a driver that ends the process in
    the middle of a run is then known by the kernel it was running."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

    def instrument(_func, name, before, _ret, *_args) -> int:
        if str(name).startswith(VM_BUILTIN):
            return 0
        if before:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(name).encode(), 0)
        else:
            device.sync()
        return 0

    vm.set_instrument(instrument)


def run_host_library(build_dir: Path, manifest: BuildManifest, inputs: dict[str, np.ndarray],
                     device: Any, *, trace: str | None = None) -> list[np.ndarray]:
    """The build's ``host/model.so`` in TVM's Relax VM on ``device``, inputs copied there; ``trace``: a
    file that names each kernel as it is called (``trace_kernels``)."""
    import tvm

    vm = load_host_library(build_dir / manifest.artifacts["host_library"].path, device)
    if trace:
        trace_kernels(vm, trace, device)
    args = [tvm.runtime.tensor(contiguous(inputs[spec.name]), device=device) for spec in manifest.inputs]
    return flatten_outputs(vm["main"](*args))  # .numpy() waits for the device


def run_on_host(build_dir: Path, manifest: BuildManifest, inputs: dict[str, np.ndarray]) -> tuple[list[np.ndarray], str]:
    """Run a build here, on the device its backend runs on; returns the outputs and what ran them."""
    backend = backend_for(manifest)
    device = backend.host_device()
    try:
        return run_host_library(build_dir, manifest, inputs, device), describe_device(device)
    except EdgepackError:
        raise
    except Exception as exc:  # TVM raises RuntimeError/ValueError/... with the runtime's message
        raise backend.run_error(exc, build_dir, "this machine") from exc
