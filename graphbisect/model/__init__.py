"""Models: load (ONNX, external data, Paddle), normalize, index, and write (atomic, shared weights).

Example:
    >>> from graphbisect.model import load_model
    >>> model = load_model("resnet50.onnx")                               # doctest: +SKIP
    >>> probe = model.with_outputs(model.intermediate_names())            # doctest: +SKIP
"""

from __future__ import annotations

from graphbisect.model.graph import Model, TensorType
from graphbisect.model.io import (
    ExternalRef,
    copy_model,
    save_proto,
    strip_to_external,
    write_weights_file,
)
from graphbisect.model.load import load_model
from graphbisect.model.normalize import fingerprint, normalize_model

__all__ = [
    "ExternalRef",
    "Model",
    "TensorType",
    "copy_model",
    "fingerprint",
    "load_model",
    "normalize_model",
    "save_proto",
    "strip_to_external",
    "write_weights_file",
]
