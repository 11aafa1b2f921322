"""The public façade of graphbisect.model is pinned: changing it is a deliberate act."""

from __future__ import annotations

import graphbisect.model as model_pkg


def test_model_public_api_is_pinned() -> None:
    assert set(model_pkg.__all__) == {
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
    }
    assert all(hasattr(model_pkg, name) for name in model_pkg.__all__)
