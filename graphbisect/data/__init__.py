"""Data: model inputs (load, generate, validate, save) and the on-disk activation store.

The input functions (:mod:`.inputs`) need ``onnx`` and are imported when first used, so a backend worker
(which has only numpy, perhaps under another interpreter) can read the activation store
(:mod:`.store`, numpy only) through this package.

Example:
    >>> from graphbisect.data import random_inputs, save_inputs
    >>> save_inputs("inputs.npz", random_inputs(model, seed=0))     # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from graphbisect.data.store import ActivationStore, StoredTensor

if TYPE_CHECKING:
    from graphbisect.data.inputs import (
        SUPPORTED_FORMATS,
        ChosenDim,
        chosen_dims,
        dims_note,
        index_bounds,
        load_inputs,
        parse_shapes,
        random_input_notes,
        random_inputs,
        save_inputs,
        validate_inputs,
    )

__all__ = [
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
]

_INPUTS = frozenset(__all__) - {"ActivationStore", "StoredTensor"}


def __getattr__(name: str) -> Any:
    """The input functions, imported from :mod:`.inputs` on first use (it imports onnx)."""
    if name in _INPUTS:
        return getattr(importlib.import_module("graphbisect.data.inputs"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
