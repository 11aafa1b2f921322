"""The public Python API: every CLI job in a few lines, with the CLI's defaults.

Each function takes what a user has — a model as a path, an ``onnx.ModelProto``, a Paddle inference model
folder or an already loaded :class:`~graphbisect.model.Model`; inputs as a dict of arrays, a file (``.npz``,
``.npy``, ``.pb``, Polygraphy JSON) or nothing (seeded random inputs) — and returns a result dataclass whose
attributes are the fields of the command's ``--json`` output (``result.to_json()`` is that JSON). Errors are
:class:`~graphbisect.errors.GraphBisectError` subclasses with a ``hint``: :class:`~graphbisect.errors.ModelError`
(the model), :class:`~graphbisect.errors.InputError` (inputs), its subclass :class:`~graphbisect.errors.OptionError`
(an option out of its range, e.g. ``jobs=0``, raised before anything runs; also a ``ValueError``),
:class:`~graphbisect.errors.SpecError`
(a backend spec), :class:`~graphbisect.errors.BackendUnavailableError` (library not installed) and
:class:`~graphbisect.errors.BackendError` (a backend could not be driven at all). A backend that crashes or
computes wrong values is a *result*, not an error.

Example:
    >>> import graphbisect as gb
    >>> found = gb.compare("model.onnx", target="openvino")                 # doctest: +SKIP
    >>> found.passed, found.to_json()["first_divergence"]                     # doctest: +SKIP
    >>> bug = gb.reduce("model.onnx", "bug-report", target="ort:opt_level=all")  # doctest: +SKIP
    >>> bug.final_nodes, bug.bundle                                           # doctest: +SKIP

This module imports only the standard library at import time: every workflow is imported when called,
so ``import graphbisect`` stays cheap (backend workers import the package too). The CLI does not go through
this module: both call the workflows (:mod:`graphbisect.cli`).
"""

from __future__ import annotations

import functools
import inspect
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, Union

from graphbisect.backends.registry import DEFAULT_ORACLE, DEFAULT_TARGET
from graphbisect.settings.options import (
    EXIT_CODE,
    INVOCATIONS,
    JOBS,
    SEED,
    TIMEOUT,
    Allowed,
    pattern,
    real,
    seconds,
    whole,
)

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from graphbisect.checker import Audit
    from graphbisect.compare import Tolerance
    from graphbisect.data import ChosenDim
    from graphbisect.engine import ProgressEvent
    from graphbisect.model import Model
    from graphbisect.tactics import TacticRecord
    from graphbisect.triage.outcome import ModelOutcome
    from graphbisect.workflows.compare import CompareResult
    from graphbisect.workflows.passes import PassesResult
    from graphbisect.workflows.precision import PrecisionResult
    from graphbisect.workflows.reduce import ReduceOptions, ReduceResult
    from graphbisect.workflows.releases import ReleaseSearch
    from graphbisect.workflows.tactics import IsolateResult, RecordResult, ReplayResult
    from graphbisect.workflows.triage import TriageResult
    from graphbisect.workflows.verify import Verification

__all__ = [
    "DEFAULT_ORACLE",
    "DEFAULT_TARGET",
    "InputsSource",
    "ModelSource",
    "OutputCheck",
    "Tactics",
    "audit",
    "compare",
    "load_model",
    "passes",
    "precision",
    "reduce",
    "releases",
    "tactics",
    "triage",
    "verify",
]

#: A model: an ONNX file or Paddle inference model (folder or path prefix), a ``ModelProto``, or a loaded Model.
ModelSource = Union[str, "os.PathLike[str]", "onnx.ModelProto", "Model"]
#: Inputs: a dict of arrays by input name, a file (.npz, .npy, .pb file or folder, JSON), or None (seeded random).
InputsSource = Union[Mapping[str, "np.ndarray"], str, "os.PathLike[str]", None]
#: A Python check: ``check(outputs, expected) -> bool``. ``outputs``: the target's values by tensor name (a
#: ``dict[str, numpy.ndarray]``: the model's outputs in ``compare``, the tensors a candidate computes in
#: ``reduce``); ``expected``: the oracle's values of the same tensors. True when the outputs are acceptable.
OutputCheck = Callable[[Mapping[str, "np.ndarray"], Mapping[str, "np.ndarray"]], bool]

_P = ParamSpec("_P")
_R = TypeVar("_R")


# ----------------------------------------------------------------------------------- the arguments' types
# Every argument of the functions below is checked against what it accepts before anything runs, by name, in
# this one table (issue 36: a number for a path, a list for a tolerance or ``check=42`` raised AttributeError or
# numpy's ValueError, the last only after both backends had run; ``trust="no"`` trusted). A parameter whose
# default is None accepts None too. Ranges are the options' own (graphbisect/settings/options.py).
def _is_path(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike))


def _is_model_source(value: Any) -> bool:
    if _is_path(value):
        return True
    import onnx

    from graphbisect.model import Model

    return isinstance(value, (onnx.ModelProto, Model))


def _is_arrays(value: Any) -> bool:
    return isinstance(value, Mapping) and all(isinstance(name, str) for name in value)


def _is_dims(value: Any) -> bool:
    return (isinstance(value, Sequence) and not isinstance(value, (str, bytes))
            and all(isinstance(d, numbers.Integral) and not isinstance(d, bool) and int(d) >= 0 for d in value))


def _is_tolerance(value: Any) -> bool:
    from graphbisect.compare import Tolerance

    return isinstance(value, Tolerance)


def _is_spec(value: Any) -> bool:
    from graphbisect.backends.base import BackendSpec

    return isinstance(value, (str, BackendSpec))


def _is_record(value: Any) -> bool:
    from graphbisect.tactics import TacticRecord

    return _is_path(value) or isinstance(value, TacticRecord)


def _is_bool(value: Any) -> bool:  # numpy's bool too; not "no", which is true
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))


def _path_to(example: str) -> Allowed:
    return Allowed("a path (a str or os.PathLike)", _is_path, repr(example))


_FLAG = Allowed("True or False", _is_bool, "True")
_CALLBACK = Allowed("a callable", callable, "print")
_CHECK = Allowed("a callable check(outputs, expected) -> bool", callable, "lambda outputs, expected: True")
#: What each argument accepts, by name (see :func:`_checked`).
_ARGUMENTS: dict[str, Allowed] = {
    "model": Allowed("a model: the path (a str or os.PathLike) of an ONNX file or Paddle model, an "
                     "onnx.ModelProto or a graphbisect Model", _is_model_source, "'model.onnx'"),
    "output": _path_to("bug-report"), "bundle": _path_to("bug-report"), "input_dir": _path_to("models/"),
    "workdir": _path_to("work"), "cache": _path_to("cache"),
    "inputs": Allowed("a mapping of input names to arrays, or the path (a str or os.PathLike) of an inputs file "
                      "(.npz, .npy, .pb, JSON)", lambda v: _is_path(v) or _is_arrays(v), "'inputs.npz'"),
    "shapes": Allowed("a mapping of input names to sequences of whole numbers >= 0 (the dims)",
                      lambda v: _is_arrays(v) and all(_is_dims(dims) for dims in v.values()),
                      "{'x': [1, 3, 224, 224]}"),
    "seed": SEED, "atol": real(), "rtol": real(example="1e-3"),
    "tolerance": Allowed("a graphbisect.compare.Tolerance", _is_tolerance, "Tolerance(atol=1e-4, rtol=1e-3)"),
    "oracle": Allowed("a backend spec (a str such as 'reference', or a BackendSpec)", _is_spec, "'reference'"),
    "target": Allowed("a backend spec (a str such as 'onnxruntime:opt_level=all', or a BackendSpec)", _is_spec,
                      "'onnxruntime:opt_level=all'"),
    "check": _CHECK, "on_stage": _CALLBACK, "on_progress": _CALLBACK, "on_model": _CALLBACK,
    **dict.fromkeys(("layerwise", "all_tensors", "keep_work", "zip", "resume", "force", "passes", "strict_band",
                     "sensitivity", "prefix", "alone", "trust", "pre"), _FLAG),
    "mode": Allowed("a precision mode name (fp16, bf16 or int8)", lambda v: isinstance(v, str), "'fp16'"),
    "calibration": Allowed("a calibration method name", lambda v: isinstance(v, str), "'minmax'"),
    "executor": Allowed("an executor name ('local' or 'ray')", lambda v: isinstance(v, str), "'local'"),
    "fail_regex": pattern, "fail_code": EXIT_CODE, "max_invocations": INVOCATIONS, "timeout": TIMEOUT,
    "deadline": seconds(), "jobs": JOBS, "candidate_jobs": JOBS, "builds": whole(0), "repeat": whole(1),
    "record": Allowed("a TacticRecord or the path of its JSON file", _is_record, "'tactics.json'"),
    "good": Allowed("a TacticRecord or the path of its JSON file", _is_record, "'good.json'"),
    "bad": Allowed("a TacticRecord or the path of its JSON file", _is_record, "'bad.json'"),
    "perturb": Allowed("a sequence of str", lambda v: isinstance(v, Sequence) and not isinstance(v, str)
                       and all(isinstance(item, str) for item in v), "('fp16',)"),
}


def _refuse_inside_a_worker_importing_the_script(name: str) -> None:
    """A worker process of the local executor (``spawn``, as :mod:`multiprocessing` starts them) imports the
    script that started it; a call at its top level, not under ``if __name__ == "__main__":``, runs again
    there. Refused with the fix, instead of a second run colliding with the first (triage's folder lock)."""
    import multiprocessing.process

    if getattr(multiprocessing.process.current_process(), "_inheriting", False):  # multiprocessing's own test
        from graphbisect.errors import InputError

        script = next((caller.filename for caller in inspect.stack(0)
                       if caller.frame.f_globals.get("__name__") == "__mp_main__"), "the script that started it")
        raise InputError(f"graphbisect.{name} was called while a worker process graphbisect started was "
                         f"importing {script}",
                         hint='put the script\'s work under `if __name__ == "__main__":`: worker processes '
                              "import the script that started them, and a call at its top level runs again there")


def _checked(*, owner: str | None = None, **overrides: Allowed) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Check each argument of the decorated function against :data:`_ARGUMENTS` (or ``overrides``: the same
    name accepting other values here) before it runs: :class:`~graphbisect.errors.OptionError` (an
    :class:`~graphbisect.errors.InputError`) names the function, the argument and what it accepts."""

    def decorate(function: Callable[_P, _R]) -> Callable[_P, _R]:
        signature = inspect.signature(function)
        name = owner or function.__name__
        checks = {}
        for parameter in signature.parameters.values():
            allowed = overrides.get(parameter.name) or _ARGUMENTS.get(parameter.name)
            if allowed is not None:
                checks[parameter.name] = allowed.or_none("the default") if parameter.default is None else allowed

        @functools.wraps(function)
        def checked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            _refuse_inside_a_worker_importing_the_script(name)
            for argument, value in signature.bind(*args, **kwargs).arguments.items():
                if argument in checks:
                    checks[argument].check(name, argument, value)
            return function(*args, **kwargs)

        return checked

    return decorate


@_checked(source=_ARGUMENTS["model"])
def load_model(source: ModelSource) -> Model:
    """Load and normalize a model: an ONNX path, a ``ModelProto`` (copied, never modified), a Paddle inference
    model (folder or prefix; converted with paddle2onnx and cached), or a :class:`Model` (returned as is).

    Raises :class:`~graphbisect.errors.ModelError` naming the file and what is wrong with it.

    Example:
        >>> model = load_model("resnet50.onnx")          # doctest: +SKIP
        >>> len(model.nodes), model.input_names          # doctest: +SKIP
    """
    from graphbisect.model import Model
    from graphbisect.model import load_model as _load

    if isinstance(source, Model):
        return source
    return _load(source if not isinstance(source, os.PathLike) else Path(source))


@_checked()
def compare(
    model: ModelSource,
    *,
    oracle: str = DEFAULT_ORACLE,
    target: str = DEFAULT_TARGET,
    inputs: InputsSource = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    atol: float = 1e-4,
    rtol: float = 1e-3,
    tolerance: Tolerance | None = None,
    layerwise: bool = True,
    all_tensors: bool = False,
    workdir: str | os.PathLike[str] | None = None,
    check: OutputCheck | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> CompareResult:
    """Run ``target`` and ``oracle`` on the model (``graphbisect compare``): the verdict on the outputs, and
    with ``layerwise`` the per-tensor table, first divergence and root causes.

    ``tolerance`` (a :class:`~graphbisect.compare.Tolerance`, with per-output overrides) replaces
    ``atol``/``rtol``. ``all_tensors`` probes every intermediate tensor instead of those that survive in the
    target's compiled graph. ``workdir`` keeps the normalized model, inputs and the oracle's activations.
    ``check`` (an :data:`OutputCheck`, as ``reduce``'s Python check) decides the verdict instead of the
    tolerance: it gets the target's and the oracle's values of the model's outputs and returns True when they
    are acceptable (``result.check_passed``; the comparison and the layerwise table stay the tolerance's view).
    ``on_stage`` gets a line per step (what the CLI prints). The result's attributes are the ``--json``
    fields (``verdict``, ``outputs``, ``first_divergence``, ``root_causes``, ``layers``, ``compiled_graph``...).

    Example:
        >>> r = compare("model.onnx", target="openvino", atol=1e-3)    # doctest: +SKIP
        >>> r.verdict, r.first_divergence.node, r.root_causes[0].role    # doctest: +SKIP
    """
    from graphbisect.backends.process import prestart

    for spec in dict.fromkeys((oracle, target)):  # the workers' zygote imports while the model loads
        prestart(spec)
    from graphbisect.workflows.compare import compare_models

    loaded = load_model(model)
    feeds, chosen = _feeds(loaded, inputs, shapes, seed)
    return compare_models(loaded, oracle=oracle, target=target, inputs=feeds, chosen=chosen, check=check,
                          tolerance=_tolerance(tolerance, atol, rtol), workdir=_path(workdir),
                          layerwise=layerwise, all_tensors=all_tensors, seed=seed, on_stage=on_stage)


@_checked(check=Allowed("a shell command (a str) or a callable check(outputs, expected) -> bool",
                        lambda v: isinstance(v, str) or callable(v), "'./check.sh {model} {inputs}'"))
def reduce(model: ModelSource, output: str | os.PathLike[str], *, oracle: str = DEFAULT_ORACLE,
           target: str = DEFAULT_TARGET, inputs: InputsSource = None, shapes: Mapping[str, Sequence[int]] | None = None,
           seed: int = 0, atol: float = 1e-4, rtol: float = 1e-3, tolerance: Tolerance | None = None,
           check: str | OutputCheck | None = None, fail_code: int | None = None, fail_regex: str | None = None,
           passes: bool = False, strict_band: bool = False, max_invocations: int | None = None,
           deadline: float | None = None, jobs: int = 1, executor: str | None = None, timeout: float | None = None,
           layerwise: bool = True, keep_work: bool = False, zip: bool = False, resume: bool = False,
           force: bool = False, on_stage: Callable[[str], None] | None = None,
           on_progress: Callable[[ProgressEvent], None] | None = None) -> ReduceResult:
    """Shrink a failing model to a 1-minimal subgraph that fails the same way and write the bug-report bundle
    to ``output`` (``graphbisect reduce``).

    ``check`` replaces the output comparison: a shell command with ``{model}`` and ``{inputs}`` whose non-zero
    exit is the failure (``--check``; ``fail_code`` narrows it to one exit code), or a Python callable
    ``check(outputs, expected) -> bool`` that gets the target's outputs and the oracle's values of the same
    tensors (a candidate's outputs are the tensors it computes, not always the model's outputs) and returns
    True when they are acceptable. ``passes=True`` first finds the culprit optimization passes and reduces
    under them (``--passes``). ``resume=True`` continues the interrupted reduction that was writing
    ``output`` (its model, inputs and options are the recorded ones). The work folder ``OUTPUT.work`` is
    removed when the result is 1-minimal (or the reduction failed before its search), and kept for
    ``resume`` otherwise or with ``keep_work``. ``output`` must be new, empty or a bundle of the same model;
    ``force=True`` replaces a bundle of another model. ``on_stage`` gets a line per step, ``on_progress`` the
    search's progress events (best size, tests, runs).

    Example:
        >>> r = reduce("model.onnx", "bug-report", target="openvino", zip=True)   # doctest: +SKIP
        >>> r.final_nodes, r.kept_nodes, r.bundle                                  # doctest: +SKIP
    """
    from graphbisect.workflows.reduce import ReduceOptions, reduce_model, resume_reduction

    bundle = Path(output)
    if resume:
        return resume_reduction(bundle, max_invocations=max_invocations, deadline_seconds=deadline, jobs=jobs,
                                timeout=timeout, keep_work=keep_work, executor=executor, zip_bundle=zip,
                                output_check=None if isinstance(check, str) else check, on_stage=on_stage,
                                on_progress=on_progress)
    command, output_check = (check, None) if isinstance(check, str) or check is None else (None, check)
    options = ReduceOptions(
        oracle=oracle, target=target, tolerance=_tolerance(tolerance, atol, rtol), fail_regex=fail_regex,
        strict_band=strict_band, max_invocations=max_invocations, deadline_seconds=deadline, jobs=jobs,
        layerwise=layerwise, timeout=timeout, keep_work=keep_work, check=command, fail_code=fail_code,
        executor=executor, output_check=output_check)
    loaded = load_model(model)
    feeds, chosen = _feeds(loaded, inputs, shapes, seed)
    if not passes:
        return reduce_model(loaded, bundle, inputs=feeds, options=options, zip_bundle=zip, force=force,
                            on_stage=on_stage, on_progress=on_progress, chosen=chosen)
    return _reduce_under_passes(loaded, bundle, feeds, chosen, options, zip_bundle=zip, force=force,
                                on_stage=on_stage, on_progress=on_progress)


def _reduce_under_passes(model: Model, bundle: Path, feeds: Mapping[str, Any], chosen: Sequence[ChosenDim],
                         options: ReduceOptions, *, zip_bundle: bool, force: bool,
                         on_stage: Callable[[str], None] | None,
                         on_progress: Callable[[ProgressEvent], None] | None) -> ReduceResult:
    """``reduce(passes=True)``: the culprit passes under the reduction's own options (refused when there are
    none), then the reduction with only the passes they leave enabled."""
    from graphbisect.artifacts.bundle import check_destination
    from graphbisect.errors import InputError
    from graphbisect.workflows.passes import PassesOptions, find_culprit_passes, reduce_under_culprits

    check_destination(bundle, force=force)  # before the pass search runs anything
    found = find_culprit_passes(model, inputs=feeds, options=PassesOptions(
        oracle=options.oracle, target=options.target, tolerance=options.tolerance, strict_band=options.strict_band,
        timeout=options.timeout), on_stage=on_stage, on_progress=on_progress, chosen=chosen)
    if not found.culprits:
        raise InputError(f"no culprit optimization passes on {options.target} ({found.signature.describe()}): "
                         "nothing to reduce under them", hint="reduce without passes=True"
                         + (f"; {found.dims_note}" if found.dims_note else ""))
    return reduce_under_culprits(model, bundle, found, inputs=feeds, reduce_options=options, zip_bundle=zip_bundle,
                                 force=force, on_stage=on_stage, on_progress=on_progress)


@_checked()
def passes(
    model: ModelSource,
    *,
    oracle: str = DEFAULT_ORACLE,
    target: str = DEFAULT_TARGET,
    inputs: InputsSource = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    atol: float = 1e-4,
    rtol: float = 1e-3,
    tolerance: Tolerance | None = None,
    strict_band: bool = False,
    max_invocations: int | None = None,
    timeout: float | None = None,
    workdir: str | os.PathLike[str] | None = None,
    on_stage: Callable[[str], None] | None = None,
    on_progress: Callable[[ProgressEvent], None] | None = None,
) -> PassesResult:
    """The target's optimization passes responsible for the failure (``graphbisect passes``): ``culprits``
    (a 1-minimal set to disable), ``required`` (a 1-minimal set that reproduces it alone), ``fixed_target``
    (the workaround spec). To also reduce the model under them, use ``reduce(..., passes=True)``.

    Example:
        >>> p = passes("model.onnx")                     # doctest: +SKIP
        >>> p.culprits, p.fixed_target                   # doctest: +SKIP
    """
    from graphbisect.workflows.passes import PassesOptions, find_culprit_passes

    loaded = load_model(model)
    options = PassesOptions(oracle=oracle, target=target, tolerance=_tolerance(tolerance, atol, rtol),
                            strict_band=strict_band, timeout=timeout, max_invocations=max_invocations)
    feeds, chosen = _feeds(loaded, inputs, shapes, seed)
    return find_culprit_passes(loaded, inputs=feeds, options=options, workdir=_path(workdir), on_stage=on_stage,
                               on_progress=on_progress, chosen=chosen)


@_checked()
def precision(
    model: ModelSource,
    *,
    mode: str = "fp16",
    oracle: str = DEFAULT_ORACLE,
    target: str = DEFAULT_TARGET,
    inputs: InputsSource = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    atol: float = 1e-2,
    rtol: float = 1e-2,
    tolerance: Tolerance | None = None,
    sensitivity: bool = False,
    prefix: bool = True,
    alone: bool | None = None,
    calibration: str = "minmax",
    max_invocations: int | None = None,
    jobs: int = 1,
    output: str | os.PathLike[str] | None = None,
    workdir: str | os.PathLike[str] | None = None,
    on_stage: Callable[[str], None] | None = None,
    on_progress: Callable[[ProgressEvent], None] | None = None,
) -> PrecisionResult:
    """The fewest nodes that must stay FP32 when the rest runs in ``mode`` (fp16, bf16 or int8), judged at
    ``atol``/``rtol`` (default 1e-2 each, as ``graphbisect precision``). ``output`` receives the
    mixed-precision model and the override configs for TensorRT, ORT, Paddle and OpenVINO. ``alone``: mark
    the kept nodes that break the tolerance by themselves (one run each; None: only when at most 32 are kept);
    ``jobs``: target workers testing candidates at once (same answer).

    Example:
        >>> p = precision("model.onnx", mode="int8")     # doctest: +SKIP
        >>> p.keep_fp32, p.meets_tolerance               # doctest: +SKIP
    """
    from graphbisect.workflows.precision import find_precision

    loaded = load_model(model)
    feeds, chosen = _feeds(loaded, inputs, shapes, seed)
    return find_precision(loaded, mode=mode, oracle=oracle, target=target, inputs=feeds, chosen=chosen,
                          tolerance=_tolerance(tolerance, atol, rtol),
                          workdir=_path(workdir), out_dir=_path(output), with_sensitivity=sensitivity,
                          with_prefix=prefix, calibration=calibration, max_invocations=max_invocations, seed=seed,
                          on_stage=on_stage, on_progress=on_progress, alone=alone, jobs=jobs)


@_checked(model=_path_to("model.onnx"),
          inputs=Allowed("a mapping of input names to arrays", _is_arrays, "{'x': array}"))
def verify(bundle: str | os.PathLike[str], *, target: str | None = None, trust: bool = False,
           check: OutputCheck | None = None, model: str | os.PathLike[str] | None = None,
           inputs: Mapping[str, np.ndarray] | None = None) -> Verification:
    """Re-run a bundle (folder or .zip) on its recorded target or on ``target`` (``graphbisect verify``):
    ``outcome`` is ``"reproduces"``, ``"fixed"``, ``"different"``, or ``"fixed-reduced"``: the reduced model
    passes but nothing shows the user's model fixed (its failure was matched by kind alone; ``model=`` decides,
    and makes it ``"fixed"`` when the original passes). A recorded target that sets an option not
    known to be inert (a program, an interpreter, a session config key or compiler flag naming a file) runs
    only with ``trust=True`` (a bundle is a download; see docs/security.md).
    A bundle reduced with a Python ``check`` is judged by the ``check`` given here (the same callable); without
    it a run that completed is ``"undecided"``, since the tolerance may accept what the check rejected.
    The verdict is re-established by the independent checker with plain runs (``audit``); one it finds false
    is ``"undecided"``.
    ``model``: the model the bundle was reduced from, re-checked on the same target (``original``: whether it
    still fails; ``inputs`` its inputs, default the seeded random ones ``reduce`` draws).

    Example:
        >>> verify("bug-report", target="ort:opt_level=all,python=/opt/ort-next/bin/python").outcome  # doctest: +SKIP
        'fixed'
    """
    from graphbisect.artifacts.bundle import load_bundle
    from graphbisect.workflows.verify import recheck_original, verify_bundle

    with load_bundle(Path(bundle)) as loaded:
        result = verify_bundle(loaded, target, trust=trust, check=check)
        if model is not None:
            result = recheck_original(result, loaded, Path(model), inputs=inputs, trust=trust)
        return result


def releases(source: str | os.PathLike[str] | ModelSource, *, package: str, within: str | None = None,
             versions: Sequence[str] | None = None, pre: bool = False, target: str | None = None, find: str = "bad",
             cache: str | os.PathLike[str] | None = None, jobs: int = 2, repeat: int = 3, trust: bool = False,
             installer: str = "auto", section: bool = True, oracle: str = DEFAULT_ORACLE,
             inputs: InputsSource = None, seed: int = 0, atol: float = 1e-4, rtol: float = 1e-3,
             failure_bundle: str | os.PathLike[str] | None = None, workdir: str | os.PathLike[str] | None = None,
             on_progress: Callable[[str], None] | None = None) -> ReleaseSearch:
    """The first release of ``package`` where a failure appears (``find="bad"``: ``last_good``, ``first_bad``) or
    is gone (``find="fixed"``: ``last_bad``, ``first_fixed``): ``graphbisect releases``.

    ``source``: a bundle (folder or .zip), whose recorded outputs are the oracle and whose failure is searched
    for (``section``: add what was found to its report.md and report.json, beside a .zip:
    :mod:`graphbisect.artifacts.releases_section`); or a model, on which ``oracle`` (this interpreter's) runs once
    and whose failure is the baseline release's (the newest that installs, the oldest with ``find="fixed"``), or
    ``failure_bundle``'s; ``inputs`` (default: seeded random ones, ``seed``), ``atol``/``rtol`` and ``workdir``
    are the model's. Each release runs
    the target (the bundle's, or ``target``; ``onnxruntime:opt_level=all`` on a model) with ``python=`` its own
    cached environment, judged as :func:`verify` judges a bundle; a release that cannot install, cannot run the
    model or fails differently is a skip with its reason. ``versions``: the releases to search (default: the
    package index's for this Python, final ones unless ``pre``), within ``within`` (``"A..B"``). ``cache``: where
    environments are kept (default ``$GRAPHBISECT_CACHE/releases``); ``jobs`` installs at once, by ``installer``
    (``auto``: uv where it is there, else pip; ``uv``; ``pip``); ``repeat`` runs, voted, of each release the answer
    rests on. ``package``: one of :data:`graphbisect.releases.packages.PACKAGES` (``onnxruntime``,
    ``onnxruntime-gpu``, ``openvino``, ``iree``, ``paddlepaddle``, ``onnx``), or any package with a ``command:``
    ``target``: your program, run with each release's environment first on its ``PATH`` (``python`` and the
    package's scripts are that release's), the release it held measured there.

    Example:
        >>> found = releases("bug-report", package="onnxruntime", within="1.17..1.22.1")   # doctest: +SKIP
        >>> found.last_good, found.first_bad, found.releases_run, found.paragraph               # doctest: +SKIP
        >>> releases("model.onnx", package="onnxruntime", versions=["1.20.1", "1.22.1"]).status  # doctest: +SKIP
    """
    from graphbisect.artifacts.bundle import load_bundle, names_bundle
    from graphbisect.workflows.releases import search_releases, search_releases_model

    common: dict[str, Any] = {"versions": versions, "within": within, "pre": pre, "find": find,
                              "cache": _path(cache), "jobs": jobs, "repeat": repeat, "installer": installer,
                              "on_progress": on_progress}
    if isinstance(source, (str, os.PathLike)) and names_bundle(Path(source)):
        with load_bundle(Path(source)) as loaded:
            found = search_releases(loaded, package, target=target, trust=trust, **common)
        if section:
            from graphbisect.artifacts.releases_section import add_releases_section

            add_releases_section(Path(source), found.to_json())
        return found
    model = load_model(source)
    feeds, _ = _feeds(model, inputs, None, seed)
    arguments = {"oracle": oracle, "target": target, "inputs": feeds, "seed": seed,
                 "tolerance": _tolerance(None, atol, rtol), "workdir": _path(workdir), **common}
    if failure_bundle is None:
        return search_releases_model(model, package, **arguments)
    with load_bundle(Path(failure_bundle)) as failure:
        return search_releases_model(model, package, bundle=failure, **arguments)


@_checked()
def audit(bundle: str | os.PathLike[str], *, trust: bool = False) -> Audit:
    """Re-establish each claim of a bundle (folder or .zip) with plain runs (``graphbisect audit``): the target
    fails on its model, the recorded way and as strongly; ``oracle_outputs.npz`` is what the oracle computes;
    1-minimal; (not) flaky; the lowest failing optimization level; the ONNX specification's word. The checker
    (:mod:`graphbisect.checker`) shares no code with the search that wrote the bundle. ``claims``: each with
    ``holds`` True, False or None (not established) and its ``evidence``; ``holds`` of the result is False when
    any claim is false. The recorded specs run only when known to be inert, else only with ``trust=True``.

    Example:
        >>> [(c.id, c.holds) for c in audit("bug-report").claims]            # doctest: +SKIP
        [('expected_outputs', True), ('failure', True), ('identity', True), ('magnitude', True), ...]
    """
    from graphbisect.checker import audit_bundle

    return audit_bundle(Path(bundle), trust=trust)


@_checked()
def triage(
    input_dir: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    oracle: str = DEFAULT_ORACLE,
    target: str = DEFAULT_TARGET,
    atol: float = 1e-4,
    rtol: float = 1e-3,
    tolerance: Tolerance | None = None,
    passes: bool = True,
    seed: int = 0,
    executor: str = "local",
    jobs: int | None = None,
    candidate_jobs: int = 1,
    max_invocations: int | None = None,
    timeout: float | None = None,
    on_model: Callable[[ModelOutcome], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> TriageResult:
    """Compare, ablate passes, reduce and bundle every model of ``input_dir`` into ``output``, then group the
    failures into distinct bugs (``graphbisect triage``); re-running on the same ``output`` skips finished
    models. ``on_model`` gets each model's outcome as it arrives; ``on_stage`` a line at once saying what is
    triaged, then one every 30 s while no model ends (what the CLI prints on stderr).

    Example:
        >>> t = triage("failing-models/", "triage-out", jobs=2)     # doctest: +SKIP
        >>> [(bug.count, bug.culprits) for bug in t.bugs]             # doctest: +SKIP
    """
    from graphbisect.workflows.triage import TriageOptions
    from graphbisect.workflows.triage import triage as _triage

    options = TriageOptions(oracle=oracle, target=target, tolerance=_tolerance(tolerance, atol, rtol),
                            passes=passes, seed=seed, candidate_jobs=candidate_jobs,
                            max_invocations=max_invocations, timeout=timeout)
    return _triage(Path(input_dir), Path(output), options=options, executor=executor, jobs=jobs, on_model=on_model,
                   on_stage=on_stage)


@dataclass(frozen=True)
class Tactics:
    """``graphbisect.tactics``: record, replay and isolate per-node kernel choices (``graphbisect tactics``).

    Example:
        >>> good = tactics.record("model.onnx").record                                     # doctest: +SKIP
        >>> tactics.isolate("model.onnx", good=good, bad=bad, oracle="reference").to_json()  # doctest: +SKIP
    """

    default_target: str = "openvino"

    @_checked(owner="tactics.record")
    def record(self, model: ModelSource, *, target: str | None = None, inputs: InputsSource = None,
               shapes: Mapping[str, Sequence[int]] | None = None, seed: int = 0) -> RecordResult:
        """Build and run the model once; ``.record`` is the build's kernel choice per ONNX node."""
        from graphbisect.workflows.tactics import record_tactics

        loaded = load_model(model)
        return record_tactics(loaded, target or self.default_target, inputs=_feeds(loaded, inputs, shapes, seed)[0])

    @_checked(owner="tactics.replay")
    def replay(self, model: ModelSource, record: TacticRecord | str | os.PathLike[str], *, target: str | None = None,
               inputs: InputsSource = None, shapes: Mapping[str, Sequence[int]] | None = None,
               seed: int = 0) -> ReplayResult:
        """Build with ``record`` (a record or its JSON file) forced; ``.not_applied`` lists what did not take."""
        from graphbisect.workflows.tactics import replay_tactics

        loaded = load_model(model)
        return replay_tactics(loaded, target or self.default_target, _record(record),
                              inputs=_feeds(loaded, inputs, shapes, seed)[0])

    @_checked(owner="tactics.isolate")
    def isolate(self, model: ModelSource, *, good: TacticRecord | str | os.PathLike[str] | None = None,
                bad: TacticRecord | str | os.PathLike[str] | None = None, builds: int = 0,
                perturb: Sequence[str] = (), target: str | None = None, oracle: str | None = None,
                atol: float | None = None, rtol: float | None = None, inputs: InputsSource = None,
                shapes: Mapping[str, Sequence[int]] | None = None, seed: int = 0,
                max_invocations: int | None = None) -> IsolateResult:
        """The fewest (node, choice) pairs that turn the good build bad, confirmed by replay. Without
        ``oracle`` the good build's outputs are the reference, compared bit-exactly (atol = rtol = 0)."""
        from graphbisect.compare import Tolerance
        from graphbisect.workflows.tactics import isolate_tactics

        loaded = load_model(model)
        default = (1e-4, 1e-3) if oracle else (0.0, 0.0)
        tol = Tolerance(atol=default[0] if atol is None else atol, rtol=default[1] if rtol is None else rtol)
        return isolate_tactics(loaded, target or self.default_target, good=_record(good) if good else None,
                               bad=_record(bad) if bad else None, builds=builds, perturb=perturb, oracle=oracle,
                               tolerance=tol, inputs=_feeds(loaded, inputs, shapes, seed)[0], seed=seed,
                               max_invocations=max_invocations)


#: ``graphbisect.tactics.record(...)``, ``.replay(...)``, ``.isolate(...)``.
tactics = Tactics()


# ------------------------------------------------------------------------------------------------- helpers
def _path(value: str | os.PathLike[str] | None) -> Path | None:
    return None if value is None else Path(value)


def _tolerance(tolerance: Tolerance | None, atol: float, rtol: float) -> Tolerance:
    from graphbisect.compare import Tolerance

    return tolerance if tolerance is not None else Tolerance(atol=atol, rtol=rtol)


def _feeds(model: Model, inputs: InputsSource, shapes: Mapping[str, Sequence[int]] | None,
           seed: int) -> tuple[dict[str, Any], tuple[ChosenDim, ...]]:
    """The model's inputs from what the user gave (arrays, validated; a file) or seeded random values, and the
    dynamic dims graphbisect sized for the latter (:func:`graphbisect.data.chosen_dims`)."""
    from graphbisect.data import chosen_dims, load_inputs, random_inputs, validate_inputs
    from graphbisect.errors import GraphBisectError, InputError

    if inputs is None:
        return random_inputs(model, shapes=shapes, seed=seed), chosen_dims(model, shapes=shapes)
    if isinstance(inputs, (str, os.PathLike)):
        return load_inputs(Path(inputs), model), ()
    try:
        return validate_inputs(model, inputs), ()
    except GraphBisectError:
        raise
    except (TypeError, ValueError) as exc:  # numpy's, e.g. a ragged list for a tensor: the argument, not a bug
        raise InputError(f"inputs: a value cannot be read as the array the model takes ({exc})",
                         hint="give each input as a numpy array of the dtype and shape the model declares") from exc


def _record(record: TacticRecord | str | os.PathLike[str]) -> TacticRecord:
    from graphbisect.tactics import load_record

    return load_record(Path(record)) if isinstance(record, (str, os.PathLike)) else record
