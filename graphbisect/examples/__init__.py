"""Example models with real onnxruntime bugs: the README example, test fixtures and benchmark hosts.

- :mod:`~graphbisect.examples.patterns`: the bug patterns and their healthy look-alikes, emitted into a
  :class:`GraphBuilder` (table :data:`BUGS`).
- :mod:`~graphbisect.examples.hosts`: :func:`host_network`, 100 to 50,000+ node hosts with the bugs on the
  main path, a branch, behind a mask, or split over two distant sites, with ground truth.
- :mod:`~graphbisect.examples.zoo`: the onnx "light" model zoo, a transformer encoder, a wide model.
- :mod:`~graphbisect.examples.bundled`: the shipped ``layernorm_bug.onnx`` and its inputs.
- :mod:`~graphbisect.examples.quantized`: an int8-weight MatMul and a QDQ network that OpenVINO computes
  otherwise than the graph says (dynamic quantization, QuantizeLinear rounding).

>>> from graphbisect.examples import example_model_path, host_network
>>> host = host_network(150, bug="relu_clip_f64", position="branch")
>>> host.kind, example_model_path().name
('crash', 'layernorm_bug.onnx')
"""

from __future__ import annotations

from graphbisect.examples.bundled import build_example, example_inputs_path, example_model_path
from graphbisect.examples.hosts import POSITIONS, HostNetwork, ground_truth, host_inputs, host_network
from graphbisect.examples.patterns import BUGS, LOOKALIKES, BugSite, GraphBuilder, pattern_model
from graphbisect.examples.zoo import light_models, transformer, transformer_inputs, wide_model

__all__ = [
    "BUGS",
    "LOOKALIKES",
    "POSITIONS",
    "BugSite",
    "GraphBuilder",
    "HostNetwork",
    "build_example",
    "example_inputs_path",
    "example_model_path",
    "ground_truth",
    "host_inputs",
    "host_network",
    "light_models",
    "pattern_model",
    "transformer",
    "transformer_inputs",
    "wide_model",
]
