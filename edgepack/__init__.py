"""edgepack: compile ONNX and TFLite models for edge devices with Apache TVM, check them on the device,
and package them for deployment.

The Python API is what the ``edgepack`` command line calls; every function returns a dataclass and
raises :class:`EdgepackError` (message + fix) for anything a user can cause::

    import edgepack

    build = edgepack.compile("mobilenetv2.onnx", "rpi4", "build/rpi4")        # CompileResult
    framed = edgepack.compile("mobilenetv2.onnx", "rpi4", "build/cls",         # camera frames in, top-5 out
                              preprocess="input=image:bgr8,size=480x640,mean=123.7/116.3/103.5,std=58.4/57.1/57.4",
                              postprocess="logits=topk:5")
    report = edgepack.validate(build.output_dir, on="emulator")               # ValidationReport
    assert report.passed
    bundle = edgepack.package_c(build.output_dir, "dist/rpi4-c")               # CBundle
    tuned = edgepack.tune("mobilenetv2.onnx", "rpi4", "tuning/rpi4", on="pi4", trials=500)
    timings = edgepack.bench("build/rpi4", on="pi4")                           # [BenchResult]
"""

from edgepack.benchmark import bench
from edgepack.compiling import CompileResult
from edgepack.compiling import compile_model as compile  # noqa: A001  (edgepack.compile, like iree's compile_file)
from edgepack.errors import EdgepackError
from edgepack.frontends import ModelInfo, parse_input_shapes
from edgepack.inspection import KernelListing, ModelInspection, inspect, kernels
from edgepack.manifest import BuildManifest, read_manifest
from edgepack.packaging.android import AndroidPackage, package_android
from edgepack.packaging.c import CBundle, package_c, read_bundle, run_bundle
from edgepack.processing import ImagePreprocess, NmsPostprocess, OutputPostprocess
from edgepack.profiles import Profile, get_profile, list_profiles
from edgepack.quantizing import QuantizeResult, quantize
from edgepack.run.results import BenchResult
from edgepack.tuning import TuningResult, TuningSummary, load_tuning
from edgepack.tuning import tune_model as tune
from edgepack.validation import ValidationReport, validate
from edgepack.versions import __version__

__all__ = [
    "AndroidPackage", "BenchResult", "BuildManifest", "CBundle", "CompileResult", "EdgepackError", "ImagePreprocess",
    "KernelListing", "ModelInfo", "ModelInspection", "NmsPostprocess", "OutputPostprocess", "Profile", "QuantizeResult",
    "TuningResult",
    "TuningSummary", "ValidationReport", "__version__",
    "bench", "compile", "get_profile", "inspect", "kernels", "list_profiles", "load_tuning", "package_android",
    "package_c", "parse_input_shapes", "quantize", "read_bundle", "read_manifest", "run_bundle", "tune", "validate",
]
