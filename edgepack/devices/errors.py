"""Errors of the remote-device layer; each names the device and says how to fix the problem."""

from __future__ import annotations

from edgepack.errors import EdgepackError


class RemoteError(EdgepackError):
    """A problem talking to a device over SSH."""


class HostKeyError(RemoteError):
    """The device's SSH host key is not the one we trust (unknown, or changed)."""


class UnknownHostKeyError(HostKeyError):
    """The device presented a host key that is not in the known hosts file yet."""

    def __init__(self, message: str, hint: str = "", *, fingerprint: str = "", key_type: str = "") -> None:
        super().__init__(message, hint)
        self.fingerprint = fingerprint
        self.key_type = key_type


class ChangedHostKeyError(HostKeyError):
    """The device presented a host key that differs from the trusted one: possibly an attack."""

    def __init__(self, message: str, hint: str = "", *, fingerprint: str = "", expected_fingerprint: str = "") -> None:
        super().__init__(message, hint)
        self.fingerprint = fingerprint
        self.expected_fingerprint = expected_fingerprint


class DeviceUnreachableError(RemoteError):
    """No SSH session: refused, timed out, no route, failed handshake, or the connection dropped."""


class AuthenticationError(DeviceUnreachableError):
    """The device answered but did not accept our key."""


class RemoteCommandError(RemoteError):
    """A command on the device failed or did not finish in time."""

    def __init__(self, message: str, hint: str = "", *, rc: int | None = None, stdout: str = "",
                 stderr: str = "") -> None:
        super().__init__(message, hint)
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr


class RemoteTimeoutError(RemoteCommandError):
    """A command on the device ran past its timeout."""


class TunnelError(RemoteError):
    """The local port forward to the device could not be set up or died."""


# name -> class, so that errors raised in the tunnel process can be re-raised in the parent
ERROR_TYPES: dict[str, type[EdgepackError]] = {
    cls.__name__: cls
    for cls in (RemoteError, HostKeyError, UnknownHostKeyError, ChangedHostKeyError, DeviceUnreachableError,
                AuthenticationError, RemoteCommandError, RemoteTimeoutError, TunnelError)
}


class DeviceError(RemoteError):
    """A device is reachable but cannot do what was asked."""


class ArchMismatchError(DeviceError):
    """``uname -m`` on the device does not match the profile's triple."""


class DeployError(DeviceError):
    """Installing the runtime and RPC server on the device failed."""


class RPCServerError(DeviceError):
    """The RPC server on the device does not start, or died."""


class DeviceBusyError(DeviceError):
    """The device's RPC server is serving another session."""


class ConnectionLostError(DeviceUnreachableError):
    """The connection to the device dropped during an operation, and retrying did not help."""


class RemoteRunError(DeviceError):
    """The model failed on the device (load or run)."""


class BuildMismatchError(DeviceError):
    """The build was made for another kind of device."""
