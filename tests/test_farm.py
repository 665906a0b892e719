"""End to end against the farm-in-a-box (scripts/farm.sh): real sshd in network namespaces,
aarch64 userland through qemu-user, real SFTP, and a real TVM RPC session with the Python-free
RPC server (runtimes/rpc-server) running on an emulated device behind an SSH tunnel.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from farm_helpers import farm_sh, farm_skip_reason, farm_state_dir

from edgepack.devices.errors import (
    AuthenticationError,
    ChangedHostKeyError,
    DeviceUnreachableError,
    UnknownHostKeyError,
)
from edgepack.devices.ssh import (
    LocalTunnel,
    SSHEndpoint,
    connect,
    scan_host_key,
    trust_host_key,
)
from edgepack.toolchain.sources import c_api_sources

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SERVER_SOURCE = ROOT / "runtimes" / "rpc-server" / "edgepack_rpc_server.c"
C_API_DIR = ROOT / "runtimes" / "api" / "c"
TRIPLE = "aarch64-linux-gnu"
RPC_DIR = "edgepack-rpc"  # on the device, relative to the login directory








@pytest.fixture(scope="session")
def farm():
    reason = farm_skip_reason(need_cross_compiler=False)
    if reason:
        pytest.skip(reason)
    was_running = (farm_state_dir() / "farm.json").exists()
    farm_sh("start", "2")
    info = json.loads((farm_state_dir() / "farm.json").read_text())
    yield info
    if was_running:
        farm_sh("start", "2", check=False)  # leave someone else's farm as we found it (revived)
    else:
        farm_sh("stop", check=False)


def _device(farm_info: dict, name: str) -> dict:
    return next(d for d in farm_info["devices"] if d["name"] == name)


def _endpoint(farm_info: dict, name: str, known_hosts: Path, **kw) -> SSHEndpoint:
    d = _device(farm_info, name)
    return SSHEndpoint(d["address"], d["port"], d["user"], Path(d["key_path"]), known_hosts, name=name,
                       connect_timeout=kw.pop("connect_timeout", 10), **kw)


@pytest.fixture(scope="module")
def known_hosts(farm, tmp_path_factory) -> Path:
    """Both devices scanned and trusted, as `edgepack device trust` would."""
    path = tmp_path_factory.mktemp("ssh") / "known_hosts"
    for d in farm["devices"]:
        key = scan_host_key(d["address"], d["port"], timeout=10)
        assert key.fingerprint == d["host_key_fingerprint"]
        trust_host_key(_endpoint(farm, d["name"], path), key)
    return path


def test_farm_description_and_status(farm):
    assert [d["name"] for d in farm["devices"]] == ["farm0", "farm1"]
    for d in farm["devices"]:
        assert d["port"] == 22 and d["user"] == d["name"]
        assert d["host_key_fingerprint"].startswith("SHA256:")
        assert Path(d["key_path"]).is_file()
    status = farm_sh("status")
    lines = status.stdout.strip().splitlines()
    assert len(lines) == 2 and all("reachable=yes" in line for line in lines), status.stdout
    # idempotent: a second start changes nothing
    again = farm_sh("start", "2")
    assert "reachable=yes" in again.stdout
    assert json.loads((farm_state_dir() / "farm.json").read_text())["devices"] == farm["devices"]


def test_scan_and_trust(farm, known_hosts):
    lines = known_hosts.read_text().splitlines()
    assert len(lines) == 2
    for d in farm["devices"]:  # port 22: plain host form
        assert f"{d['address']} {d['host_key_type']} {d['host_key']}" in lines


def test_unknown_host_key_is_refused(farm, tmp_path):
    d = _device(farm, "farm0")
    with pytest.raises(UnknownHostKeyError) as info:
        connect(_endpoint(farm, "farm0", tmp_path / "empty_known_hosts"))
    assert info.value.fingerprint == d["host_key_fingerprint"]
    assert d["host_key_fingerprint"] in str(info.value)
    assert "edgepack device trust farm0" in info.value.hint


def test_wrong_key_is_refused(farm, known_hosts, tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "stranger")], check=True)
    ep = _endpoint(farm, "farm0", known_hosts)
    ep = SSHEndpoint(ep.host, ep.port, ep.user, tmp_path / "stranger", known_hosts, name="farm0")
    with pytest.raises(AuthenticationError) as info:
        connect(ep)
    assert "10.77.0.10:22" in str(info.value) or ep.address in str(info.value)


def test_device_looks_aarch64(farm, known_hosts):
    with connect(_endpoint(farm, "farm0", known_hosts)) as session:
        assert session.run(["uname", "-m"], timeout=30) == (0, "aarch64\n", "")
        assert session.run(["hostname"], timeout=30).stdout.strip() == "farm0"


def test_arguments_arrive_verbatim(farm, known_hosts):
    weird = [
        "two words", "it's", 'say "hi"', "$(touch /tmp/edgepack-pwned)", "`id`", "a; echo injected",
        "x && y || z", "$HOME ${PATH}", "back\\slash", "glob * ?", "new\nline", "", "-n", "ünïcödé",
    ]
    with connect(_endpoint(farm, "farm0", known_hosts)) as session:
        for arg in weird:
            result = session.run(["printf", "%s", arg], timeout=30)
            assert (result.rc, result.stdout) == (0, arg)
        everything = session.run(["printf", "[%s]", *weird], timeout=30)
        assert everything.stdout == "".join(f"[{w}]" for w in weird)
    assert not Path("/tmp/edgepack-pwned").exists()


def test_upload_is_atomic_and_idempotent(farm, known_hosts, tmp_path):
    payload = tmp_path / "payload.bin"
    payload.write_bytes(os.urandom(300_000))
    digest = hashlib.sha256(payload.read_bytes()).hexdigest()
    with connect(_endpoint(farm, "farm0", known_hosts)) as session:
        session.run(["rm", "-rf", "upload test"], timeout=30)
        assert session.upload(payload, "upload test/dir/payload.bin", mode=0o750) is True
        assert session.remote_sha256("upload test/dir/payload.bin") == digest
        assert session.upload(payload, "upload test/dir/payload.bin", mode=0o750) is False  # already there
        listing = session.run(["ls", "-la", "upload test/dir"], timeout=30).stdout
        assert "-rwxr-x---" in listing and ".tmp" not in listing
        payload.write_bytes(os.urandom(300_000))  # same size, new content
        assert session.upload(payload, "upload test/dir/payload.bin", mode=0o750) is True
        assert session.remote_sha256("upload test/dir/payload.bin") == hashlib.sha256(payload.read_bytes()).hexdigest()
        session.run(["rm", "-rf", "upload test"], timeout=30, check=True)


# ---------------------------------------------------------------------------------------------
# TVM RPC on the device, without Python there


def _aarch64_runtime(tmp_path_factory) -> tuple[list[Path], list[Path]]:
    """(include dirs, [libtvm_ffi.so, libtvm_runtime.so]) of the official aarch64 runtime."""
    try:
        from edgepack.toolchain.tvm_runtime import ensure_target_runtime

        rt = ensure_target_runtime(TRIPLE, f"{TRIPLE}-gcc", f"{TRIPLE}-g++", need_static=False)
        return list(rt.include_dirs), list(rt.shared_libs)
    except Exception as exc:  # noqa: BLE001 - fall back to fetching the official wheels here
        print(f"edgepack.toolchain.tvm_runtime unavailable ({exc}); downloading the aarch64 wheels")
    import zipfile

    import tvm_ffi.libinfo

    work = tmp_path_factory.mktemp("aarch64-wheels")
    for req in ("apache-tvm==0.27.0.post1", "apache-tvm-ffi==0.1.14.post1"):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--platform", "manylinux_2_28_aarch64", "--python-version", "3.11", "-d", str(work), req],
                       check=True, capture_output=True, timeout=600)
    libs = {}
    for wheel in work.glob("*.whl"):
        with zipfile.ZipFile(wheel) as zf:
            for member in ("tvm/lib/libtvm_runtime.so", "tvm_ffi/lib/libtvm_ffi.so"):
                if member in zf.namelist():
                    out = work / Path(member).name
                    out.write_bytes(zf.read(member))
                    libs[out.name] = out
    return [Path(tvm_ffi.libinfo.find_include_path())], [libs["libtvm_ffi.so"], libs["libtvm_runtime.so"]]


def build_rpc_server(out_dir: Path, include_dirs: list[Path], libs: list[Path], cc: str = f"{TRIPLE}-gcc") -> Path:
    """Cross-compile runtimes/rpc-server (warnings are errors) next to copies of the runtime libraries."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for lib in libs:
        shutil.copy2(lib, out_dir / lib.name)
    exe = out_dir / "edgepack_rpc_server"
    includes = [f"-I{d}" for d in (C_API_DIR / "include", C_API_DIR / "src", *include_dirs)]
    cmd = [cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", *includes,
           "-o", str(exe), str(SERVER_SOURCE), *map(str, c_api_sources()), f"-L{out_dir}",
           "-Wl,--no-as-needed", "-ltvm_runtime", "-ltvm_ffi",
           "-Wl,--as-needed", "-lpthread", "-ldl", "-Wl,-rpath,$ORIGIN"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    return exe


def start_rpc_server(session, remote_dir: str, port: int = 9090, timeout: float = 120) -> int:
    """Start the uploaded server on the device's loopback (in the background); returns its port."""
    script = (
        f"cd {remote_dir} && rm -f rpc.port && "
        f"setsid ./edgepack_rpc_server --host 127.0.0.1 --port {port} --port-end {port + 10} "
        "--port-file rpc.port >rpc.log 2>&1 </dev/null & echo $! > rpc.pid"
    )
    session.run(["sh", "-c", script], timeout=30, check=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = session.run(["cat", f"{remote_dir}/rpc.port"], timeout=30)
        if result.rc == 0 and result.stdout.strip().isdigit():
            return int(result.stdout.strip())
        time.sleep(0.5)
    log = session.run(["cat", f"{remote_dir}/rpc.log"], timeout=30).stdout
    raise AssertionError(f"the RPC server did not start on {session.endpoint.label}:\n{log}")


def _small_model(path: Path) -> None:
    import tvm
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((32, 512), "float32"), w: R.Tensor((512, 256), "float32")) -> R.Tensor((32, 256), "float32"):
            with R.dataflow():
                y = R.matmul(x, w)
                z = R.nn.relu(R.add(y, R.const(0.25, "float32")))
                R.output(z)
            return z

    target = tvm.target.Target({"kind": "llvm", "mtriple": TRIPLE, "mattr": ["+neon"]})
    executable = tvm.compile(Module, target)
    executable.export_library(str(path), fcompile=tvm.support.cc.cross_compiler(f"{TRIPLE}-g++"))


@pytest.fixture(scope="module")
def rpc_bundle(tmp_path_factory) -> Path:
    """The cross-compiled RPC server with the aarch64 runtime libraries beside it."""
    include_dirs, libs = _aarch64_runtime(tmp_path_factory)
    return build_rpc_server(tmp_path_factory.mktemp("rpc-bundle"), include_dirs, libs).parent


@pytest.fixture(scope="module")
def model_so(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "model.so"
    _small_model(path)
    return path


def _upload_bundle(session, bundle: Path) -> None:
    for f in sorted(bundle.iterdir()):
        session.upload(f, f"{RPC_DIR}/{f.name}", mode=0o755)


def _stop_rpc_server(session) -> None:
    session.run(["sh", "-c", f"kill $(cat {RPC_DIR}/rpc.pid) 2>/dev/null; rm -f {RPC_DIR}/rpc.pid; true"], timeout=30)


def test_rpc_server_runs_a_model_through_a_tunnel(farm, known_hosts, rpc_bundle, model_so):
    import tvm
    from tvm import relax, rpc

    endpoint = _endpoint(farm, "farm0", known_hosts)
    with connect(endpoint) as session:
        _upload_bundle(session, rpc_bundle)
        version = session.run([f"{RPC_DIR}/edgepack_rpc_server", "--version"], timeout=60)
        assert version.stdout.startswith("edgepack_rpc_server"), version
        port = start_rpc_server(session, RPC_DIR)
        try:
            # the server listens on the device's loopback only
            listening = session.run(["netstat", "-ltn"], timeout=30).stdout
            assert f"127.0.0.1:{port}" in listening and f"0.0.0.0:{port}" not in listening
            with LocalTunnel(endpoint, port) as tunnel:
                remote = rpc.connect("127.0.0.1", tunnel.local_port, session_timeout=300)
                remote.upload(str(model_so))
                lib = remote.load_module("model.so")
                dev = remote.cpu()
                vm = relax.VirtualMachine(lib, dev)
                rng = np.random.default_rng(0)
                # hundreds of KB each way: a forwarder inside this process would deadlock here
                x = rng.standard_normal((32, 512), dtype=np.float32)
                w = rng.standard_normal((512, 256), dtype=np.float32)
                out = vm["main"](tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev)).numpy()
                np.testing.assert_allclose(out, np.maximum(x @ w + 0.25, 0), rtol=1e-4, atol=1e-4)
                timer = vm.time_evaluator("main", dev, number=2, repeat=2)
                result = timer(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev))
                assert len(result.results) == 2 and result.mean > 0
                del vm, lib, dev, remote, timer
                # a second session on the same server (sessions are served one after another)
                again = rpc.connect("127.0.0.1", tunnel.local_port, session_timeout=120)
                assert again.cpu().exist
                del again
        finally:
            _stop_rpc_server(session)
        log = session.run(["cat", f"{RPC_DIR}/rpc.log"], timeout=30).stdout
        assert "load_module" in log and "finished serving" in log


def test_tunnel_waits_for_a_server_that_starts_late(farm, known_hosts, rpc_bundle):
    from tvm import rpc

    endpoint = _endpoint(farm, "farm1", known_hosts)
    with connect(endpoint) as session:
        _upload_bundle(session, rpc_bundle)
        # the tunnel first: nothing listens on the device's port yet
        with LocalTunnel(endpoint, 9095, connect_deadline=90) as tunnel:
            script = (f"cd {RPC_DIR} && (sleep 2; exec setsid ./edgepack_rpc_server --port 9095 --key edge) "
                      ">rpc.log 2>&1 </dev/null & echo $! > rpc.pid")
            session.run(["sh", "-c", script], timeout=30, check=True)
            try:
                remote = rpc.connect("127.0.0.1", tunnel.local_port, key="edge", session_timeout=60)
                assert remote.cpu().exist
                del remote
                assert "not ready" in tunnel.log_text()  # the channel was retried until the port opened
            finally:
                _stop_rpc_server(session)


def test_tunnel_reports_host_key_errors(farm, tmp_path):
    with pytest.raises(UnknownHostKeyError):
        LocalTunnel(_endpoint(farm, "farm1", tmp_path / "nothing_trusted"), 9090).start()


# ---------------------------------------------------------------------------------------------
# devices that change or die (these run last: they alter the farm)


def test_changed_host_key_is_refused(farm, known_hosts):
    old = _device(farm, "farm1")["host_key_fingerprint"]
    farm_sh("rekey", "farm1")
    new_info = json.loads((farm_state_dir() / "farm.json").read_text())
    new = _device(new_info, "farm1")["host_key_fingerprint"]
    assert new != old
    endpoint = _endpoint(farm, "farm1", known_hosts)
    with pytest.raises(ChangedHostKeyError) as info:
        connect(endpoint)
    text = str(info.value)
    assert old in text and new in text and "attack" in text
    assert f"ssh-keygen -R '{endpoint.host}' -f {known_hosts}" in text
    # trusting the new key on purpose makes it work again
    trust_host_key(endpoint, scan_host_key(endpoint.host, endpoint.port, timeout=10))
    with connect(endpoint) as session:
        assert session.run(["uname", "-m"], timeout=30).stdout == "aarch64\n"


def test_killed_device_is_a_clear_error_while_the_other_answers(farm, known_hosts):
    farm1 = _endpoint(farm, "farm1", known_hosts, connect_timeout=5)
    open_session = connect(farm1)
    farm_sh("kill", "farm1")
    try:
        with pytest.raises(DeviceUnreachableError) as info:
            connect(farm1)
        assert farm1.address in info.value.message and info.value.hint
        with pytest.raises(DeviceUnreachableError):
            open_session.run(["uname", "-m"], timeout=10)  # the session it had is gone too
        with connect(_endpoint(farm, "farm0", known_hosts)) as session:
            assert session.run(["uname", "-m"], timeout=30).stdout == "aarch64\n"
        status = farm_sh("status", check=False)
        assert "farm1" in status.stdout and "reachable=no" in status.stdout and status.returncode != 0
    finally:
        open_session.close()
    # `start` brings the dead device back
    farm_sh("start", "2")
    with connect(farm1) as session:
        assert session.run(["uname", "-m"], timeout=30).stdout == "aarch64\n"
