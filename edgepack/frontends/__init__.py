"""Model formats: read ONNX and TFLite models into TVM's Relax IR, and run them on their reference runtime."""

from edgepack.frontends.importer import (
    detect_format,
    import_model,
    inspect_model,
    parse_input_shapes,
    require_supported_operators,
    resolve_input_shapes,
)
from edgepack.frontends.reference import run_reference
from edgepack.frontends.types import ImportedModel, ModelInfo

__all__ = ["ImportedModel", "ModelInfo", "detect_format", "import_model", "inspect_model", "parse_input_shapes",
           "require_supported_operators", "resolve_input_shapes", "run_reference"]
