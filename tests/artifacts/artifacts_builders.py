"""Builders for the bundle tests: two real ONNX Runtime bugs, run through real isolated backends.

* **LayerNormFusion with keepdims=0** (wrong values): x[4,4] → ReduceMean(axes=[-1], keepdims=0) → Sub → Pow 2 →
  ReduceMean(keepdims=0) → Add eps → Sqrt → Div → Mul gamma → Add beta. ``opt_level=all`` fuses it into
  LayerNormalization although the mean was not kept along the reduced axis, so the broadcast is wrong;
  ``opt_level=disable`` is right.
* **ReluClipFusion with float64 bounds** (crash): Relu → Clip(min, max as double initializers). At
  ``opt_level=basic`` session creation fails "Unexpected data type for Clip 'min' input of 11".
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphbisect.artifacts import BundleContent
from graphbisect.backends import BackendProcess, BackendSpec
from graphbisect.compare import Tolerance, compare_outputs
from graphbisect.oracle.signature import signature_of

IR_VERSION = 8  # onnx 1.23 writes IR 14 by default, which ONNX Runtime 1.31 rejects
ORACLE = "onnxruntime:opt_level=disable"
MISMATCH_TARGET = "onnxruntime:opt_level=all"
CRASH_TARGET = "onnxruntime:opt_level=basic"
FIXED_TARGET = "onnxruntime:opt_level=disable"

#: Tensor names a hostile (or just unlucky) model may carry: quotes, newlines, code, markup, shell syntax.
HOSTILE = {
    "x": 'x"""\n__import__(\'os\').system(\'touch PWNED_x\')',
    "mean": "m'''; import os; os.system('touch PWNED_mean') #",
    "d": "{model} $(touch PWNED_d) `touch PWNED_d2`",
    "sq": "sq\\n\\\\ | pipe <script>alert(1)</script>",
    "var": "var\r\n# heading *bold*",
    "y": "y'); __import__('os').system('touch PWNED_y'); ('",
}


def layernorm_model(names: Mapping[str, str] | None = None) -> onnx.ModelProto:
    """The LayerNormFusion keepdims=0 bug (see the module docstring); ``names`` renames tensors."""
    n = {k: k for k in ("x", "mean", "d", "sq", "var", "ve", "std", "n", "g", "y")} | dict(names or {})
    nodes = [
        helper.make_node("ReduceMean", [n["x"]], [n["mean"]], axes=[-1], keepdims=0, name=f"mean1 {n['mean']}"),
        helper.make_node("Sub", [n["x"], n["mean"]], [n["d"]], name=f"sub {n['d']}"),
        helper.make_node("Pow", [n["d"], "two"], [n["sq"]], name="pow"),
        helper.make_node("ReduceMean", [n["sq"]], [n["var"]], axes=[-1], keepdims=0, name="mean2"),
        helper.make_node("Add", [n["var"], "eps"], [n["ve"]], name="add_eps"),
        helper.make_node("Sqrt", [n["ve"]], [n["std"]], name="sqrt"),
        helper.make_node("Div", [n["d"], n["std"]], [n["n"]], name="div"),
        helper.make_node("Mul", [n["n"], "gamma"], [n["g"]], name="mul_gamma"),
        helper.make_node("Add", [n["g"], "beta"], [n["y"]], name=f"add_beta {n['y']}"),
    ]
    initializers = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        numpy_helper.from_array(np.linspace(0.5, 1.5, 4).astype(np.float32), "gamma"),
        numpy_helper.from_array(np.linspace(-0.2, 0.2, 4).astype(np.float32), "beta"),
    ]
    graph = helper.make_graph(nodes, "layernorm_keepdims0",
                              [helper.make_tensor_value_info(n["x"], TensorProto.FLOAT, [4, 4])],
                              [helper.make_tensor_value_info(n["y"], TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


def layernorm_argmax_model() -> onnx.ModelProto:
    """The LayerNormFusion bug with a second, integer output: ``idx`` = ArgMax(x) along the last axis (computed
    from the input, so no optimization level changes it): a bundle can fail in either value class."""
    model = layernorm_model()
    model.graph.node.append(helper.make_node("ArgMax", ["x"], ["idx"], axis=-1, keepdims=0, name="argmax"))
    model.graph.output.append(helper.make_tensor_value_info("idx", TensorProto.INT64, [4]))
    return model


def relu_clip_model() -> onnx.ModelProto:
    """The ReluClipFusion float64 bug: Relu → Clip with double min/max initializers, input double[4]."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Clip", ["r", "lo", "hi"], ["y"], name="clip")]
    initializers = [numpy_helper.from_array(np.array(0.0), "lo"), numpy_helper.from_array(np.array(6.0), "hi")]
    graph = helper.make_graph(nodes, "relu_clip64", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [4])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


def build_content(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray], folder: Path, *,
                  oracle: str = ORACLE, target: str) -> BundleContent:
    """Run oracle and target for real (isolated workers) and assemble what the reduce workflow would pass."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(model, path)
    tolerance = Tolerance()
    with BackendProcess(oracle) as o, BackendProcess(target) as t:
        oracle_run, target_run = o.run(path, inputs), t.run(path, inputs)
    assert oracle_run.ok, oracle_run.describe()
    comparison = compare_outputs(oracle_run.outputs, target_run.outputs, tolerance) if target_run.ok else None
    signature = signature_of(target_run, comparison)
    message = None if target_run.ok else f"{target_run.error_type}: {target_run.message}"
    report = {
        "original_model": {"path": "original/model.onnx", "fingerprint": "f" * 64, "nodes": 40},
        "final_nodes": len(model.graph.node),
        "kept_nodes": [{"name": node.name, "op_type": node.op_type} for node in model.graph.node],
        "invocations": {"oracle": 3, "target": 17},
        "seconds": 2.5,
        "journey": [[0, 40], [6, 12], [17, len(model.graph.node)]],
        "one_minimal": True,
        "stop_reason": None,
        "versions": {"oracle": dict(oracle_run.ran_with), "target": dict(target_run.ran_with)},
        "search": {"tests": 17, "cache_hits": 4},
    }
    return BundleContent(
        model=model, inputs=dict(inputs), oracle_outputs={k: np.array(v) for k, v in oracle_run.outputs.items()},
        target_outputs={k: np.array(v) for k, v in target_run.outputs.items()},
        oracle=BackendSpec.parse(oracle), target=BackendSpec.parse(target), tolerance=tolerance,
        signature=signature, target_message=message, report=report,
    )


LN_INPUT = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
CLIP_INPUT = np.array([-1.0, 0.5, 3.0, 9.0])


def run_repro(bundle: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python repro.py`` in a fresh interpreter (this one: it has numpy and onnxruntime)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script must not need graphbisect
    return subprocess.run([sys.executable, str(bundle / "repro.py"), *args], cwd=cwd or bundle, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
