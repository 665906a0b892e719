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
