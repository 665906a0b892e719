"""Devices end to end against the farm-in-a-box (scripts/farm.sh): the `edgepack device|farm|bench|validate`
commands and the library under them, with real sshd, real SFTP, real TVM RPC through SSH tunnels, and a
real model (PP-OCR's text direction classifier) compiled for rpi4 running on emulated aarch64 devices.

The tests run in file order and share one inventory: add -> trust -> check -> run -> farm -> failures.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_clean_error
from farm_helpers import farm_info, farm_sh, farm_skip_reason, farm_state_dir
from mutation import wrong_build

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TRACKER_PORT = 19190  # not the default 9190: leave a user's own tracker alone










def _farm_device(name: str) -> dict:
    return next(d for d in farm_info()["devices"] if d["name"] == name)


@pytest.fixture(scope="session")
def farm():
    reason = farm_skip_reason(need_cross_compiler=True)
    if reason:
        pytest.skip(reason)
    was_running = (farm_state_dir() / "farm.json").exists()
    farm_sh("start", "2")
    yield farm_info()
    if was_running:
        farm_sh("start", "2", check=False)  # leave someone else's farm as we found it (revived)
    else:
        farm_sh("stop", check=False)


@pytest.fixture(scope="module")
def env(farm, tmp_path_factory):
    """A private config dir (inventory, known_hosts, status); the farm's inventory file is passed explicitly."""
    config = tmp_path_factory.mktemp("config")
    inventory = config / "edgepack" / "devices.toml"
    environment = {"XDG_CONFIG_HOME": str(config), "COLUMNS": "200", "EDGEPACK_INVENTORY": ""}
    yield {"config": config, "inventory": inventory, "known_hosts": config / "edgepack" / "known_hosts",
           "env": environment}
    # whatever happens, no farm process of ours survives the module
    _cli(environment, "farm", "stop", "--inventory", str(inventory))


def _cli(environment: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "EDGEPACK_INVENTORY"}
    full.update({k: v for k, v in environment.items() if v})
    return subprocess.run([sys.executable, "-m", "edgepack", *args], check=False, capture_output=True, text=True, env=full,
                          timeout=timeout, cwd=ROOT)


def _ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stdout + result.stderr
    return result


def _json(result: subprocess.CompletedProcess):
    return json.loads(_ok(result).stdout)


def _inv(env) -> list[str]:
    return ["--inventory", str(env["inventory"])]


@pytest.fixture(scope="module")
def cls_build(models, build_cache) -> Path:
    """A real model with real weights (PP-OCR mobile v2 text direction classifier) compiled for rpi4."""
    return build_cache(models["ppocr_cls"], "rpi4")


def _library(env):
    """The library API with this module's inventory and known hosts."""
    from edgepack.devices.inventory import load_inventory

    return load_inventory(env["inventory"]), env["known_hosts"]


# ---------------------------------------------------------------------------------------------
# inventory and trust


def test_add_trust_and_check(env, farm):
    for d in farm["devices"]:
        added = _json(_cli(env["env"], "device", "add", d["name"], "--host", d["address"], "--user", d["user"],
                           "--profile", "rpi4", "--key", d["key_path"], "--port", str(d["port"]), *_inv(env), "--json"))
        assert added["device"]["host"] == d["address"] and added["inventory"] == str(env["inventory"])
    text = env["inventory"].read_text()
    assert "[devices.farm0]" in text and "[devices.farm1]" in text

    # a second add of the same name is refused, a bad profile too
    assert_clean_error(_cli(env["env"], "device", "add", "farm0", "--host", "h", "--user", "u", "--profile", "rpi4",
                            *_inv(env)), "already in")
    assert_clean_error(_cli(env["env"], "device", "add", "x", "--host", "h", "--user", "u", "--profile", "nope",
                            *_inv(env)), "Unknown device profile")

    # not trusted yet: check refuses and says how to trust
    refused = _cli(env["env"], "device", "check", "farm0", *_inv(env))
    assert refused.returncode == 1 and "Traceback" not in refused.stdout + refused.stderr
    flat = " ".join(refused.stdout.split())
    assert "not trusted yet" in flat and "edgepack device trust farm0" in flat

    # declining the prompt records nothing
    declined = subprocess.run([sys.executable, "-m", "edgepack", "device", "trust", "farm0", *_inv(env)],
                              check=False, input="n\n", capture_output=True, text=True, timeout=120, cwd=ROOT,
                              env={**os.environ, **{k: v for k, v in env["env"].items() if v}})
    assert declined.returncode != 0 and _farm_device("farm0")["host_key_fingerprint"] in declined.stdout
    assert not env["known_hosts"].exists() or "10.77" not in env["known_hosts"].read_text()

    for d in farm["devices"]:
        trusted = _json(_cli(env["env"], "device", "trust", d["name"], "--yes", "--json", *_inv(env)))
        assert trusted["fingerprint"] == d["host_key_fingerprint"] and trusted["was_trusted"] is False
    again = _json(_cli(env["env"], "device", "trust", "farm0", "--yes", "--json", *_inv(env)))
    assert again["was_trusted"] is True

    checks = _json(_cli(env["env"], "device", "check", "--json", *_inv(env), timeout=900))
    assert [c["device"] for c in checks] == ["farm0", "farm1"]
    for check in checks:
        assert check["ok"], check
        assert check["arch"] == "aarch64" and check["rpc"] == "ok" and check["runtime"] == "TVM 0.27.0.post1"
        assert [i["name"] for i in check["items"]] == ["ssh", "arch", "runtime", "rpc"]

    listing = _json(_cli(env["env"], "device", "list", "--json", *_inv(env)))
    assert [d["name"] for d in listing] == ["farm0", "farm1"]
    for entry in listing:
        assert entry["reachable"] is True and entry["profile"] == "rpi4"
        assert entry["status"]["rpc"] == "ok" and entry["status"]["arch"] == "aarch64" and entry["status"]["last_check"]
    table = _ok(_cli(env["env"], "device", "list", *_inv(env))).stdout
    for column in ("name", "profile", "reachable", "arch", "RPC", "last check", "farm0", "farm1"):
        assert column in table


def test_deploy_is_idempotent_and_the_server_listens_on_loopback_only(env, farm):
    from edgepack.devices.deploy import deploy, endpoint_for
    from edgepack.devices.server import ensure_rpc_server
    from edgepack.devices.ssh import connect

    inventory, known_hosts = _library(env)
    device = inventory.get("farm0")
    with connect(endpoint_for(device, known_hosts)) as session:
        install = deploy(session, device)
        assert install.uploaded == ()  # the check above installed it: nothing to send
        assert install.directory.endswith("/.edgepack/0.27.0.post1/aarch64-linux-gnu")
        listing = session.run(["ls", install.directory], timeout=30).stdout.split()
        assert sorted(listing) == ["edgepack_rpc_server", "install.json", "libtvm_ffi.so", "libtvm_runtime.so"]
        server = ensure_rpc_server(session, device, None, install)
        assert server.reused
        listening = session.run(["netstat", "-ltn"], timeout=30).stdout
        assert f"127.0.0.1:{server.port}" in listening
        assert f"0.0.0.0:{server.port}" not in listening and f":::{server.port}" not in listening


# ---------------------------------------------------------------------------------------------
# running a real model


def test_validate_a_real_model_on_a_device(env, cls_build):
    env_with_inventory = dict(env["env"], EDGEPACK_INVENTORY=str(env["inventory"]))
    report = _json(_cli(env_with_inventory, "validate", str(cls_build), "--on", "farm1", "--json", timeout=900))
    assert report["passed"] and report["on"] == "farm1" and report["reference"] == "onnxruntime"
    assert not report["degenerate"]
    (output,) = report["outputs"]
    assert output["shape"] == [1, 2] and output["max_abs_error"] < 1e-4


@pytest.mark.parametrize("name", ["iris_landmark", "ppocr_det", "resnet8_int8"])
def test_validate_real_models_on_natural_inputs_on_a_device(env, models, build_cache, name):
    """A TFLite landmark model on an eye from a photo, PP-OCR's text detector on a scanned page, an int8
    TFLite classifier on a photo (its integer kernels, within one step of LiteRT): outputs that show any
    wrong kernel (landmark coordinates, a probability map, int8 logits), computed on the device."""
    model = models[name]
    build = build_cache(model, "rpi4")
    report = _json(_cli(dict(env["env"], EDGEPACK_INVENTORY=str(env["inventory"])), "validate", str(build), "--on",
                        "farm1", "--inputs", str(model.natural), "--json", timeout=900))
    assert report["passed"] and not report["degenerate"] and report["ran_on"].startswith("farm1: cpu"), report


def test_a_wrong_build_fails_on_a_device(env, models, tmp_path):
    """The mutation harness (tests/mutation.py) on the remote path: PP-OCR's classifier built for rpi4 with a
    reduction loop of one kernel one iteration short, run by a farm device over SSH and TVM RPC, fails
    `validate` (exit 1; the unmodified build passes: test_validate_a_real_model_on_a_device)."""
    cls = models["ppocr_cls"]
    wrong = wrong_build(cls.path, "rpi4", tmp_path / "wrong", "loop_bound", input_shapes=cls.input_shapes)
    result = _cli(dict(env["env"], EDGEPACK_INVENTORY=str(env["inventory"])), "validate", str(wrong), "--on", "farm1",
                  "--json", timeout=900)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert not report["passed"] and not report["degenerate"] and report["on"] == "farm1"
    assert report["ran_on"].startswith("farm1: cpu"), report["ran_on"]


def test_validate_a_scalar_input_model_on_a_device(env, models, build_cache, tmp_path):
    """Silero VAD (a scalar int64 sample rate `sr`): the 0-d tensor crosses TVM RPC to the device and back."""
    build = build_cache(models["silero_vad"], "rpi4")
    rng = np.random.default_rng(5)
    np.savez(tmp_path / "vad.npz", input=(rng.standard_normal((1, 576)) * 0.1).astype(np.float32),
             state=(rng.standard_normal((2, 1, 128)) * 0.5).astype(np.float32), sr=np.array(16000, np.int64))
    report = _json(_cli(dict(env["env"], EDGEPACK_INVENTORY=str(env["inventory"])), "validate", str(build),
                        "--on", "farm1", "--inputs", str(tmp_path / "vad.npz"), "--json", timeout=900))
    assert report["passed"] and report["on"] == "farm1", report
    assert [o["shape"] for o in report["outputs"]] == [[1, 1], [2, 1, 128]]


def test_data_dependent_operators_on_a_device(env, tmp_path):
    """NonZero, TopK and Unique call functions TVM's Python provides on the host; the RPC server registers
    the C API's versions of them (and the outputs' shapes are the ones each run produced)."""
    from model_factory import onnx_with_data_dependent_outputs

    from edgepack.compiling import compile_model

    build = compile_model(onnx_with_data_dependent_outputs(tmp_path / "dd.onnx"), "rpi4", tmp_path / "build").output_dir
    report = _json(_cli(dict(env["env"], EDGEPACK_INVENTORY=str(env["inventory"])), "validate", str(build),
                        "--on", "farm1", "--json", timeout=900))
    assert report["passed"], report


def test_run_on_device_library_matches_the_host(env, cls_build):
    from edgepack.manifest import read_manifest
    from edgepack.run.host import run_on_host
    from edgepack.run.remote import run_on_device
    from edgepack.tensors import random_inputs

    inventory, known_hosts = _library(env)
    manifest = read_manifest(cls_build)
    inputs = random_inputs(manifest.inputs, seed=3)
    on_device, ran_on = run_on_device(cls_build, manifest, inputs, inventory.get("farm0"), known_hosts=known_hosts)
    on_host, _ = run_on_host(cls_build, manifest, inputs)
    assert ran_on == "farm0: cpu(0)"
    assert len(on_device) == len(on_host) == 1
    np.testing.assert_allclose(on_device[0], on_host[0], rtol=1e-4, atol=1e-5)
    assert abs(float(on_device[0].sum()) - 1.0) < 1e-4  # a softmax over two classes


def test_bench_on_a_device(env, cls_build):
    (result,) = _json(_cli(env["env"], "bench", str(cls_build), "--on", "farm0", "--repeat", "5", "--json",
                           *_inv(env), timeout=900))
    assert result["device"] == "farm0" and result["via"] == "ssh" and result["repeat"] == 5
    assert len(result["samples_ms"]) == 5
    assert result["p99_ms"] >= result["p90_ms"] >= result["median_ms"] > 0
    assert result["max_ms"] >= result["p99_ms"] and result["min_ms"] <= result["median_ms"]
    assert abs(result["mean_ms"] - np.mean(result["samples_ms"])) < 1e-2
    table = _ok(_cli(env["env"], "bench", str(cls_build), "--on", "farm1", "--repeat", "2", *_inv(env))).stdout
    for column in ("mean", "median", "p90", "p99", "farm1"):
        assert column in table


def test_a_stale_rpc_server_is_restarted(env, farm):
    from edgepack.devices.check import check_device

    inventory, known_hosts = _library(env)
    info_file = Path(_farm_device("farm1")["home"]) / ".edgepack" / "run" / "rpc.json"
    # a server that died: the next use starts a new one
    pid = json.loads(info_file.read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    check = check_device(inventory.get("farm1"), known_hosts=known_hosts)
    assert check.ok, check
    assert "restarted: the previous server" in check.items[-1].detail
    # a server that hangs (accepts nothing, serves nobody): replaced too
    pid = json.loads(info_file.read_text())["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        check = check_device(inventory.get("farm1"), known_hosts=known_hosts)
    finally:
        with pytest.raises(ProcessLookupError):  # it was killed and replaced
            os.kill(pid, signal.SIGCONT)
    assert check.ok, check
    assert "restarted: it stopped answering" in check.items[-1].detail
    assert json.loads(info_file.read_text())["pid"] != pid


# ---------------------------------------------------------------------------------------------
# the farm: tracker on loopback, devices registered through their agents


def _wait_for_free(env, count: int, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    status = {}
    while time.monotonic() < deadline:
        status = _json(_cli(env["env"], "farm", "status", "--json", *_inv(env)))
        if status["running"] and status["queue"].get("rpi4", {}).get("free") == count:
            return status
        time.sleep(1.0)
    raise AssertionError(f"the tracker never had {count} free rpi4 devices: {status}")


def test_farm_tracker_with_two_devices(env, cls_build):
    started = _json(_cli(env["env"], "farm", "start", "--port", str(TRACKER_PORT), "--json", *_inv(env),
                         timeout=300))
    assert set(started["devices"]) == {"farm0", "farm1"}
    assert all(a["state"] == "free" for a in started["devices"].values()), started
    status = _wait_for_free(env, 2)
    assert status["tracker"].startswith("127.0.0.1:")
    assert sorted(s["device"] for s in status["servers"]) == ["farm0", "farm1"]
    assert all(s["addr"][0] == "127.0.0.1" for s in status["servers"])
    # the tracker and the agents listen on loopback only
    listening = subprocess.run(["ss", "-ltnp"], check=False, capture_output=True, text=True).stdout if shutil.which("ss") else ""
    for line in listening.splitlines():
        if f"pid={started['pid']}," in line or f":{status['tracker'].split(':')[1]} " in line:
            assert "127.0.0.1:" in line, line
    table = _ok(_cli(env["env"], "farm", "status", *_inv(env))).stdout
    assert "Tracker queue" in table and "rpi4" in table and "free" in table

    (result,) = _json(_cli(env["env"], "bench", str(cls_build), "--on", "farm:rpi4", "--repeat", "3", "--json",
                           *_inv(env), timeout=900))
    assert result["via"] == "tracker" and result["device"] in ("farm0", "farm1")
    assert result["p99_ms"] >= result["median_ms"] > 0
    _wait_for_free(env, 2)  # the device went back into the queue

    env_with_inventory = dict(env["env"], EDGEPACK_INVENTORY=str(env["inventory"]))
    report = _json(_cli(env_with_inventory, "validate", str(cls_build), "--on", "farm:rpi4", "--json", timeout=900))
    assert report["passed"]

    # a device that dies leaves the queue; the farm keeps serving with the other one
    farm_sh("kill", "farm1")
    try:
        status = _wait_for_free(env, 1)
        states = {d["name"]: d["state"] for d in status["devices"]}
        assert states == {"farm0": "free", "farm1": "down"}, status
        (result,) = _json(_cli(env["env"], "bench", str(cls_build), "--on", "farm:rpi4", "--repeat", "2", "--json",
                               *_inv(env), timeout=900))
        assert result["device"] == "farm0"
    finally:
        farm_sh("start", "2")
    _wait_for_free(env, 2)  # its agent brought it back

    stopped = _json(_cli(env["env"], "farm", "stop", "--json", *_inv(env)))
    assert stopped["stopped"] is True
    assert _json(_cli(env["env"], "farm", "status", "--json", *_inv(env)))["running"] is False
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(started["pid"], 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("processes of the farm survived `farm stop`")


# ---------------------------------------------------------------------------------------------
# failures (these run last: they alter the farm)


def _kill_during_timing(device: str, *, revive_after: float | None = None) -> threading.Event:
    """From a thread: once the device has loaded a model, wait 2 s (timing runs) and kill it; optionally
    bring it back ``revive_after`` seconds later (a reboot)."""
    log = Path(_farm_device(device)["home"]) / ".edgepack" / "run" / "rpc.log"
    marker = log.read_text().count("load_module") if log.exists() else 0
    killed = threading.Event()

    def killer() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if log.exists() and log.read_text().count("load_module") > marker:
                time.sleep(2.0)
                farm_sh("kill", device)
                killed.set()
                if revive_after is not None:
                    time.sleep(revive_after)
                    farm_sh("start", "2")
                return
            time.sleep(0.2)

    threading.Thread(target=killer, daemon=True).start()
    return killed


def test_device_rebooting_mid_benchmark_is_retried(env, cls_build):
    """farm1 goes away during timing and comes back 3 s later: the benchmark reconnects and completes."""
    killed = _kill_during_timing("farm1", revive_after=3.0)
    try:
        result = _ok(_cli(env["env"], "bench", str(cls_build), "--on", "farm1", "--repeat", "60", *_inv(env),
                          timeout=600))
    finally:
        farm_sh("start", "2")
    assert killed.is_set(), "the device was not killed during the benchmark"
    text = result.stdout + result.stderr
    assert "Lost the connection to farm1 during benchmarking" in " ".join(text.split())
    assert "farm1" in result.stdout and "60 x 1" in result.stdout


def test_device_killed_mid_benchmark(env, cls_build):
    """farm1 dies while `bench` runs on it: a clear error, non-zero exit, no traceback; farm0 still benchmarks."""
    killed = _kill_during_timing("farm1")
    started = time.monotonic()
    try:
        result = _cli(env["env"], "bench", str(cls_build), "--on", "farm1", "--repeat", "400",
                      "--reconnect-window", "5", *_inv(env), timeout=600)
        assert killed.is_set(), "the device was not killed during the benchmark"
        assert time.monotonic() - started < 120, "the failure took too long to be reported"
        assert_clean_error(result, "farm1 dropped out during benchmarking", "could not be reached again within 5 s",
                           "connection refused", "edgepack device check farm1")
        # the other device answers
        (other,) = _json(_cli(env["env"], "bench", str(cls_build), "--on", "farm0", "--repeat", "2", "--json",
                              *_inv(env), timeout=600))
        assert other["device"] == "farm0" and other["median_ms"] > 0
        down = _cli(env["env"], "device", "check", "farm1", "--json", *_inv(env))
        assert down.returncode == 1 and "Traceback" not in down.stdout + down.stderr
        (report,) = json.loads(down.stdout)
        assert report["ok"] is False and report["reachable"] is False and "connection refused" in report["message"]
    finally:
        farm_sh("start", "2")
    _json(_cli(env["env"], "device", "check", "farm1", "--json", *_inv(env)))  # back, same host key


def test_changed_host_key_is_refused(env, cls_build):
    old = _farm_device("farm1")["host_key_fingerprint"]
    farm_sh("rekey", "farm1")
    new = _farm_device("farm1")["host_key_fingerprint"]
    assert new != old
    check = _cli(env["env"], "device", "check", "farm1", *_inv(env))
    assert check.returncode == 1 and "Traceback" not in check.stdout + check.stderr
    flat = " ".join(check.stdout.split())
    assert "has CHANGED" in flat and old in flat and new in flat and "Refusing to connect" in flat
    assert "man-in-the-middle" in flat
    assert_clean_error(_cli(env["env"], "bench", str(cls_build), "--on", "farm1", "--repeat", "1", *_inv(env)),
                       "has CHANGED", "Refusing to connect")
    # trusting the new key on purpose (after seeing it flagged as changed) makes it work again
    shown = _ok(_cli(env["env"], "device", "trust", "farm1", "--yes", *_inv(env))).stdout
    assert "CHANGED" in shown and new in shown
    (again,) = _json(_cli(env["env"], "device", "check", "farm1", "--json", *_inv(env)))
    assert again["ok"], again
