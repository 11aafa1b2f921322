"""Which accelerator a backend spec uses, and `compare` not overlapping two runs on one.

Before: compare ran the oracle and the target at the same time whatever they ran on, so a TensorRT target
and a CUDA-provider oracle shared GPU 0 during the overlap (distorted timings and memory).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphbisect as gb
from graphbisect.backends.base import BackendSpec
from graphbisect.backends.registry import UNKNOWN_DEVICE, get, register_backend, shared_accelerator, unregister_backend

CUDA_ORT = "onnxruntime:providers=CUDAExecutionProvider;CPUExecutionProvider"


@pytest.mark.parametrize(("spec", "device"), [
    ("onnxruntime", None),
    ("onnxruntime:providers=CPUExecutionProvider", None),
    (CUDA_ORT, "gpu:0"),
    ("ort:providers=TensorrtExecutionProvider", "gpu:0"),
    ("tensorrt", "gpu:0"),
    ("trt:device=1", "gpu:1"),
    ("paddle", None),
    ("paddle:device=gpu", "gpu:0"),
    ("paddle:device=gpu:2", "gpu:2"),
    ("openvino", None),
    ("openvino:device=GPU.1", "gpu:1"),
    ("openvino:device=AUTO", "gpu:0"),
    ("reference", None),
    ("onnxoptimizer", None),
    ("iree", None),
    ("command:cmd=true", UNKNOWN_DEVICE),  # an external program: graphbisect cannot tell
])
def test_each_row_says_which_accelerator_a_spec_uses(spec: str, device: str | None) -> None:
    parsed = BackendSpec.parse(spec)
    assert get(parsed.name).accelerator(parsed) == device


@pytest.mark.parametrize(("oracle", "target", "shared"), [
    (CUDA_ORT, "tensorrt", "gpu:0"),  # the case of the report: one GPU, two engines
    (CUDA_ORT, "tensorrt:device=1", None),  # two GPUs
    ("onnxruntime:opt_level=disable", "tensorrt", None),  # the default oracle runs on the CPU
    ("reference", "onnxruntime", None),
    ("command:cmd=a", "tensorrt", "gpu:0"),  # unknown beside a GPU: assumed shared
    ("command:cmd=a", "command:cmd=b", UNKNOWN_DEVICE),
    ("command:cmd=a", "reference", None),
])
def test_oracle_and_target_share_an_accelerator(oracle: str, target: str, shared: str | None) -> None:
    assert shared_accelerator(BackendSpec.parse(oracle), BackendSpec.parse(target)) == shared


def test_a_registered_backend_that_does_not_say_is_unknown() -> None:
    register_backend("graphbisect.backends.onnxruntime:OnnxRuntime", name="doubling-accel")
    try:
        assert get("doubling-accel").accelerator(BackendSpec.parse("doubling-accel")) == UNKNOWN_DEVICE
    finally:
        unregister_backend("doubling-accel")


STAMP = """
import json, sys, time
from pathlib import Path
import numpy as np
model, inputs, outputs, log = sys.argv[1:5]
start = time.time()
time.sleep(1.0)
with np.load(inputs) as data:
    np.savez(outputs, y=data["x"] + 1)
with open(log, "a") as f:
    f.write(json.dumps([start, time.time()]) + "\\n")
"""


def test_compare_does_not_overlap_two_runs_that_may_share_an_accelerator(tmp_path: Path) -> None:
    """Two external programs (device unknown, so assumed shared) run one after the other: each records when it
    ran, and the intervals do not overlap. Before, both slept at the same time."""
    script = tmp_path / "stamp.py"
    script.write_text(STAMP)
    graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    spec = f"command:cmd={sys.executable} {script} {{model}} {{inputs}} {{outputs}} {tmp_path / 'runs.jsonl'}"
    result = gb.compare(model, oracle=spec, target=spec, inputs={"x": np.zeros(2, np.float32)}, layerwise=False)
    assert result.passed
    (_, first_end), (second_start, _) = sorted(json.loads(line) for line in (tmp_path / "runs.jsonl").open())
    assert first_end <= second_start, "the oracle's and the target's runs overlapped"
