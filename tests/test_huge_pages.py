"""A model's memory on huge pages (``edgepack.run.huge_pages`` and the C API's ``ep_model_open*``): what
loading a model adds to the process is collapsed onto transparent huge pages, from Python and from the C
runner, the outputs unchanged on the host and under qemu (rpi4, rpi3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from model_factory import onnx_large_weights

from edgepack.compiling import compile_model
from edgepack.manifest import read_manifest
from edgepack.profiles import get_profile
from edgepack.run import huge_pages
from edgepack.run.c_runner import runner_for_profile
from edgepack.run.host import load_host_library
from edgepack.validation import validate

MIB = 1 << 20


def _moved_for_a_new_block(size: int) -> int:
    """What ``model_memory_on_huge_pages`` moves of a private anonymous block of ``size`` bytes, mapped and
    written inside it."""
    import mmap

    with huge_pages.model_memory_on_huge_pages() as moved:
        block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        block.write(b"\1" * size)
    block.close()
    return moved.bytes


def _kernel_cannot_collapse() -> str | None:
    """Why this kernel cannot collapse memory onto huge pages, read from the kernel itself (never from
    ``edgepack.run.huge_pages``, which the tests check): MADV_COLLAPSE came in Linux 6.1, and transparent
    huge pages must not be ``never``."""
    release = os.uname().release
    try:
        major, minor = (int(part) for part in release.split(".")[:2])
    except ValueError:
        return f"cannot read the kernel's version from {release!r}"
    if (major, minor) < (6, 1):
        return f"Linux {release} has no MADV_COLLAPSE (6.1+)"
    try:
        enabled = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "this kernel has no transparent huge pages"
    return "transparent huge pages are [never] here" if "[never]" in enabled else None


needs_collapse = pytest.mark.skipif(_kernel_cannot_collapse() is not None, reason=str(_kernel_cannot_collapse()))


@pytest.fixture(scope="module")
def large_model(tmp_path_factory):
    return onnx_large_weights(tmp_path_factory.mktemp("large") / "large_weights.onnx")


@pytest.fixture(scope="module")
def host_build(large_model, tmp_path_factory):
    return compile_model(large_model, "host", tmp_path_factory.mktemp("host") / "build").output_dir


@pytest.fixture(scope="module")
def host_library(host_build):
    return host_build / read_manifest(host_build).artifacts["host_library"].path


@needs_collapse
def test_loading_a_model_from_python_puts_its_weights_on_huge_pages(host_build, host_library):
    """In a fresh process, as `edgepack validate` and `bench` load a build: the whole huge pages of its
    12 MB of weights are on huge pages after ``load_host_library``. (A long-lived process may give the
    model memory it already had, which is left as it is: a model loaded after another often reuses the
    first one's, already collapsed.)"""
    script = (
        "import sys, tvm\n"
        "from edgepack.run.host import load_host_library\n"
        "def kib():\n"
        "    return sum(int(l.split()[1]) for l in open('/proc/self/smaps') if l.startswith('AnonHugePages:'))\n"
        "before = kib()\n"
        "vm = load_host_library(sys.argv[1], tvm.cpu())\n"
        "print(kib() - before)\n")
    moved = subprocess.run([sys.executable, "-c", script, str(host_library)], capture_output=True, text=True,
                           check=True)
    assert int(moved.stdout.split()[-1]) >= 8 * 1024
    report = validate(host_build, "host")
    assert report.passed, [(o.name, o.max_abs_error) for o in report.outputs]


@needs_collapse
def test_a_fresh_anonymous_block_is_collapsed():
    """Where the kernel can (the probe above asks the kernel, not edgepack), a block mapped inside
    ``model_memory_on_huge_pages`` ends on huge pages: whole ones, at least one of three."""
    size = huge_pages.huge_page_size()
    assert size > 0
    moved = _moved_for_a_new_block(3 * size)
    assert moved >= size and moved % size == 0


def test_huge_pages_are_off_with_the_environment_switch(monkeypatch):
    monkeypatch.setenv(huge_pages.ENV, "0")
    assert huge_pages.huge_page_size() == 0
    assert _moved_for_a_new_block(8 * MIB) == 0


def _runner_stats(runner: Path, library: Path, *, env: dict | None = None) -> dict:
    result = subprocess.run([runner, library, "--repeat", "2", "--quiet"], capture_output=True, text=True,
                            check=True, env={**os.environ, **(env or {})})
    return json.loads(next(line for line in result.stdout.splitlines() if line.startswith("{")))


@needs_collapse
def test_the_c_runner_puts_the_weights_on_huge_pages(host_build, host_library):
    """The C API (ep_model_open) collapses what loading added; EDGEPACK_HUGE_PAGES=0 leaves it."""
    runner = runner_for_profile(get_profile("host"))
    assert _runner_stats(runner, host_library)["huge_page_bytes"] >= 8 * MIB
    assert _runner_stats(runner, host_library, env={huge_pages.ENV: "0"})["huge_page_bytes"] == 0
    report = validate(host_build, "emulator")  # the host build's emulator is the C runner, run natively
    assert report.passed, [(o.name, o.max_abs_error) for o in report.outputs]


@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
def test_the_device_runner_computes_the_same_with_its_memory_collapsed(large_model, profile, tmp_path):
    """On the device path (the C runner under qemu-user, which passes madvise through as a hint) the
    model opens and computes what ONNX Runtime does."""
    build = compile_model(large_model, profile, tmp_path / profile).output_dir
    report = validate(build, "emulator")
    assert report.passed, [(o.name, o.max_abs_error) for o in report.outputs]


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _process_huge_page_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps") as smaps:
        return sum(int(line.split()[1]) for line in smaps if line.startswith("AnonHugePages:"))


@needs_collapse
def test_the_rpc_server_loads_a_model_onto_huge_pages(host_library):
    """edgepack's RPC server (built for this machine, as `tune --on host-opencl` runs it) moves a model's
    weights onto huge pages when a client loads it, as the C API does; the model runs the same."""
    import numpy as np
    import tvm
    from tvm import relax, rpc

    from edgepack.devices.local_server import LocalRPCServer
    from edgepack.toolchain.compilers import HOST_TRIPLE, host_compilers
    from edgepack.toolchain.rpc_server import server_bundle
    from edgepack.toolchain.tvm_runtime import host_runtime

    server = LocalRPCServer.start(server_bundle(HOST_TRIPLE, host_compilers()[0], host_runtime()), "huge-pages")
    try:
        session = rpc.connect("127.0.0.1", server.port, key=server.key, session_timeout=120)
        session.upload(str(host_library), "large.so")
        vm = relax.VirtualMachine(session.load_module("large.so"), session.cpu())
        x = np.random.default_rng(0).normal(size=(1, 512)).astype(np.float32)
        remote = vm["main"](tvm.runtime.tensor(x, device=session.cpu())).numpy()
        local = load_host_library(host_library, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(remote, local, rtol=1e-5, atol=1e-5)
        assert max(_process_huge_page_kib(pid) for pid in _children(server.process.pid)) >= 8 * 1024
    finally:
        server.stop()
