"""Reaching real devices: the inventory, SSH (strict host keys, quoted commands, uploads, tunnels)."""

from edgepack.remote.errors import (
    AuthenticationError,
    ChangedHostKeyError,
    DeviceUnreachableError,
    HostKeyError,
    RemoteCommandError,
    RemoteError,
    RemoteTimeoutError,
    TunnelError,
    UnknownHostKeyError,
)
from edgepack.remote.ssh import (
    CommandResult,
    HostKey,
    LocalTunnel,
    SSHEndpoint,
    SSHSession,
    connect,
    default_known_hosts_path,
    fingerprint_sha256,
    forget_host_key,
    known_host_keys,
    known_hosts_name,
    quote_argv,
    scan_host_key,
    trust_host_key,
)

__all__ = [
    "AuthenticationError", "ChangedHostKeyError", "CommandResult", "DeviceUnreachableError", "HostKey",
    "HostKeyError", "LocalTunnel", "RemoteCommandError", "RemoteError", "RemoteTimeoutError", "SSHEndpoint",
    "SSHSession", "TunnelError", "UnknownHostKeyError", "connect", "default_known_hosts_path", "fingerprint_sha256",
    "forget_host_key", "known_host_keys", "known_hosts_name", "quote_argv", "scan_host_key", "trust_host_key",
]
