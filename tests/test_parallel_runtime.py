"""edgepack's thread pool for the models' parallel loops (runtimes/api/c/src/ep_parallel.c): its own C test
on this machine and under qemu (aarch64, armv7), then real models whose kernels run on it here (Python),
in the C runner (the C API of bundles and AARs) and under a background load. Timings live in
scripts/bench.py (--load N); these tests check what is computed and that the pool is the one in use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgepack.manifest import read_manifest
from edgepack.profiles import get_profile
from edgepack.run.c_runner import runner_for_profile
from edgepack.toolchain.compilers import emulator_command
from edgepack.validation import validate

ROOT = Path(__file__).resolve().parent.parent
C_API = ROOT / "runtimes" / "api" / "c"
TRIPLES = {"host": ("gcc", []), "rpi4": ("aarch64-linux-gnu-gcc", None), "rpi3": ("arm-linux-gnueabihf-gcc", None)}


@pytest.mark.parametrize("profile", list(TRIPLES))
def test_the_pools_own_test_passes_here_and_under_qemu(profile, tmp_path):
    """Loops split as TVM splits them, element by element; a library that synchronises inside its loops;
    loops inside loops and from several threads; an error in one part; the thread count honoured."""
    cc, prefix = TRIPLES[profile]
    prefix = emulator_command(get_profile(profile)) if prefix is None else prefix
    flags = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]
    sync = tmp_path / "test_parallel_sync.so"
    program = tmp_path / "test_parallel"
    subprocess.run([cc, *flags, "-shared", "-fPIC", C_API / "tests" / "test_parallel_sync.c", "-o", sync],
                   check=True, capture_output=True)
    subprocess.run([cc, *flags, "-rdynamic", "-I", C_API / "src", C_API / "tests" / "test_parallel.c",
                    C_API / "src" / "ep_parallel.c", "-lpthread", "-ldl", "-o", program], check=True, capture_output=True)
    result = subprocess.run([*prefix, str(program), str(sync)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


def _fake_cpus(root: Path, cpus: dict[int, tuple[int, int]]) -> Path:
    """A copy of /sys/devices/system/cpu describing ``cpus``: {cpu: (max kHz, core id)}."""
    for cpu, (khz, core) in cpus.items():
        (root / f"cpu{cpu}" / "cpufreq").mkdir(parents=True)
        (root / f"cpu{cpu}" / "topology").mkdir()
        (root / f"cpu{cpu}" / "cpufreq" / "cpuinfo_max_freq").write_text(f"{khz}\n")
        (root / f"cpu{cpu}" / "topology" / "physical_package_id").write_text("0\n")
        (root / f"cpu{cpu}" / "topology" / "core_id").write_text(f"{core}\n")
    return root


def test_the_pool_takes_the_big_cores_of_a_big_little_device(tmp_path):
    """A phone's CPU tree (one little, one big core, as this machine's two CPUs): one thread by default, its
    workers pinned to the big core; two equal cores: both, unpinned; hyper-threads of one core: one."""
    import os

    if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1")  # the fake trees below describe them
    program = tmp_path / "test_parallel"
    subprocess.run(["gcc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-rdynamic", "-I", C_API / "src",
                    C_API / "tests" / "test_parallel.c", C_API / "src" / "ep_parallel.c", "-lpthread", "-ldl", "-o",
                    program], check=True, capture_output=True)

    def device(cpus: dict[int, tuple[int, int]], name: str) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
        env["EDGEPACK_SYSFS_CPU"] = str(_fake_cpus(tmp_path / name, cpus))
        return json.loads(subprocess.run([program, "--device"], capture_output=True, text=True, env=env,
                                         check=True).stdout)

    assert device({0: (1_800_000, 0), 1: (2_400_000, 1)}, "big-little") == {"default_threads": 1, "pinned_cpus": 1}
    assert device({0: (2_400_000, 0), 1: (2_400_000, 1)}, "equal") == {"default_threads": 2, "pinned_cpus": 0}
    assert device({0: (2_400_000, 0), 1: (2_400_000, 0)}, "one-core") == {"default_threads": 1, "pinned_cpus": 0}


@pytest.mark.parametrize("milliseconds", [600, 0])
def test_the_pool_gives_up_a_core_another_process_holds(tmp_path, background_load, milliseconds):
    """With a process spinning on one of this machine's cores, the pool's loops run on the cores left (a
    worker sharing that core would hold up every kernel); it looks at /proc/stat, not at timings: over
    intervals of CPU time, and at its very first loop at the threads running then (0 ms: one loop; a model
    run a few times after start took 1.9x its 1-thread time while the first interval ran)."""
    import os

    cpus = len(os.sched_getaffinity(0))
    program = tmp_path / "test_parallel"
    subprocess.run(["gcc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-rdynamic", "-I", C_API / "src",
                    C_API / "tests" / "test_parallel.c", C_API / "src" / "ep_parallel.c", "-lpthread", "-ldl", "-o",
                    program], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    done = json.loads(subprocess.run([program, "--busy", str(milliseconds)], capture_output=True, text=True, env=env,
                                     check=True, timeout=120).stdout)
    assert done["threads"] >= 2 and 1 <= done["threads_in_use"] <= min(done["threads"], cpus - 1), done


def _in_a_fresh_process(code: str, env: dict | None = None) -> dict:
    import os

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **(env or {})), check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


VALIDATE = """
import json, sys
from edgepack.run.parallel import pool_loops
from edgepack.validation import validate
reports = [validate(sys.argv[1] if len(sys.argv) > 1 else {build!r}, "host", threads=t) for t in (1, 2, 3)]
print(json.dumps({{"passed": all(r.passed for r in reports), "loops": pool_loops(),
                   "degenerate": any(r.degenerate for r in reports)}}))
"""


@pytest.mark.slow
def test_a_real_model_runs_on_the_pool_here_and_matches_at_every_thread_count(models, build_cache):
    build = build_cache(models["mobilenetv2"], "host")
    ours = _in_a_fresh_process(VALIDATE.format(build=str(build)))
    assert ours["passed"] and not ours["degenerate"] and ours["loops"] > 50, ours  # every kernel's loops
    theirs = _in_a_fresh_process(VALIDATE.format(build=str(build)), env={"EDGEPACK_PARALLEL": "tvm"})
    assert theirs["passed"] and theirs["loops"] == 0, theirs  # TVM's own pool, where asked for


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["host", "rpi4"])
def test_the_c_runner_runs_models_on_the_pool(models, build_cache, profile):
    """The C API (C bundles, the AAR's JNI layer, the RPC server share it) installs the pool before it
    opens a model: the runner's statistics count the kernels' loops it ran."""
    build = build_cache(models["mobilenetv2"], profile)
    manifest = read_manifest(build)
    prefix = emulator_command(get_profile(profile)) if profile != "host" else []
    runner = runner_for_profile(get_profile(profile))
    library = build / manifest.artifacts["device_library"].path
    for threads, expect in (("2", True), ("1", True)):
        done = subprocess.run([*prefix, str(runner), str(library), "--repeat", "2", "--threads", threads, "--quiet"],
                              capture_output=True, text=True, timeout=900, check=True)
        stats = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
        assert stats["threads"] == int(threads) and (stats["parallel_loops"] > 50) == expect, stats


@pytest.fixture
def background_load():
    """One process spinning on a core for as long as the test runs (a phone's other app)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield spinner
    finally:
        spinner.kill()
        spinner.wait()


@pytest.mark.slow
def test_models_compute_the_same_under_background_load(models, build_cache, background_load):
    """With a core held by another process, every thread count gives the reference's numbers (parts a
    parked worker did not take are run by the others)."""
    for name in ("mobilenetv2", "ppocr_det"):
        model = models[name]
        build = build_cache(model, "host")
        for threads in (2, 3):
            report = validate(build, "host", threads=threads, inputs=model.natural)
            assert report.passed and not report.degenerate, report.to_dict()
