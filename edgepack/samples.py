"""Sample models that edgepack can make by itself: a MobileNetV2-shaped ONNX network.

The weights are seeded random numbers (He initialisation, realistic BatchNorm statistics), so the
numerics exercise every layer the way a trained network does, without a model hub.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgepack.files import atomic_file

# (expansion, output channels, repeats, first stride), as in the MobileNetV2 paper
_MOBILENETV2_BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def _divisible(v: float, divisor: int = 8) -> int:
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def mobilenetv2(width: float = 1.0, resolution: int = 224, classes: int = 1000, seed: int = 0):
    """A MobileNetV2 (inverted residuals, depthwise convs, ReLU6) as an ``onnx.ModelProto``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    counter = iter(range(10**6))

    def const(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    inits.append(numpy_helper.from_array(np.array(0.0, np.float32), "relu6_min"))
    inits.append(numpy_helper.from_array(np.array(6.0, np.float32), "relu6_max"))

    def conv_bn(x: str, cin: int, cout: int, k: int, stride: int, groups: int = 1, relu6: bool = True) -> str:
        i = next(counter)
        fan_in = cin // groups * k * k
        w = rng.normal(0, np.sqrt(2.0 / fan_in), (cout, cin // groups, k, k))
        y = f"conv{i}"
        nodes.append(helper.make_node("Conv", [x, const(f"conv{i}.w", w)], [y], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[k // 2] * 4, group=groups))
        bn = f"bn{i}"
        nodes.append(helper.make_node(
            "BatchNormalization",
            [y, const(f"bn{i}.gamma", rng.uniform(0.8, 1.2, cout)), const(f"bn{i}.beta", rng.normal(0, 0.1, cout)),
             const(f"bn{i}.mean", rng.normal(0, 0.1, cout)), const(f"bn{i}.var", rng.uniform(0.8, 1.2, cout))],
            [bn], epsilon=1e-5))
        if not relu6:
            return bn
        out = f"relu{i}"
        nodes.append(helper.make_node("Clip", [bn, "relu6_min", "relu6_max"], [out]))
        return out

    channels = _divisible(32 * width)
    x = conv_bn("input", 3, channels, 3, 2)
    for expansion, c, repeats, first_stride in _MOBILENETV2_BLOCKS:
        cout = _divisible(c * width)
        for r in range(repeats):
            stride = first_stride if r == 0 else 1
            hidden = channels * expansion
            y = x if expansion == 1 else conv_bn(x, channels, hidden, 1, 1)
            y = conv_bn(y, hidden, hidden, 3, stride, groups=hidden)
            y = conv_bn(y, hidden, cout, 1, 1, relu6=False)
            if stride == 1 and channels == cout:
                added = f"add{next(counter)}"
                nodes.append(helper.make_node("Add", [x, y], [added]))
                y = added
            x, channels = y, cout
    last = _divisible(1280 * max(1.0, width))
    x = conv_bn(x, channels, last, 1, 1)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"]))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["features"], axis=1))
    fc_w = const("fc.w", rng.normal(0, np.sqrt(1.0 / last), (classes, last)))
    fc_b = const("fc.b", rng.normal(0, 0.01, classes))
    nodes.append(helper.make_node("Gemm", ["features", fc_w, fc_b], ["logits"], transB=1))

    graph = helper.make_graph(
        nodes, "mobilenetv2",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, resolution, resolution])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="edgepack.samples")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_mobilenetv2(path: Path, **kwargs) -> Path:
    import onnx

    path = Path(path)
    with atomic_file(path) as tmp:
        onnx.save(mobilenetv2(**kwargs), str(tmp))
    return path
