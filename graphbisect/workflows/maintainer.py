"""What a maintainer wants beside the reduced model, measured on it (cheap at this size).

* **the spec's word**: ``onnx.reference`` (the ONNX specification in numpy) runs the reduced model, and its
  outputs are compared with the oracle's and the target's under the bundle's tolerance;
* **the lowest failing optimization level** of a target whose table row lists its levels, and the passes
  that fired there (a fact, not a verdict on which one is wrong: ``graphbisect passes`` searches that); each
  level is judged as the reduction judged its candidates (with its ``--fail-regex`` or Python check), so
  "fails the same way" means the failure the bundle reports;
* **the model as ONNX text** (:mod:`graphbisect.artifacts.model_text`), the target's compiled version of it
  where the target saves one, and ``repro_min.py`` (:mod:`graphbisect.artifacts.repro_min`);
* **the command line** of the process that wrote the bundle.

:func:`maintainer_facts` gathers them as report facts, report sections and extra files; every backend run
goes through an isolated worker and is counted in ``calls`` (its runs and what they compiled, per role).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from graphbisect.artifacts.model_text import onnx_text
from graphbisect.artifacts.repro_min import render_repro_min
from graphbisect.backends import BackendProcess, BackendSpec, RunResult, reference_cost, resolve
from graphbisect.backends.cost import CallTally
from graphbisect.compare import Tolerance, compare_outputs
from graphbisect.oracle.floor import NoiseFloor
from graphbisect.oracle.signature import CHECK_REJECTED, FailureKind, ModelNames, Signature
from graphbisect.oracle.tester import OutputCheck, judge
from graphbisect.text.shareable import shareable_command

__all__ = ["MaintainerFacts", "command_line", "maintainer_facts"]

log = logging.getLogger(__name__)

#: Spec-check runs stop after this many seconds: onnx.reference is slow on large convolutions.
SPEC_TIMEOUT = 120.0
#: A spec-check run estimated beyond this many times :data:`SPEC_TIMEOUT` is not started
#: (:mod:`graphbisect.backends.reference_cost`: its estimates were 0.97–1.17× the time taken).
SPEC_MARGIN = 3


@dataclass(frozen=True)
class _Runs:
    """How the facts' backend runs are made: the reduced model, its feeds, where, how long; counted in ``out``.

    A role's runs share one worker where its backend switches options inside a running worker (a
    ``reconfigurable`` row, ONNX Runtime: every option is a session setting; Paddle for ``delete_pass`` alone, on
    the CPU; :meth:`~graphbisect.backends.process.BackendProcess.reconfigure`), as the pass search's candidates do: the
    facts run the target up to four times (its compiled model, the optimization levels, the passes that fired),
    and starting a worker (Python, numpy, the backend library) costs more than a run of the reduced model.
    Any other backend gets a fresh worker per spec. :meth:`close` stops them."""

    model: Path
    feeds: Mapping[str, np.ndarray]
    workdir: Path
    timeout: float | None
    out: MaintainerFacts
    workers: dict[str, BackendProcess] = field(default_factory=dict)

    def run(self, spec: BackendSpec, role: str, folder: str, outputs: Sequence[str] | None = None, *,
            model: Path | None = None) -> RunResult:
        """One run of ``spec`` on the reduced model (or ``model``, another version of it)."""
        proc = self.workers.get(role)
        if proc is not None and proc.can_reconfigure(spec):
            proc.reconfigure(spec)
        else:
            if proc is not None:
                proc.close()
            timeout = SPEC_TIMEOUT if role == "reference" else self.timeout
            proc = self.workers[role] = BackendProcess(spec, workdir=self.workdir / folder, timeout=timeout)
        run = proc.run(model or self.model, dict(self.feeds), outputs)
        values = {k: np.array(v) for k, v in run.outputs.items()}  # before the next run overwrites the worker's files
        self.out.calls.count(role, run)
        return dataclasses.replace(run, outputs=values)

    def close(self) -> None:
        for proc in self.workers.values():
            proc.close()
        self.workers.clear()


@dataclass(frozen=True)
class MaintainerFacts:
    """Report facts (JSON), report sections (markdown by title), extra files, and the backend calls spent
    (runs and compiles per role: the report's ``report_calls``)."""

    facts: dict[str, Any] = field(default_factory=dict)
    sections: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    calls: CallTally = field(default_factory=CallTally)

    @property
    def runs(self) -> dict[str, int]:
        """{role: runs} (the report's ``report_runs``)."""
        return self.calls.runs()


def command_line() -> str:
    """The command line of this process, as a shell would take it (``graphbisect reduce ...`` for the CLI),
    its files relative to the folder it ran in or by name (:func:`~graphbisect.text.shareable.shareable_command`:
    a bundle does not say where the reporter's files live)."""
    argv = list(sys.argv)
    if not argv or not argv[0]:
        return "(a Python session)"
    script = Path(argv[0])
    if script.name == "graphbisect" or (script.name == "__main__.py" and script.parent.name == "graphbisect"):
        return shareable_command(["graphbisect", *argv[1:]])
    if script.name == "__main__.py":  # `python -m PACKAGE`: argv[0] is the package's __main__.py
        return shareable_command([Path(sys.executable).name, "-m", script.parent.name, *argv[1:]])
    return shareable_command([Path(sys.executable).name, *argv])


def maintainer_facts(
    *,
    model: onnx.ModelProto,
    run_model: Path,
    feeds: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    target_outputs: Mapping[str, np.ndarray],
    oracle: BackendSpec,
    target: BackendSpec,
    tolerance: Tolerance,
    signature: Signature,
    workdir: Path,
    timeout: float | None = None,
    stage: Callable[[str], None] = lambda _msg: None,
    fail_regex: re.Pattern[str] | None = None,
    check: OutputCheck | None = None,
    names: Collection[str] | None = None,
    floor: NoiseFloor | None = None,
) -> MaintainerFacts:
    """Everything of the module docstring for the reduced ``model`` (``run_model``: a runnable copy of it).

    ``fail_regex`` and ``check`` are the reduction's own verdict (``--fail-regex``, a Python output check):
    the optimization levels are judged with them, as every candidate was; ``names``, the names taken out of
    crash messages, are the ones ``signature`` was computed with (default: the reduced model's); ``floor``, the
    target's noise floor the reduction judged above, judges the optimization levels too.

    Ctrl-C while they are gathered stops them: the facts measured so far are kept, ``interrupted`` says the
    rest were not measured, and the bundle is still written (its result is already re-verified).
    """
    out = MaintainerFacts()
    runs = _Runs(run_model, feeds, workdir, timeout, out)
    try:
        _gather(runs, out, model=model, feeds=feeds, expected=expected, target_outputs=target_outputs,
                oracle=oracle, target=target, tolerance=tolerance, signature=signature, stage=stage,
                fail_regex=fail_regex, check=check, names=ModelNames(model) if names is None else names, floor=floor)
    except KeyboardInterrupt:
        out.facts["interrupted"] = True
        out.sections["Not measured"] = ("Ctrl-C stopped the gathering of these facts: the sections that are "
                                        "missing (the specification's word, optimization levels, repro_min.py) "
                                        "were not measured.")
    finally:
        runs.close()
    return out


def _gather(runs: _Runs, out: MaintainerFacts, *, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
            expected: Mapping[str, np.ndarray], target_outputs: Mapping[str, np.ndarray], oracle: BackendSpec,
            target: BackendSpec, tolerance: Tolerance, signature: Signature, stage: Callable[[str], None],
            fail_regex: re.Pattern[str] | None, check: OutputCheck | None, names: Collection[str],
            floor: NoiseFloor | None = None) -> None:
    out.facts["command_line"] = command_line()
    out.sections["Command line"] = f"```sh\n{out.facts['command_line']}\n```"
    text = onnx_text(model)
    if text is not None:
        out.sections["The reduced model (ONNX text)"] = f"```\n{text}\n```"
    crash = signature.kind.raised or signature.kind is FailureKind.TIMEOUT
    stage("cross-checking the oracle with onnx.reference (the ONNX specification)")
    judged_by = ("`--fail-regex`" if signature.kind is FailureKind.REGEX else
                 "the Python output check" if signature.detail == CHECK_REJECTED else None)
    spec = _spec_check(runs, expected, target_outputs, oracle, tolerance, model=model, crash=crash,
                       refusal=signature.kind is FailureKind.UNSUPPORTED, judged_by=judged_by, target=target)
    out.facts["spec_check"] = spec
    out.sections["The specification's word"] = spec["text"]
    compiled = _compiled_text(runs, target)
    if compiled is not None:
        out.sections["The target's compiled model"] = (
            f"What the target compiled the reduced model into (its saved optimized graph):\n\n```\n{compiled}\n```")
    stage("finding the lowest optimization level that fails")
    levels = _levels(runs, expected, target, tolerance, signature, fail_regex=fail_regex, check=check, names=names,
                     floor=floor)
    if levels is not None:
        out.facts["optimization_levels"] = levels
        out.sections["Optimization levels"] = levels["text"]
    if signature.detail == CHECK_REJECTED:  # its assertion (the tolerance) printed "fixed" on the bug's own model
        script, why = None, "the failure is the Python output check's verdict, which an assertion cannot repeat"
    elif signature.kind in (FailureKind.MISMATCH, FailureKind.NAN) or signature.kind.raised:
        verb = "refuses the model as unsupported" if signature.kind is FailureKind.UNSUPPORTED else \
            f"{'crashes on' if crash else 'disagrees with'} {oracle}"
        title = f"{target} {verb}: {signature.describe()}"
        script, why = render_repro_min(model, feeds, oracle=oracle, target=target, tolerance=tolerance,
                                       crash=crash, title=title.replace('"""', "'''"))
    else:
        script, why = None, f"a {signature.kind.value} failure is judged by graphbisect, not by an assertion"
    out.facts["repro_min"] = {"written": script is not None, "why_not": why or None}
    if script is not None:
        out.files["repro_min.py"] = script


def _spec_check(runs: _Runs, expected: Mapping[str, np.ndarray], target_outputs: Mapping[str, np.ndarray],
                oracle: BackendSpec, tol: Tolerance, *, model: onnx.ModelProto, crash: bool, refusal: bool = False,
                judged_by: str | None = None, target: BackendSpec | None = None) -> dict[str, Any]:
    """What ``onnx.reference`` says of the reduced model's values, and what that says of the failure.

    A side the specification's values would call wrong is not called wrong when its difference starts as a
    rounding flip (:func:`_rounding_flip`): an ulp of ``Erf`` turned into another integer by a
    ``DynamicQuantizeLinear`` is within what the specification allows of both sides.

    Its values speak to which side is wrong only for a failure *of values* under the bundle's tolerance: a
    failure matched by ``judged_by`` (``--fail-regex``, a Python output check) or a target that produced no
    outputs gets the comparison as a fact, with no side called wrong (the target's missing outputs once made
    "agrees with the oracle and not with the target" of a crash matched by a regex).

    A model onnx.reference would not finish within :data:`SPEC_TIMEOUT` three times over (its ``Resize`` is a
    Python loop per output element: :mod:`graphbisect.backends.reference_cost`) is not run: the fact says so
    and why, instead of the bundle waiting out the limit for nothing.
    """
    if oracle.name == "reference":
        return {"verdict": "oracle-is-reference", "text": "The oracle is `onnx.reference` itself, the ONNX "
                "specification's reference implementation: the expected values are the specification's."}
    cost = reference_cost.estimate(model, {name: np.shape(value) for name, value in runs.feeds.items()})
    if cost is not None and cost.seconds > SPEC_MARGIN * SPEC_TIMEOUT:
        return {"verdict": "unavailable", "reference_estimate": cost.to_json(),
                "text": f"`onnx.reference` was not run on the reduced model: it would take {cost.describe()}, "
                f"beyond this check's limit of {SPEC_TIMEOUT:.0f} s; the specification's word is not known here."}
    run = runs.run(BackendSpec("reference"), "reference", "spec-check", list(expected))
    spec_values = dict(run.outputs)
    if not run.ok:
        return {"verdict": "unavailable", "reference_run": run.describe(),
                "text": f"`onnx.reference` could not run the reduced model ({run.describe()}), so the "
                "specification's word is not known here."}
    with_oracle = _agrees(spec_values, expected, tol)
    with_target = None if crash or not target_outputs else _agrees(spec_values, target_outputs, tol)
    verdict, text = _spec_verdict(with_oracle, with_target, crash=crash, refusal=refusal, judged_by=judged_by)
    found: dict[str, Any] = {"verdict": verdict, "agrees_with_oracle": with_oracle, "agrees_with_target": with_target}
    accused = {"target": ("oracle", oracle), "oracle": ("target", target)}.get(verdict)
    flip = None if accused is None or accused[1] is None else _rounding_flip(runs, model, accused[1], accused[0],
                                                                             tol)
    if flip is not None:
        found.update(verdict="rounding", rounding=flip)
        text = (f"`onnx.reference` agrees with the {'target' if verdict == 'target' else 'oracle'} and not with the "
                f"{flip['side']}, but the difference starts as a rounding flip: {flip['op']} {flip['node']!r} turns "
                f"inputs on which the {flip['side']} and `onnx.reference` agree within the tolerance (not bit for "
                f"bit: max abs {flip['input_max_abs']:.3g}) into other values ({flip['differing']} of "
                f"{flip['elements']} elements of {flip['tensor']!r}). Both roundings are of inputs the specification "
                "allows, so by the specification neither side is shown wrong here.")
    return {**found, "text": text + " (Compared under the bundle's tolerance on the reduced model's outputs.)"}


def _spec_verdict(with_oracle: bool, with_target: bool | None, *, crash: bool, refusal: bool,
                  judged_by: str | None) -> tuple[str, str]:
    """(the verdict, its sentence) from whether ``onnx.reference`` agrees with the oracle and with the target
    (None: the target gave no outputs to compare), before any rounding flip is looked for."""
    if crash:
        verdict = "spec-runs-it" if with_oracle else "spec-runs-it-differently"
        text = ("`onnx.reference` runs the reduced model without error"
                + (" and agrees with the oracle" if with_oracle else ", but its values differ from the oracle's")
                + ": by the specification the model is valid and the target's "
                + ("refusal is a feature the target lacks." if refusal else "crash is the target's."))
    elif with_target is None:
        verdict, text = "no-target-outputs", (
            f"`onnx.reference` {'agrees' if with_oracle else 'does not agree'} with the oracle; the target "
            "produced no outputs to compare with it" + (f" (the failure is {judged_by}'s match)." if judged_by
                                                        else "."))
    elif judged_by is not None:
        verdict, text = "not-a-value-failure", (
            f"The failure is {judged_by}'s verdict, not a difference of values under the tolerance: "
            f"`onnx.reference` {'agrees' if with_oracle else 'does not agree'} with the oracle and "
            f"{'agrees' if with_target else 'does not agree'} with the target.")
    elif with_oracle and not with_target:
        verdict, text = "oracle", ("`onnx.reference` agrees with the oracle and not with the target: by the "
                                   "specification the target is wrong.")
    elif with_target and not with_oracle:
        verdict, text = "target", ("`onnx.reference` agrees with the *target* and not with the oracle: by the "
                                   "specification the oracle is wrong here, not the target.")
    elif with_oracle and with_target:
        verdict, text = "both", ("`onnx.reference` is within tolerance of both the oracle and the target "
                                 "(the spec's reference sits between them): the tolerance may be too tight.")
    else:
        verdict, text = "neither", ("`onnx.reference` agrees with neither the oracle nor the target under this "
                                    "tolerance.")
    return verdict, text


#: A model with more node outputs than this is not probed for a rounding flip (every one is exposed).
ROUNDING_PROBE_LIMIT = 500


def _rounding_flip(runs: _Runs, model: onnx.ModelProto, spec: BackendSpec, role: str,
                   tol: Tolerance) -> dict[str, Any] | None:
    """Where the ``spec`` side's difference from ``onnx.reference`` starts, when every place it starts is a
    rounding flip: a node with an integer or boolean output that differs, whose inputs differ but within the
    tolerance (identical inputs would make the node's own arithmetic the difference: the specification
    decides that). None when a difference starts anywhere else, when the model has no node that rounds a
    float into integers, or when a run does not complete. Costs one run of each side on the model with every
    node output exposed, only where such a node exists."""
    names = [name for node in model.graph.node for name in node.output if name]
    if not names or len(names) > ROUNDING_PROBE_LIMIT or not _has_rounding_node(model):
        return None
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    shown = {value.name for value in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names if name not in shown)
    path = runs.workdir / "spec-rounding.onnx"
    try:
        onnx.save(probe, str(path))
    except (ValueError, OSError) as exc:  # over 2 GB inline, or the disk
        log.debug("rounding probe not written: %s", exc)
        return None
    side = runs.run(spec, role, "spec-rounding", names, model=path)
    reference = runs.run(BackendSpec("reference"), "reference", "spec-check", names, model=path)
    if not (side.ok and reference.ok):
        return None
    a, b = dict(side.outputs), dict(reference.outputs)
    first = None
    for node in model.graph.node:
        outputs = [name for name in node.output if name in a and name in b]
        inputs = [name for name in node.input if name in a and name in b]
        if not any(not _close(a[name], b[name], tol, name) for name in outputs) or \
                not all(_close(a[name], b[name], tol, name) for name in inputs):
            continue  # the difference does not start here
        flipped = [name for name in outputs if not _is_float(b[name]) and not np.array_equal(a[name], b[name])]
        moved = [name for name in inputs if _is_float(b[name]) and not np.array_equal(a[name], b[name])]
        if not flipped or not moved:
            return None  # it starts in float arithmetic, or in this node's own arithmetic on identical inputs
        if first is None:
            out = flipped[0]
            first = {"node": node.name or node.output[0], "op": node.op_type, "side": role, "tensor": out,
                     "differing": int(np.count_nonzero(np.asarray(a[out]) != np.asarray(b[out]))),
                     "elements": int(np.asarray(b[out]).size),
                     "input_max_abs": max(float(np.max(np.abs(np.asarray(a[n], np.float64)
                                                              - np.asarray(b[n], np.float64)))) for n in moved)}
    return first


def _has_rounding_node(model: onnx.ModelProto) -> bool:
    """True when a node reads a float tensor and writes an integer or boolean one (by ONNX's shape inference;
    False when it cannot say)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # onnx.shape_inference raises its own kinds: no types, no probe
        return False
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.value_info, *graph.output)}
    types.update({t.name: t.data_type for t in graph.initializer})
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    return any(any(types.get(i) in floats for i in node.input)
               and any(types.get(o, 0) not in floats | {0} for o in node.output) for node in graph.node)


def _is_float(value: Any) -> bool:
    return np.asarray(value).dtype.kind in "fc"


def _close(a: Any, b: Any, tol: Tolerance, name: str) -> bool:
    if not _is_float(b):
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    return compare_outputs({name: b}, {name: a}, tol, [name]).passed


def _agrees(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], tol: Tolerance) -> bool:
    names = [n for n in b if n in a]
    return bool(names) and compare_outputs({n: b[n] for n in names}, a, tol, names).passed


def _levels(runs: _Runs, expected: Mapping[str, np.ndarray], target: BackendSpec, tol: Tolerance,
            signature: Signature, *, fail_regex: re.Pattern[str] | None = None, check: OutputCheck | None = None,
            names: Collection[str] = (), floor: NoiseFloor | None = None) -> dict[str, Any] | None:
    """The target at each optimization level below its own (its row's ``opt_levels``), lowest first.

    Each run is judged as the reduction judged (:func:`~graphbisect.oracle.tester.judge` with its regex, check
    and noise floor): judged by the tolerance alone, a ``--fail-regex`` failure read "crash-load (...)" or
    "passes" at the very level the result was verified at, and no level was "the lowest failing"; and the lowest
    level, the target's own noise floor, "failed" by the kernel precision the reduction had judged no failure.
    """
    _, info = resolve(target, require_available=False)
    levels: Sequence[str] = info.opt_levels
    current = target.options.get("opt_level", levels[-1] if levels else "")
    if current not in levels:
        return None
    tried: dict[str, str] = {}
    lowest = None
    for level in levels[: levels.index(current) + 1]:
        run = runs.run(target.with_options(opt_level=level), "target", f"level-{level}")
        observed = judge(run, expected.__getitem__, list(expected), tol, fail_regex, check=check, names=names,
                         floor=floor).signature
        same = signature.matches(observed)
        tried[level] = "fails the same way" if same else ("passes" if not observed.failed else observed.describe())
        if same:
            lowest = level
            break
    rows = "\n".join(f"| `opt_level={level}` | {what} |" for level, what in tried.items())
    text = "| Level | On the reduced model |\n|---|---|\n" + rows
    fired = _fired(runs, target.with_options(opt_level=lowest)) if lowest else None
    if lowest is not None:
        text += f"\n\nLowest failing level: `opt_level={lowest}`."
    if fired:
        text += (f" Passes that fired there on the reduced model: {', '.join(f'`{p}`' for p in fired)} "
                 "(`graphbisect passes` names the culprit).")
    return {"levels": tried, "lowest_failing": lowest, "fired_at_lowest": fired, "text": text}


def _compiled_text(runs: _Runs, target: BackendSpec) -> str | None:
    """The target's optimized graph of the reduced model as ONNX text, where the target saves one."""
    _, info = resolve(target, require_available=False)
    if "save_optimized" not in info.options:
        return None
    run = runs.run(target.with_options(save_optimized="1"), "target", "compiled")
    saved = run.info.get("optimized_model")
    if not run.ok or not saved or not Path(saved).is_file():
        return None
    try:
        return onnx_text(onnx.load(str(saved), load_external_data=False), metadata=False)  # the model's own, above
    except Exception as exc:  # the report goes on without it
        log.warning("cannot read the target's optimized model %s: %s", saved, exc)
        return None


def _fired(runs: _Runs, spec: BackendSpec) -> list[str] | None:
    _, info = resolve(spec, require_available=False)
    if "report_passes" not in info.options:
        return None
    run = runs.run(spec.with_options(report_passes="1"), "target", "fired")
    fired = run.info.get("fired_passes")
    return [str(p) for p in fired] if isinstance(fired, list) else None

