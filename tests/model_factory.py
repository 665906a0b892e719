"""Small models built in the tests to exercise error paths (bad operators, custom ops)."""

from __future__ import annotations

from pathlib import Path


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
