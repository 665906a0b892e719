"""The inventory as a user edits and reads it: add a device (checked), list devices with a reachability probe."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgepack.devices.deploy import probe_reachable
from edgepack.devices.inventory import Device, DeviceStatus, Inventory, load_inventory
from edgepack.errors import EdgepackError
from edgepack.profiles import get_profile


@dataclass(frozen=True)
class DeviceAdded:
    device: Device
    inventory: Path
    replaced: bool

    def to_dict(self) -> dict[str, Any]:
        return {"inventory": str(self.inventory), "replaced": self.replaced, "device": asdict(self.device)}


@dataclass(frozen=True)
class DeviceListing:
    device: Device
    reachable: bool | None  # None: not probed
    status: DeviceStatus | None  # what the last `device check` found

    def to_dict(self) -> dict[str, Any]:
        return asdict(self.device) | {"reachable": self.reachable,
                                      "status": asdict(self.status) if self.status else None}


def inventory_at(path: Path | str | None) -> Inventory:
    """The inventory at ``path`` (default: ``$EDGEPACK_INVENTORY``, else ``~/.config/edgepack/devices.toml``)."""
    return load_inventory(Path(path) if path else None)


def add_device(name: str, host: str, user: str, profile: str, *, key: str | None = None, port: int = 22,
               rpc_port: int = 9090, rpc_server: str = "edgepack", replace: bool = False,
               inventory: Path | str | None = None) -> DeviceAdded:
    """Add a device to the inventory (then trust its host key and check it)."""
    get_profile(profile)  # an unknown profile is refused now
    if key and not Path(key).expanduser().is_file():
        raise EdgepackError(f"The SSH key {key} does not exist.",
                            "Pass the private key file (e.g. --key ~/.ssh/id_ed25519), or leave --key out to use "
                            "the SSH agent.")
    inv = inventory_at(inventory)
    device = Device(name, host, user, profile, port=port, key=key, rpc_port=rpc_port, rpc_server=rpc_server)
    replaced = name in inv.devices
    inv.add(device, replace_existing=replace)
    inv.save()
    return DeviceAdded(device, inv.path, replaced)


def list_devices(inventory: Path | str | Inventory | None = None, *, probe: bool = True) -> list[DeviceListing]:
    """Every device with its last check, and (``probe``) whether it answers on its SSH port now."""
    inv = inventory if isinstance(inventory, Inventory) else inventory_at(inventory)
    statuses = inv.load_status()
    devices = sorted(inv.devices.values(), key=lambda d: d.name)
    reachable: dict[str, bool | None] = {d.name: None for d in devices}
    if probe and devices:
        with ThreadPoolExecutor(max_workers=min(16, len(devices))) as pool:
            for device, ok in zip(devices, pool.map(lambda d: probe_reachable(d, timeout=3.0), devices)):
                reachable[device.name] = ok
    return [DeviceListing(d, reachable[d.name], statuses.get(d.name)) for d in devices]
