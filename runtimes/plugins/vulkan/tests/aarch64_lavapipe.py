#!/usr/bin/env python3
"""Run a Vulkan build's aarch64 C bundle on an aarch64 Vulkan driver (lavapipe), emulated on this machine.

    python3 runtimes/plugins/vulkan/tests/aarch64_lavapipe.py BUILD_DIR [--work /tmp/edgepack-arm64-lavapipe]

What it checks, end to end, with no real device: `edgepack package c` of an aarch64-linux-gnu Vulkan
build (vulkan-generic, mali-g610-vulkan): its runner (runtimes/api/c, official aarch64 TVM runtime), the
Vulkan plug-in cross-built for aarch64 (lib/libtvm_vulkan.so) and the aarch64 wheel's wgpu-native
(lib/libwgpu_native.so), running device/model.so (aarch64 host code + WGSL) on Debian's arm64 Mesa
lavapipe; the outputs are compared with the reference runtime.

How (as runtimes/plugins/opencl/tests/aarch64_pocl.py): the arm64 packages of lavapipe and the Vulkan loader
(and their dependencies) are downloaded with apt-get into a private apt state under --work (the
system's apt configuration and dpkg database are not touched) and unpacked into a root file system
there; the runner runs in a chroot of it through qemu-user's binfmt_misc registration, with /proc,
/dev and /sys bind-mounted for the run. Needs root and network. Slow: lavapipe compiles every
shader with LLVM, and runs it, under emulation.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

PACKAGES = ["mesa-vulkan-drivers", "libvulkan1"]
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
    if (rootfs / "usr" / "share" / "vulkan" / "icd.d" / "lvp_icd.aarch64.json").exists():
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
    from edgepack.frontends import run_reference
    from edgepack.manifest import read_manifest
    from edgepack.packaging.c import package_c
    from edgepack.tensors import random_inputs
    from edgepack.validation import compare

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/edgepack-arm64-lavapipe"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    manifest = read_manifest(args.build)
    if manifest.profile.get("backend") != "vulkan" or manifest.profile.get("triple") != "aarch64-linux-gnu":
        parser.error(f"{args.build} is not an aarch64-linux-gnu Vulkan build")
    rootfs = make_rootfs(args.work)
    job = rootfs / "edgepack"
    shutil.rmtree(job, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        bundle = package_c(args.build, Path(tmp) / "bundle", progress=print)
        shutil.copytree(bundle.output_dir, job)
    (job / "out").mkdir()
    (rootfs / "tmp").mkdir(exist_ok=True)

    import numpy as np

    inputs = random_inputs(manifest.inputs, args.seed)
    argv = ["chroot", str(rootfs), "/edgepack/bin/edgepack_run", "/edgepack/lib/model.so"]
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
        # chroot keeps the environment: a runtime directory silences Mesa's warning
        result = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False,
                                env=dict(os.environ, XDG_RUNTIME_DIR="/tmp"))
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
    print(f"{'PASS' if ok else 'FAIL'}: aarch64 C bundle (libtvm_vulkan.so + libwgpu_native.so) on arm64 "
          f"lavapipe (emulated), {seconds:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
