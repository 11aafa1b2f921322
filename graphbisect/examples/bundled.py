"""The example model shipped with graphbisect: a 200-node host with a real onnxruntime LayerNorm bug.

``layernorm_bug.onnx`` is ``host_network(200, bug="layernorm_keepdims0", position="branch", seed=0)``:
the LayerNormFusion keepdims=0 bug (onnxruntime issue 30513) on a side branch that rejoins the residual
stream later, among look-alikes that fuse correctly. It is the README's main example::

    graphbisect compare "$(python -c 'import graphbisect.examples as e; print(e.example_model_path())')"

Why a branch and not the main path: a bisection along the path from ``x`` to ``y`` walks past the culprit,
so the example shows what a structural reducer buys over a layer-by-layer walk. The ground truth
(culprit nodes, passes) travels inside the file as ``metadata_props`` (see
:func:`graphbisect.examples.hosts.ground_truth`).

Regenerate both files (byte-identical on onnx 1.17 and 1.23) with
``python -m graphbisect.examples.build_bundled [--out DIR]``.
"""

from __future__ import annotations

import io
import logging
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from graphbisect.examples.hosts import HostNetwork, host_network
from graphbisect.storage.atomic import atomic_write_bytes

logger = logging.getLogger(__name__)

__all__ = [
    "EXAMPLE_INPUTS_FILE",
    "EXAMPLE_MODEL_FILE",
    "build_example",
    "example_inputs_path",
    "example_model_path",
    "npz_bytes",
    "write_example",
]

EXAMPLE_MODEL_FILE = "layernorm_bug.onnx"
EXAMPLE_INPUTS_FILE = "layernorm_bug_inputs.npz"
EXAMPLE_NODES = 200
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def example_model_path() -> Path:
    """Path of the bundled example model (package data, read-only; copy it before editing).

    >>> example_model_path().name
    'layernorm_bug.onnx'
    """
    return Path(__file__).with_name(EXAMPLE_MODEL_FILE)


def example_inputs_path() -> Path:
    """Path of the bundled ``.npz`` holding the deterministic input ``x`` (float32, ``[1, 4, 16]``)."""
    return Path(__file__).with_name(EXAMPLE_INPUTS_FILE)


def build_example() -> HostNetwork:
    """Rebuild the example in memory, exactly as shipped."""
    return host_network(EXAMPLE_NODES, bug="layernorm_keepdims0", position="branch", seed=0)


def write_example(directory: Path | None = None) -> tuple[Path, Path]:
    """Write the example model and inputs into ``directory`` (default: this package); return both paths."""
    folder = Path(directory) if directory is not None else Path(__file__).parent
    folder.mkdir(parents=True, exist_ok=True)
    host = build_example()
    model_path, inputs_path = folder / EXAMPLE_MODEL_FILE, folder / EXAMPLE_INPUTS_FILE
    atomic_write_bytes(model_path, host.model.SerializeToString())
    atomic_write_bytes(inputs_path, npz_bytes(host.inputs))
    return model_path, inputs_path


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An ``.npz`` that ``np.load`` reads, with fixed timestamps so equal arrays give equal bytes.

    ``np.savez`` stamps each member with the current time, which would make the shipped file change on
    every regeneration.
    """
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_EPOCH), member.getvalue())
    return buffer.getvalue()


