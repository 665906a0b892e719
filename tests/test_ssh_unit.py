"""Fast tests of edgepack.devices.ssh without the farm: quoting, known_hosts, strict host keys.

The host key and authentication tests talk to a real SSH server: a small paramiko server on
127.0.0.1 in a thread of this process, which runs commands with the local /bin/sh.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from pathlib import Path

import paramiko
import pytest

from edgepack.devices.errors import (
    AuthenticationError,
    ChangedHostKeyError,
    DeviceUnreachableError,
    UnknownHostKeyError,
)
from edgepack.devices.ssh import (
    HostKey,
    SSHEndpoint,
    connect,
    fingerprint_sha256,
    forget_host_key,
    known_host_keys,
    known_hosts_name,
    quote_argv,
    scan_host_key,
    trust_host_key,
)
from edgepack.errors import EdgepackError

WEIRD = [
    "plain",
    "",
    "two words",
    "it's",
    'say "hi"',
    "$(echo injected)",
    "`id`",
    "a; rm -rf /tmp/nothing-here",
    "x && y || z",
    "$HOME ${PATH} $1 $@",
    "back\\slash",
    "glob * ? [a-z]",
    "new\nline\ttab",
    "ünïcödé ✓",
    "-n",
    "--",
    "'",
    "''\"\"'",
    "> /tmp/redirected < in | pipe &",
]


# ---------------------------------------------------------------------------------------------
# quoting


@pytest.mark.parametrize("weird", WEIRD)
def test_quote_argv_round_trips_through_a_posix_shell(weird):
    command = quote_argv(["printf", "%s", weird])
    out = subprocess.run(["/bin/sh", "-c", command], check=False, capture_output=True, timeout=10)
    assert out.returncode == 0
    assert out.stdout.decode() == weird


def test_quote_argv_keeps_argument_boundaries():
    argv = ["printf", "[%s]", *WEIRD]
    out = subprocess.run(["/bin/sh", "-c", quote_argv(argv)], check=False, capture_output=True, timeout=10)
    assert out.stdout.decode() == "".join(f"[{w}]" for w in WEIRD)


def test_quote_argv_rejects_strings_nul_and_empty():
    with pytest.raises(TypeError):
        quote_argv("uname -m")
    with pytest.raises(ValueError):
        quote_argv([])
    with pytest.raises(ValueError):
        quote_argv(["echo", "a\0b"])
    with pytest.raises(TypeError):
        quote_argv(["echo", 3])  # type: ignore[list-item]
    assert quote_argv(["ls", Path("/a b")]) == "ls '/a b'"


# ---------------------------------------------------------------------------------------------
# known_hosts


def _key(seed: int = 0) -> HostKey:
    return HostKey.from_pkey(paramiko.ECDSAKey.generate())


def _endpoint(known_hosts: Path, host: str = "10.1.2.3", port: int = 22, **kw) -> SSHEndpoint:
    return SSHEndpoint(host, port, "pi", kw.pop("key_path", None), known_hosts, **kw)


def test_known_hosts_name():
    assert known_hosts_name("10.0.0.2", 22) == "10.0.0.2"
    assert known_hosts_name("10.0.0.2", 2222) == "[10.0.0.2]:2222"
    assert known_hosts_name("pi.local", 22) == "pi.local"


def test_trust_host_key_writes_bracket_form_atomically(tmp_path):
    kh = tmp_path / "sub" / "known_hosts"
    key = _key()
    trust_host_key(_endpoint(kh, port=2222), key)
    text = kh.read_text()
    assert text == f"[10.1.2.3]:2222 {key.key_type} {key.base64}\n"
    assert kh.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in kh.parent.iterdir()) == ["known_hosts"]  # no temporary files left
    assert known_host_keys(kh, "10.1.2.3", 2222) == [key]
    assert known_host_keys(kh, "10.1.2.3", 22) == []


def test_trust_host_key_replaces_only_that_host(tmp_path):
    kh = tmp_path / "known_hosts"
    other = _key()
    old, new = _key(), _key()
    hashed_name = paramiko.HostKeys.hash_host("10.1.2.3")
    kh.write_text(
        "# a comment stays\n"
        f"10.9.9.9 {other.key_type} {other.base64}\n"
        f"10.1.2.3 {old.key_type} {old.base64}\n"
        f"{hashed_name} {old.key_type} {old.base64}\n"
        f"[10.1.2.3]:2222 {other.key_type} {other.base64}\n"
    )
    trust_host_key(_endpoint(kh), new)
    lines = kh.read_text().splitlines()
    assert lines[0] == "# a comment stays"
    assert f"10.9.9.9 {other.key_type} {other.base64}" in lines
    assert f"[10.1.2.3]:2222 {other.key_type} {other.base64}" in lines  # other port: untouched
    assert not any(old.base64 in line for line in lines)  # plain and hashed old entries gone
    assert lines[-1] == f"10.1.2.3 {new.key_type} {new.base64}"
    assert known_host_keys(kh, "10.1.2.3") == [new]


def test_forget_host_key(tmp_path):
    kh = tmp_path / "known_hosts"
    a, b = _key(), _key()
    trust_host_key(_endpoint(kh, port=2200), a)
    trust_host_key(_endpoint(kh, host="10.0.0.5"), b)
    assert forget_host_key(kh, "10.1.2.3", 2200) == 1
    assert known_host_keys(kh, "10.1.2.3", 2200) == []
    assert known_host_keys(kh, "10.0.0.5") == [b]
    assert forget_host_key(tmp_path / "missing", "x") == 0


def test_fingerprint_matches_ssh_keygen(tmp_path):
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    key = _key()
    pub = tmp_path / "k.pub"
    pub.write_text(f"{key.key_type} {key.base64}\n")
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)], capture_output=True, text=True,
                         timeout=10, check=True)
    assert out.stdout.split()[1] == key.fingerprint
    assert HostKey.from_line(pub.read_text()) == key


def test_malformed_known_hosts_is_a_clear_error(tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("10.1.2.3 ssh-ed25519 !!!notbase64!!!\n")
    with pytest.raises(EdgepackError) as info:
        connect(_endpoint(kh, connect_timeout=2))
    assert str(kh) in str(info.value)


# ---------------------------------------------------------------------------------------------
# a real SSH server on loopback (paramiko, in a thread)


class _Server(paramiko.ServerInterface):
    def __init__(self, allowed: paramiko.PKey) -> None:
        self.allowed = allowed

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        ok = username == "dev" and key.get_base64() == self.allowed.get_base64()
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command):
        def work():
            stdin = b""
            while chunk := channel.recv(65536):
                stdin += chunk
            proc = subprocess.run(["/bin/sh", "-c", command.decode()], input=stdin, capture_output=True, timeout=30,
                                  check=False)
            channel.sendall(proc.stdout)
            channel.sendall_stderr(proc.stderr)
            channel.send_exit_status(proc.returncode)
            channel.shutdown_write()
            channel.close()

        threading.Thread(target=work, daemon=True).start()
        return True


class LoopbackSSH:
    def __init__(self, host_key: paramiko.PKey, client_key: paramiko.PKey) -> None:
        self.host_key = host_key
        self.client_key = client_key
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.transports: list[paramiko.Transport] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(self.host_key)
            self.transports.append(transport)
            try:
                transport.start_server(server=_Server(self.client_key))
            except (paramiko.SSHException, EOFError, OSError):
                continue

    def close(self):
        self._stop = True
        self.sock.close()
        for t in self.transports:
            t.close()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    client = paramiko.ECDSAKey.generate()
    client.write_private_key_file(str(d / "client_key"))
    other = paramiko.ECDSAKey.generate()
    other.write_private_key_file(str(d / "other_key"))
    return {"host": paramiko.ECDSAKey.generate(), "client": client, "client_path": d / "client_key",
            "other_path": d / "other_key"}


@pytest.fixture
def server(keys):
    srv = LoopbackSSH(keys["host"], keys["client"])
    yield srv
    srv.close()


def test_unknown_host_key_is_refused_with_its_fingerprint(server, keys, tmp_path):
    ep = SSHEndpoint("127.0.0.1", server.port, "dev", keys["client_path"], tmp_path / "kh", name="bench1",
                     connect_timeout=5)
    with pytest.raises(UnknownHostKeyError) as info:
        connect(ep)
    fp = fingerprint_sha256(keys["host"])
    assert info.value.fingerprint == fp
    text = str(info.value)
    assert fp in text and "edgepack device trust bench1" in text
    assert not (tmp_path / "kh").exists()  # nothing was trusted implicitly


def test_scan_trust_connect_run(server, keys, tmp_path):
    ep = SSHEndpoint("127.0.0.1", server.port, "dev", keys["client_path"], tmp_path / "kh", connect_timeout=5)
    key = scan_host_key("127.0.0.1", server.port, timeout=5)
    assert key.fingerprint == fingerprint_sha256(keys["host"])
    trust_host_key(ep, key)
    assert (tmp_path / "kh").read_text().startswith(f"[127.0.0.1]:{server.port} ")
    with connect(ep) as session:
        for weird in WEIRD:
            result = session.run(["printf", "%s", weird], timeout=10)
            assert result.rc == 0 and result.stdout == weird
        result = session.run(["sh", "-c", "echo out; echo err >&2; exit 7"], timeout=10)
        assert result == (7, "out\n", "err\n")
        assert session.run(["cat"], input="fed via stdin", timeout=10).stdout == "fed via stdin"


def test_changed_host_key_is_refused(server, keys, tmp_path):
    ep = SSHEndpoint("127.0.0.1", server.port, "dev", keys["client_path"], tmp_path / "kh", name="bench1",
                     connect_timeout=5)
    old = _key()
    trust_host_key(ep, old)
    with pytest.raises(ChangedHostKeyError) as info:
        connect(ep)
    text = str(info.value)
    assert "CHANGED" in text and "attack" in text
    assert fingerprint_sha256(keys["host"]) in text and old.fingerprint in text
    assert f"ssh-keygen -R '[127.0.0.1]:{server.port}' -f {tmp_path / 'kh'}" in text


def test_wrong_client_key_is_an_authentication_error(server, keys, tmp_path):
    ep = SSHEndpoint("127.0.0.1", server.port, "dev", keys["other_path"], tmp_path / "kh", connect_timeout=5)
    trust_host_key(ep, scan_host_key("127.0.0.1", server.port, timeout=5))
    with pytest.raises(AuthenticationError) as info:
        connect(ep)
    assert isinstance(info.value, DeviceUnreachableError)
    assert f"127.0.0.1:{server.port}" in str(info.value)


def test_refused_port_is_unreachable(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    ep = SSHEndpoint("127.0.0.1", port, "dev", None, tmp_path / "kh", name="gone", connect_timeout=3)
    with pytest.raises(DeviceUnreachableError) as info:
        connect(ep)
    assert f"127.0.0.1:{port}" in info.value.message and "refused" in info.value.message
    assert "sshd" in str(info.value)
    with pytest.raises(DeviceUnreachableError):
        scan_host_key("127.0.0.1", port, timeout=3)


def test_silent_server_times_out(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)  # accepts the TCP connection, never says a word
    port = s.getsockname()[1]
    try:
        ep = SSHEndpoint("127.0.0.1", port, "dev", None, tmp_path / "kh", connect_timeout=1.5)
        with pytest.raises(DeviceUnreachableError) as info:
            connect(ep)
        assert f"127.0.0.1:{port}" in info.value.message
    finally:
        s.close()


def test_missing_key_file(tmp_path):
    ep = SSHEndpoint("127.0.0.1", 22, "dev", tmp_path / "nope", tmp_path / "kh")
    with pytest.raises(AuthenticationError) as info:
        connect(ep)
    assert "does not exist" in str(info.value)


def test_endpoint_round_trips_through_dict(tmp_path):
    ep = SSHEndpoint("h", 2222, "u", tmp_path / "k", tmp_path / "kh", name="n", connect_timeout=3.0)
    assert SSHEndpoint.from_dict(ep.to_dict()) == ep
