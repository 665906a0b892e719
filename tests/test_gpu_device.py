"""A GPU build on a device reached over SSH runs on that device's GPU, not its CPU.

The device is an x86-64 machine in its own network namespace with its own sshd (``scripts/farm.sh`` with
``EDGEPACK_FARM_ARCH=x86_64``), whose OpenCL driver is PoCL; the profile is the shipped
``x86-64-opencl``. Through the real commands: ``device add/trust/check``, ``validate --on DEVICE``,
``bench --on DEVICE`` and a short ``tune --on DEVICE`` of a real model (PP-OCR's text direction
classifier), whose records then compile and validate there too. Each result records the device the
kernels ran on in the RPC session (``opencl(0)``), which is what this test is about: before the Backend
interface, remote runs always used the device's CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from farm_helpers import FARM, farm_skip_reason
from gpu_common import opencl_driver_missing

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PROFILE = "x86-64-opencl"
FARM_ENV = {"EDGEPACK_FARM_ARCH": "x86_64", "EDGEPACK_FARM_DIR": "/var/lib/edgepack-farm-x86_64"}


def _farm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", str(FARM), *args], capture_output=True, text=True, timeout=900, check=False,
                            env=os.environ | FARM_ENV)
    if check and result.returncode != 0:
        raise AssertionError(f"farm.sh {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def gpu_device(tmp_path_factory):
    reason = farm_skip_reason() or opencl_driver_missing()  # the system's own tools, not edgepack's probe
    if reason:
        pytest.skip(reason)
    was_running = Path(FARM_ENV["EDGEPACK_FARM_DIR"], "farm.json").exists()
    _farm("start", "1")
    info = json.loads(Path(FARM_ENV["EDGEPACK_FARM_DIR"], "farm.json").read_text())["devices"][0]
    config = tmp_path_factory.mktemp("config")
    env = {"XDG_CONFIG_HOME": str(config), "COLUMNS": "200"}
    yield {"env": env, "info": info}
    if not was_running:
        _farm("stop", check=False)


def _cli(env: dict, *args: str, timeout: float = 1500) -> dict | list:
    full = {k: v for k, v in os.environ.items() if k != "EDGEPACK_INVENTORY"} | env
    result = subprocess.run([sys.executable, "-m", "edgepack", *args, "--json"], capture_output=True, text=True,
                            env=full, timeout=timeout, cwd=ROOT, check=False)
    assert result.returncode == 0, f"edgepack {' '.join(args)}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def test_gpu_build_runs_on_the_devices_opencl_device(gpu_device, models, tmp_path):
    env, info = gpu_device["env"], gpu_device["info"]
    model = models["ppocr_cls"]
    shape = [a for s in model.input_shapes.items() for a in ("--input-shape", f"{s[0]}:{','.join(map(str, s[1]))}")]

    _cli(env, "device", "add", "gpu", "--host", info["address"], "--user", info["user"], "--key", info["key_path"],
         "--profile", PROFILE)
    trusted = _cli(env, "device", "trust", "gpu", "--yes")
    assert trusted["fingerprint"] == info["host_key_fingerprint"]
    check = _cli(env, "device", "check", "gpu")[0]
    assert check["ok"] and check["arch"] == "x86_64", check
    rpc = next(item for item in check["items"] if item["name"] == "rpc")
    assert "kernels run on opencl(0)" in rpc["detail"], rpc  # the plug-in loaded beside the device's RPC server

    build = tmp_path / "build"
    compiled = _cli(env, "compile", str(model.path), "--profile", PROFILE, "-o", str(build), *shape)
    assert compiled["extra"]["opencl"]["cpu_fallback"] == []

    report = _cli(env, "validate", str(build), "--on", "gpu")
    assert report["passed"], report
    assert report["ran_on"] == "gpu: opencl(0)", report  # the device's GPU, through RPC

    timings = _cli(env, "bench", str(build), "--on", "gpu", "--repeat", "3")
    assert len(timings) == 1 and timings[0]["ran_on"] == "opencl(0)" and timings[0]["device"] == "gpu"
    assert len(timings[0]["samples_ms"]) == 3 and all(s > 0 for s in timings[0]["samples_ms"])

    # a short tuning run measured on the device's GPU; its records compile and still match there
    tuning = tmp_path / "tuning"
    tuned = _cli(env, "tune", str(model.path), "--profile", PROFILE, "--on", "gpu", "--trials", "4", "--batch", "4",
                 "--task", "fused_conv2d1_", "-o", str(tuning), *shape)
    assert tuned["on"] == "gpu" and tuned["trials_run"] >= 1, tuned
    measured = [t for t in tuned["tasks"] if t["best_seconds"]]
    assert measured and all("conv2d1_" in t["name"] for t in measured), tuned["tasks"]
    tuned_build = tmp_path / "tuned"
    compiled = _cli(env, "compile", str(model.path), "--profile", PROFILE, "-o", str(tuned_build), "--tuning",
                    str(tuning), *shape)
    assert compiled["extra"]["opencl"]["schedules"].get("tuned", 0) >= 1
    report = _cli(env, "validate", str(tuned_build), "--on", "gpu")
    assert report["passed"] and report["ran_on"] == "gpu: opencl(0)", report


def test_operators_the_gpu_cannot_run_run_on_the_devices_cpu_through_rpc(gpu_device, tmp_path):
    """The RPC server carries both devices of one program: for a GPU without 64-bit floats (the shipped profile
    with ``[limits] fp64 = false``, as a profile file), a model's double operators run on the device's CPU and
    the rest on its OpenCL device; the build validates there against ONNX Runtime."""
    from model_factory import onnx_doubles

    env, info = gpu_device["env"], gpu_device["info"]
    text = (ROOT / "device_profiles" / f"{PROFILE}.toml").read_text()
    assert "buffer_size = 134217728\n" in text
    profile = tmp_path / "no-fp64.toml"
    profile.write_text(text.replace(f'name = "{PROFILE}"', 'name = "x86-64-opencl-no-fp64"')
                       .replace("buffer_size = 134217728\n", "buffer_size = 134217728\nfp64 = false\n"))
    _cli(env, "device", "add", "gpu-no-fp64", "--host", info["address"], "--user", info["user"], "--key",
         info["key_path"], "--profile", PROFILE)
    _cli(env, "device", "trust", "gpu-no-fp64", "--yes")
    build = tmp_path / "build"
    compiled = _cli(env, "compile", str(onnx_doubles(tmp_path / "doubles.onnx")), "--profile", str(profile), "-o",
                    str(build))
    placed = {op.split(" ")[0] for op in compiled["extra"]["opencl"]["cpu_operators"]}
    assert placed == {"to_double", "scale_double", "shift_double", "to_float"}, compiled["extra"]["opencl"]
    assert "double" not in (build / "device" / "kernels.cl").read_text()
    for seed in ("1", "2"):
        report = _cli(env, "validate", str(build), "--on", "gpu-no-fp64", "--seed", seed)
        assert report["passed"] and not report["degenerate"], report
        assert report["ran_on"] == "gpu-no-fp64: opencl(0)", report
