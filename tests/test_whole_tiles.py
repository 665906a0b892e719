"""Issue 43's speed at run-time sizes: register tiles computed whole (``backends/cpu/whole_tiles.py``).

The blocks of a kernel that write only its own buffers lose their predicate over a ``--dim`` size; the
kernels' outputs keep theirs. Builds are validated on the host and under qemu at several sizes, and a
build whose buffers get no room for the indices past the edge fails."""

from __future__ import annotations

import pytest

from edgepack.backends.cpu import whole_tiles
from edgepack.compiling import compile_model
from edgepack.validation import validate


def _lowered_kernel(name_part: str, model, shapes: dict, dims: list[str], whole: bool = True):
    """The TIR of the first host kernel whose name contains ``name_part``, scheduled by the default rules
    and lowered (through the pass where ``whole``) to TVM's opaque loops."""
    import tvm
    from tvm import s_tir

    from edgepack.backends.cpu.pipeline import UNTUNED_FORM, prepare_passes
    from edgepack.backends.cpu.schedules import default_rules
    from edgepack.backends.scheduling import recording_schedule_pass
    from edgepack.dims import parse_dims
    from edgepack.frontends.importer import import_model
    from edgepack.profiles import get_profile

    imported = import_model(model, shapes, parse_dims(dims))
    target = get_profile("host").tvm_target()
    with target:
        mod = tvm.transform.Sequential([*prepare_passes(target, UNTUNED_FORM),
                                        recording_schedule_pass(default_rules(), {})])(imported.mod)
        for gvar, func in mod.functions_items():
            if name_part in gvar.name_hint and isinstance(func, tvm.tirx.PrimFunc):
                single = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
                return tvm.transform.Sequential([
                    *([whole_tiles.unpredicated_tiles()] if whole else []), s_tir.transform.LowerInitBlock(),
                    s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
                    s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.CompactBufferAllocation(),
                    s_tir.transform.LowerOpaqueBlock()])(single)["main"].script()
    raise AssertionError(f"no kernel named like {name_part}")


def test_accumulators_of_a_run_time_width_are_not_guarded(tmp_path):
    """A fused depthwise + pointwise convolution over a ``--dim`` width: without the pass every block under
    its register tile is behind a condition (the accumulators' updates: a branch per pixel of the tile per
    input channel); with it, only the stores of the kernel's output are."""
    import onnx
    from model_factory import onnx_depthwise_pointwise

    model = onnx.load(onnx_depthwise_pointwise(tmp_path / "dwpw.onnx"))
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "W"  # its width known at run time
    for output in model.graph.output:
        output.type.tensor_type.shape.dim[3].dim_param = "V"
    onnx.save(model, tmp_path / "dwpw-any-width.onnx")
    args = ("conv2d", tmp_path / "dwpw-any-width.onnx", {"x": (1, 16, 28, "W")}, ["W=8..64"])

    def conditions(text: str) -> list[str]:
        return [line.strip() for line in text.splitlines() if line.strip().startswith("if ")]

    before, after = conditions(_lowered_kernel(*args, whole=False)), conditions(_lowered_kernel(*args))
    assert after and len(after) < len(before) / 2, (before, after)


@pytest.mark.slow
def test_an_attention_recognizer_fails_without_room_past_the_edge(models, tmp_path, monkeypatch):
    """PP-OCRv4's recognizer over W = 32..1280 matches ONNX Runtime at five widths on the host and under qemu
    (rpi4). Built with the kernels' own buffers left at their declared sizes, its pooling's register tile of
    64 pixels over a row of 4 overlaps the next row's accumulators, and validation fails."""
    model = models["ppocr_rec"].path
    shapes, dims = {"x": (1, 3, 48, "W")}, ["W=32..1280"]
    build = compile_model(model, "rpi4", tmp_path / "b", input_shapes=shapes, dims=dims).output_dir
    for on in ("host", "emulator"):
        report = validate(build, on)
        assert report.passed and len(report.sizes) == 5, (on, report.to_dict())
    monkeypatch.setattr(whole_tiles, "with_room", lambda buffer, _tops: buffer)
    wrong = compile_model(model, "host", tmp_path / "wrong", input_shapes=shapes, dims=dims).output_dir
    assert not validate(wrong, sizes=["W=32"]).passed
