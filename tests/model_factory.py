"""Small models built in the tests to exercise error paths (bad operators, custom ops)."""

from __future__ import annotations

from pathlib import Path


def _save_opset17(graph, path: Path) -> Path:
    """Save a test graph as a checked opset-17 ONNX model (IR version 8)."""
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="edgepack.tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


class _ConvLayers:
    """Convolutions with random weights and biases, each optionally followed by a ReLU6 (Clip 0..6)."""

    def __init__(self, seed: int) -> None:
        import numpy as np
        from onnx import numpy_helper

        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits = [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]

    def conv(self, x: str, name: str, out: int, inp: int, k: int, group: int = 1, stride: int = 1,
             relu6: bool = True) -> str:
        import numpy as np
        from onnx import helper, numpy_helper

        w = self.rng.normal(0, np.sqrt(2.0 / (inp // group * k * k)), (out, inp // group, k, k)).astype(np.float32)
        self.inits.extend([numpy_helper.from_array(w, name + "_w"),
                           numpy_helper.from_array(self.rng.normal(0, 0.1, out).astype(np.float32), name + "_b")])
        self.nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [name], kernel_shape=[k, k],
                                           pads=[k // 2] * 4, group=group, strides=[stride, stride]))
        if not relu6:
            return name
        self.nodes.append(helper.make_node("Clip", [name, "lo", "hi"], [name + "_relu6"]))
        return name + "_relu6"

def onnx_with_unsupported_ops(path: Path) -> Path:
    """An ONNX graph with a vendor-domain op (x2) that no converter knows."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("FancyNorm", ["a"], ["b"], domain="com.example"),
        helper.make_node("FancyNorm", ["b"], ["y"], domain="com.example"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)])
    onnx.save(model, str(path))
    return path


def tflite_with_custom_op(path: Path, custom_code: str = "MyFancyOp") -> Path:
    """A minimal TFLite flatbuffer: input -> CUSTOM(custom_code) -> output."""
    import flatbuffers
    import tflite

    b = flatbuffers.Builder(1024)
    code_name = b.CreateString(custom_code)
    tflite.OperatorCodeStart(b)
    tflite.OperatorCodeAddDeprecatedBuiltinCode(b, 32)  # BuiltinOperator.CUSTOM
    tflite.OperatorCodeAddBuiltinCode(b, 32)
    tflite.OperatorCodeAddCustomCode(b, code_name)
    tflite.OperatorCodeAddVersion(b, 1)
    op_code = tflite.OperatorCodeEnd(b)

    def tensor(name: str):
        n = b.CreateString(name)
        tflite.TensorStartShapeVector(b, 2)
        b.PrependInt32(4)
        b.PrependInt32(1)
        shape = b.EndVector()
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, shape)
        tflite.TensorAddType(b, 0)  # FLOAT32
        tflite.TensorAddBuffer(b, 0)
        tflite.TensorAddName(b, n)
        return tflite.TensorEnd(b)

    t_in, t_out = tensor("x"), tensor("y")

    def int_vector(start, values):
        start(b, len(values))
        for v in reversed(values):
            b.PrependInt32(v)
        return b.EndVector()

    op_inputs = int_vector(tflite.OperatorStartInputsVector, [0])
    op_outputs = int_vector(tflite.OperatorStartOutputsVector, [1])
    tflite.OperatorStart(b)
    tflite.OperatorAddOpcodeIndex(b, 0)
    tflite.OperatorAddInputs(b, op_inputs)
    tflite.OperatorAddOutputs(b, op_outputs)
    op = tflite.OperatorEnd(b)

    tflite.SubGraphStartTensorsVector(b, 2)
    b.PrependUOffsetTRelative(t_out)
    b.PrependUOffsetTRelative(t_in)
    tensors = b.EndVector()
    sg_inputs = int_vector(tflite.SubGraphStartInputsVector, [0])
    sg_outputs = int_vector(tflite.SubGraphStartOutputsVector, [1])
    tflite.SubGraphStartOperatorsVector(b, 1)
    b.PrependUOffsetTRelative(op)
    operators = b.EndVector()
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, tensors)
    tflite.SubGraphAddInputs(b, sg_inputs)
    tflite.SubGraphAddOutputs(b, sg_outputs)
    tflite.SubGraphAddOperators(b, operators)
    subgraph = tflite.SubGraphEnd(b)

    tflite.BufferStart(b)
    empty_buffer = tflite.BufferEnd(b)
    tflite.ModelStartOperatorCodesVector(b, 1)
    b.PrependUOffsetTRelative(op_code)
    codes = b.EndVector()
    tflite.ModelStartSubgraphsVector(b, 1)
    b.PrependUOffsetTRelative(subgraph)
    subgraphs = b.EndVector()
    tflite.ModelStartBuffersVector(b, 1)
    b.PrependUOffsetTRelative(empty_buffer)
    buffers = b.EndVector()
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddOperatorCodes(b, codes)
    tflite.ModelAddSubgraphs(b, subgraphs)
    tflite.ModelAddBuffers(b, buffers)
    model = tflite.ModelEnd(b)
    b.Finish(model, file_identifier=b"TFL3")
    path.write_bytes(b.Output())
    return path


def onnx_detector(path: Path, *, size: int = 64, classes: int = 3, seed: int = 0) -> Path:
    """A small detector-shaped ONNX model: input [1, 3, size, size] -> ``boxes`` [1, N, 4] (cx, cy, w, h in
    pixels: a grid of anchors every 8 pixels, boxes about 32 pixels wide, so neighbours overlap) and
    ``scores`` [1, N, classes] (sigmoid), N = (size / 8) ** 2. Seeded random convolution weights."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def const(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def conv(x, cin, cout, k, stride, name, relu=True, scale=1.0):
        w = rng.normal(0, scale * np.sqrt(2.0 / (cin * k * k)), (cout, cin, k, k))
        nodes.append(helper.make_node("Conv", [x, const(f"{name}.w", w), const(f"{name}.b", rng.normal(0, 0.1, cout))],
                                      [name], kernel_shape=[k, k], strides=[stride] * 2, pads=[k // 2] * 4))
        if relu:
            nodes.append(helper.make_node("Relu", [name], [f"{name}.relu"]))
            return f"{name}.relu"
        return name

    cells = size // 8
    n = cells * cells
    x = conv("input", 3, 16, 3, 2, "c1")
    x = conv(x, 16, 32, 3, 2, "c2")
    x = conv(x, 32, 32, 3, 2, "c3")
    head = conv(x, 32, 4 + classes, 1, 1, "head", relu=False, scale=0.5)
    inits.append(numpy_helper.from_array(np.array([1, 4 + classes, n], np.int64), "flat_shape"))
    nodes.append(helper.make_node("Reshape", [head, "flat_shape"], ["flat"]))
    nodes.append(helper.make_node("Transpose", ["flat"], ["rows"], perm=[0, 2, 1]))
    nodes.append(helper.make_node("Split", ["rows", "split"], ["t_xy", "t_wh", "t_cls"], axis=2))
    inits.append(numpy_helper.from_array(np.array([2, 2, classes], np.int64), "split"))
    gy, gx = np.mgrid[0:cells, 0:cells]
    anchors = np.stack([gx.ravel(), gy.ravel()], axis=-1)[None].astype(np.float32) * 8 + 4
    nodes.append(helper.make_node("Tanh", ["t_xy"], ["d_xy"]))
    nodes.append(helper.make_node("Mul", ["d_xy", const("offset", 4.0)], ["o_xy"]))
    nodes.append(helper.make_node("Add", ["o_xy", const("anchors", anchors)], ["xy"]))
    nodes.append(helper.make_node("Tanh", ["t_wh"], ["d_wh"]))
    nodes.append(helper.make_node("Mul", ["d_wh", const("spread", 0.5)], ["l_wh"]))
    nodes.append(helper.make_node("Exp", ["l_wh"], ["e_wh"]))
    nodes.append(helper.make_node("Mul", ["e_wh", const("box", 32.0)], ["wh"]))
    nodes.append(helper.make_node("Concat", ["xy", "wh"], ["boxes"], axis=2))
    nodes.append(helper.make_node("Sigmoid", ["t_cls"], ["scores"]))
    graph = helper.make_graph(
        nodes, "detector", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, n, 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, n, classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="edgepack.tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def onnx_passthrough(path: Path, shape: tuple[int, ...], *, name: str = "input", output: str = "output",
                     scale: float = 1.0) -> Path:
    """An ONNX model whose output is its float32 input times ``scale``: the program's output then shows
    exactly what pre-processing made, or gives post-processing known values."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Mul", [name, "scale"], [output])], "passthrough",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, list(shape))],
        [numpy_helper.from_array(np.array(scale, np.float32), "scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="edgepack.tests")
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def onnx_winograd_convs(path: Path, *, seed: int = 0, squeeze: int = 12) -> Path:
    """Two 3x3 convolutions of stride 1 that edgepack runs as Winograd kernels, one F(4x4, 3x3) and one
    F(2x2, 3x3), in shapes whose tiles overhang the output: batch 4 (16 tiles of 4x4 pixels, as many as
    edgepack asks to share each transformed weight of F(4x4)), 7x8 pixels, 32 -> 48 channels with padding
    1 (and a ReLU; 4x4 tiles, 8x8), concatenated after a 1x1 convolution's ``squeeze`` channels as in
    SqueezeNet's fire module (the concatenation fuses into the output transform; 12 channels: a SIMD
    vector of 8 or 16 holds both inputs), then 48 + ``squeeze`` -> 40 without padding (5x6 out: 2x2
    tiles, 6x6). Input ``x`` [4, 32, 7, 8], output ``y`` [4, 40, 5, 6]."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, np.sqrt(2.0 / (32 * 9)), (48, 32, 3, 3)).astype(np.float32)
    we = rng.normal(0, np.sqrt(2.0 / 32), (squeeze, 32, 1, 1)).astype(np.float32)
    w2 = rng.normal(0, np.sqrt(2.0 / ((48 + squeeze) * 9)), (40, 48 + squeeze, 3, 3)).astype(np.float32)
    bias = rng.normal(0, 0.1, 40).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["x", "we"], ["e"], kernel_shape=[1, 1]),
             helper.make_node("Concat", ["e", "r"], ["c"], axis=1),
             helper.make_node("Conv", ["c", "w2", "b2"], ["y"], kernel_shape=[3, 3])]
    graph = helper.make_graph(
        nodes, "winograd", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32, 7, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 40, 5, 6])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(we, "we"), numpy_helper.from_array(w2, "w2"),
         numpy_helper.from_array(bias, "b2")])
    return _save_opset17(graph, path)


def onnx_fire_module(path: Path, *, seed: int = 0) -> Path:
    """SqueezeNet's fire module at 27x27 pixels: a 1x1 squeeze (32 -> 16 channels) to a 1x1 and a 3x3
    expansion (16 -> 64 each, ReLU), concatenated, then a 1x1 convolution (128 -> 8). The 3x3 expansion
    runs as Winograd F(4x4, 3x3), its tiles overhang the 27 pixels, and the concatenation fuses into its
    output transform. Input ``x`` [1, 32, 27, 27], output ``y`` [1, 8, 27, 27]."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def weights(name: str, out: int, inp: int, k: int):
        return numpy_helper.from_array(rng.normal(0, np.sqrt(2.0 / (inp * k * k)), (out, inp, k, k))
                                       .astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "ws"], ["s"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["s"], ["sr"]),
             helper.make_node("Conv", ["sr", "w1"], ["e1"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["e1"], ["r1"]),
             helper.make_node("Conv", ["sr", "w3"], ["e3"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["e3"], ["r3"]),
             helper.make_node("Concat", ["r1", "r3"], ["c"], axis=1),
             helper.make_node("Conv", ["c", "wy"], ["y"], kernel_shape=[1, 1])]
    graph = helper.make_graph(
        nodes, "fire", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 27, 27])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 27, 27])],
        [weights("ws", 16, 32, 1), weights("w1", 64, 16, 1), weights("w3", 64, 16, 3), weights("wy", 8, 128, 1)])
    return _save_opset17(graph, path)


def onnx_odd_channels(path: Path, *, seed: int = 0) -> Path:
    """Convolutions whose output channels no SIMD width divides, which edgepack computes padded to whole
    vectors and crops: 16 -> 21 channels (1x1, ReLU), 21 -> 21 (3x3, padding 1, a residual add of the
    first one's output and a ReLU after the crop), 21 -> 1001 (1x1, a classifier's count; it ends in the
    NCHW transpose of the model's output). Input ``x`` [1, 16, 9, 10]; outputs ``y`` [1, 1001, 9, 10] and
    ``features`` [1, 21, 9, 10]."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def weights(name: str, out: int, inp: int, k: int):
        return [numpy_helper.from_array(rng.normal(0, np.sqrt(2.0 / (inp * k * k)), (out, inp, k, k))
                                        .astype(np.float32), name),
                numpy_helper.from_array(rng.normal(0, 0.1, out).astype(np.float32), name + "_b")]

    inits = weights("w1", 21, 16, 1) + weights("w2", 21, 21, 3) + weights("w3", 1001, 21, 1)
    nodes = [helper.make_node("Conv", ["x", "w1", "w1_b"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "w2_b"], ["b"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["b", "r"], ["s"]),
             helper.make_node("Relu", ["s"], ["features"]),
             helper.make_node("Conv", ["features", "w3", "w3_b"], ["y"], kernel_shape=[1, 1])]
    graph = helper.make_graph(
        nodes, "odd_channels", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 9, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1001, 9, 10]),
         helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 21, 9, 10])], inits)
    return _save_opset17(graph, path)


def onnx_stems(path: Path, *, seed: int = 0) -> Path:
    """First convolutions of image networks, on 3 colour channels (which make no SIMD vector), each
    with padding and stride 2 over an odd-sized image: 3x3 -> 16 channels with a ReLU6 (MobileNetV2),
    5x5 -> 8 (BlazeFace) and 7x7 -> 12 (ResNet). Input ``x`` [1, 3, 37, 30]; outputs ``y3`` [1, 16, 19, 15],
    ``y5`` [1, 8, 19, 15] and ``y7`` [1, 12, 19, 15]."""
    from onnx import TensorProto, helper

    layers = _ConvLayers(seed)
    stems = [(3, 16, True), (5, 8, True), (7, 12, False)]  # window, output channels, ReLU6
    for k, out, relu6 in stems:
        x = layers.conv("x", f"stem{k}", out, 3, k, stride=2, relu6=relu6)
        layers.nodes.append(helper.make_node("Identity", [x], [f"y{k}"]))
    graph = helper.make_graph(
        layers.nodes, "stems", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 37, 30])],
        [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, [1, out, 19, 15]) for k, out, _ in stems],
        layers.inits)
    return _save_opset17(graph, path)


def onnx_strided_convs(path: Path, *, seed: int = 0) -> Path:
    """ResNet's downsampling: 3x3 convolutions of stride 2 with padding over many channels, so that several
    tiles of output channels read each tile of pixels: 32 -> 64 with a ReLU6 over an odd-sized input, then
    64 -> 128, each input large enough for a parallel padding pass. Input ``x`` [1, 32, 29, 27]; output
    ``y`` [1, 128, 8, 7]."""
    from onnx import TensorProto, helper

    layers = _ConvLayers(seed)
    x = layers.conv("x", "down1", 64, 32, 3, stride=2)
    x = layers.conv(x, "down2", 128, 64, 3, stride=2, relu6=False)
    layers.nodes.append(helper.make_node("Identity", [x], ["y"]))
    graph = helper.make_graph(
        layers.nodes, "strided_convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 29, 27])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 128, 8, 7])], layers.inits)
    return _save_opset17(graph, path)


def onnx_streamed_depthwise(path: Path, *, seed: int = 0) -> Path:
    """Depthwise convolutions whose outputs are larger than a cache holds (over 1 MiB), which edgepack
    tiles to write whole pixels: 32 channels 3x3 at 96x96, a 1x1 convolution 32 -> 144 and 144 channels
    3x3 of stride 2 (48x48x144), each with a ReLU6. Input ``x`` [1, 32, 96, 96]; output ``y`` [1, 144, 48, 48]."""
    from onnx import TensorProto, helper

    layers = _ConvLayers(seed)
    x = layers.conv("x", "dw32", 32, 32, 3, group=32)
    x = layers.conv(x, "expand", 144, 32, 1)
    x = layers.conv(x, "dw144", 144, 144, 3, group=144, stride=2)
    layers.nodes.append(helper.make_node("Identity", [x], ["y"]))
    graph = helper.make_graph(
        layers.nodes, "streamed_depthwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 96, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 144, 48, 48])], layers.inits)
    return _save_opset17(graph, path)


def onnx_layer_zoo(path: Path, *, size: int = 20, seed: int = 0) -> Path:
    """One ONNX model with a layer of every kind edgepack's CPU schedule rules take, shapes chosen to hit
    their corner cases (channel counts that are not multiples of the SIMD width, groups of 6 channels,
    odd spatial sizes): regular 3x3 convolution with padding, depthwise stride-2, grouped 1x1, a 3x3
    convolution with enough channels to run as Winograd kernels, pointwise with a residual add, max and
    average pooling, global average pooling, a dense layer with softmax, layer normalisation, a
    batched matmul of two activations, and transposed convolutions (stride 2 with output padding, then
    depthwise stride 2; stride 4 dilated 2, grouped; stride 4, a 5x5 kernel, uneven padding and output
    padding past it). Outputs: ``logits`` [1, 10] (softmax), ``features`` [1, 24, H, W], ``attention``
    [1, 4, 6, 6], ``normed`` [1, 24, H*W], ``upsampled`` [1, 12, 4H, 4W], ``dilated`` and ``strided4``
    [1, 8 / 6, 4H + 1, 4W + 1] (H = W = size / 2)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def const(name, array, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(array, dtype), name))
        return name

    def conv(x, cin, cout, k, stride, name, group=1, relu=True):
        w = rng.normal(0, np.sqrt(2.0 / (cin // group * k * k)), (cout, cin // group, k, k))
        nodes.append(helper.make_node("Conv", [x, const(f"{name}.w", w), const(f"{name}.b", rng.normal(0, 0.1, cout))],
                                      [name], kernel_shape=[k, k], strides=[stride] * 2, pads=[k // 2] * 4,
                                      group=group))
        if relu:
            nodes.append(helper.make_node("Relu", [name], [f"{name}.relu"]))
            return f"{name}.relu"
        return name

    x = conv("input", 3, 12, 3, 1, "c1")                                  # regular 3x3, 12 channels
    x = conv(x, 12, 12, 3, 2, "dw", group=12)                             # depthwise, stride 2
    x = conv(x, 12, 24, 1, 1, "grouped", group=2)                         # grouped 1x1, 6 per group
    x = conv(x, 24, 48, 3, 1, "winograd")                                 # 3x3 as Winograd F(2x2, 3x3)
    x = conv(x, 48, 24, 1, 1, "squeeze")
    y = conv(x, 24, 24, 1, 1, "pw", relu=False)                           # pointwise + residual
    nodes.append(helper.make_node("Add", [x, y], ["res"]))
    nodes.append(helper.make_node("MaxPool", ["res"], ["maxpool"], kernel_shape=[3, 3], strides=[1, 1],
                                  pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("AveragePool", ["maxpool"], ["features"], kernel_shape=[3, 3],
                                  strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=0))
    nodes.append(helper.make_node("GlobalAveragePool", ["features"], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"]))
    nodes.append(helper.make_node("Gemm", ["flat", const("fc.w", rng.normal(0, 0.2, (10, 24))),
                                           const("fc.b", rng.normal(0, 0.1, 10))], ["fc"], transB=1))
    nodes.append(helper.make_node("Softmax", ["fc"], ["logits"], axis=1))
    half = size // 2
    nodes.append(helper.make_node("Reshape", ["features", const("rows", [1, 24, half * half], np.int64)], ["seq"]))
    nodes.append(helper.make_node("LayerNormalization", ["seq", const("ln.g", rng.normal(1, 0.1, half * half)),
                                                         const("ln.b", rng.normal(0, 0.1, half * half))],
                                  ["normed"], axis=-1))
    nodes.append(helper.make_node("Reshape", ["normed", const("heads", [1, 4, 6, half * half], np.int64)], ["q"]))
    nodes.append(helper.make_node("Transpose", ["q"], ["k"], perm=[0, 1, 3, 2]))
    nodes.append(helper.make_node("MatMul", ["q", "k"], ["attention"]))

    def conv_transpose(x, cin, cout, k, name, group=1, **attrs):
        w = rng.normal(0, np.sqrt(2.0 / (cin // group * k * k)), (cin, cout // group, k, k))
        nodes.append(helper.make_node("ConvTranspose", [x, const(f"{name}.w", w),
                                                        const(f"{name}.b", rng.normal(0, 0.1, cout))],
                                      [name], kernel_shape=[k, k], group=group, **attrs))
        return name

    up = conv_transpose("res", 24, 12, 3, "up2", strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])
    nodes.append(helper.make_node("Relu", [up], ["up2.relu"]))
    conv_transpose("up2.relu", 12, 12, 2, "upsampled", group=12, strides=[2, 2])  # depthwise
    conv_transpose("res", 24, 8, 3, "dilated", group=2, strides=[4, 4], dilations=[2, 2], pads=[1, 1, 1, 1],
                   output_padding=[2, 2])
    conv_transpose("res", 24, 6, 5, "strided4", strides=[4, 4], pads=[1, 2, 2, 1], output_padding=[3, 3])
    graph = helper.make_graph(
        nodes, "layer_zoo", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10]),
         helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 24, half, half]),
         helper.make_tensor_value_info("attention", TensorProto.FLOAT, [1, 4, 6, 6]),
         helper.make_tensor_value_info("normed", TensorProto.FLOAT, [1, 24, half * half]),
         helper.make_tensor_value_info("upsampled", TensorProto.FLOAT, [1, 12, 4 * half, 4 * half]),
         helper.make_tensor_value_info("dilated", TensorProto.FLOAT, [1, 8, 4 * half + 1, 4 * half + 1]),
         helper.make_tensor_value_info("strided4", TensorProto.FLOAT, [1, 6, 4 * half + 1, 4 * half + 1])], inits)
    return _save_opset17(graph, path)

def onnx_with_scalar_input(path: Path, length: int = 8) -> Path:
    """A float input ``x`` [1, length] and a scalar (0-d) int64 sample rate ``sr``, used the way
    voice-activity models use theirs: in arithmetic (``x * sr / 1000``) and as the condition of an
    ``If`` (``sr == 16000``: add 1, else subtract 1). Outputs ``y`` [1, length] float32 and the
    scalar int64 ``sr_next`` (``sr + 1``), so a 0-d array crosses the boundary both ways."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def const(name: str, value) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))

    def branch(op: str, tag: str):
        one = const(f"one_{tag}", np.float32(1.0))
        return helper.make_graph([one, helper.make_node(op, ["scaled", f"one_{tag}"], [f"y_{tag}"])], tag, [],
                                 [helper.make_tensor_value_info(f"y_{tag}", TensorProto.FLOAT, [1, length])])

    then_graph, else_graph = branch("Add", "then"), branch("Sub", "else")
    nodes = [
        helper.make_node("Cast", ["sr"], ["sr_f"], to=TensorProto.FLOAT),
        const("thousand", np.float32(1000.0)),
        helper.make_node("Div", ["sr_f", "thousand"], ["khz"]),
        helper.make_node("Mul", ["x", "khz"], ["scaled"]),
        const("sixteen_k", np.int64(16000)),
        helper.make_node("Equal", ["sr", "sixteen_k"], ["is_16k"]),
        helper.make_node("If", ["is_16k"], ["y"], then_branch=then_graph, else_branch=else_graph),
        const("one_i", np.int64(1)),
        helper.make_node("Add", ["sr", "one_i"], ["sr_next"]),
    ]
    graph = helper.make_graph(
        nodes, "scalar_sr",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, length]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, length]),
         helper.make_tensor_value_info("sr_next", TensorProto.INT64, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def onnx_with_data_dependent_outputs(path: Path) -> Path:
    """Operators TVM runs with functions of its Python package (NonZero, Unique: ``relax.run.*``) or of
    its optional runtime part (TopK: ``tvm.contrib.sort.topk``), two of them with outputs whose shape
    depends on the data: ``x`` [3, 4] float32 -> ``nonzero`` int64 [2, n] (positions of x > 0),
    ``top_values``/``top_indices`` [3, 2] (TopK, k = 2), ``unique``/``unique_counts`` [?] (Unique of
    round(x * 2), sorted)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.float32(0.0), "zero")),
        helper.make_node("Greater", ["x", "zero"], ["positive"]),
        helper.make_node("NonZero", ["positive"], ["nonzero"]),
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([2], np.int64), "k")),
        helper.make_node("TopK", ["x", "k"], ["top_values", "top_indices"], axis=1),
        helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.float32(2.0), "two")),
        helper.make_node("Mul", ["x", "two"], ["doubled"]),
        helper.make_node("Round", ["doubled"], ["rounded"]),
        helper.make_node("Unique", ["rounded"], ["unique", "", "", "unique_counts"], sorted=1),
    ]
    graph = helper.make_graph(
        nodes, "data_dependent", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("nonzero", TensorProto.INT64, [2, "n"]),
         helper.make_tensor_value_info("top_values", TensorProto.FLOAT, [3, 2]),
         helper.make_tensor_value_info("top_indices", TensorProto.INT64, [3, 2]),
         helper.make_tensor_value_info("unique", TensorProto.FLOAT, ["u"]),
         helper.make_tensor_value_info("unique_counts", TensorProto.INT64, ["u"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def onnx_depthwise_pointwise(path: Path, *, seed: int = 0) -> Path:
    """Depthwise convolutions followed by 1x1 convolutions, the pairs edgepack fuses into one kernel, in
    the forms real models have them: MobileNetV2's (1x1 expand, depthwise 3x3 and ReLU6, 1x1 project with
    a residual add; and with a depthwise stride of 2), BlazeFace's (depthwise of stride 2 without
    activation, 1x1 to more channels, the input max-pooled and padded with zero channels as the residual,
    ReLU; 36 output channels, which edgepack pads to whole SIMD vectors and crops), and a depthwise
    convolution too wide for the fused tile (640 channels at 7x7: kept as two kernels). Input ``x``
    [1, 16, 28, 28]; outputs ``y`` [1, 36, 7, 7] and ``z`` [1, 16, 7, 7]."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    layers = _ConvLayers(seed)
    conv, nodes = layers.conv, layers.nodes
    # MobileNetV2: expand, depthwise, project + residual; then a block with a stride-2 depthwise
    h = conv("x", "expand1", 48, 16, 1)
    h = conv(h, "dw1", 48, 48, 3, group=48)
    h = conv(h, "project1", 16, 48, 1, relu6=False)
    nodes.append(helper.make_node("Add", ["x", h], ["block1"]))
    h = conv("block1", "expand2", 48, 16, 1)
    h = conv(h, "dw2", 48, 48, 3, group=48, stride=2)
    b2 = conv(h, "project2", 24, 48, 1, relu6=False)
    # BlazeFace: depthwise of stride 2 (no activation), 1x1 to more channels; the residual max-pooled and
    # padded with zero channels
    h = conv(b2, "dw3", 24, 24, 3, group=24, stride=2, relu6=False)
    h = conv(h, "project3", 36, 24, 1, relu6=False)
    layers.inits.append(numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 12, 0, 0], np.int64), "channel_pads"))
    nodes += [helper.make_node("MaxPool", [b2], ["pooled"], kernel_shape=[2, 2], strides=[2, 2]),
              helper.make_node("Pad", ["pooled", "channel_pads"], ["padded"]),
              helper.make_node("Add", [h, "padded"], ["sum3"]),
              helper.make_node("Relu", ["sum3"], ["y"])]
    # too wide to fuse: 640 channels a pixel
    h = conv("y", "expand4", 640, 36, 1)
    h = conv(h, "dw4", 640, 640, 3, group=640)
    conv(h, "z", 16, 640, 1, relu6=False)
    graph = helper.make_graph(
        nodes, "depthwise_pointwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 36, 7, 7]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 16, 7, 7])], layers.inits)
    return _save_opset17(graph, path)


def onnx_hardswish_convs(path: Path, *, seed: int = 0) -> Path:
    """MobileNetV3's activation after convolutions, as PaddlePaddle exports it (PP-OCR): ``x * clip(x + 3,
    0, 6) / 6``, which reads the convolution's output twice; after a 1x1 convolution to 88 channels (which
    edgepack computes as 96 and crops) and after a depthwise one. Input ``x`` [1, 16, 6, 40]; output ``y``
    [1, 88, 6, 40]."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    layers = _ConvLayers(seed)
    layers.inits += [numpy_helper.from_array(np.float32(3), "three"), numpy_helper.from_array(np.float32(6), "six")]

    def hardswish(x: str) -> str:
        layers.nodes.extend([helper.make_node("Add", [x, "three"], [x + "_p3"]),
                             helper.make_node("Clip", [x + "_p3", "lo", "hi"], [x + "_c"]),
                             helper.make_node("Mul", [x, x + "_c"], [x + "_m"]),
                             helper.make_node("Div", [x + "_m", "six"], [x + "_hs"])])
        return x + "_hs"

    h = hardswish(layers.conv("x", "pw", 88, 16, 1, relu6=False))
    h = hardswish(layers.conv(h, "dw", 88, 88, 3, group=88, relu6=False))
    layers.nodes.append(helper.make_node("Identity", [h], ["y"]))
    graph = helper.make_graph(
        layers.nodes, "hardswish_convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 6, 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 88, 6, 40])], layers.inits)
    return _save_opset17(graph, path)


def onnx_silu_tanh(path: Path, *, seed: int = 0) -> Path:
    """YOLOv8's activation and an LSTM cell's: ``x * Sigmoid(x)`` after a 3x3 convolution of real-valued
    weights (3 -> 16 channels, stride 2, as YOLOv8's first layer), then ``Tanh`` of a 1x1 convolution, scaled by
    4 so that both see inputs far into their tails. Input ``x`` [1, 3, 32, 40]; outputs ``silu`` [1, 16, 16, 20]
    and ``t`` [1, 8, 16, 20]."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.normal(0, 1.0, (16, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.5, 16).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.normal(0, 0.5, (8, 16, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.float32(4.0), "four")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
             helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["silu"]),
             helper.make_node("Conv", ["silu", "w2"], ["p"], kernel_shape=[1, 1]),
             helper.make_node("Mul", ["p", "four"], ["p4"]),
             helper.make_node("Tanh", ["p4"], ["t"])]
    graph = helper.make_graph(
        nodes, "silu_tanh", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 40])],
        [helper.make_tensor_value_info("silu", TensorProto.FLOAT, [1, 16, 16, 20]),
         helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 8, 16, 20])], inits)
    return _save_opset17(graph, path)


def onnx_squeeze_excitation(path: Path, *, seed: int = 0) -> Path:
    """MobileNetV3's squeeze-and-excitation, three ways: after a depthwise convolution, the block's input
    times a gate of one value per channel (global average pool, 1x1 convolutions to a quarter of the
    channels and back, a hard sigmoid), projected by a 1x1 convolution, as in PP-OCR's classifier (72
    channels, 12x20); the same gated by a sigmoid (computed per channel: edgepack keeps it apart from the
    projection); and a wide one (960 channels at 6x10, more than a tile's stack buffer holds). Input
    ``x`` [1, 16, 12, 20]; outputs ``y`` [1, 24, 12, 20], ``s`` [1, 24, 12, 20], ``w`` [1, 16, 6, 10]."""
    from onnx import TensorProto, helper

    layers = _ConvLayers(seed)
    conv, nodes = layers.conv, layers.nodes

    def squeeze_excite(x: str, name: str, channels: int, gate: str) -> str:
        nodes.append(helper.make_node("GlobalAveragePool", [x], [name + "_pool"]))
        h = conv(name + "_pool", name + "_down", channels // 4, channels, 1)
        h = conv(h, name + "_up", channels, channels // 4, 1, relu6=False)
        if gate == "hard":
            nodes.append(helper.make_node("HardSigmoid", [h], [name + "_gate"], alpha=0.2, beta=0.5))
        else:
            nodes.append(helper.make_node("Sigmoid", [h], [name + "_gate"]))
        nodes.append(helper.make_node("Mul", [x, name + "_gate"], [name + "_scaled"]))
        return name + "_scaled"

    h = conv("x", "expand1", 72, 16, 1)
    h = conv(h, "dw1", 72, 72, 3, group=72)
    conv(squeeze_excite(h, "se1", 72, "hard"), "y", 24, 72, 1, relu6=False)
    h = conv("x", "expand2", 72, 16, 1)
    h = conv(h, "dw2", 72, 72, 3, group=72)
    conv(squeeze_excite(h, "se2", 72, "sigmoid"), "s", 24, 72, 1, relu6=False)
    h = conv("x", "expand3", 960, 16, 1, stride=2)  # 6x10
    conv(squeeze_excite(h, "se3", 960, "hard"), "w", 16, 960, 1, relu6=False)
    graph = helper.make_graph(
        nodes, "squeeze_excitation", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, 12, 20]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 24, 12, 20]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [1, 16, 6, 10])], layers.inits)
    return _save_opset17(graph, path)


def onnx_large_weights(path: Path, *, seed: int = 0) -> Path:
    """Two fully connected layers with 12 MB of weights (512 -> 2048 -> 1024, a ReLU between) and little
    computation: a model whose loading adds whole huge pages of weights to the process."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.normal(0, 0.05, shape).astype(np.float32), name)
             for name, shape in [("w1", (512, 2048)), ("b1", (2048,)), ("w2", (2048, 1024)), ("b2", (1024,))]]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "large_weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024])], inits)
    return _save_opset17(graph, path)


def onnx_sparse_convs(path: Path, *, seed: int = 0) -> Path:
    """Convolutions whose weights are mostly zeros (pruned, as MediaPipe's sparse face detector's): a 3x3
    convolution 16 -> 64 with 80% zeros, a 3x3 one 64 -> 64 with 85%, a 1x1 one 64 -> 96 with 75%, and a
    dense 1x1 one to 8 channels. Input ``x`` [1, 16, 20, 20], output ``y`` [1, 8, 20, 20]."""
    import numpy as np
    from onnx import TensorProto, helper

    layers = _ConvLayers(seed)
    h = layers.conv("x", "c1", 64, 16, 3)
    h = layers.conv(h, "c2", 64, 64, 3)
    h = layers.conv(h, "c3", 96, 64, 1)
    layers.conv(h, "y", 8, 96, 1, relu6=False)
    rng = np.random.default_rng(seed + 1)
    for init in layers.inits:
        zeros = {"c1_w": 0.8, "c2_w": 0.85, "c3_w": 0.75}.get(init.name)
        if zeros is not None:
            w = np.frombuffer(init.raw_data, np.float32).copy()
            w[rng.random(w.size) < zeros] = 0
            init.raw_data = (w * np.sqrt(1 / (1 - zeros))).astype(np.float32).tobytes()  # the same variance
    graph = helper.make_graph(
        layers.nodes, "sparse_convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 20, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 20, 20])], layers.inits)
    return _save_opset17(graph, path)


def onnx_conv_lstm_classifier(path: Path, *, seed: int = 0, classes: int = 1001) -> Path:
    """A CRNN in small (PP-OCRv2's recogniser's form): convolutions over a 8x40 text line, its columns as a
    sequence through a bidirectional LSTM (imported as steps stacked at the end), a classifier of an odd
    number of classes (no SIMD width divides 1001) and a softmax over them, each row 1001 long."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    layers = _ConvLayers(seed)
    rng, hidden, channels = layers.rng, 24, 16
    x = layers.conv("x", "stem", channels, 3, 3)
    x = layers.conv(x, "dw", channels, channels, 3, group=channels)
    x = layers.conv(x, "pw", channels, channels, 1)  # [1, 16, 8, 40]
    features = channels * 8
    lstm = [rng.normal(0, 0.3, shape).astype(np.float32)
            for shape in ((2, 4 * hidden, features), (2, 4 * hidden, hidden), (2, 8 * hidden))]
    head = [rng.normal(0, 0.5, (2 * hidden, classes)).astype(np.float32), rng.normal(0, 0.5, classes).astype(np.float32)]
    layers.inits += [numpy_helper.from_array(a, n) for a, n in zip([*lstm, *head], ["W", "R", "B", "fc_w", "fc_b"])]
    layers.inits.append(numpy_helper.from_array(np.array([40, 1, features], np.int64), "seq_shape"))
    layers.inits.append(numpy_helper.from_array(np.array([1, 40, 2 * hidden], np.int64), "out_shape"))
    layers.nodes += [
        helper.make_node("Transpose", [x], ["cols"], perm=[3, 0, 1, 2]),  # [40, 1, 16, 8]: a column a step
        helper.make_node("Reshape", ["cols", "seq_shape"], ["seq"]),
        helper.make_node("LSTM", ["seq", "W", "R", "B"], ["states"], hidden_size=hidden, direction="bidirectional"),
        helper.make_node("Transpose", ["states"], ["steps"], perm=[1, 0, 2, 3]),  # [1, 40, 2, 24]
        helper.make_node("Reshape", ["steps", "out_shape"], ["both"]),
        helper.make_node("MatMul", ["both", "fc_w"], ["logits0"]),
        helper.make_node("Add", ["logits0", "fc_b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    graph = helper.make_graph(layers.nodes, "crnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 40])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 40, classes])],
                              layers.inits)
    return _save_opset17(graph, path)


def onnx_qdq_convs(path: Path, *, dtype: str = "int8", seed: int = 0, weights: tuple[int, ...] | None = None,
                   depth: int = 4) -> Path:
    """An 8-bit QDQ network (``dtype`` activations in and out, per-channel int8 weights, int32 biases) whose
    convolutions take every form the dot-product kernels handle: 5 input channels (not a multiple of 4),
    output channels that make no whole vector (24, 20),
    asymmetric padding, stride 2, dilation 2, a 1x1; activations with a zero point away from 0.
    ``weights``: the values the weights are drawn from (default: all of int8 but -128), their scales
    made small enough that sums of the largest products stay in range. ``depth``: the first so many of the
    4 convolutions."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    elem = TensorProto.INT8 if dtype == "int8" else TensorProto.UINT8
    zero = -9 if dtype == "int8" else 121
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(value, name))
        return name

    def dequantize(name, x, scale, z):
        nodes.append(helper.make_node("DequantizeLinear", [x, const(name + "_s", np.float32(scale)),
                                                            const(name + "_z", np.array(z, dtype))], [name]))
        return name

    def quantize(name, x, scale, z):
        nodes.append(helper.make_node("QuantizeLinear", [x, const(name + "_s", np.float32(scale)),
                                                          const(name + "_z", np.array(z, dtype))], [name]))
        return name

    x, x_scale = "input", 0.05
    channels = 5
    layers = [(32, 3, [1, 0, 2, 1], 1, 1), (24, 3, [1, 1, 1, 1], 2, 1), (48, 3, [2, 2, 2, 2], 1, 2),
              (20, 1, [0] * 4, 1, 1)][:depth]
    size = [15, 13]
    for i, (out, k, pads, stride, dilation) in enumerate(layers):
        if weights is None:
            w = rng.integers(-127, 128, (out, channels, k, k)).astype(np.int8)
            w_scale = (rng.uniform(0.5, 1.5, out) * 0.01).astype(np.float32)
        else:
            w = rng.choice(np.array(weights, np.int8), (out, channels, k, k))
            w_scale = (rng.uniform(0.5, 1.5, out) * 1e-4).astype(np.float32)
        nodes.append(helper.make_node("DequantizeLinear", [const(f"w{i}", w), const(f"w{i}_s", w_scale),
                                                            const(f"w{i}_z", np.zeros(out, np.int8))], [f"wf{i}"], axis=0))
        bias = rng.integers(-2000, 2000, out).astype(np.int32)
        nodes.append(helper.make_node("DequantizeLinear", [const(f"b{i}", bias), const(f"b{i}_s", w_scale * np.float32(x_scale)),
                                                            const(f"b{i}_z", np.zeros(out, np.int32))], [f"bf{i}"], axis=0))
        xf = dequantize(f"xf{i}", x, x_scale, zero)
        nodes.append(helper.make_node("Conv", [xf, f"wf{i}", f"bf{i}"], [f"y{i}"], kernel_shape=[k, k], pads=pads,
                                      strides=[stride, stride], dilations=[dilation, dilation]))
        x_scale = 0.05 * (i + 2)
        x = quantize(f"q{i}" if i < len(layers) - 1 else "output", f"y{i}", x_scale, zero)
        channels = out
        size = [(n + pads[a] + pads[a + 2] - dilation * (k - 1) - 1) // stride + 1 for a, n in enumerate(size)]
    graph = helper.make_graph(nodes, "qdq_convs", [helper.make_tensor_value_info("input", elem, [1, 5, 15, 13])],
                              [helper.make_tensor_value_info("output", elem, [1, channels, *size])], inits)
    return _save_opset17(graph, path)


def onnx_8_bit_io(path: Path) -> Path:
    """An ONNX model with 8-bit inputs and outputs (what a Vulkan build reads and writes as 32-bit words of
    the caller's buffer): ``pixels`` uint8 [1, 3, 5, 4] (60 bytes) and ``codes`` int8 [2, 7, 2] (28 bytes)
    in; out ``brighter`` (uint8, the pixels requantized with a gain, saturating), ``negated`` (int8, the
    codes' real values negated: negative codes become positive and back), ``sums`` (int8 [1, 5]: 5
    bytes, not a whole number of words; per row of pixels) and ``codes`` itself (given back as it is)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.array(v, dtype), name) for name, v, dtype in (
        ("p_s", 0.1, np.float32), ("p_z", 7, np.uint8), ("gain", 1.7, np.float32), ("b_s", 0.1, np.float32),
        ("b_z", 3, np.uint8), ("c_s", 0.05, np.float32), ("c_z", -3, np.int8), ("n_z", 2, np.int8),
        ("s_s", 2.0, np.float32), ("s_z", -20, np.int8), ("axes", [1, 3], np.int64))]
    nodes = [
        helper.make_node("DequantizeLinear", ["pixels", "p_s", "p_z"], ["pf"]),
        helper.make_node("Mul", ["pf", "gain"], ["pg"]),
        helper.make_node("QuantizeLinear", ["pg", "b_s", "b_z"], ["brighter"]),
        helper.make_node("DequantizeLinear", ["codes", "c_s", "c_z"], ["cf"]),
        helper.make_node("Neg", ["cf"], ["cn"]),
        helper.make_node("QuantizeLinear", ["cn", "c_s", "n_z"], ["negated"]),
        helper.make_node("ReduceSum", ["pf", "axes"], ["ps"], keepdims=0),
        helper.make_node("QuantizeLinear", ["ps", "s_s", "s_z"], ["sums"]),
    ]
    u8, i8 = TensorProto.UINT8, TensorProto.INT8
    graph = helper.make_graph(
        nodes, "eight_bit_io",
        [helper.make_tensor_value_info("pixels", u8, [1, 3, 5, 4]), helper.make_tensor_value_info("codes", i8, [2, 7, 2])],
        [helper.make_tensor_value_info("brighter", u8, [1, 3, 5, 4]), helper.make_tensor_value_info("negated", i8, [2, 7, 2]),
         helper.make_tensor_value_info("sums", i8, [1, 5]), helper.make_tensor_value_info("codes", i8, [2, 7, 2])],
        inits)
    return _save_opset17(graph, path)


def onnx_bool_masks(path: Path) -> Path:
    """An ONNX model with internal bool masks (what a Vulkan build holds in int32): ``x`` float32 [2, 3, 8] in;
    ``keep = Greater(x, 0.1) And Not(Less(x, 0.6))`` chooses per element between ``2x`` and ``-x`` (Where), and
    the count of kept elements per row (Cast of the mask, ReduceSum) is added: the mask has two readers, so
    it crosses from one kernel to others."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.array(v, dtype), name) for name, v, dtype in (
        ("low", 0.1, np.float32), ("high", 0.6, np.float32), ("two", 2.0, np.float32), ("axes", [2], np.int64))]
    nodes = [
        helper.make_node("Greater", ["x", "low"], ["above"]),
        helper.make_node("Less", ["x", "high"], ["below"]),
        helper.make_node("Not", ["below"], ["not_below"]),
        helper.make_node("And", ["above", "not_below"], ["keep"]),
        helper.make_node("Mul", ["x", "two"], ["doubled"]),
        helper.make_node("Neg", ["x"], ["negated"]),
        helper.make_node("Where", ["keep", "doubled", "negated"], ["chosen"]),
        helper.make_node("Cast", ["keep"], ["kept"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["kept", "axes"], ["count"], keepdims=1),
        helper.make_node("Add", ["chosen", "count"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "bool_masks", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 8])], inits)
    return _save_opset17(graph, path)


def onnx_bool_io(path: Path, *, valid: tuple[int, ...] = (2, 6)) -> Path:
    """An ONNX model with a bool input and bool outputs (one byte per element for the caller, 32-bit words
    for a Vulkan build): ``x`` float32 [2, 6] and ``valid`` bool (``valid``: [2, 6] is 12 bytes, whole words;
    [1, 6], broadcast over rows, is not) in; out ``kept`` (bool [2, 6]: ``x > 0.3 and valid``), ``flipped``
    (bool [2, 6]: ``x > 0.5 xor valid``), ``first`` (bool [1, 5], 5 bytes: ``x > 0.5`` in the first row's
    first 5 columns) and ``picked`` (float32: ``x`` where valid, else 0)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.array(v, dtype), name) for name, v, dtype in (
        ("zero", 0.0, np.float32), ("third", 0.3, np.float32), ("half", 0.5, np.float32), ("starts", [0, 0], np.int64),
        ("ends", [1, 5], np.int64))]
    nodes = [
        helper.make_node("Greater", ["x", "third"], ["above"]),
        helper.make_node("And", ["above", "valid"], ["kept"]),
        helper.make_node("Greater", ["x", "half"], ["big"]),
        helper.make_node("Xor", ["big", "valid"], ["flipped"]),
        helper.make_node("Slice", ["big", "starts", "ends"], ["first"]),
        helper.make_node("Where", ["valid", "x", "zero"], ["picked"]),
    ]
    b, f = TensorProto.BOOL, TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "bool_io", [helper.make_tensor_value_info("x", f, [2, 6]), helper.make_tensor_value_info("valid", b, list(valid))],
        [helper.make_tensor_value_info("kept", b, [2, 6]), helper.make_tensor_value_info("flipped", b, [2, 6]),
         helper.make_tensor_value_info("first", b, [1, 5]), helper.make_tensor_value_info("picked", f, [2, 6])],
        inits)
    return _save_opset17(graph, path)


def onnx_nan_to_zero(path: Path) -> Path:
    """``x`` float32 [4, 8] in; ``y``: ``x`` with its NaNs replaced by 0 (IsNaN, Where) and ``nan`` (bool)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("IsNaN", ["x"], ["nan"]), helper.make_node("Where", ["nan", "zero", "x"], ["y"])]
    graph = helper.make_graph(
        nodes, "nan_to_zero", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8]),
         helper.make_tensor_value_info("nan", TensorProto.BOOL, [4, 8])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    return _save_opset17(graph, path)


#: the math operators TVM lowers to C's float functions for OpenCL and WGSL (``backends/gpu_math.py``)
INVERSE_TRIG = ("Asinh", "Acosh", "Atanh", "Asin", "Acos", "Atan", "Tan")


def onnx_inverse_trig(path: Path) -> Path:
    """``x`` float32 [4, 33] in (values in (-1, 1) keep every operator in its domain); one output per operator
    of ``INVERSE_TRIG``, Acosh's of ``|x| + 1``."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Abs", ["x"], ["abs"]), helper.make_node("Add", ["abs", "one"], ["at_least_one"])]
    nodes += [helper.make_node(op, ["at_least_one" if op == "Acosh" else "x"], [op.lower()]) for op in INVERSE_TRIG]
    graph = helper.make_graph(
        nodes, "inverse_trig", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 33])],
        [helper.make_tensor_value_info(op.lower(), TensorProto.FLOAT, [4, 33]) for op in INVERSE_TRIG],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    return _save_opset17(graph, path)


def onnx_dynamic_convs(path: Path, *, seed: int = 0) -> Path:
    """Convolutions as ``onnxruntime.quantization.quantize_dynamic`` leaves them: each float input quantized
    at run time (DynamicQuantizeLinear: uint8, its zero point from the values' range), a ConvInteger over it
    with int8 weights and that run-time zero point (5 input channels, padding: the zero point fills it), the
    int32 sum scaled back to float. Two such layers, the second after a ReLU-free float bias add, then a
    depthwise one (12 channels, 3x3, padded)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    x, channels = "input", 5
    for i, (out, pads, stride, group) in enumerate([(16, [1, 0, 2, 1], 1, 1), (12, [1, 1, 1, 1], 2, 1),
                                                    (12, [1, 1, 1, 1], 1, 12)]):
        nodes.append(helper.make_node("DynamicQuantizeLinear", [x], [f"q{i}", f"s{i}", f"z{i}"]))
        w = rng.integers(-127, 128, (out, channels // group, 3, 3)).astype(np.int8)
        nodes.append(helper.make_node("ConvInteger", [f"q{i}", const(f"w{i}", w), f"z{i}"], [f"acc{i}"],
                                      kernel_shape=[3, 3], pads=pads, strides=[stride, stride], group=group))
        nodes.append(helper.make_node("Cast", [f"acc{i}"], [f"accf{i}"], to=TensorProto.FLOAT))
        nodes.append(helper.make_node("Mul", [f"s{i}", const(f"ws{i}", np.float32(0.004))], [f"scale{i}"]))
        nodes.append(helper.make_node("Mul", [f"accf{i}", f"scale{i}"], [f"y{i}"]))
        bias = rng.normal(0, 0.1, (1, out, 1, 1)).astype(np.float32)
        x = "output" if i == 2 else f"h{i}"
        nodes.append(helper.make_node("Add", [f"y{i}", const(f"b{i}", bias)], [x]))
        channels = out
    graph = helper.make_graph(nodes, "dynamic_convs",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 5, 15, 13])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 12, 8, 6])], inits)
    return _save_opset17(graph, path)


def onnx_dynamic_matmul(path: Path, *, seed: int = 0) -> Path:
    """``quantize_dynamic``'s matrix product: a float [1, 7, 38] input quantized at run time
    (DynamicQuantizeLinear), a MatMulInteger with int8 weights [38, 37] (no multiple of 4 deep, no whole
    vector wide) and the run-time zero point, the int32 sum scaled back to float."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.integers(-127, 128, (38, 37)).astype(np.int8), "w")
    ws = numpy_helper.from_array(np.float32(0.01), "ws")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["input"], ["q", "s", "z"]),
             helper.make_node("MatMulInteger", ["q", "w", "z"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["s", "ws"], ["scale"]),
             helper.make_node("Mul", ["accf", "scale"], ["output"])]
    graph = helper.make_graph(nodes, "dynamic_matmul",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 7, 38])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 7, 37])], [w, ws])
    return _save_opset17(graph, path)


def onnx_qlinear_contrib(path: Path, *, seed: int = 0) -> Path:
    """ONNX Runtime's com.microsoft quantized operators in one uint8 network: QLinearSigmoid, QLinearLeakyRelu,
    QLinearMul, QLinearAdd, QLinearConcat, QLinearAveragePool, QLinearGlobalAveragePool; and a float branch
    through DynamicQuantizeMatMul and MatMulIntegerToFloat (the first quantizes its input at run time)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = []

    def const(name, value):
        if name not in {init.name for init in inits}:
            inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    ms = "com.microsoft"
    s, z = const("s_in", np.float32(0.04)), const("z_in", np.uint8(100))

    def q(i):
        return const(f"s{i}", np.float32(0.02 + 0.01 * i)), const(f"z{i}", np.uint8(90 + 7 * i))

    nodes = [
        helper.make_node("QLinearSigmoid", ["x", s, z, *q(1)], ["a"], domain=ms),
        helper.make_node("QLinearLeakyRelu", ["x", s, z, *q(2)], ["b"], domain=ms, alpha=0.2),
        helper.make_node("QLinearMul", ["a", *q(1), "b", *q(2), *q(3)], ["c"], domain=ms),
        helper.make_node("QLinearAdd", ["c", *q(3), "x", s, z, *q(4)], ["d"], domain=ms),
        helper.make_node("QLinearConcat", [*q(5), "d", *q(4), "a", *q(1)], ["e"], domain=ms, axis=1),
        helper.make_node("QLinearAveragePool", ["e", *q(5), *q(6)], ["pooled"], domain=ms, kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1], strides=[2, 2], count_include_pad=0),
        helper.make_node("QLinearGlobalAveragePool", ["pooled", *q(6), *q(7)], ["gap"], domain=ms),
        helper.make_node("DynamicQuantizeMatMul", ["f", const("wb", rng.integers(-127, 128, (16, 8)).astype(np.int8)),
                                                   const("wb_s", np.full(8, 0.01, np.float32)),
                                                   const("wb_z", np.zeros(8, np.int8)),
                                                   const("bias", rng.standard_normal(8).astype(np.float32))],
                         ["g"], domain=ms),
        helper.make_node("MatMulIntegerToFloat", ["x2", const("wc", rng.integers(-127, 128, (6, 5)).astype(np.int8)),
                                                  s, const("wc_s", np.float32(0.03)), z],
                         ["h"], domain=ms),
    ]
    graph = helper.make_graph(
        nodes, "qlinear_contrib",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 8, 6, 6]),
         helper.make_tensor_value_info("f", TensorProto.FLOAT, [1, 4, 16]),
         helper.make_tensor_value_info("x2", TensorProto.UINT8, [1, 3, 6])],
        [helper.make_tensor_value_info("pooled", TensorProto.UINT8, [1, 16, 3, 3]),
         helper.make_tensor_value_info("gap", TensorProto.UINT8, [1, 16, 1, 1]),
         helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 4, 8]),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 3, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)],
                              producer_name="edgepack.tests")
    model.ir_version = 8
    import onnx

    onnx.save(model, str(path))
    return path


def relax_tiny_dynamic():
    """``main(x: (2, W), y: (2, W)) -> (a = 2x + y: (2, W), b = concat([x, y], 1): (2, 2W))``: the smallest
    Relax module with a symbolic dimension, as the C API and Java tests build it for their targets."""
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((2, "W"), "float32"), y: R.Tensor((2, "W"), "float32")):
            with R.dataflow():
                a = R.add(R.multiply(x, R.const(2.0, "float32")), y)
                b = R.concat([x, y], axis=1)
                R.output(a, b)
            return (a, b)

    return Module


def onnx_cumulative(path: Path, op: str, dtype, exclusive: bool) -> Path:
    """A 3 x 37 ONNX ``op`` (CumSum / CumProd) along axis 1 of an input of ``dtype`` (np.float32, np.int32)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    elem = {np.float32: TensorProto.FLOAT, np.int32: TensorProto.INT32}[dtype]
    graph = helper.make_graph([helper.make_node(op, ["x", "axis"], ["y"], exclusive=int(exclusive))], op.lower(),
                              [helper.make_tensor_value_info("x", elem, [3, 37])],
                              [helper.make_tensor_value_info("y", elem, [3, 37])],
                              initializer=[numpy_helper.from_array(np.array(1, np.int32), "axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26 if op == "CumProd" else 17)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def onnx_doubles(path: Path) -> Path:
    """``y = relu(float(double(x W) * s + c))``: a float product (GPU) and a double scale and shift with real
    (seeded) weights, which a GPU without 64-bit floats cannot compute (CPU)."""
    import numpy as np
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(8), "s"), numpy_helper.from_array(rng.standard_normal(8), "c")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"], name="matmul"),
             helper.make_node("Cast", ["xw"], ["xd"], to=T.DOUBLE, name="to_double"),
             helper.make_node("Mul", ["xd", "s"], ["scaled"], name="scale_double"),
             helper.make_node("Add", ["scaled", "c"], ["shifted"], name="shift_double"),
             helper.make_node("Cast", ["shifted"], ["back"], to=T.FLOAT, name="to_float"),
             helper.make_node("Relu", ["back"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "doubles", [helper.make_tensor_value_info("x", T.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, 8])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def onnx_lstm_any_length(path: Path, *, seed: int = 0, features: int = 12, hidden: int = 24, batch: int = 2,
                         sequence_lens: bool = False) -> Path:
    """Two bidirectional LSTM layers over a sequence of any length ``T``: the first with peepholes, a clip,
    HardSigmoid/Tanh/Relu activations in one direction and the defaults in the other, initial states from
    the model's inputs (``h0``, ``c0``); the second over the first's outputs (both directions concatenated),
    with zero initial states. ``sequence_lens``: an int32 input of each batch item's length (steps past it
    output zeros and keep the state). Outputs: the second layer's Y and the first layer's Y_h and Y_c."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = []

    def const(name, shape, scale=0.4):
        inits.append(numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name))
        return name

    gates = 4 * hidden
    state = [2, batch, hidden]
    lens = "lens" if sequence_lens else ""
    first = helper.make_node(
        "LSTM", ["x", const("w1", (2, gates, features)), const("r1", (2, gates, hidden)), const("b1", (2, 2 * gates)),
                 lens, "h0", "c0", const("p1", (2, 3 * hidden))], ["y1", "y1_h", "y1_c"], hidden_size=hidden,
        direction="bidirectional", clip=2.5,
        activations=["HardSigmoid", "Tanh", "Relu", "Sigmoid", "Tanh", "Tanh"], activation_alpha=[0.25],
        activation_beta=[0.45])
    nodes = [first, helper.make_node("Transpose", ["y1"], ["y1t"], perm=[0, 2, 1, 3]),  # [T, B, 2, H]
             helper.make_node("Reshape", ["y1t", "flat"], ["y1f"]),
             helper.make_node("LSTM", ["y1f", const("w2", (2, gates, 2 * hidden)), const("r2", (2, gates, hidden)),
                                       const("b2", (2, 2 * gates)), lens], ["y"], hidden_size=hidden,
                              direction="bidirectional")]
    flat = [0, 0, 2 * hidden]
    inits.append(numpy_helper.from_array(np.array(flat, np.int64), "flat"))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", batch, features]),
              helper.make_tensor_value_info("h0", TensorProto.FLOAT, state),
              helper.make_tensor_value_info("c0", TensorProto.FLOAT, state)]
    if sequence_lens:
        inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [batch]))
    y_shape = ["T", 2, batch, hidden]
    graph = helper.make_graph(nodes, "lstm_any_length", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape),
                               helper.make_tensor_value_info("y1_h", TensorProto.FLOAT, state),
                               helper.make_tensor_value_info("y1_c", TensorProto.FLOAT, state)], inits)
    return _save_opset17(graph, path)
