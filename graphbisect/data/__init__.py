"""Data: model inputs (load, generate, validate, save) and the on-disk activation store.

Example:
    >>> from graphbisect.data import random_inputs, save_inputs
    >>> save_inputs("inputs.npz", random_inputs(model, seed=0))     # doctest: +SKIP
"""

from __future__ import annotations

from graphbisect.data.inputs import (
    SUPPORTED_FORMATS,
    index_bounds,
    load_inputs,
    parse_shapes,
    random_input_notes,
    random_inputs,
    save_inputs,
    validate_inputs,
)
from graphbisect.data.store import ActivationStore, StoredTensor

__all__ = [
    "SUPPORTED_FORMATS",
    "ActivationStore",
    "StoredTensor",
    "index_bounds",
    "load_inputs",
    "parse_shapes",
    "random_input_notes",
    "random_inputs",
    "save_inputs",
    "validate_inputs",
]
