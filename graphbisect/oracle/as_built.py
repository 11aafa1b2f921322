"""The oracle's capture, and its run of the model as built when exposing tensors may change what it computes.

Every workflow captures the oracle's intermediate tensors by running a probe model (the model with those
tensors as extra outputs). An oracle that computes the graph as written (``reference``,
``onnxruntime:opt_level=disable``: :meth:`~graphbisect.backends.registry.BackendInfo.computes_as_written`)
computes the same outputs either way, so its capture is its verdict. One that rewrites the graph (ONNX Runtime
above ``opt_level=disable``, OpenVINO) may build the probe differently from the model — ORT at ``all`` fuses
the keepdims=0 LayerNorm of onnxruntime#30513 wrongly only when its tensors are not exposed — so it also runs
the model as built, and that run's outputs are the expected ones.

:func:`capture_as_built` runs both through the caller's runner (its warm worker: no second start) and
measures how the capture's final outputs differ from the plain run's (:class:`CaptureDifference`). What to do
about a difference is each workflow's own policy: ``reduce`` stops and explains (candidates are judged against
the capture), ``passes`` does not search a region on that capture, ``precision`` takes the plain outputs as
expected and says so in ``oracle_expected``, ``compare`` takes the plain verdict and says which side a
probe-masking flip comes from.

"Differ" is judged with the workflow's tolerance, the rule its verdicts use: a fused kernel's last bits are
no different computation. :attr:`CaptureDifference.identical` still says which outputs are bit-identical.

Example:
    >>> runs = capture_as_built(lambda path, out: proc.run(path, feeds, output_dir=out),   # doctest: +SKIP
    ...                         probe, model_path, outputs=["y"], rewrites=True, tolerance=Tolerance())
    >>> runs.expected(["y"]), runs.differs                                                   # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphbisect.backends.base import Phase, RunResult, RunStatus
from graphbisect.backends.machine import memory_hint, out_of_memory
from graphbisect.compare import Comparison, Tolerance, compare_outputs
from graphbisect.errors import BackendError
from graphbisect.storage.values import bit_identical

__all__ = ["CaptureDifference", "OracleIncomplete", "OracleRuns", "Runner", "capture_as_built", "capture_difference",
           "oracle_failed_hint", "require_as_built", "require_outputs"]

log = logging.getLogger(__name__)

#: One oracle run: (model file, folder its outputs are written to or None) -> the run.
Runner = Callable[[Path, "Path | None"], RunResult]


@dataclass(frozen=True)
class CaptureDifference:
    """How the capture's final outputs differ from the plain run's, measured on both runs.

    ``comparison``: the capture's outputs against the plain run's, judged with the workflow's tolerance;
    ``identical``: the outputs whose values are bit-identical in both runs.
    """

    comparison: Comparison
    identical: tuple[str, ...]

    @property
    def differs(self) -> bool:
        """Whether some output differs beyond the tolerance (the rule every workflow's verdict uses)."""
        return not self.comparison.passed

    def describe(self) -> str:
        """One clause for a message, e.g. ``differ on 'y' (mismatch, 12/16 elements, max abs 1.73)``."""
        outputs = self.comparison.outputs
        if len(self.identical) == len(outputs):
            return "are bit-identical"
        worst = self.comparison.worst
        assert worst is not None
        numbers = f"{worst.mismatches}/{worst.numel} elements, max abs {worst.max_abs:.3g}"
        if not self.differs:
            return f"differ only within the tolerance (max abs {worst.max_abs:.3g})"
        names = ", ".join(repr(s.name) for s in self.comparison.failing[:3])
        return f"differ on {names} ({worst.kind.value}, {numbers})"

    def why(self, spec: object) -> str:
        """The sentence every workflow uses for this difference (``spec``: the oracle)."""
        return (f"the oracle {spec} computes the model differently when its intermediate tensors are exposed: its "
                f"capture and its run of the model as built {self.describe()}")

    def to_json(self) -> dict[str, Any]:
        return {"differs": self.differs, "identical": list(self.identical), "description": self.describe(),
                "outputs": [s.to_json() for s in self.comparison.outputs]}


def capture_difference(captured: Mapping[str, Any], plain: Mapping[str, Any], names: Sequence[str],
                       tolerance: Tolerance) -> CaptureDifference:
    """How the capture's outputs ``names`` differ from the plain run's (each a name -> value mapping)."""
    comparison = compare_outputs(captured, plain, tolerance, names)
    identical = tuple(name for name in names
                      if name in captured and name in plain and bit_identical(captured[name], plain[name]))
    return CaptureDifference(comparison, identical)


@dataclass(frozen=True)
class OracleRuns:
    """The oracle's capture and, when it rewrites the graph, its run of the model as built.

    ``plain``: None when the capture is the verdict (the oracle computes the graph as written) or when the
    capture failed (nothing to compare it with: the caller decides whether the model itself runs).
    ``difference``: how the two runs' outputs differ; None without a successful plain run.
    """

    capture: RunResult
    plain: RunResult | None = None
    difference: CaptureDifference | None = None

    @property
    def verdict(self) -> RunResult:
        """The run whose outputs are the oracle's verdict: the plain run when there is one."""
        return self.plain if self.plain is not None else self.capture

    @property
    def differs(self) -> bool:
        """Whether the capture computes otherwise than the oracle as built (beyond the tolerance)."""
        return self.difference is not None and self.difference.differs

    def expected(self, names: Sequence[str]) -> dict[str, Any]:
        """The verdict's outputs ``names`` (the plain run's when there is one, else the capture's)."""
        outputs = self.verdict.outputs
        return {name: outputs[name] for name in names}

    def require_ok(self, spec: object, what: str = "the model") -> None:
        """Raise :class:`~graphbisect.errors.BackendError` when the oracle ``spec`` failed on ``what``: its capture
        (with :func:`oracle_failed_hint`) or, though the capture ran, its plain run (:func:`require_as_built`)."""
        if not self.capture.ok:
            raise BackendError(f"the oracle {spec} failed on {what}: {self.capture.describe()}",
                               hint=oracle_failed_hint(spec, self.capture))
        if self.plain is not None:
            require_as_built(self.plain, spec)


def require_as_built(run: RunResult, spec: object) -> None:
    """Raise :class:`~graphbisect.errors.BackendError` when ``run``, the oracle ``spec``'s run of the model as
    built, failed (its capture ran, so the rewrite it does on the model is what fails)."""
    if not run.ok:
        raise BackendError(f"the oracle {spec} failed on the model as built, though it ran it with its "
                           f"intermediate tensors exposed: {run.describe()}",
                           hint="choose an oracle that computes the graph as written, e.g. oracle='reference' "
                           "or oracle='onnxruntime:opt_level=disable'",
                           cli_hint="choose an oracle that computes the graph as written, e.g. --oracle "
                           "reference or --oracle onnxruntime:opt_level=disable")


def oracle_failed_hint(spec: object, run: RunResult) -> str:
    """The hint for the oracle ``spec`` whose ``run`` of the model failed, one for every workflow.

    It names an oracle other than ``spec`` (it used to offer the one that had just failed). A crash that says
    memory ran out (:func:`graphbisect.backends.machine.out_of_memory`: under ``ulimit -v`` a library cannot map its
    code or allocate a buffer) is the machine's: the hint says to raise the limit, not to choose another
    oracle. A crash while running may be the inputs' fault, not the oracle's: a value the model cannot take
    (an index past the axis it indexes, two inputs whose sizes disagree) crashes every correct backend alike,
    and seeded random inputs, used when none are given, are where that happens (an embedding table given as an
    input has no size to draw its indices below).

    Example:
        >>> oracle_failed_hint("reference", RunResult(RunStatus.CRASH, phase=Phase.LOAD))
        'the oracle must run the model correctly; choose another oracle, e.g. --oracle onnxruntime:opt_level=disable'
    """
    if run.status is RunStatus.CRASH and out_of_memory(f"{run.error_type}: {run.message}"):
        return memory_hint()  # the machine's memory, not the oracle: another oracle would not help (issue 36)
    name = getattr(spec, "name", None) or str(spec).partition(":")[0]
    other = "onnxruntime:opt_level=disable" if name == "reference" else "reference"
    another = f"choose another oracle, e.g. --oracle {other}"
    if run.status is RunStatus.CRASH and run.phase is Phase.RUN:
        return ("it crashed while running, which input values the model cannot take cause too (an index out of "
                "range, sizes that disagree): without --inputs they are seeded random, so pass real ones with "
                f"--inputs FILE (and --shape NAME:DIMS for dynamic dims); if the inputs are right, {another}")
    return f"the oracle must run the model correctly; {another}"


class OracleIncomplete(BackendError):
    """The oracle's run completed without a value for some graph outputs: there is no expected value to
    judge the target by (``compare`` raises it as its ``OracleFailed``)."""


def require_outputs(run: RunResult, names: Sequence[str], spec: object) -> None:
    """Raise :class:`OracleIncomplete` when ``run``, the oracle ``spec``'s completed run, lacks any of the graph
    outputs ``names``. Judged without it, the target was said to be "missing" the output (compare: FAIL,
    divergence) and reduce stopped with an internal KeyError, for an oracle that never produced it.
    """
    missing = [name for name in names if name not in run.outputs] if run.ok else []
    if missing:
        listed = ", ".join(repr(name) for name in missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise OracleIncomplete(
            f"the oracle {spec} ran the model but gave no value for graph output(s) {listed}, so the target's "
            "cannot be judged",
            hint="the oracle must produce every graph output (a command backend writes each one, by name, into "
                 "{outputs}); or choose another oracle, e.g. --oracle reference")


def capture_as_built(runner: Runner, probe: Path, model: Path, *, outputs: Sequence[str], rewrites: bool,
                     tolerance: Tolerance, spec: object, capture_dir: Path | None = None,
                     plain_dir: Path | None = None, on_plain: Callable[[], None] | None = None) -> OracleRuns:
    """Run the capture (``probe``, outputs into ``capture_dir``) and, when the oracle ``rewrites`` the graph
    and the capture ran, the model as built (``model``, into ``plain_dir``), both through ``runner``.

    ``on_plain`` is called before the plain run (a stage line). A failed capture or plain run is returned,
    not raised: compare turns it into ``OracleFailed``, the other workflows into their own errors. A run that
    completed without some of the graph ``outputs`` raises :class:`OracleIncomplete` (``spec`` names the oracle).
    """
    capture = runner(probe, capture_dir)
    require_outputs(capture, outputs, spec)
    if not capture.ok or not rewrites:
        return OracleRuns(capture)
    if on_plain is not None:
        on_plain()
    plain = runner(model, plain_dir)
    require_outputs(plain, outputs, spec)
    if not plain.ok:
        return OracleRuns(capture, plain)
    difference = capture_difference(capture.outputs, plain.outputs, outputs, tolerance)
    if difference.differs:
        log.info("the oracle's capture and its run of the model as built %s", difference.describe())
    return OracleRuns(capture, plain, difference)
