"""Bigger and more varied models for tests and benchmarks: the onnx "light" zoo, a transformer, a wide model.

``light_models()``
    The ONNX backend-test "light" models shipped inside the onnx wheel
    (``onnx/backend/test/data/light``): AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet,
    SqueezeNet, VGG-19, ZFNet-512, each with every float weight replaced by
    ``ConstantOfShape(value=0.02)``. On onnxruntime 1.31.1 (onnx 1.17 and 1.23) all nine load and run at
    every optimization level: IR version 3, opset 9, initializers also listed as graph inputs (old IR
    style), ResNet-50 and ZFNet-512 carry one unused initializer that ORT warns about and drops.
    ``all`` vs ``disable`` differ by at most 6e-8 and the outputs equal the shipped
    ``*_output_0.pb``. Caveat: because every weight is the same constant, the output is the same for
    *every* input (uniform softmax, 0.001 per class), so an error injected inside is usually invisible at
    the output. Use them for structure (size: 38–1,746 nodes; Conv/BatchNorm/Concat topologies; hundreds
    of ConstantOfShape weight subgraphs; IR 3 quirks), not as numerical bug hosts.
``transformer()``
    A BERT-style post-norm encoder as older PyTorch exports emit it: token ids → Gather embedding,
    decomposed LayerNorms (keepdims=1), Erf GELU, head reshapes computed at run time
    (Shape → Gather → Unsqueeze → Concat). 56 nodes per layer + 12: 24 layers = 1,356 nodes,
    40 layers = 2,252. ``bug_layer`` turns one LayerNorm into the keepdims=0 bug (needs ``seq == hidden``).
``wide_model()``
    Many parallel branches merged by one Sum: the shape that stresses reducers whose cost grows with the
    number of independent units rather than depth.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from graphbisect.examples.hosts import HostNetwork, package_host
from graphbisect.examples.patterns import (
    BUGS,
    GraphBuilder,
    layernorm_keepdims0,
    layernorm_keepdims1,
)

logger = logging.getLogger(__name__)

__all__ = [
    "LIGHT_MODEL_NAMES",
    "light_model_inputs",
    "light_models",
    "light_models_dir",
    "transformer",
    "transformer_inputs",
    "wide_model",
]

LIGHT_MODEL_NAMES = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
                     "squeezenet", "vgg19", "zfnet512")


def light_models_dir() -> Path:
    """Folder of the light models inside the installed onnx package (it may be missing in slim installs)."""
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def light_models() -> dict[str, Path]:
    """Name (``resnet50``, ...) → path of every light model present in the installed onnx wheel.

    >>> sorted(light_models())[:2]
    ['bvlc_alexnet', 'densenet121']
    """
    folder = light_models_dir()
    found = {name: folder / f"light_{name}.onnx" for name in LIGHT_MODEL_NAMES}
    missing = [name for name, path in found.items() if not path.is_file()]
    if missing:
        logger.info("onnx %s ships no light model(s) %s in %s", onnx.__version__, missing, folder)
    return {name: path for name, path in found.items() if path.is_file()}


def light_model_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded float32 inputs for a light model (graph inputs that are not initializers; static shapes)."""
    rng = np.random.default_rng(seed)
    initializers = {init.name for init in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name not in initializers:
            shape = [dim.dim_value for dim in value.type.tensor_type.shape.dim]
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


# ------------------------------------------------------------------------------------------ transformer


def _dense(b: GraphBuilder, x: str, fan_in: int, fan_out: int, hint: str) -> str:
    weight = (b.rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
    bias = (0.02 * b.rng.standard_normal(fan_out)).astype(np.float32)
    with b.scope(hint):
        return b.op("Add", [b.op("MatMul", [x, b.const(weight, "weight")]), b.const(bias, "bias")])


def _runtime_dims(b: GraphBuilder, x: str) -> tuple[str, str]:
    """Batch and sequence sizes of ``x`` as ``[1]`` int64 tensors, computed the way exporters do."""
    shape = b.op("Shape", [x])
    dims = []
    for axis in (0, 1):
        dims.append(b.op("Unsqueeze", [b.op("Gather", [shape, b.index(axis)], axis=0), b.ints([0])]))
    return dims[0], dims[1]


def _self_attention(b: GraphBuilder, h: str, hidden: int, heads: int) -> str:
    batch, seq = _runtime_dims(b, h)
    split = b.op("Concat", [batch, seq, b.ints([heads, hidden // heads])], axis=0)
    perms = {"query": [0, 2, 1, 3], "key": [0, 2, 3, 1], "value": [0, 2, 1, 3]}
    proj = {name: b.op("Transpose", [b.op("Reshape", [_dense(b, h, hidden, hidden, name), split])], perm=perm)
            for name, perm in perms.items()}
    scores = b.op("Div", [b.op("MatMul", [proj["query"], proj["key"]]), b.scalar(float(np.sqrt(hidden // heads)))])
    context = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), proj["value"]])
    merged = b.op("Concat", [batch, seq, b.ints([hidden])], axis=0)
    context = b.op("Reshape", [b.op("Transpose", [context], perm=[0, 2, 1, 3]), merged])
    return _dense(b, context, hidden, hidden, "output")


def _feed_forward(b: GraphBuilder, h: str, hidden: int) -> str:
    up = _dense(b, h, hidden, 4 * hidden, "intermediate")
    erf = b.op("Erf", [b.op("Div", [up, b.scalar(float(np.sqrt(2.0)))])])
    gelu = b.op("Mul", [b.op("Mul", [up, b.op("Add", [erf, b.scalar(1.0)])]), b.scalar(0.5)])
    return _dense(b, gelu, 4 * hidden, hidden, "ffn_output")


def _encoder_layer(b: GraphBuilder, h: str, hidden: int, heads: int, *, layer: int, buggy: bool) -> str:
    with b.scope("attention"):
        h = b.op("Add", [h, _self_attention(b, h, hidden, heads)])
    norm = layernorm_keepdims0 if buggy else layernorm_keepdims1
    h = norm(b, h, gamma_seed=2 * layer, width=hidden, prefix="attention_norm")
    with b.scope("ffn"):
        h = b.op("Add", [h, _feed_forward(b, h, hidden)])
    return layernorm_keepdims1(b, h, gamma_seed=2 * layer + 1, width=hidden, prefix="output_norm")


def transformer(num_layers: int = 24, hidden: int = 16, heads: int = 2, seq: int = 8, *, vocab: int = 64,
                seed: int = 0, bug_layer: int | None = None) -> onnx.ModelProto:
    """A BERT-style encoder: ``input_ids: int64[1, seq]`` → ``last_hidden_state: float[1, seq, hidden]``.

    Random weights from ``seed`` (deterministic). ``bug_layer`` replaces that layer's attention LayerNorm
    with the keepdims=0 bug; its ground truth is stored in ``metadata_props`` like a host network's.
    Feed it :func:`transformer_inputs`.

    >>> model = transformer(num_layers=2)
    >>> [i.name for i in model.graph.input], len(model.graph.node)
    (['input_ids'], 124)
    """
    if hidden % heads:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
    if bug_layer is not None and not (0 <= bug_layer < num_layers and seq == hidden):
        raise ValueError(f"bug_layer={bug_layer} needs 0 <= bug_layer < num_layers={num_layers} and seq == hidden "
                         f"(got seq={seq}, hidden={hidden}): the keepdims=0 mean only broadcasts on a square "
                         "[seq, hidden] activation")
    b = GraphBuilder(seed=seed)
    with b.scope("embeddings"):
        table = b.const((0.5 * b.rng.standard_normal((vocab, hidden))).astype(np.float32), "word_embeddings")
        position = b.const((0.1 * b.rng.standard_normal((seq, hidden))).astype(np.float32),
                           "position_embeddings")
        h = b.op("Add", [b.op("Gather", [table, "input_ids"], axis=0), position])
    h = layernorm_keepdims1(b, h, gamma_seed=seed, width=hidden, prefix="embeddings_norm")
    for layer in range(num_layers):
        with b.scope(f"encoder/layer.{layer}"):
            h = _encoder_layer(b, h, hidden, heads, layer=layer, buggy=layer == bug_layer)
    b.nodes.append(helper.make_node("Identity", [h], ["last_hidden_state"], name="/output/Identity"))
    model = b.model([helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])],
                    [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, seq, hidden])],
                    graph_name="transformer",
                    doc=f"graphbisect example encoder: layers={num_layers} hidden={hidden} heads={heads}")
    return package_host(model, b.sites, position="main", seed=seed).model


def transformer_inputs(seq: int = 8, *, vocab: int = 64, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded token ids for :func:`transformer` (``int64[1, seq]`` in ``[0, vocab)``)."""
    return {"input_ids": np.random.default_rng(seed).integers(0, vocab, size=(1, seq), dtype=np.int64)}


# ----------------------------------------------------------------------------------------------- wide


def _branch_unit(b: GraphBuilder, h: str, unit: int) -> str:
    """MatMul → Add → Tanh on the ``[8, 8]`` branch state; every fourth unit is a healthy LayerNorm."""
    if unit % 4 == 3:
        return layernorm_keepdims1(b, h, gamma_seed=unit, width=8)
    weight = (b.rng.standard_normal((8, 8)) / np.sqrt(8)).astype(np.float32)
    bias = (0.1 * b.rng.standard_normal(8)).astype(np.float32)
    return b.op("Tanh", [b.op("Add", [b.op("MatMul", [h, b.const(weight, "weight")]), b.const(bias, "bias")])])


def _unit_cost(unit: int) -> int:
    return 9 if unit % 4 == 3 else 3


def wide_model(num_nodes: int = 5000, *, branches: int | None = None, bug: str | None = None,
               seed: int = 0) -> HostNetwork:
    """``x[1, 4, 16]`` → ``[8, 8]`` → ``branches`` parallel chains → one Sum → ``y[1, 4, 16]``.

    ``branches`` defaults to about sqrt(num_nodes / 2), so a 5,000-node model has 50 chains of ~100 nodes.
    ``bug`` (a name from :data:`~graphbisect.examples.patterns.BUGS`) goes halfway down the middle
    chain. The node count is exact. Same :class:`HostNetwork` ground truth as a host (position "branch").
    """
    if bug is not None and bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; known bugs: {', '.join(BUGS)}")
    count = branches or max(2, round(np.sqrt(num_nodes / 2)))
    budget = num_nodes - 3 - (_site_cost(bug) if bug else 0)  # 3 = Reshape in, Sum, Reshape out
    if budget < count * 3:
        raise ValueError(f"num_nodes={num_nodes} is too small for {count} branches; use at least "
                         f"{num_nodes - budget + count * 3}")
    b = GraphBuilder(seed=seed)
    square = b.op("Reshape", ["x", b.ints([8, 8])])
    outputs = [_wide_branch(b, square, i, budget // count + (i < budget % count), bug if i == count // 2 else None)
               for i in range(count)]
    b.op("Reshape", [b.op("Sum", outputs), b.ints([1, 4, 16])], output="y")
    model = b.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16])],
                    graph_name="wide", doc=f"graphbisect example wide model: bug={bug}, seed={seed}")
    return package_host(model, b.sites, position="branch", seed=seed)


def _emit_site(b: GraphBuilder, bug: str, h: str, gamma_seed: int) -> str:
    if BUGS[bug].needs_square:
        return BUGS[bug].emit(b, h, width=8, gamma_seed=gamma_seed)
    return BUGS[bug].emit(b, h)


def _site_cost(bug: str) -> int:
    scratch = GraphBuilder()
    _emit_site(scratch, bug, "h", 0)
    return len(scratch.nodes)


def _wide_branch(b: GraphBuilder, h: str, index: int, nodes: int, bug: str | None) -> str:
    """One chain of exactly ``nodes`` nodes plus the bug site, if any, after its second unit."""
    with b.scope(f"branch{index}"):
        used, unit = 0, 0
        while used + _unit_cost(unit) <= nodes:
            if bug is not None and unit == 2:
                h, bug = _emit_site(b, bug, h, index), None
            h = _branch_unit(b, h, unit)
            used, unit = used + _unit_cost(unit), unit + 1
        if bug is not None:
            h = _emit_site(b, bug, h, index)
        for _ in range(nodes - used):
            h = b.op("Mul", [h, b.scalar(0.999)], hint="LayerScale")
        return h
