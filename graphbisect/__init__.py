"""graphbisect: turn "my model gives wrong results on backend X" into a minimal failing model artifact.

The public API (see ``docs/api.md``): every CLI command is a function here, with the CLI's defaults.

Example:
    >>> import graphbisect as gb
    >>> result = gb.reduce("model.onnx", "bug-report", target="openvino")    # doctest: +SKIP
    >>> result.final_nodes, result.bundle                                     # doctest: +SKIP

Importing this package needs only numpy: backend workers import it, maybe under another interpreter.
"""

from __future__ import annotations

# The subpackages whose names the API's functions take are imported first, so that importing one of their
# modules later does not rebind ``graphbisect.compare`` (and the others) to the subpackage. They import
# only the standard library and numpy here.
import graphbisect.compare
import graphbisect.precision
import graphbisect.releases
import graphbisect.tactics
import graphbisect.triage  # noqa: F401
from graphbisect._version import __version__
from graphbisect.api import (
    audit,
    compare,
    load_model,
    passes,
    precision,
    reduce,
    releases,
    tactics,
    triage,
    verify,
)
from graphbisect.backends.base import Runtime
from graphbisect.backends.registry import register_backend, unregister_backend
from graphbisect.errors import (
    BackendError,
    BackendUnavailableError,
    GraphBisectError,
    InputError,
    ModelError,
    OptionError,
    SpecError,
)

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "GraphBisectError",
    "InputError",
    "ModelError",
    "OptionError",
    "Runtime",
    "SpecError",
    "__version__",
    "audit",
    "compare",
    "load_model",
    "passes",
    "precision",
    "reduce",
    "register_backend",
    "releases",
    "tactics",
    "triage",
    "unregister_backend",
    "verify",
]
