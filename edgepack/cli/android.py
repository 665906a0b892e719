"""``edgepack package android``: a thin command over :func:`edgepack.android.package_android`.

Mounted by :mod:`edgepack.cli` with ``package_app.command("android")(package_android_command)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

import edgepack
from edgepack.cli import render
from edgepack.cli.common import JsonOption, print_json


def package_android_command(
    build: Annotated[Path, typer.Argument(help="A build directory made by `edgepack compile --profile android-arm64`.")],
    java_package: Annotated[str, typer.Option("--package", metavar="JAVA.PACKAGE",
                                              help="Java package of the generated model class, e.g. com.example.vision.")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Output directory \\[default: dist/NAME-android].")] = None,
    ndk: Annotated[str | None, typer.Option("--ndk", metavar="PATH",
                                            help="Android NDK root \\[default: $ANDROID_NDK_HOME, or TVM_NDK_CC].")] = None,
    abi: Annotated[list[str] | None, typer.Option("--abi", help="Android ABI to include: arm64-v8a (default), "
                                                                "armeabi-v7a, x86_64 (emulator). Repeat for several.")] = None,
    class_name: Annotated[str | None, typer.Option("--class-name", help="Name of the generated Java class "
                                                                        "\\[default: from the model file name].")] = None,
    android_jar: Annotated[Path | None, typer.Option("--android-jar", help="android.jar to compile the Java API against "
                                                                           "\\[default: $ANDROID_HOME's, else edgepack's stubs].")] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Replace the output directory if it exists.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Make an Android library: edgepack-MODEL.aar (Java API, JNI layer, TVM runtime, model) and a Gradle module. Needs the Android NDK."""
    output = output or Path("dist") / f"{build.resolve().name}-android"
    with render.steps(quiet=as_json) as step:
        result = edgepack.package_android(build, output, java_package=java_package, ndk=ndk, abis=tuple(abi or ("arm64-v8a",)),
                                 class_name=class_name, android_jar=android_jar, force=force, progress=step)
    if as_json:
        print_json({"output_dir": str(result.output_dir)} | result.to_dict())
        return
    _summary(result)


def _summary(result) -> None:
    from rich.table import Table

    sizes = {f.path: f.size for f in result.files}
    table = Table(title=f"Android package of {result.model_name} ({', '.join(result.abis)})", title_justify="left")
    table.add_column("")
    table.add_column("")
    table.add_row("output", str(result.output_dir))
    table.add_row("AAR", f"{result.aar.name}  {sizes.get(result.aar.name, 0) / 1024:.0f} KiB")
    table.add_row("Gradle module", result.module_dir.name + "/")
    table.add_row("Java class", f"{result.java_package}.{result.class_name}")
    for spec in result.inputs:
        table.add_row("input", f"{spec.name} {spec.dtype} {list(spec.shape)}")
    for spec in result.outputs:
        table.add_row("output", f"{spec.name} {spec.dtype} {list(spec.shape)}")
    render.console.print(table)
    render.console.print(f"Use it: [bold]implementation files('{result.aar.name}')[/] and "
                         f"[bold]{result.class_name}.load(context)[/] (see {result.output_dir / 'README.md'}).",
                         highlight=False)
