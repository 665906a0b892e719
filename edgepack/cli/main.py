"""The ``edgepack`` command line. Thin: each command calls one library function and renders it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

import edgepack
from edgepack.cli import common, render
from edgepack.cli.android import package_android_command
from edgepack.cli.common import DimOption, InputShapeOption, JsonOption, ThreadsOption, print_json
from edgepack.cli.devices import bench, device_app, farm_app
from edgepack.cli.tuning import tune, tuning_app
from edgepack.doctor import run_checks
from edgepack.errors import EdgepackError

app = typer.Typer(
    name="edgepack",
    help="Compile ONNX and TFLite models for edge devices (ARM CPUs, mobile GPUs) with Apache TVM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

def _version(value: bool) -> None:
    if value:
        typer.echo(f"edgepack {edgepack.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Show the version and exit.")] = False,
) -> None:
    """Compile ONNX and TFLite models for edge devices with Apache TVM."""


@app.command()
def profiles(as_json: JsonOption = False) -> None:
    """List the device profiles edgepack knows (shipped and your own)."""
    found = edgepack.list_profiles()
    if as_json:
        print_json([p.to_dict() for p in found])
    else:
        render.profiles_table(found)


@app.command()
def inspect(
    model: Annotated[Path, typer.Argument(help="An .onnx or .tflite model, or a build directory (its model, and what its program takes and returns, with any compiled-in processing; --kernels: a GPU build's kernels).")],
    ir: Annotated[bool, typer.Option("--ir", help="Also print the Relax IR before and after operator fusion.")] = False,
    kernels: Annotated[bool, typer.Option("--kernels", help="For a GPU build directory: its OpenCL kernels / WGSL shaders with launch sizes.")] = False,
    input_shape: InputShapeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show a model's inputs, outputs, operators and any operator edgepack cannot compile."""
    if kernels:
        listing = edgepack.kernels(model)
        if as_json:
            print_json(listing.to_dict())
        else:
            render.console.print(listing.text, markup=False, highlight=False)
        return
    found = edgepack.inspect(model, ir=ir, input_shapes=edgepack.parse_input_shapes(input_shape))
    if as_json:
        print_json(found.to_dict())
    else:
        render.model_info(found.info, (found.ir_before_fusion, found.ir_after_fusion) if ir else None)
        if found.build is not None:
            render.build_program(found.build)


@app.command(name="compile")
def compile_(
    model: Annotated[Path, typer.Argument(help="An .onnx or .tflite model.")],
    profile: Annotated[str, typer.Option("--profile", "-p", help="Device profile (see `edgepack profiles`).")] = "rpi4",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Build directory \\[default: build/PROFILE].")] = None,
    input_shape: InputShapeOption = None,
    dim: DimOption = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Replace the output directory if it exists.")] = False,
    ndk: Annotated[str | None, typer.Option("--ndk", help="Android NDK root (android profiles).")] = None,
    tuning: Annotated[Path | None, typer.Option("--tuning", help="Apply the best records of a tuning directory (`edgepack tune`).")] = None,
    precision: Annotated[str | None, typer.Option(
        "--precision", metavar="fp32|fp16",
        help="What float tensors are stored and computed in: fp16 (GPU profiles) halves the weights and uses the "
             "GPU's half arithmetic; inputs and outputs stay float32 \\[default: the profile's, fp32 but for "
             "android-mali and adreno-6xx].")] = None,
    gpu_only: Annotated[bool, typer.Option(
        "--gpu-only",
        help="GPU profiles: refuse a model with operators the GPU cannot run exactly (64-bit integers on Vulkan, "
             "64-bit floats where the GPU has none, scans in WGSL, kernels without a GPU schedule) instead of "
             "running them on the device's CPU in the same program.")] = False,
    bundle: Annotated[str | None, typer.Option("--bundle", help="Also package the build: 'c' writes DIR-c/.")] = None,
    preprocess: Annotated[list[str] | None, typer.Option(
        "--preprocess", metavar="NAME=image:FORMAT,...|FILE.toml",
        help="Compile camera-frame pre-processing into the model: input NAME then takes uint8 frames. FORMAT: "
             "rgb8, bgr8, rgba8, gray8, nv21; size=HxW of the frame \\[default: the model's]; "
             "resize=bilinear|nearest|none; mean=M\\[/M/M], std=S\\[/S/S] in pixel units (0-255), in the model's "
             "channel order (order=rgb|bgr); layout=nchw|nhwc \\[default: from the model's shape]. Repeat per input; "
             "a .toml file holds the same settings per input (\\[NAME] image = \"rgb8\" ...).")] = None,
    postprocess: Annotated[list[str] | None, typer.Option(
        "--postprocess", metavar="NAME=STEPS|BOXES,SCORES=nms:...|FILE.toml",
        help="Compile post-processing into the model: NAME=softmax, sigmoid, argmax or topk:K along the last axis "
             "(chain with '+': softmax+topk:5); BOXES,SCORES=nms:iou=0.45,score=0.25,max=100,boxes=xyxy|yxyx|cxcywh "
             "for detectors (ONNX NonMaxSuppression semantics; fixed-size outputs and a count). Repeat per output; "
             "a .toml file holds NAME = \"topk:5\" lines.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Compile a model for a device profile into a build directory."""
    if bundle not in (None, "c"):
        raise EdgepackError(f"Unknown bundle kind {bundle!r}.", "Use --bundle c (Android comes with `package android`).")
    output = output or Path("build") / profile
    with render.steps(quiet=as_json) as step:
        result = edgepack.compile(model, profile, output, input_shapes=edgepack.parse_input_shapes(input_shape),
                                  dims=dim or None, force=force, ndk=ndk, tuning=tuning, preprocess=preprocess, postprocess=postprocess,
                                  precision=precision, gpu_only=gpu_only, progress=step)
    packaged = None
    if bundle == "c":
        with render.steps(quiet=as_json) as step:
            packaged = edgepack.package_c(result.output_dir, Path(f"{result.output_dir}-c"), force=force, progress=step)
    if as_json:
        data = {"output_dir": str(result.output_dir)} | result.manifest.to_dict()
        if packaged:
            data["bundle"] = {"output_dir": str(packaged.output_dir)} | packaged.to_dict()
        print_json(data)
    else:
        render.compile_summary(result)
        if packaged:
            render.bundle_summary(packaged)


@app.command()
def validate(
    build: Annotated[Path, typer.Argument(help="A build directory made by `edgepack compile`.")],
    on: Annotated[str, typer.Option("--on", help="Where to run the build: host, host-opencl / host-vulkan (GPU builds on this machine's OpenCL / Vulkan), emulator (the C runner under qemu-user), a device NAME, or farm:PROFILE.")] = "host",
    inventory: Annotated[Path | None, typer.Option("--inventory", envvar="EDGEPACK_INVENTORY", help="Device inventory \\[default: ~/.config/edgepack/devices.toml].")] = None,
    inputs: Annotated[Path | None, typer.Option("--inputs", "-i", help=".npz of inputs keyed by input name \\[default: seeded random].")] = None,
    seed: Annotated[int, typer.Option(help="Seed for random inputs.")] = 0,
    atol: Annotated[float | None, typer.Option(help="Absolute tolerance \\[default: 1e-4; fp16 builds: 1e-2 of the output's largest value].", show_default=False)] = None,
    rtol: Annotated[float | None, typer.Option(help="Relative tolerance \\[default: 1e-3; fp16 builds: 1e-2].", show_default=False)] = None,
    threads: ThreadsOption = None,
    size: Annotated[list[str] | None, typer.Option("--size", metavar="NAME=VALUE", help="A build with --dim ranges: run at this size only (repeat per dim) \\[default: each dim at its smallest, largest and three sizes between].")] = None,
    as_json: JsonOption = False,
) -> None:
    """Run a build and compare every output with ONNX Runtime / LiteRT. Exits 1 on mismatch.

    Warns where the reference output could not show a wrong build (constant, the same for every input,
    saturated probabilities, a near tie at the decision): `degenerate` in --json."""
    with render.steps(quiet=as_json) as step:
        step(f"Running {build} on {on} and the reference")
        report = edgepack.validate(build, on, inputs=inputs, seed=seed, atol=atol, rtol=rtol, inventory=inventory,
                                   threads=threads, sizes=size or None, progress=step)
    if as_json:
        print_json(report.to_dict())
    else:
        render.validation_report(report)
    if not report.passed:
        raise typer.Exit(1)


@app.command()
def quantize(
    model: Annotated[Path, typer.Argument(help="A float ONNX model.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the 8-bit model (.onnx).")],
    calibration: Annotated[Path, typer.Option("--calibration", "-c", help="A folder of pictures (with --preprocess) or an .npz of inputs, each array the samples stacked on a new first axis.")],
    preprocess: Annotated[list[str] | None, typer.Option("--preprocess", metavar="NAME=image:FORMAT,...", help="How a picture becomes the model's input, as for `compile` (mean, std, layout, order).")] = None,
    input_shape: InputShapeOption = None,
    method: Annotated[str, typer.Option("--method", help="Activation ranges: minmax, percentile or entropy.")] = "minmax",
    per_tensor: Annotated[bool, typer.Option("--per-tensor", help="One scale per weight tensor \\[default: per output channel].")] = False,
    keep_float: Annotated[list[str] | None, typer.Option("--keep-float", metavar="OP_TYPE|NODE", help="Leave these operator types or nodes in float (repeat).")] = None,
    held_out: Annotated[float, typer.Option("--held-out", help="Share of the samples kept out of calibration to measure the cost (0: none).")] = 0.2,
    force: Annotated[bool, typer.Option("--force", "-f", help="Replace the output if it exists.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Quantize a float ONNX model to 8 bits (QDQ) from calibration data; print what it costs against the
    float model on held-out samples. `edgepack compile` runs the result on integer kernels."""
    with render.steps(quiet=as_json) as step:
        result = edgepack.quantize(model, output, calibration=calibration, preprocess=preprocess,
                                   input_shapes=edgepack.parse_input_shapes(input_shape), method=method,
                                   per_channel=not per_tensor, keep_float=tuple(keep_float or ()),
                                   held_out=held_out, force=force, progress=step)
    if as_json:
        print_json(result.to_dict())
    else:
        render.quantize_summary(result)


app.command()(tune)
app.add_typer(tuning_app, name="tuning")
app.add_typer(device_app, name="device")
app.add_typer(farm_app, name="farm")
app.command()(bench)

package_app = typer.Typer(help="Package a build for deployment.", no_args_is_help=True)
app.add_typer(package_app, name="package")


@package_app.command("c")
def package_c_command(
    build: Annotated[Path, typer.Argument(help="A build directory made by `edgepack compile`.")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Bundle directory \\[default: dist/NAME-c].")] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Replace the output directory if it exists.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Make a C bundle: header, libraries (shared and static), CMake/Makefile, example runner. No Python needed on the device."""
    output = output or Path("dist") / f"{build.resolve().name}-c"
    with render.steps(quiet=as_json) as step:
        bundle = edgepack.package_c(build, output, force=force, progress=step)
    if as_json:
        print_json({"output_dir": str(bundle.output_dir)} | bundle.to_dict())
    else:
        render.bundle_summary(bundle)


package_app.command("android")(package_android_command)


@app.command()
def run(
    bundle: Annotated[Path, typer.Argument(help="A C bundle made by `edgepack package c`.")],
    inputs: Annotated[Path | None, typer.Option("--inputs", "-i", help=".npz of inputs keyed by input name \\[default: seeded random].")] = None,
    emulate: Annotated[bool, typer.Option("--emulate/--native", help="Run under qemu-user (ARM bundles) or natively.")] = True,
    static: Annotated[bool, typer.Option("--static", help="Use the single-file static runner.")] = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Save the outputs to this .npz.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for random inputs.")] = 0,
    as_json: JsonOption = False,
) -> None:
    """Run a C bundle's example runner on inputs and print (or save) its outputs."""
    result = edgepack.run_bundle(bundle, inputs, seed=seed, emulate=emulate, static=static, save_to=output)
    outputs = edgepack.read_bundle(bundle).outputs
    if as_json:
        print_json({"seconds": result.seconds, "command": result.command, "saved_to": str(output) if output else None,
                     "outputs": [{"name": s.name, "shape": list(a.shape), "dtype": str(a.dtype),
                                  "values": a.ravel()[:16].tolist()} for s, a in zip(outputs, result.outputs)]})
    else:
        render.run_outputs(outputs, result, output)


@app.command()
def doctor(as_json: JsonOption = False) -> None:
    """Check which toolchains, emulators and optional pieces are installed."""
    checks = run_checks()
    if as_json:
        print_json([c.to_dict() for c in checks])
    else:
        render.doctor_table(checks)
    if any(c.required and not c.ok for c in checks):
        raise typer.Exit(1)


def main() -> None:
    """Console entry point: EdgepackErrors become one clear paragraph and an exit code, not a traceback."""
    common.ENTRY_ARGV = sys.argv[1:]
    try:
        app()
    except EdgepackError as exc:
        render.error(exc)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        render.error(EdgepackError("Interrupted.", "Outputs are written atomically; nothing half-done was left."))
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("EDGEPACK_DEBUG"):
            raise
        render.error(EdgepackError(
            f"Internal error: {type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}",
            "This is a bug in edgepack; rerun with EDGEPACK_DEBUG=1 for the traceback and report it.",
        ))
        sys.exit(3)


if __name__ == "__main__":
    main()
