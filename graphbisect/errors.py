"""One exception hierarchy for graphbisect.

Every error names the thing that is wrong (a file, a node, a tensor, a backend spec) and carries a
``hint`` that says how to fix it. The CLI prints both and exits with code 2. Wrap lower-level
exceptions with ``raise GraphBisectError(...) from exc``: a debugging tool must never erase the cause.

Code that both front ends reach speaks each one's language: ``hint`` names the API's arguments
(``oracle=``), and ``cli_hint``, where the fix is written otherwise on the command line, names the flags
(``--oracle``); the CLI prints ``cli_hint`` in place of ``hint``.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "GraphBisectError",
    "InputError",
    "ModelError",
    "OptionError",
    "SpecError",
]


class GraphBisectError(Exception):
    """Base class of every error graphbisect raises on purpose.

    Example:
        >>> err = ModelError("model.onnx is not an ONNX model", hint="pass a .onnx file or a Paddle model")
        >>> str(err)
        'model.onnx is not an ONNX model\\n  hint: pass a .onnx file or a Paddle model'
    """

    def __init__(self, message: str, *, hint: str | None = None, cli_hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        self.cli_hint = cli_hint
        super().__init__(message if hint is None else f"{message}\n  hint: {hint}")


class ModelError(GraphBisectError):
    """The model cannot be loaded, normalized or materialized (bad file, missing external data, ...)."""


class InputError(GraphBisectError):
    """Model inputs are missing, of the wrong name, dtype or shape, or the inputs file is unreadable."""


class OptionError(InputError, ValueError):
    """An option's value is out of its allowed range (``jobs=0``, a negative budget, an unknown name).

    Raised when an options object is built (``ReduceOptions(jobs=0)``), before anything runs; the message
    names the option, the value and what is allowed. Also a ``ValueError``, what Python code expects of a
    bad argument value.
    """


class SpecError(GraphBisectError):
    """A backend spec string (``NAME[:key=value,...]``) or one of its options is invalid."""


class BackendUnavailableError(GraphBisectError):
    """The backend's library is not installed here (or the machine lacks the device it needs)."""


class BackendError(GraphBisectError):
    """graphbisect could not drive a backend at all (worker would not start, protocol broke).

    A backend that crashes or returns wrong values on a model is *not* an error: that is a result
    (see :class:`graphbisect.backends.RunResult`), and possibly the bug the user is hunting.
    """
