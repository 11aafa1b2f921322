"""A folder of real failing models for the triage tests, and a session-wide local triage of it.

Two LayerNorm keepdims=0 hosts at different positions and seeds (one bug), a FuseReluClip crash (another),
a healthy host (passed) and a file that is not a model (error).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from graphbisect.examples import host_network

MODELS = (
    ("ln_main", 150, "layernorm_keepdims0", "main", 0),
    ("ln_branch", 200, "layernorm_keepdims0", "branch", 1),
    ("relu_clip", 150, "relu_clip_f64", "main", 0),
    ("healthy", 150, None, "main", 0),
)


def write_models(folder: Path) -> Path:
    """Write the models (with their inputs as NAME.npz) and a broken file into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, nodes, bug, position, seed in MODELS:
        host = host_network(nodes, bug=bug, position=position, seed=seed)
        onnx.save(host.model, str(folder / f"{name}.onnx"))
        np.savez(folder / f"{name}.npz", **host.inputs)
    (folder / "broken.onnx").write_bytes(b"this is not an onnx model")
    return folder
