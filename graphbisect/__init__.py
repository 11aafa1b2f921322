"""graphbisect: turn "my model gives wrong results on backend X" into a minimal failing model artifact.

The public API (see ``docs/api.md``): every CLI command is a function here, with the CLI's defaults.

Example:
    >>> import graphbisect as gb
    >>> result = gb.reduce("model.onnx", "bug-report", target="openvino")    # doctest: +SKIP
    >>> result.final_nodes, result.bundle                                     # doctest: +SKIP

Importing this package imports only the standard library; each name of the API is imported on first use
(backend workers and zygotes import the package too, maybe under another interpreter).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from graphbisect._version import __version__

if TYPE_CHECKING:
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

#: Where each name of the API is defined: imported on first use (:func:`__getattr__`), so that a process that
#: imports one module of the package (a backend worker, a zygote, ``python -m graphbisect --version``) pays for
#: that module and not for every workflow's (~50 ms of a zygote's ~140 ms on a 2-core Xeon).
_HOMES = {
    **dict.fromkeys(("audit", "compare", "load_model", "passes", "precision", "reduce", "releases", "tactics",
                     "triage", "verify"), "graphbisect.api"),
    "Runtime": "graphbisect.backends.base",
    **dict.fromkeys(("register_backend", "unregister_backend"), "graphbisect.backends.registry"),
    **dict.fromkeys(("BackendError", "BackendUnavailableError", "GraphBisectError", "InputError", "ModelError",
                     "OptionError", "SpecError"), "graphbisect.errors"),
}


def __getattr__(name: str) -> Any:
    """A name of the API, imported from its module on first use; else a subpackage (``graphbisect.model``),
    imported on first use as an attribute."""
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value
    if name.startswith("_"):  # a tool's probe (``__wrapped__``, ``_pytestfixturefunction``): no module
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """This package's module: the subpackages named like the API's functions (``graphbisect.compare``, ...)
    never rebind the function's name when one of their modules is first imported (the import system sets a
    loaded subpackage as an attribute of its parent)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _HOMES.get(name) == "graphbisect.api":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
