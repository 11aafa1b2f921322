"""Models with genuine reduced-precision sensitivity, for the precision search's tests and benchmark.

``sensitive_transformer()``
    :func:`~graphbisect.examples.zoo.transformer` with two realistic weight changes (everything else is the
    same random encoder):

    * the last layer's FFN output projection is scaled by ``ffn_scale`` (default 1000; large residual-stream
      activations are common in trained LLMs). The final LayerNorm then sees ``|x - mean|`` of several
      hundred, and its variance branch ``Pow → ReduceMean → Add(eps) → Sqrt`` holds values above 65504:
      they overflow FP16 to ``inf`` and the LayerNorm output collapses to its bias (the classic "LayerNorm
      variance overflow"). ``embed_scale`` does the same to the embeddings LayerNorm (off by default);
    * the query projection of layer ``logit_layer`` is scaled by ``logit_scale`` (default 1000): attention
      logits reach the hundreds, where an FP16 value has a spacing of 0.25–0.5, so rounding the logits
      before the Softmax shifts the attention probabilities by tens of percent ("softmax over large
      logits"). Only the nodes that hold the logits (the QK MatMul, the scaling Div, the Softmax) matter.

    Every other node is harmless in FP16 at a tolerance of a few percent.
``drift_chain()``
    ``blocks`` pairs ``Mul(c_i) → Add(b_i)`` on a ``float[1, width]`` vector, multipliers near 1: under INT8
    each lowered node adds its activation's and its constant's rounding to the output, so the error grows
    with the number of nodes lowered, not with any one of them (the cumulative int8 error of an unrolled
    recurrent network). At an absolute tolerance of 0.015 about four in five of its 100 units must stay in
    FP32: a *dense* answer, which the precision search leaves to one-by-one removal early.
``residual_cnn()``
    A small ResNet-style CNN built with ``onnx.helper``: a stem Conv, ``blocks`` residual blocks
    (Conv → Relu → Conv → Add → Relu), global average pooling and a Gemm head, with real random weights
    (He initialization). In block ``hot_block`` output channel 0 of the first Conv is scaled by
    ``hot_scale`` (default 1e5) and input channel 0 of the second Conv by ``1 / hot_scale``: mathematically
    the same block (ReLU is positively homogeneous), but channel 0 of the activation between them is an
    *outlier channel* ``hot_scale`` times larger than the others — values above 65504 overflow FP16, and
    under per-tensor INT8 its range leaves the other channels a single quantization step. Outlier
    channels like this appear in real networks after BatchNorm folding and weight re-parameterization.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphbisect.examples.zoo import transformer

__all__ = ["cancelling_net", "cnn_inputs", "drift_chain", "drift_chain_inputs", "residual_cnn",
           "sensitive_transformer"]

logger = logging.getLogger(__name__)

_OPSET, _IR = 17, 8


def _scale_initializer(model: onnx.ModelProto, name: str, factor: float) -> None:
    for i, init in enumerate(model.graph.initializer):
        if init.name == name:
            value = numpy_helper.to_array(init) * np.float32(factor)
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))
            return
    raise KeyError(f"no initializer {name!r}")


def sensitive_transformer(num_layers: int = 2, *, ffn_scale: float = 1000.0, logit_scale: float = 1000.0,
                          embed_scale: float = 1.0, logit_layer: int = 0, seed: int = 0) -> onnx.ModelProto:
    """The encoder of :func:`transformer` (hidden 16, 2 heads, seq 8) with FP16-sensitive spots (see above).

    Feed it :func:`graphbisect.examples.transformer_inputs`.

    >>> len(sensitive_transformer().graph.node)
    124
    """
    model = transformer(num_layers=num_layers, seed=seed)
    _scale_initializer(model, "embeddings.word_embeddings", embed_scale)
    last = f"encoder/layer.{num_layers - 1}.ffn.ffn_output"
    _scale_initializer(model, f"{last}.weight", ffn_scale)
    _scale_initializer(model, f"{last}.bias", ffn_scale)
    if 0 <= logit_layer < num_layers:
        _scale_initializer(model, f"encoder/layer.{logit_layer}.attention.query.weight", logit_scale)
        _scale_initializer(model, f"encoder/layer.{logit_layer}.attention.query.bias", logit_scale)
    return model


def _conv(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], rng: np.random.Generator, x: str, *,
          cin: int, cout: int, name: str, scale: tuple[float, float] = (1.0, 1.0)) -> str:
    """A 3x3 Conv; ``scale = (out, in)`` multiplies output channel 0's weights and input channel 0's."""
    weight = rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))
    bias = 0.05 * rng.standard_normal(cout)
    weight[0] *= scale[0]
    bias[0] *= scale[0]
    weight[:, 0] *= scale[1]
    inits += [numpy_helper.from_array(weight.astype(np.float32), f"{name}.weight"),
              numpy_helper.from_array(bias.astype(np.float32), f"{name}.bias")]
    nodes.append(helper.make_node("Conv", [x, f"{name}.weight", f"{name}.bias"], [f"{name}_out"], name=name,
                                  pads=[1, 1, 1, 1]))
    return f"{name}_out"


def _relu(nodes: list[onnx.NodeProto], x: str, name: str) -> str:
    nodes.append(helper.make_node("Relu", [x], [f"{name}_out"], name=name))
    return f"{name}_out"


def residual_cnn(blocks: int = 4, *, channels: int = 8, size: int = 16, classes: int = 10, hot_block: int = 3,
                 hot_scale: float = 1e5, seed: int = 0) -> onnx.ModelProto:
    """A residual CNN ``input: float[1, 3, size, size]`` → ``logits: float[1, classes]`` (see above).

    >>> len(residual_cnn().graph.node)
    25
    """
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    h = _relu(nodes, _conv(nodes, inits, rng, "input", cin=3, cout=channels, name="stem/conv"), "stem/relu")
    for b in range(blocks):
        scale = hot_scale if b == hot_block else 1.0
        t = _conv(nodes, inits, rng, h, cin=channels, cout=channels, name=f"block{b}/conv1", scale=(scale, 1.0))
        t = _relu(nodes, t, f"block{b}/relu1")
        t = _conv(nodes, inits, rng, t, cin=channels, cout=channels, name=f"block{b}/conv2",
                  scale=(1.0, 1.0 / scale))
        nodes.append(helper.make_node("Add", [h, t], [f"block{b}/add_out"], name=f"block{b}/add"))
        h = _relu(nodes, f"block{b}/add_out", f"block{b}/relu2")
    nodes.append(helper.make_node("GlobalAveragePool", [h], ["pool_out"], name="head/pool"))
    nodes.append(helper.make_node("Flatten", ["pool_out"], ["flat_out"], name="head/flatten"))
    inits += [numpy_helper.from_array((rng.standard_normal((classes, channels)) / np.sqrt(channels)).astype(np.float32),
                                      "head.weight"),
              numpy_helper.from_array((0.1 * rng.standard_normal(classes)).astype(np.float32), "head.bias")]
    nodes.append(helper.make_node("Gemm", ["flat_out", "head.weight", "head.bias"], ["logits"], name="head/fc",
                                  transB=1))
    graph = helper.make_graph(nodes, "residual_cnn",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)])
    model.ir_version = _IR
    return model


def cnn_inputs(size: int = 16, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded standard-normal images for :func:`residual_cnn`."""
    return {"input": np.random.default_rng(seed).standard_normal((1, 3, size, size)).astype(np.float32)}


def drift_chain(blocks: int = 50, *, width: int = 64, seed: int = 0) -> onnx.ModelProto:
    """``x: float[1, width]`` → ``blocks`` × (``Mul`` by ``c_i`` in [0.9, 1.1], ``Add`` ``b_i`` in [-0.05, 0.05])
    → ``y`` (see above)."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    h = "x"
    for i in range(blocks):
        inits += [numpy_helper.from_array(rng.uniform(0.9, 1.1, width).astype(np.float32), f"c{i}"),
                  numpy_helper.from_array(rng.uniform(-0.05, 0.05, width).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Mul", [h, f"c{i}"], [f"m{i}"], name=f"mul{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}")]
        h = f"a{i}"
    nodes.append(helper.make_node("Identity", [h], ["y"], name="out"))
    graph = helper.make_graph(nodes, "drift_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def drift_chain_inputs(width: int = 64, *, seed: int = 1) -> dict[str, np.ndarray]:
    """Seeded uniform [-1, 1) vectors for :func:`drift_chain`."""
    return {"x": np.random.default_rng(seed).uniform(-1, 1, (1, width)).astype(np.float32)}


def cancelling_net() -> onnx.ModelProto:
    """A 7-node CNN whose answer under bf16 is known: stem conv → mix (1x1: channel pairs 1000·a + b and
    1000·a) → diff (1x1: their difference, b) → head.

    Stored in bf16 (8-bit mantissa), 1000·a loses far more than b: only mix and diff in FP32 keep b.
    """
    rng = np.random.default_rng(0)
    c = 8
    mix = np.zeros((2 * c, c, 1, 1), np.float32)
    diff = np.zeros((c, 2 * c, 1, 1), np.float32)
    for i in range(c):
        mix[2 * i, i], mix[2 * i, (i + 1) % c], mix[2 * i + 1, i] = 1000.0, 1.0, 1000.0
        diff[i, 2 * i], diff[i, 2 * i + 1] = 1.0, -1.0
    weights = {"w_in": rng.standard_normal((c, 3, 3, 3)).astype(np.float32) * 0.3, "w_mix": mix, "w_diff": diff,
               "w_out": rng.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.3}
    nodes = [
        onnx.helper.make_node("Conv", ["x", "w_in"], ["a"], name="stem/conv", pads=[1, 1, 1, 1]),
        onnx.helper.make_node("Relu", ["a"], ["a_relu"], name="stem/relu"),
        onnx.helper.make_node("Conv", ["a_relu", "w_mix"], ["m"], name="mix/conv"),
        onnx.helper.make_node("Conv", ["m", "w_diff"], ["d"], name="diff/conv"),
        onnx.helper.make_node("Conv", ["d", "w_out"], ["o"], name="head/conv", pads=[1, 1, 1, 1]),
        onnx.helper.make_node("Relu", ["o"], ["o_relu"], name="head/relu"),
        onnx.helper.make_node("GlobalAveragePool", ["o_relu"], ["y"], name="head/pool"),
    ]
    graph = onnx.helper.make_graph(
        nodes, "cancelling", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 16, 16])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, c, 1, 1])],
        [onnx.numpy_helper.from_array(value, name) for name, value in weights.items()])
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return proto
