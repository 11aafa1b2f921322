"""Fixtures for the backend tests: small real ONNX models, a command-backend script, shared workers."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphbisect.backends import BackendProcess

# ORT 1.31 rejects the IR version 14 that onnx 1.23 writes by default.
IR_VERSION = 8


def make_model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
               outputs: list[onnx.ValueInfoProto], initializers: list[onnx.TensorProto] | None = None,
               opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=initializers or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)


def tensor(name: str, elem: int = TensorProto.FLOAT, shape: list[int] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, [2, 3] if shape is None else shape)




@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model files by role (see each builder below)."""
    folder = tmp_path_factory.mktemp("models")
    built = {
        "relu_add": _relu_add(expose=False),
        "relu_add_probe": _relu_add(expose=True),
        "conv_relu": _conv_relu(),
        "relu_clip64": _relu_clip(TensorProto.DOUBLE, np.float64),
        "relu_clip32": _relu_clip(TensorProto.FLOAT, np.float32),
        "matmul": _matmul(),
    }
    paths = {}
    for name, proto in built.items():
        onnx.checker.check_model(proto)
        paths[name] = folder / f"{name}.onnx"
        onnx.save(proto, paths[name])
    return paths


# Tensor names are arbitrary strings: the worker must never use them as file names.
ODD_NAME = "../block/relu:0"


def _relu_add(expose: bool) -> onnx.ModelProto:
    """y = relu(x) + 1; the probe version also exposes relu's output (named ``ODD_NAME``)."""
    one = numpy_helper.from_array(np.ones((2, 3), np.float32), "one")
    nodes = [helper.make_node("Relu", ["x"], [ODD_NAME], name="relu"),
             helper.make_node("Add", [ODD_NAME, "one"], ["y"], name="add")]
    outputs = [tensor("y")] + ([tensor(ODD_NAME)] if expose else [])
    return make_model(nodes, [tensor("x")], outputs, [one])


def _conv_relu() -> onnx.ModelProto:
    """Conv followed by Relu: ORT's ConvActivationFusion fuses them at opt_level extended and above."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return make_model(nodes, [tensor("x", shape=[1, 3, 8, 8])], [tensor("y", shape=[1, 4, 8, 8])], [w, b])


def _relu_clip(elem: int, dtype: type) -> onnx.ModelProto:
    """Relu -> Clip(min=0, max=6). With float64 min/max, ORT's FuseReluClip rule throws at session creation."""
    bounds = [numpy_helper.from_array(np.array(v, dtype), n) for v, n in ((0.0, "lo"), (6.0, "hi"))]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Clip", ["r", "lo", "hi"], ["y"], name="clip")]
    return make_model(nodes, [tensor("x", elem)], [tensor("y", elem)], bounds)


def _matmul() -> onnx.ModelProto:
    """y = a @ b with symbolic dims, so mismatched inputs fail only when run."""
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")]
    return make_model(nodes, [tensor("a", shape=["n", "k"]), tensor("b", shape=["k2", "m"])],  # type: ignore[list-item]
                      [tensor("y", shape=["n", "m"])])  # type: ignore[list-item]


@pytest.fixture
def odd_name() -> str:
    return ODD_NAME


@pytest.fixture
def x23() -> np.ndarray:
    return np.array([[-1.0, 0.5, 2.0], [3.0, -4.0, 7.5]], np.float32)


@pytest.fixture(scope="module")
def ort(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendProcess]:
    """One default onnxruntime worker shared by a test module (starting one imports ORT)."""
    with BackendProcess("onnxruntime", workdir=tmp_path_factory.mktemp("ort")) as process:
        yield process


COMMAND_SCRIPT = """
import os, signal, sys, time
import numpy as np

model, inputs, outputs = sys.argv[1:4]
mode = open(model).read().strip()
feeds = dict(np.load(inputs))
print("stdout says", mode, flush=True)
print("stderr says", mode, file=sys.stderr, flush=True)
if mode == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
elif mode == "kill-worker":
    os.kill(os.getppid(), signal.SIGSEGV)
    time.sleep(30)
elif mode == "sleep":
    time.sleep(30)
elif mode == "exit3":
    print("boom: the device is on fire", file=sys.stderr)
    sys.exit(3)
elif mode == "wrong-output":
    np.savez(outputs, other=feeds["x"])
elif mode == "no-output":
    pass
elif mode == "hold-512mib":  # a program that needs memory: 512 MiB written, so resident
    held = np.ones(128 * 2**20, np.float32)
    np.savez(outputs, y=feeds["x"] * 2 + held[0] - 1)
else:
    np.savez(outputs, y=feeds["x"] * 2)
"""


@pytest.fixture(scope="session")
def command_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A program for the command backend whose behaviour is chosen by the text of its "model" file."""
    path = tmp_path_factory.mktemp("command") / "runner.py"
    path.write_text(textwrap.dedent(COMMAND_SCRIPT))
    return path


@pytest.fixture(scope="session")
def command_spec(command_script: Path) -> str:
    return f"command:cmd={sys.executable} {command_script} {{model}} {{inputs}} {{outputs}}"


@pytest.fixture
def mode_file(tmp_path: Path) -> Callable[[str], Path]:
    """A "model" for the command script: a text file holding the mode."""

    def make(mode: str) -> Path:
        path = tmp_path / f"{mode}.model"
        path.write_text(mode)
        return path

    return make
