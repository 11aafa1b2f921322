"""onnxoptimizer's passes, then ONNX Runtime with its own optimizations off: a third pass pipeline on CPU.

Runs inside a worker process; imports only the standard library, numpy and graphbisect's worker-safe
modules at module level, and onnx, onnxoptimizer and onnxruntime lazily in :meth:`OnnxOptimizer.load`.

Spec options (see the registry): ``passes`` (``;``-separated, default
``onnxoptimizer.get_fuse_and_elimination_passes()``), ``disabled`` (removed from that list), ``threads``,
``save_optimized``. Every name is validated against ``onnxoptimizer.get_available_passes()``: onnxoptimizer
raises on unknown names anyway, but only when the model is loaded, and with no suggestion.

**Fired passes.** The enabled passes are applied one at a time, in order, each to the output of the one
before (what ``onnxoptimizer.optimize(model, passes)`` does without ``fixed_point``), and a pass *fired* when
the serialized graph changed. That costs one ``optimize`` call (a protobuf round trip of the model) per
enabled pass instead of one in all: a few milliseconds per pass for models of thousands of nodes, always
paid, so the report is exact (a pass that only fires after another one fired is seen to fire).

The optimized model then runs on ONNX Runtime with ``ORT_DISABLE_ALL``, so the result is onnxoptimizer's
alone (ORT's mandatory transformers, e.g. cast insertion, still run).

Example (inside a worker, or directly):
    >>> rt = OnnxOptimizer({"passes": "eliminate_identity;fuse_consecutive_transposes"}, "/tmp")  # doctest: +SKIP
    >>> rt.load("model.onnx", None); rt.info()["fired_passes"]                                  # doctest: +SKIP
    ['eliminate_identity']
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from graphbisect.backends.onnxruntime import OnnxRuntime
from graphbisect.backends.worker import option_flag, unknown_names_hint
from graphbisect.errors import SpecError

__all__ = ["OnnxOptimizer", "OptimizerOptions", "check_pass_names"]

logger = logging.getLogger(__name__)

_OPTIONS = ("passes", "disabled", "threads", "save_optimized")


def _split(text: str) -> list[str]:
    return list(dict.fromkeys(part.strip() for part in text.split(";") if part.strip()))


@dataclass(frozen=True)
class OptimizerOptions:
    """The spec's options, parsed once for the runtime and for ``repro.py``'s configuration.

    ``passes`` is empty when the spec names none: the installed onnxoptimizer's fuse-and-elimination list
    applies (resolved where the passes run, since it depends on the onnxoptimizer version there).

    Example:
        >>> OptimizerOptions.parse({"passes": "fuse_pad_into_pool;nop;nop", "threads": "1"}).passes
        ('fuse_pad_into_pool', 'nop')
    """

    passes: tuple[str, ...] = ()
    disabled: tuple[str, ...] = ()
    threads: str | None = None
    save_optimized: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> OptimizerOptions:
        """Parse a spec's options (pass names are checked later, against the installed onnxoptimizer)."""
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise SpecError(f"onnxoptimizer has no option {', '.join(unknown)}", hint=f"valid: {', '.join(_OPTIONS)}")
        return cls(passes=tuple(_split(options.get("passes", ""))), disabled=tuple(_split(options.get("disabled", ""))),
                   threads=options.get("threads"), save_optimized=option_flag(options, "save_optimized"))

    def ort_options(self) -> dict[str, str]:
        """The options of the ONNX Runtime that runs the optimized model: its own optimizations off."""
        return {"opt_level": "disable", **({"threads": self.threads} if self.threads is not None else {})}


def check_pass_names(names: Sequence[str], available: Sequence[str], option: str) -> None:
    """Raise :class:`SpecError` for names onnxoptimizer does not have, with close matches in the hint.

    Example:
        >>> check_pass_names(["eliminate_identity"], ["eliminate_identity", "nop"], "passes")
        >>> try:
        ...     check_pass_names(["eliminate_identiy"], ["eliminate_identity"], "passes")
        ... except SpecError as err:
        ...     print(err.message)
        onnxoptimizer has no pass 'eliminate_identiy' (option passes=)
    """
    unknown = [name for name in names if name not in set(available)]
    if not unknown:
        return
    raise SpecError(f"onnxoptimizer has no pass {', '.join(map(repr, unknown))} (option {option}=)",
                    hint=unknown_names_hint(unknown, available, "`python -c \"import onnxoptimizer; "
                                                               "print(onnxoptimizer.get_available_passes())\"`"))


class OnnxOptimizer:
    """onnxoptimizer's passes followed by ONNX Runtime without optimizations (a :class:`Runtime`).

    ``info()`` reports ``passes`` (enabled, in order), ``disabled``, ``fired_passes`` (those that changed
    the graph), ``fired_required`` (always empty: every onnxoptimizer pass can be left out) and, with
    ``save_optimized=1``, ``optimized_model``.
    """

    def __init__(self, options: Mapping[str, str], workdir: str) -> None:
        parsed = OptimizerOptions.parse(options)
        self._onnx: Any = importlib.import_module("onnx")
        self._optimizer: Any = importlib.import_module("onnxoptimizer")
        self.workdir = Path(workdir)
        self.passes = list(parsed.passes) or list(self._optimizer.get_fuse_and_elimination_passes())
        self.disabled = list(parsed.disabled)
        self.save_optimized = parsed.save_optimized
        self._ort = OnnxRuntime(parsed.ort_options(), workdir)
        self._info: dict[str, Any] = {}

    @property
    def enabled(self) -> list[str]:
        """The passes that run, in order."""
        return [name for name in self.passes if name not in set(self.disabled)]

    def validate(self) -> None:
        """Check ``passes=`` and ``disabled=`` against ``onnxoptimizer.get_available_passes()``."""
        available = list(self._optimizer.get_available_passes())
        check_pass_names(self.passes, available, "passes")
        check_pass_names(self.disabled, available, "disabled")

    def registered_passes(self) -> list[str]:
        """The passes this spec would apply (``passes=``, else this onnxoptimizer's fuse-and-elimination list)."""
        return list(self.passes)

    def load(self, model: str, outputs: Sequence[str] | None) -> None:
        """Optimize ``model`` pass by pass, save it, and create the ORT session on the result."""
        self.validate()
        proto = self._onnx.load(model)  # external data resolves against the model's folder
        optimized, fired = self._optimize(proto)
        path = self.workdir / "optimized.onnx"
        self._onnx.save(optimized, str(path))
        self._ort.load(str(path), outputs)
        self._info = {"passes": self.enabled, "disabled": list(self.disabled), "fired_passes": fired,
                      "fired_required": [], "nodes_before": len(proto.graph.node),
                      "nodes_after": len(optimized.graph.node)}
        if self.save_optimized:
            self._info["optimized_model"] = str(path)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the optimized model on ONNX Runtime (feeds the model does not declare are ignored)."""
        return self._ort.run(inputs)

    def info(self) -> dict[str, Any]:
        """Versions, the enabled and disabled passes, and which passes fired on the last model."""
        return {"library": "onnxoptimizer", "library_version": _version(), **self._info,
                "onnxruntime_version": self._ort.info()["library_version"]}

    def _optimize(self, proto: Any) -> tuple[Any, list[str]]:
        """Apply the enabled passes one at a time; a pass fired when it changed the serialized graph."""
        fired = []
        current = proto
        before = current.graph.SerializeToString()
        for name in self.enabled:
            current = self._optimizer.optimize(current, [name])
            after = current.graph.SerializeToString()
            if after != before:
                fired.append(name)
            before = after
        logger.debug("onnxoptimizer: %d of %d passes fired: %s", len(fired), len(self.enabled), fired)
        return current, fired


def _version() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("onnxoptimizer")
    except importlib.metadata.PackageNotFoundError:
        return None
