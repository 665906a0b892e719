"""``edgepack device ...``, ``edgepack farm ...`` and ``edgepack bench``: thin commands over
:mod:`edgepack.devices` and :func:`edgepack.bench` (mounted by :mod:`edgepack.cli.main`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

import edgepack
from edgepack.cli import render, render_devices
from edgepack.cli.common import InventoryOption, JsonOption, ThreadsOption, print_json
from edgepack.devices.check import check_device
from edgepack.devices.deploy import endpoint_for, scan_device_key, trust_device, trusted_device_keys
from edgepack.devices.farm import farm_status as status_of
from edgepack.devices.farm import start_farm, stop_farm
from edgepack.devices.manage import add_device, inventory_at, list_devices
from edgepack.devices.ssh import forget_host_key
from edgepack.errors import EdgepackError

device_app = typer.Typer(help="Devices edgepack can reach over SSH: add, trust, check, list, remove.",
                         no_args_is_help=True)
farm_app = typer.Typer(help="A TVM RPC tracker on this machine's loopback for the devices of the inventory.",
                       no_args_is_help=True)


# ---------------------------------------------------------------------------------------------
# device


@device_app.command("add")
def device_add(
    name: Annotated[str, typer.Argument(help="A short name for the device, e.g. pi4.")],
    host: Annotated[str, typer.Option("--host", help="Host name or IP address of the device.")],
    user: Annotated[str, typer.Option("--user", help="SSH user on the device.")],
    profile: Annotated[str, typer.Option("--profile", "-p", help="Device profile (see `edgepack profiles`).")],
    key: Annotated[str | None, typer.Option("--key", help="SSH private key \\[default: the SSH agent / ~/.ssh keys].")] = None,
    port: Annotated[int, typer.Option("--port", help="SSH port.")] = 22,
    rpc_port: Annotated[int, typer.Option("--rpc-port", help="Port of the RPC server on the device's loopback.")] = 9090,
    rpc_server: Annotated[str, typer.Option("--rpc-server", help="edgepack (no Python on the device), or python[:PATH] "
                                                                 "for TVM's own server.")] = "edgepack",
    replace: Annotated[bool, typer.Option("--replace", help="Replace a device of the same name.")] = False,
    inventory: InventoryOption = None,
    as_json: JsonOption = False,
) -> None:
    """Add a device to the inventory (then `device trust NAME` and `device check NAME`)."""
    added = add_device(name, host, user, profile, key=key, port=port, rpc_port=rpc_port, rpc_server=rpc_server,
                       replace=replace, inventory=inventory)
    if as_json:
        print_json(added.to_dict())
    else:
        render_devices.device_added(added.device, added.inventory, added.replaced)


@device_app.command("list")
def device_list(
    probe: Annotated[bool, typer.Option("--probe/--no-probe", help="Check now whether each device answers on "
                                                                  "its SSH port (a few seconds at most).")] = True,
    inventory: InventoryOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the devices: profile, reachable, arch, runtime, RPC state and the last check."""
    inv = inventory_at(inventory)
    listing = list_devices(inv, probe=probe)
    if as_json:
        print_json([entry.to_dict() for entry in listing])
    else:
        render_devices.device_list(inv, {e.device.name: e.status for e in listing if e.status},
                                   {e.device.name: e.reachable for e in listing})


@device_app.command("check")
def device_check(
    names: Annotated[list[str] | None, typer.Argument(help="Devices to check \\[default: all].")] = None,
    install: Annotated[bool, typer.Option("--install/--no-install", help="Install or update the runtime and RPC "
                                                                        "server when needed.")] = True,
    inventory: InventoryOption = None,
    as_json: JsonOption = False,
) -> None:
    """SSH reachable (trusted host key), arch matches the profile, runtime present, RPC round trip. Exits 1 on failure."""
    inv = inventory_at(inventory)
    targets = [d for n in names for d in inv.resolve(n)] if names else sorted(inv.devices.values(), key=lambda d: d.name)
    if not targets:
        raise EdgepackError(f"No devices in {inv.path}.", "Add one with `edgepack device add`.")
    checks = []
    for device in targets:
        with render.steps(quiet=as_json) as step:
            check = check_device(device, install=install, progress=step)
        inv.save_status(device.name, check.to_status())
        checks.append(check)
        if not as_json:
            render_devices.device_check(check)
    if as_json:
        print_json([c.to_dict() for c in checks])
    if not all(c.ok for c in checks):
        raise typer.Exit(1)


@device_app.command("trust")
def device_trust(
    name: Annotated[str, typer.Argument(help="The device whose SSH host key to trust.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Trust without asking.")] = False,
    inventory: InventoryOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the device's SSH host key fingerprint and record it as trusted (after confirmation)."""
    inv = inventory_at(inventory)
    device = inv.get(name)
    key = scan_device_key(device)
    trusted = trusted_device_keys(device)
    known_hosts = endpoint_for(device).known_hosts
    already = any(k.fingerprint == key.fingerprint for k in trusted)
    changed = bool(trusted) and not already
    if not as_json:
        render_devices.host_key(device, key, trusted, known_hosts)
    if not already:
        if not yes:
            if changed:
                render.console.print("[bold red]The key differs from the one trusted before.[/] Accept it only if "
                                     "you know why it changed (device reinstalled or re-keyed).", highlight=False)
            prompt = (f"Compare the fingerprint with the device's own (`ssh-keygen -lf /etc/ssh/ssh_host_"
                      f"{key.key_type.removeprefix('ssh-').split('-')[0]}_key.pub` on it). Trust this key?")
            if not typer.confirm(prompt, default=False, err=True):
                raise EdgepackError(f"Not trusted: {device.name}'s host key was left out of {known_hosts}.",
                                    "Run the command again and answer yes, or pass --yes.")
        trust_device(device, key)
    if as_json:
        print_json({"device": device.name, "key_type": key.key_type, "fingerprint": key.fingerprint,
                     "known_hosts": str(known_hosts), "was_trusted": already, "replaced_changed_key": changed})
    elif already:
        render.console.print(f"{device.name}'s host key was already trusted; nothing changed.", highlight=False)
    else:
        render.console.print(f"Trusted {device.name}'s host key {key.fingerprint} ({known_hosts}).", highlight=False)


@device_app.command("remove")
def device_remove(
    name: Annotated[str, typer.Argument(help="The device to remove.")],
    forget_key: Annotated[bool, typer.Option("--forget-key", help="Also remove its host key from the known hosts "
                                                                  "file.")] = False,
    inventory: InventoryOption = None,
    as_json: JsonOption = False,
) -> None:
    """Remove a device from the inventory (the device itself is not touched)."""
    inv = inventory_at(inventory)
    device = inv.remove(name)
    inv.save()
    forgotten = forget_host_key(endpoint_for(device).known_hosts, device.host, device.port) if forget_key else 0
    if as_json:
        print_json({"removed": name, "inventory": str(inv.path), "host_keys_forgotten": forgotten})
    else:
        render.console.print(f"Removed {name} from {inv.path}"
                             + (f" and forgot its host key ({forgotten} line(s))." if forget_key else "."),
                             highlight=False)


# ---------------------------------------------------------------------------------------------
# farm


@farm_app.command("start")
def farm_start(
    profile: Annotated[str | None, typer.Option("--profile", "-p", help="Only the devices of this profile.")] = None,
    port: Annotated[int, typer.Option("--port", help="First loopback port to try for the tracker.")] = 9190,
    inventory: InventoryOption = None,
    as_json: JsonOption = False,
) -> None:
    """Start the RPC tracker (127.0.0.1) and register every device of the inventory with it."""
    inv = inventory_at(inventory)
    with render.steps(quiet=as_json) as step:
        state = start_farm(inv, tracker_port=port, profile=profile, progress=step)
    if as_json:
        print_json(state.to_dict())
    else:
        render_devices.farm_started(state)


@farm_app.command("stop")
def farm_stop(inventory: InventoryOption = None, as_json: JsonOption = False) -> None:
    """Stop the tracker and the device agents (the devices' RPC servers keep running)."""
    stopped = stop_farm(inventory_at(inventory))
    if as_json:
        print_json({"stopped": stopped})
    else:
        render.console.print("Farm stopped." if stopped else "The farm was not running.")


@farm_app.command("status")
def farm_status(inventory: InventoryOption = None, as_json: JsonOption = False) -> None:
    """The tracker's queue (free devices, pending requests per key) and each device's state."""
    status = status_of(inventory_at(inventory))
    if as_json:
        print_json(status.to_dict())
    else:
        render_devices.farm_status(status)


# ---------------------------------------------------------------------------------------------
# bench


def bench(
    build: Annotated[Path, typer.Argument(help="A build directory made by `edgepack compile`.")],
    on: Annotated[str, typer.Option("--on", help="host (this machine), a device of the inventory, or farm:PROFILE "
                                                 "(the first free device; every device with --all).")],
    repeat: Annotated[int, typer.Option("--repeat", "-r", help="Timed samples.")] = 50,
    number: Annotated[int, typer.Option("--number", "-n", help="Runs averaged into each sample.")] = 1,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed runs first.")] = 1,
    all_devices: Annotated[bool, typer.Option("--all", help="With farm:PROFILE: every device of the profile.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds the device may spend on one session.")] = 900.0,
    reconnect_window: Annotated[float, typer.Option("--reconnect-window", help="Seconds a device that dropped out "
                                                                            "(e.g. rebooting) may take to come back "
                                                                            "before the benchmark gives up.")] = 30.0,
    threads: ThreadsOption = None,
    inventory: InventoryOption = None,
    as_json: JsonOption = False,
) -> None:
    """Latency of a build (mean, median, p90, p99, min, max in ms), timed where it runs: here, or on a device over TVM RPC."""
    with render.steps(quiet=as_json) as step:
        results = edgepack.bench(build, on, repeat=repeat, number=number, warmup=warmup, all_devices=all_devices,
                                 threads=threads, session_timeout=timeout, reconnect_window=reconnect_window, inventory=inventory,
                                 progress=step)
    failed = [r for r in results if isinstance(r, EdgepackError)]
    if as_json:
        print_json([r.to_dict() if not isinstance(r, EdgepackError) else
                    {"device": getattr(r, "device", None), "error": r.message, "hint": r.hint} for r in results])
    else:
        render_devices.bench_results(results)
    if failed:
        raise typer.Exit(1)
