#!/usr/bin/env python3
"""Run a GPU build's *device* library on an aarch64 OpenCL implementation, emulated on this machine.

    python3 runtimes/plugins/opencl/tests/aarch64_pocl.py BUILD_DIR [--work /tmp/edgepack-arm64-pocl]

What it checks, end to end, with no real device: the aarch64 C runner (runtimes/api/c, linked against the
official aarch64 TVM runtime), edgepack's OpenCL plug-in cross-built for aarch64 (loaded by the
runner from the model's directory) and the build's device/model.so (aarch64 host code + OpenCL
kernels) run on Debian's arm64 PoCL, and the outputs are compared with the reference runtime.

How: the arm64 packages of PoCL and the OpenCL ICD loader (and their dependencies, ~190 MB) are
downloaded with apt-get into a private apt state under --work (the system's apt configuration and
dpkg database are not touched) and unpacked into a root file system there; the runner runs in a
chroot of it through qemu-user's binfmt_misc registration (qemu-user-static, binfmt-support), with
/proc, /dev and /sys bind-mounted for the duration of the run. Needs root. Slow: PoCL compiles every
kernel with LLVM under emulation (MobileNetV2: about 3.5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

PACKAGES = ["pocl-opencl-icd", "ocl-icd-libopencl1"]
SOURCES = """Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Architectures: arm64
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def apt_options(apt: Path) -> list[str]:
    return [
        "-o", f"Dir::Etc={apt / 'etc'}", "-o", "Dir::Etc::sourcelist=/dev/null",
        "-o", f"Dir::Etc::sourceparts={apt / 'etc' / 'sources.list.d'}",
        "-o", f"Dir::State={apt / 'state'}", "-o", f"Dir::State::status={apt / 'state' / 'status'}",
        "-o", f"Dir::Cache={apt / 'cache'}", "-o", "APT::Architecture=arm64",
        "-o", "APT::Architectures::=arm64", "-o", "Debug::NoLocking=1",
    ]


def make_rootfs(work: Path) -> Path:
    rootfs, apt = work / "rootfs", work / "apt"
    if (rootfs / "usr" / "lib" / "aarch64-linux-gnu" / "libpocl.so.2").exists():
        return rootfs
    for d in ("state/lists/partial", "cache/archives/partial", "etc/apt.conf.d", "etc/preferences.d",
              "etc/sources.list.d"):
        (apt / d).mkdir(parents=True, exist_ok=True)
    (apt / "state" / "status").touch()
    (apt / "etc" / "sources.list.d" / "debian.sources").write_text(SOURCES)
    opts = apt_options(apt)
    subprocess.run(["apt-get", *opts, "update", "-qq"], check=True)
    subprocess.run(["apt-get", *opts, "install", "--download-only", "-qq", "-y", *PACKAGES], check=True)
    rootfs.mkdir(parents=True, exist_ok=True)
    for deb in sorted((apt / "cache" / "archives").glob("*.deb")):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(rootfs)], check=True)
    return rootfs


def main() -> int:
    from edgepack.backends import get_backend
    from edgepack.frontends import run_reference
    from edgepack.manifest import read_manifest
    from edgepack.tensors import random_inputs
    from edgepack.toolchain.c_programs import build_c_program
    from edgepack.toolchain.plugins import target_plugin
    from edgepack.validation import compare

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/edgepack-arm64-pocl"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    manifest = read_manifest(args.build)
    if manifest.profile.get("backend") != "opencl" or manifest.profile.get("triple") != "aarch64-linux-gnu":
        parser.error(f"{args.build} is not an aarch64-linux-gnu OpenCL build")
    rootfs = make_rootfs(args.work)
    plugin, runtime = target_plugin(get_backend("opencl").recipe, "aarch64-linux-gnu", "aarch64-linux-gnu-gcc",
                                    "aarch64-linux-gnu-g++")
    job = rootfs / "edgepack"
    shutil.rmtree(job, ignore_errors=True)
    (job / "lib").mkdir(parents=True)
    (job / "out").mkdir()
    build_c_program(runtime, job / "edgepack_run", cc="aarch64-linux-gnu-gcc", rpath=["$ORIGIN/lib"])
    for lib in runtime.shared_libs:
        shutil.copy2(lib, job / "lib" / lib.name)
    shutil.copy2(plugin.shared, job / "lib" / "libtvm_opencl.so")
    shutil.copy2(args.build / manifest.artifacts["device_library"].path, job / "lib" / "model.so")

    import numpy as np

    inputs = random_inputs(manifest.inputs, args.seed)
    argv = ["chroot", str(rootfs), "/edgepack/edgepack_run", "/edgepack/lib/model.so"]
    for i, spec in enumerate(manifest.inputs):
        np.save(job / f"input{i}.npy", inputs[spec.name])
        argv += ["--input", f"{spec.name}=/edgepack/input{i}.npy"]
    argv += ["--output-dir", "/edgepack/out"]

    mounts = []
    try:
        for name, how in (("proc", ["-t", "proc", "proc"]), ("dev", ["--bind", "/dev"]), ("sys", ["--bind", "/sys"])):
            (rootfs / name).mkdir(exist_ok=True)
            subprocess.run(["mount", *how, str(rootfs / name)], check=True)
            mounts.append(rootfs / name)
        started = time.perf_counter()
        result = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
        seconds = time.perf_counter() - started
    finally:
        for m in reversed(mounts):
            subprocess.run(["umount", str(m)], check=False)
    print(result.stdout + result.stderr)
    if result.returncode != 0:
        print(f"FAIL: the aarch64 runner exited with {result.returncode}")
        return 1
    expected = run_reference(args.build / manifest.model_file, manifest.model_format, inputs, manifest.outputs)
    ok = True
    for i, (spec, want) in enumerate(zip(manifest.outputs, expected)):
        actual = np.load(next((job / "out").glob(f"{i}_*.npy")))
        cmp = compare(spec.name, actual, want, 1e-4, 1e-3)
        ok &= cmp.passed
        print(f"{spec.name}: max abs error {cmp.max_abs_error:.3g}, mismatched {cmp.mismatched} -> "
              f"{'PASS' if cmp.passed else 'FAIL'}")
    print(f"{'PASS' if ok else 'FAIL'}: aarch64 runner + libtvm_opencl.so on arm64 PoCL (emulated), {seconds:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
