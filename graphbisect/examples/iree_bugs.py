"""Real IREE bugs (iree-base-compiler 3.13, llvm-cpu) embedded in a small residual CNN, with ground truth.

Each site reproduces a public IREE report; the host around it compiles and runs correctly on IREE, so what
fails is the site alone. Verified on IREE 3.13.0rc20261016 (x86-64, ``--iree-llvmcpu-target-cpu=host``)
against ONNX Runtime 1.32 and onnx.reference:

``unique``
    ``Unique`` crashes ``iree-compile`` with SIGSEGV (in ``mlir::Type::getContext``, during the input
    conversion pipeline): https://github.com/iree-org/iree/issues/24230. The site counts the distinct
    values of the rounded feature map and scales the stream by their mean.
``maxunpool``
    ``MaxPool`` with indices → ``MaxUnpool`` (the SegNet/ENet decoder): the ONNX→torch lowering produces
    ``torch.aten.max_unpool2d``, which has no linalg lowering, so compilation fails with "failed to legalize
    operation 'torch.aten.max_unpool2d' that was explicitly marked illegal":
    https://github.com/nod-ai/AMD-SHARK-ModelDev/issues/718 (the ONNX→torch half landed in
    llvm/torch-mlir#3413, whose author notes the missing TorchToLinalg lowering).
``gridsample``
    ``GridSample`` with ``mode=nearest, align_corners=0`` on a half-pixel sampling grid returns the wrong
    neighbours: IREE rounds x.5 away from zero where ONNX (and ONNX Runtime, onnx.reference) round half to
    even, listed as a wrong-result family (``gridsample nearest``) in https://github.com/iree-org/iree/issues/24378.
``f64-output``
    A float64 output: IREE demotes f64 to f32 by default (``DemoteF64ToF32Pass``) but exports the result
    buffer as f64, so the call fails at run time with "buffer view byte length ... exceeds backing buffer
    byte length": https://github.com/iree-org/iree/issues/24180. ``--iree-input-demote-f64-to-f32=false``
    (the ``demote-f64-to-f32`` feature of the ``iree`` backend) works around it.

Example:
    >>> model, inputs, truth = iree_bug_model("gridsample")
    >>> truth.nodes, len(model.graph.node)
    (('site/grid_sample',), 20)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["IREE_BUGS", "IreeBug", "iree_bug_model"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class IreeBug:
    """Ground truth of one embedded bug."""

    name: str
    url: str
    nodes: tuple[str, ...]  # the nodes a minimal failing model keeps
    kind: str  # "crash-load", "crash-run" or "mismatch"
    summary: str


IREE_BUGS: dict[str, IreeBug] = {
    "unique": IreeBug("unique", "https://github.com/iree-org/iree/issues/24230", ("site/unique",), "crash-load",
                      "Unique crashes iree-compile (SIGSEGV)"),
    "maxunpool": IreeBug("maxunpool", "https://github.com/nod-ai/AMD-SHARK-ModelDev/issues/718", ("site/unpool",),
                         "crash-load", "MaxUnpool: torch.aten.max_unpool2d has no lowering (compile error)"),
    "gridsample": IreeBug("gridsample", "https://github.com/iree-org/iree/issues/24378", ("site/grid_sample",),
                          "mismatch", "GridSample nearest, align_corners=0: x.5 rounded away from zero"),
    "f64-output": IreeBug("f64-output", "https://github.com/iree-org/iree/issues/24180",
                          ("head/to_f64", "head/scale_f64"), "crash-run",
                          "f64 output after the default f64->f32 demotion: undersized result buffer"),
}

_C, _H, _W = 4, 8, 8


class _Graph:
    """A tiny graph builder: deterministic weights, named nodes."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], name: str, outputs: int = 1, **attrs: Any) -> list[str]:
        outs = [f"{name}:{i}" if outputs > 1 else name for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs

    def conv(self, x: str, name: str, cin: int, cout: int, k: int) -> str:
        w = self.const(f"{name}.w", (self.rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k))
                       .astype(np.float32))
        b = self.const(f"{name}.b", (0.1 * self.rng.standard_normal(cout)).astype(np.float32))
        return self.node("Conv", [x, w, b], name, kernel_shape=[k, k], pads=[k // 2] * 4)[0]


def _block(g: _Graph, x: str, name: str) -> str:
    h = g.node("Relu", [g.conv(x, f"{name}/conv1", _C, _C, 3)], f"{name}/relu")[0]
    h = g.conv(h, f"{name}/conv2", _C, _C, 3)
    return g.node("Add", [x, h], f"{name}/add")[0]


def _site(g: _Graph, bug: str, x: str, prefix: str = "site") -> str:
    """Embed ``bug`` after ``x``; its nodes, tensors and constants are named ``prefix/...``."""
    nodes, inits = len(g.nodes), len(g.inits)
    out = _site_nodes(g, bug, x)
    if prefix == "site":
        return out

    def rename(name: str) -> str:
        return prefix + name[4:] if name.startswith("site/") else name

    for node in g.nodes[nodes:]:
        node.name = rename(node.name)
        node.input[:] = [rename(i) for i in node.input]
        node.output[:] = [rename(o) for o in node.output]
    for init in g.inits[inits:]:
        init.name = rename(init.name)
    return rename(out)


def _site_nodes(g: _Graph, bug: str, x: str) -> str:
    if bug == "unique":
        scaled = g.node("Mul", [x, g.const("site/four", np.float32(4.0))], "site/scale")[0]
        rounded = g.node("Round", [scaled], "site/round")[0]
        flat = g.node("Reshape", [rounded, g.const("site/flat_shape", np.array([-1], np.int64))], "site/flatten")[0]
        values = g.node("Unique", [flat], "site/unique", sorted=1)[0]
        mean = g.node("ReduceMean", [values], "site/mean", keepdims=0)[0]
        gate = g.node("Mul", [mean, g.const("site/small", np.float32(0.01))], "site/gate")[0]
        return g.node("Add", [x, gate], "site/add")[0]
    if bug == "maxunpool":
        pooled, indices = g.node("MaxPool", [x], "site/pool", outputs=2, kernel_shape=[2, 2], strides=[2, 2])
        mixed = g.conv(pooled, "site/mix", _C, _C, 1)
        up = g.node("MaxUnpool", [mixed, indices], "site/unpool", kernel_shape=[2, 2], strides=[2, 2])[0]
        return g.node("Add", [x, up], "site/add")[0]
    if bug == "gridsample":
        # A half-pixel shifted sampling grid: x = j + 0.5 in input pixels, so every x is a tie.
        shift = (np.arange(_W, dtype=np.float32) + 1.0) / (_W / 2) - 1.0
        rows = (np.arange(_H, dtype=np.float32) * 2 + 1) / _H - 1.0  # pixel centres: exact rows
        grid = np.stack(np.meshgrid(shift, rows), axis=-1)[None].astype(np.float32)
        sampled = g.node("GridSample", [x, g.const("site/grid", grid)], "site/grid_sample", mode="nearest",
                         align_corners=0)[0]
        return g.node("Add", [x, sampled], "site/add")[0]
    if bug == "f64-output":
        return x
    raise ValueError(f"unknown IREE bug {bug!r}; choose one of {', '.join(IREE_BUGS)}")


def iree_bug_model(bug: str, *, blocks: int = 3, seed: int = 0, second: str | None = None
                   ) -> tuple[onnx.ModelProto, dict[str, np.ndarray], IreeBug]:
    """A residual CNN (``x: float32[1, 4, 8, 8]`` → ``y: float32[1, 10]``) with ``bug`` embedded after the
    first of ``blocks`` residual blocks (and ``second``, another bug, after the second block, its nodes
    prefixed ``site2/``); returns the model, seeded inputs and the ground truth of ``bug``."""
    truth = IREE_BUGS.get(bug)
    if truth is None or (second is not None and second not in IREE_BUGS):
        raise ValueError(f"unknown IREE bug {bug!r}; choose one of {', '.join(IREE_BUGS)}")
    g = _Graph(seed)
    x = g.node("Relu", [g.conv("x", "stem/conv", _C, _C, 3)], "stem/relu")[0]
    for index in range(blocks):
        x = _block(g, x, f"block{index}")
        if index == 0:
            x = _site(g, bug, x)
        if index == 1 and second is not None:
            x = _site(g, second, x, prefix="site2")
    pooled = g.node("GlobalAveragePool", [x], "head/pool")[0]
    flat = g.node("Flatten", [pooled], "head/flatten")[0]
    w = g.const("head/fc.w", (g.rng.standard_normal((_C, 10)) / 2).astype(np.float32))
    b = g.const("head/fc.b", np.zeros(10, np.float32))
    logits = g.node("Gemm", [flat, w, b], "head/fc")[0]
    y = g.node("Softmax", [logits], "y", axis=1)[0]
    outputs = [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 10])]
    if bug == "f64-output":
        wide = g.node("Cast", [logits], "head/to_f64", to=TensorProto.DOUBLE)[0]
        scaled = g.node("Mul", [wide, g.const("head/two", np.float64(2.0))], "head/scale_f64")[0]
        outputs.append(helper.make_tensor_value_info(scaled, TensorProto.DOUBLE, [1, 10]))
    graph = helper.make_graph(g.nodes, "residual_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                      [1, _C, _H, _W])],
                              outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="graphbisect")
    model.ir_version = 8
    onnx.checker.check_model(model)
    inputs = {"x": np.random.default_rng(seed + 1).standard_normal((1, _C, _H, _W)).astype(np.float32)}
    return model, inputs, truth
