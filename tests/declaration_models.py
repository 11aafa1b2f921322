"""Small models whose failure on a real backend needs what the user's model declares (issue 23).

* :func:`declared_rank_layernorm`: ONNX Runtime's LayerNormFusion fires on a ReduceMean with a *positive*
  ``axes`` only when the input's rank is known (``CheckAxesOnReduceMean``); with an input of unknown rank (as
  converters write them) only the model's ``value_info`` gives it, so the keepdims=0 mis-fusion (onnxruntime
  issue 30513) fails only with that declaration.
* :func:`bilstm_tagger`: IREE 3.13 (llvm-cpu) miscompiles a bidirectional LSTM fed by an embedding ``Gather``
  when the token ids' batch and sequence dimensions are dynamic: the tags' probabilities are off by ~0.1–0.5
  against ONNX Runtime and onnx.reference. With both dimensions fixed it computes correctly, and so it does
  when the LSTM's unused ``Y_h``/``Y_c`` are graph outputs, or when the embedded tokens are a graph input (the
  Gather cut away). The failing core is the Gather and the LSTM, fed with token ids of dynamic shape.
* :func:`reshape_fusion_host`: ONNX Runtime 1.32's ``ReshapeFusion`` fuses a chain of contiguous Reshapes
  whose last output shape is known, and follows a Reshape's output into the *shape* input of the next one as
  if it were data (onnxruntime issue 32105, where the types differ and session creation fails): here
  ``Reshape(ids, Reshape(Shape(m), [-1]))`` becomes ``Reshape(Shape(m), [2, 1])``, so the
  ids are replaced by ``m``'s shape (at ``opt_level=all``; ``disable`` is right). It fires only when the last
  Reshape's output (``bug_y``) is declared ``[2, 1]`` and ``m``'s first dimension is dynamic (a static one is
  constant-folded first). Embedded in a 30-node host whose float output reads ``bug_y`` through a Cast: the
  failing core is Shape → Reshape → Reshape (3 nodes), with ``bug_y`` an integer output.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphbisect.examples.patterns import GraphBuilder

__all__ = ["BILSTM_CORE", "RESHAPE_FUSION_CORE", "WIDTH", "bilstm_inputs", "bilstm_tagger",
           "declared_rank_layernorm", "reshape_fusion_host", "reshape_fusion_inputs"]

#: the nodes a minimal failing BiLSTM tagger keeps
BILSTM_CORE = ("embed", "bilstm")
#: the nodes a minimal failing ReshapeFusion host keeps
RESHAPE_FUSION_CORE = ("/gate/Shape", "/gate/Reshape", "/gate/Reshape_1")

#: the width of :func:`declared_rank_layernorm`'s rows
WIDTH = 8

_BATCH, _SEQ, _EMBED, _HIDDEN, _VOCAB, _TAGS = 3, 5, 4, 4, 10, 4


def bilstm_tagger(*, dynamic: bool = True) -> onnx.ModelProto:
    """``tokens: INT64[batch, seq]`` → embedding → BiLSTM → per-token tag probabilities ``[batch, seq, 4]``
    (8 nodes); ``dynamic=False`` declares the tokens ``[3, 5]``, the size :func:`bilstm_inputs` feeds."""
    rng = np.random.default_rng(0)
    weights = {"W": rng.standard_normal((2, 4 * _HIDDEN, _EMBED)) * 0.5,
               "R": rng.standard_normal((2, 4 * _HIDDEN, _HIDDEN)) * 0.5,
               "B": rng.standard_normal((2, 8 * _HIDDEN)) * 0.1, "E": rng.standard_normal((_VOCAB, _EMBED)),
               "Wo": rng.standard_normal((2 * _HIDDEN, _TAGS)), "bo": rng.standard_normal(_TAGS) * 0.1}
    inits = [numpy_helper.from_array(value.astype(np.float32), name) for name, value in weights.items()]
    inits.append(numpy_helper.from_array(np.array([0, 0, 2 * _HIDDEN], np.int64), "merge_shape"))
    nodes = [helper.make_node("Transpose", ["tokens"], ["time_major"], perm=[1, 0], name="time_major"),
             helper.make_node("Gather", ["E", "time_major"], ["embedded"], name="embed"),
             helper.make_node("LSTM", ["embedded", "W", "R", "B"], ["Y", "Y_h", "Y_c"], hidden_size=_HIDDEN,
                              direction="bidirectional", name="bilstm"),
             helper.make_node("Transpose", ["Y"], ["Y_t"], perm=[2, 0, 1, 3], name="batch_major"),
             helper.make_node("Reshape", ["Y_t", "merge_shape"], ["features"], name="merge_directions"),
             helper.make_node("MatMul", ["features", "Wo"], ["logits"], name="project"),
             helper.make_node("Add", ["logits", "bo"], ["scores"], name="bias"),
             helper.make_node("Softmax", ["scores"], ["tags"], axis=-1, name="softmax")]
    batch, seq = ("batch", "seq") if dynamic else (_BATCH, _SEQ)
    graph = helper.make_graph(nodes, "bilstm_tagger",
                              [helper.make_tensor_value_info("tokens", TensorProto.INT64, [batch, seq])],
                              [helper.make_tensor_value_info("tags", TensorProto.FLOAT, [batch, seq, _TAGS])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def bilstm_inputs() -> dict[str, np.ndarray]:
    return {"tokens": np.random.default_rng(1).integers(0, _VOCAB, (_BATCH, _SEQ)).astype(np.int64)}


def declared_rank_layernorm(value_info: bool = True) -> onnx.ModelProto:
    """x: FLOAT of unknown rank → Add → keepdims=0 LayerNorm with axes=[1]; ``h`` declared [n, 8]
    (``value_info=False``: not declared, and ONNX Runtime computes it right)."""
    nodes = [helper.make_node("Add", ["x", "zero"], ["h"], name="add"),
             helper.make_node("ReduceMean", ["h"], ["m"], axes=[1], keepdims=0, name="mean"),
             helper.make_node("Sub", ["h", "m"], ["c"], name="sub"),
             helper.make_node("Pow", ["c", "two"], ["sq"], name="pow"),
             helper.make_node("ReduceMean", ["sq"], ["v"], axes=[1], keepdims=0, name="var"),
             helper.make_node("Add", ["v", "eps"], ["ve"], name="add_eps"),
             helper.make_node("Sqrt", ["ve"], ["s"], name="sqrt"),
             helper.make_node("Div", ["c", "s"], ["n"], name="div"),
             helper.make_node("Mul", ["n", "g"], ["ng"], name="mul"),
             helper.make_node("Add", ["ng", "b"], ["y"], name="add_b")]
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.float32(0), "zero"), numpy_helper.from_array(np.float32(2), "two"),
             numpy_helper.from_array(np.float32(1e-5), "eps"),
             numpy_helper.from_array((1 + 0.1 * rng.standard_normal(WIDTH)).astype(np.float32), "g"),
             numpy_helper.from_array((0.1 * rng.standard_normal(WIDTH)).astype(np.float32), "b")]
    declared = [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["n", WIDTH])] if value_info else []
    graph = helper.make_graph(nodes, "declared_rank", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
                              value_info=declared)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def reshape_fusion_host(*, declared: bool = True) -> onnx.ModelProto:
    """``x: FLOAT[batch, 8]`` → four residual MLP blocks → a gate that reads each row's argmax channel through
    the ReshapeFusion bug → two more layers → ``y: FLOAT[batch]`` (30 nodes); ``declared=False`` leaves out the
    ``bug_y: INT64[2, 1]`` value_info the fusion needs. Feed it a batch of 2 (:func:`reshape_fusion_inputs`)."""
    b = GraphBuilder(seed=0)
    rng = b.rng
    h = "x"
    for i in range(4):
        with b.scope(f"blk{i}"):
            w = b.const((rng.standard_normal((8, 8)) / 3).astype(np.float32), "weight")
            update = b.op("MatMul", [h, w])
            update = b.op("Add", [update, b.const((0.1 * rng.standard_normal(8)).astype(np.float32), "bias")])
            h = b.op("Add", [h, b.op("Tanh", [update])])
    with b.scope("gate"):
        channel = b.op("ArgMax", [h], axis=1, keepdims=0)  # INT64[batch]
        mean = b.op("ReduceMean", [h], axes=[1], keepdims=1)  # FLOAT[batch, 1]
        shape = b.op("Shape", [mean])
        column = b.op("Reshape", [shape, b.ints([-1])])  # the shape [batch, 1], computed at run time
        chosen = b.op("Reshape", [channel, column], output="bug_y")
        gate = b.op("Mul", [b.op("Cast", [chosen], to=TensorProto.FLOAT), b.scalar(0.125)])
        gate = b.op("Add", [mean, gate])
    with b.scope("head"):
        h = b.op("Mul", [h, gate])
        for i in range(2):
            h = b.op("Relu", [b.op("MatMul", [h, b.const((rng.standard_normal((8, 8)) / 3).astype(np.float32),
                                                           f"w{i}")])])
        b.op("ReduceSum", [h, b.ints([1])], keepdims=0, output="y")
    model = b.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])], graph_name="reshape_fusion")
    if declared:
        model.graph.value_info.append(helper.make_tensor_value_info("bug_y", TensorProto.INT64, [2, 1]))
    return model


def reshape_fusion_inputs() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)}
