"""The device inventory: one TOML file listing the devices edgepack can reach.

    # ~/.config/edgepack/devices.toml
    [devices.pi4]
    host = "192.168.1.20"
    user = "pi"
    profile = "rpi4"
    port = 22
    key = "~/.ssh/id_ed25519"

A farm is the set of devices sharing a profile (``farm:rpi4``). Check results are kept apart from the
inventory (``devices.status.json`` beside it) so the file users edit is never rewritten with state.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from edgepack.errors import EdgepackError
from edgepack.files import write_text_atomic
from edgepack.paths import config_root
from edgepack.profiles import Profile, get_profile

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
DEFAULT_RPC_PORT = 9090


class InventoryError(EdgepackError):
    """The inventory file is malformed, or names a device that is not in it."""


@dataclass(frozen=True)
class Device:
    name: str
    host: str
    user: str
    profile: str
    port: int = 22
    key: str | None = None  # private key file; None: the SSH agent / default keys
    rpc_port: int = DEFAULT_RPC_PORT  # port of the RPC server on the device's loopback
    remote_dir: str = ".edgepack"  # relative to the user's home on the device
    # the RPC server on the device: "edgepack" (ours, no Python needed), or "python" / "python:/path/to/python"
    # for TVM's own `python -m tvm.exec.rpc_server` on a device that has TVM's Python package
    rpc_server: str = "edgepack"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def key_path(self) -> Path | None:
        return Path(self.key).expanduser() if self.key else None


@dataclass
class DeviceStatus:
    reachable: bool | None = None
    arch: str | None = None
    runtime: str | None = None
    rpc: str | None = None
    last_check: str | None = None
    message: str = ""


@dataclass
class Inventory:
    path: Path
    devices: dict[str, Device] = field(default_factory=dict)

    def get(self, name: str) -> Device:
        if name not in self.devices:
            known = ", ".join(sorted(self.devices)) or "none yet"
            raise InventoryError(
                f"No device named {name!r} in {self.path} (known: {known}).",
                "Add it with `edgepack device add NAME --host HOST --user USER --profile PROFILE`.",
            )
        return self.devices[name]

    def farm(self, profile: str) -> list[Device]:
        """Every device of a profile (``farm:PROFILE``)."""
        members = [d for d in self.devices.values() if d.profile == profile]
        if not members:
            raise InventoryError(f"No device with profile {profile!r} in {self.path}.",
                                 "Add devices with `edgepack device add ... --profile " + profile + "`.")
        return sorted(members, key=lambda d: d.name)

    def resolve(self, target: str) -> list[Device]:
        """``NAME`` -> that device; ``farm:PROFILE`` -> every device of the profile."""
        if target.startswith("farm:"):
            return self.farm(target.removeprefix("farm:"))
        return [self.get(target)]

    def add(self, device: Device, replace_existing: bool = False) -> None:
        if not NAME_PATTERN.match(device.name):
            raise InventoryError(f"Device name {device.name!r} is not allowed.",
                                 "Use letters, digits, '.', '_' and '-' (up to 63 characters).")
        if device.name in self.devices and not replace_existing:
            raise InventoryError(f"Device {device.name!r} is already in {self.path}.",
                                 "Remove it first with `edgepack device remove`, or pass --replace.")
        if not 0 < device.port < 65536 or not 0 < device.rpc_port < 65536:
            raise InventoryError(f"Port out of range for device {device.name!r}.", "Use 1..65535.")
        self.devices[device.name] = device

    def remove(self, name: str) -> Device:
        device = self.get(name)
        del self.devices[name]
        return device

    def save(self) -> None:
        lines = ["# edgepack device inventory (edgepack device add/remove edit this file)", ""]
        for device in sorted(self.devices.values(), key=lambda d: d.name):
            lines.append(f"[devices.{_toml_key(device.name)}]")
            for key, value in asdict(device).items():
                if key == "name" or value is None:
                    continue
                if key in _OMIT_DEFAULTS and value == _OMIT_DEFAULTS[key]:
                    continue
                lines.append(f"{key} = {_toml_value(value)}")
            lines.append("")
        write_text_atomic(self.path, "\n".join(lines))

    # --- status, kept beside the inventory ---

    @property
    def status_path(self) -> Path:
        return self.path.with_name(self.path.stem + ".status.json")

    def load_status(self) -> dict[str, DeviceStatus]:
        try:
            data = json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}
        return {name: DeviceStatus(**fields) for name, fields in data.items() if name in self.devices}

    def save_status(self, name: str, status: DeviceStatus) -> None:
        statuses = self.load_status()
        statuses[name] = status
        write_text_atomic(self.status_path,
                          json.dumps({k: asdict(v) for k, v in statuses.items()}, indent=2) + "\n")


# fields left out of the file when they have their default value (files stay short and readable)
_OMIT_DEFAULTS = {"remote_dir": ".edgepack", "rpc_server": "edgepack"}


def default_inventory_path() -> Path:
    """``$EDGEPACK_INVENTORY``, else ``$XDG_CONFIG_HOME/edgepack/devices.toml``."""
    explicit = os.environ.get("EDGEPACK_INVENTORY")
    if explicit:
        return Path(explicit).expanduser()
    return config_root() / "devices.toml"


def load_inventory(path: Path | None = None) -> Inventory:
    """Read the inventory; a missing file is an empty inventory."""
    path = Path(path).expanduser() if path else default_inventory_path()
    if not path.exists():
        return Inventory(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InventoryError(f"Cannot read the device inventory {path}: {exc}.", "Fix the TOML syntax.") from exc
    inventory = Inventory(path)
    for name, fields in (data.get("devices") or {}).items():
        try:
            inventory.add(_device_from_toml(name, fields))
        except TypeError as exc:
            raise InventoryError(
                f"Device {name!r} in {path} is malformed ({exc}).",
                "Each device needs host, user and profile; optional: port, key, rpc_port, remote_dir, rpc_server.",
            ) from exc
    return inventory


def _device_from_toml(name: str, fields: Any) -> Device:
    if not isinstance(fields, dict):
        raise TypeError("expected a table")
    allowed = {f for f in Device.__dataclass_fields__ if f != "name"}
    unknown = set(fields) - allowed
    if unknown:
        raise TypeError(f"unknown keys {', '.join(sorted(unknown))}")
    device = Device(name=name, **fields)
    for key in ("port", "rpc_port"):
        if not isinstance(getattr(device, key), int):
            raise TypeError(f"{key} must be an integer")
    return replace(device)


def _toml_key(name: str) -> str:
    return name if re.match(r"^[A-Za-z0-9_-]+$", name) else json.dumps(name)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def device_profile(device: Device, profile: Profile | str | None = None) -> Profile:
    """The profile a device is used with: ``profile`` when given (a name or a Profile), else its own."""
    if profile is None:
        return get_profile(device.profile)
    if isinstance(profile, str):
        return get_profile(profile)
    return profile


#: ``uname -m`` values a triple's binaries run on
_ARCH_NAMES: dict[str, tuple[str, ...]] = {
    "aarch64": ("aarch64", "arm64", "armv8b"),
    "arm": ("armv7l", "armv7", "armv8l", "armhf"),
    "armv7a": ("armv7l", "armv7", "armv8l", "armhf"),
    "armv7": ("armv7l", "armv7", "armv8l", "armhf"),
    "x86_64": ("x86_64", "amd64"),
    "riscv64": ("riscv64",),
}


def expected_arches(triple: str) -> tuple[str, ...]:
    """The ``uname -m`` values of machines that run binaries for ``triple``."""
    cpu = triple.split("-")[0]
    return _ARCH_NAMES.get(cpu, (cpu,))
