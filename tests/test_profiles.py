
import pytest

from edgepack.errors import ProfileError
from edgepack.profiles import get_profile, list_profiles, require_supported

REQUIRED = {"host", "rpi3", "rpi4", "rpi5", "android-arm64", "mali-g610", "adreno-6xx", "vulkan-generic"}


def test_every_required_profile_ships_and_builds_a_tvm_target():
    profiles = {p.name: p for p in list_profiles()}
    assert REQUIRED <= set(profiles)
    for p in profiles.values():
        target = p.tvm_target()  # a real TVM Target: the dict is valid
        assert target.kind.name == p.target["kind"]
        assert p.rpc_key and p.triple and p.toolchain.cxx


def test_arm_profiles_describe_the_right_cpus():
    rpi3, rpi4, rpi5 = get_profile("rpi3"), get_profile("rpi4"), get_profile("rpi5")
    assert rpi3.target["mtriple"].startswith("armv7") and rpi3.target["mfloat-abi"] == "hard"
    assert rpi3.target["mcpu"] == "cortex-a53"
    assert (rpi4.target["mcpu"], rpi5.target["mcpu"]) == ("cortex-a72", "cortex-a76")
    assert rpi4.emulator and rpi4.emulator.command[0] == "qemu-aarch64"
    assert get_profile("mali-g610").backend == "opencl"


def test_planned_backends_refuse_clearly(tmp_path):
    planned = tmp_path / "npu.toml"
    planned.write_text('name = "npu"\nstatus = "planned"\nbackend = "vulkan"\ntriple = "aarch64-linux-gnu"\n'
                       '[target]\nkind = "webgpu"\n[toolchain]\ncc = "gcc"\ncxx = "g++"\n')
    with pytest.raises(ProfileError, match="not supported yet"):
        require_supported(get_profile(str(planned)))
    assert get_profile("vulkan-generic").status == "supported"


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(ProfileError) as err:
        get_profile("rpi9")
    assert "rpi4" in err.value.hint


def test_a_new_device_is_a_new_file(tmp_path, monkeypatch):
    (tmp_path / "jetson.toml").write_text(
        'name = "jetson-nano-cpu"\ntriple = "aarch64-linux-gnu"\n'
        '[target]\nkind = "llvm"\nmtriple = "aarch64-linux-gnu"\nmcpu = "cortex-a57"\n'
        '[toolchain]\ncc = "aarch64-linux-gnu-gcc"\ncxx = "aarch64-linux-gnu-g++"\n'
    )
    monkeypatch.setenv("EDGEPACK_PROFILES_DIR", str(tmp_path))
    profile = get_profile("jetson-nano-cpu")
    assert profile.target["mcpu"] == "cortex-a57" and profile.status == "supported"
    assert profile.source == tmp_path / "jetson.toml"


def test_malformed_profile_names_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\n')
    with pytest.raises(ProfileError, match="malformed"):
        get_profile(str(bad))


def test_a_profile_recorded_in_a_manifest_reads_back_the_same():
    from edgepack.profiles import profile_from_dict

    for profile in list_profiles():
        assert profile_from_dict(profile.to_dict()) == profile
