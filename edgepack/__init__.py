"""edgepack: compile ONNX and TFLite models for edge devices with Apache TVM."""

__version__ = "0.1.0"
