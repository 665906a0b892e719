import pytest

from edgepack.devices.inventory import Device, InventoryError, load_inventory


def test_round_trip_and_farm_grouping(tmp_path):
    path = tmp_path / "devices.toml"
    inv = load_inventory(path)
    assert inv.devices == {}
    inv.add(Device("pi4-a", "192.168.1.20", "pi", "rpi4", key="~/.ssh/id_ed25519"))
    inv.add(Device("pi4-b", "pi4b.local", "pi", "rpi4", port=2222))
    inv.add(Device("rk", "10.0.0.9", "rock", "mali-g610", rpc_port=9191))
    inv.add(Device('odd "name"'.replace(" ", "_").replace('"', ""), "h", "u", "rpi3"))
    inv.save()

    again = load_inventory(path)
    assert again.devices == inv.devices
    assert [d.name for d in again.resolve("farm:rpi4")] == ["pi4-a", "pi4-b"]
    assert again.resolve("rk")[0].rpc_port == 9191
    assert again.get("pi4-a").key_path().is_absolute()


def test_values_that_need_escaping_survive(tmp_path):
    inv = load_inventory(tmp_path / "d.toml")
    weird = 'C:\\keys\\my "key"\tfile'
    inv.add(Device("x", "host", "user", "rpi4", key=weird))
    inv.save()
    assert load_inventory(tmp_path / "d.toml").get("x").key == weird


@pytest.mark.parametrize("text, match", [
    ("[devices.a]\nhost = 'h'\nuser = 'u'\n", "malformed"),  # no profile
    ("[devices.a]\nhost = 'h'\nuser = 'u'\nprofile = 'rpi4'\ncolour = 'red'\n", "unknown keys colour"),
    ("[devices.a]\nhost = 'h'\nuser = 'u'\nprofile = 'rpi4'\nport = '22'\n", "port must be an integer"),
    ("[devices.a\n", "Cannot read"),
    ("[devices.'bad name']\nhost = 'h'\nuser = 'u'\nprofile = 'rpi4'\n", "not allowed"),
])
def test_malformed_inventories_are_explained(tmp_path, text, match):
    path = tmp_path / "devices.toml"
    path.write_text(text)
    with pytest.raises(InventoryError, match=match):
        load_inventory(path)


def test_unknown_device_and_duplicates(tmp_path):
    inv = load_inventory(tmp_path / "d.toml")
    inv.add(Device("a", "h", "u", "rpi4"))
    with pytest.raises(InventoryError, match="already"):
        inv.add(Device("a", "h2", "u", "rpi4"))
    with pytest.raises(InventoryError, match="known: a"):
        inv.get("b")
    with pytest.raises(InventoryError, match="No device with profile"):
        inv.resolve("farm:rpi5")
