"""The public façade of graphbisect.data is pinned: changing it is a deliberate act."""

from __future__ import annotations

import graphbisect.data as data_pkg


def test_data_public_api_is_pinned() -> None:
    assert set(data_pkg.__all__) == {
        "SUPPORTED_FORMATS",
        "ActivationStore",
        "ChosenDim",
        "StoredTensor",
        "chosen_dims",
        "dims_note",
        "index_bounds",
        "load_inputs",
        "parse_shapes",
        "random_input_notes",
        "random_inputs",
        "save_inputs",
        "validate_inputs",
    }
    assert all(hasattr(data_pkg, name) for name in data_pkg.__all__)
