"""How devices, checks, benchmarks and the farm look in a terminal (rich tables). No logic lives here."""

from __future__ import annotations

from rich.table import Table

from edgepack.cli.render import console


def _mark(ok: bool | None) -> str:
    return "[green]✓[/]" if ok else ("[dim]–[/]" if ok is None else "[bold red]✗[/]")


def _yes_no(value: bool | None) -> str:
    if value is None:
        return "[dim]?[/]"
    return "[green]yes[/]" if value else "[bold red]no[/]"


def _when(stamp: str | None) -> str:
    if not stamp:
        return "[dim]never[/]"
    return stamp.replace("T", " ").split("+")[0]


def device_added(device, path, replaced: bool) -> None:
    verb = "Updated" if replaced else "Added"
    console.print(f"{verb} [bold]{device.name}[/] ({device.user}@{device.host}:{device.port}, profile "
                  f"{device.profile}) in {path}.", highlight=False)
    console.print(f"Next: [bold]edgepack device trust {device.name}[/], then "
                  f"[bold]edgepack device check {device.name}[/].", highlight=False)


def device_list(inventory, statuses, reachable) -> None:
    """``reachable``: name -> live probe result (None when not probed)."""
    table = Table(title=f"Devices in {inventory.path}", title_justify="left")
    for col in ("name", "profile", "address", "reachable", "arch", "runtime", "RPC", "last check"):
        table.add_column(col, no_wrap=col != "address")
    for device in sorted(inventory.devices.values(), key=lambda d: d.name):
        status = statuses.get(device.name)
        live = reachable.get(device.name)
        if live is None and status is not None:
            live = status.reachable
        rpc = status.rpc if status and status.rpc else None
        rpc_text = "[dim]?[/]" if rpc is None else ("[green]ok[/]" if rpc == "ok" else f"[bold red]{rpc}[/]")
        table.add_row(
            device.name, device.profile, f"{device.user}@{device.host}:{device.port}", _yes_no(live),
            (status.arch if status and status.arch else "[dim]?[/]"),
            (status.runtime if status and status.runtime else "[dim]?[/]"), rpc_text,
            _when(status.last_check if status else None),
        )
    console.print(table)
    if not inventory.devices:
        console.print("No devices yet: add one with [bold]edgepack device add NAME --host HOST --user USER "
                      "--profile PROFILE[/].", highlight=False)
    for device in sorted(inventory.devices.values(), key=lambda d: d.name):
        status = statuses.get(device.name)
        if status and status.message:
            console.print(f"[yellow]{device.name}[/]: {status.message}", highlight=False)


def device_check(check) -> None:
    verdict = "[bold green]OK[/]" if check.ok else "[bold red]FAILED[/]"
    table = Table(title=f"{check.device} ({check.profile}): {verdict}", title_justify="left")
    table.add_column("")
    table.add_column("check", no_wrap=True)
    table.add_column("result")
    labels = {"ssh": "ssh + host key", "arch": "arch", "runtime": "runtime", "rpc": "RPC round trip"}
    for item in check.items:
        table.add_row(_mark(item.ok), labels.get(item.name, item.name), item.detail)
    console.print(table)
    if not check.ok and check.hint:
        console.print(f"[bold]Fix:[/] {check.hint}", highlight=False)


def host_key(device, key, trusted, known_hosts) -> None:
    table = Table(title=f"SSH host key of {device.name} ({device.host}:{device.port})", title_justify="left")
    table.add_column("")
    table.add_column("")
    table.add_row("type", key.key_type)
    table.add_row("fingerprint", f"[bold]{key.fingerprint}[/]")
    if not trusted:
        state = "[yellow]not trusted yet[/]"
    elif any(k.fingerprint == key.fingerprint for k in trusted):
        state = "[green]already trusted[/]"
    else:
        state = ("[bold red]CHANGED[/]: " + ", ".join(k.fingerprint for k in trusted) + " was trusted")
    table.add_row("state", state)
    table.add_row("known hosts", str(known_hosts))
    console.print(table)


def bench_results(results) -> None:
    """``results``: BenchResult or EdgepackError (with ``.device``) per device."""
    first = next((r for r in results if hasattr(r, "samples_ms")), None)
    title = "Latency" + (f" of {first.build_dir}" if first else "") + " (ms)"
    table = Table(title=title, title_justify="left")
    for col in ("device", "mean", "median", "p90", "p99", "min", "max", "std", "samples"):
        table.add_column(col, justify="left" if col == "device" else "right", no_wrap=True)
    failures = []
    for r in results:
        if hasattr(r, "samples_ms"):
            via = " [dim](tracker)[/]" if r.via == "tracker" else ""
            table.add_row(f"{r.device}{via}", *(f"{getattr(r, k):.3f}" for k in
                                               ("mean_ms", "median_ms", "p90_ms", "p99_ms", "min_ms", "max_ms",
                                                "std_ms")),
                          f"{r.repeat} x {r.number}")
        else:
            name = getattr(r, "device", "?")
            table.add_row(name, *(["[bold red]failed[/]"] + [""] * 6), "")
            failures.append((name, r))
    console.print(table)
    for name, exc in failures:
        console.print(f"[bold red]{name}[/]: {exc.message}", highlight=False)
        if exc.hint:
            console.print(f"  [bold]Fix:[/] {exc.hint}", highlight=False)


def farm_started(state) -> None:
    console.print(f"Farm running: tracker on [bold]127.0.0.1:{state.tracker_port}[/] (pid {state.pid}), "
                  f"log {state.log}", highlight=False)
    _agents(state.devices.values())


def _agents(agents) -> None:
    table = Table(title="Devices", title_justify="left")
    for col in ("device", "profile", "key", "state", "local port", "sessions", "since", "message"):
        table.add_column(col, no_wrap=col != "message")
    colours = {"free": "green", "busy": "cyan", "down": "bold red", "starting": "yellow"}
    for a in sorted(agents, key=lambda a: a.name):
        table.add_row(a.name, a.profile, a.key, f"[{colours.get(a.state, 'white')}]{a.state}[/]",
                      f"127.0.0.1:{a.port}" if a.port else "", str(a.sessions), _when(a.updated), a.message)
    console.print(table)


def farm_status(status) -> None:
    if not status.running:
        console.print(status.message, highlight=False)
        return
    console.print(f"Farm running: tracker on [bold]{status.tracker}[/] (pid {status.pid}), log {status.log}",
                  highlight=False)
    queue = Table(title="Tracker queue", title_justify="left")
    for col in ("key", "free", "pending requests", "registered"):
        queue.add_column(col, justify="left" if col == "key" else "right")
    registered: dict[str, int] = {}
    for server in status.servers:
        key = str(server.get("key", "")).removeprefix("server:")
        registered[key] = registered.get(key, 0) + 1
    for key in sorted(set(status.queue) | set(registered)):
        info = status.queue.get(key, {})
        queue.add_row(key, str(info.get("free", 0)), str(info.get("pending", 0)), str(registered.get(key, 0)))
    console.print(queue)
    _agents(status.devices)
    if status.message:
        console.print(f"[yellow]{status.message}[/]", highlight=False)
