"""Re-establish each claim a bundle makes, with plain runs only.

A bundle's ``report.json`` states facts: the target fails on ``model.onnx``, in the recorded way and as strongly
as recorded; ``oracle_outputs.npz`` is what the oracle computes; the model is 1-minimal; the target is (not)
flaky; the lowest optimization level that fails; what the ONNX specification's reference says. :func:`audit`
checks each one it finds with plain runs (:mod:`.runs`), compares with its own rule (:mod:`.values`) and builds
its own removals (:mod:`.removal`). Each claim ends as holds (True), does not hold (False) or not established
(None: the checker could not run what would decide it, and says why).

**The same failure.** A value failure is the same when it fails in the same class (float values beyond
tolerance, exact values, non-finite values, structure), on the same outputs, with the worst score within a
decade of the recorded one, and — where the bundle records what the target compiled the failing region as
and the target can describe its compiled graph — with a compiled node of that kind (made by that pass) in it.
A crash is the same when its message, normalized (:func:`normalize_message`), is the recorded one's.

**Above the noise floor.** Where ``report.json`` records a measured ``noise_floor``, an output fails only above
the target's own error with its optimizations off, which the checker measures again on each model it judges
(:mod:`.floor`); when it cannot, the claims it decides are not established. A ``rounding`` verdict of the
specification's check is re-established by :mod:`.rounding`.
"""

from __future__ import annotations

import math
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from graphbisect.backends.base import BackendSpec, Phase
from graphbisect.backends.registry import resolve
from graphbisect.checker.floor import Floor, FloorRule, floor_rule
from graphbisect.checker.removal import exposed, produced_names, removal
from graphbisect.checker.rounding import check_flip
from graphbisect.checker.runs import Run, Runner
from graphbisect.checker.values import Limits, bit_identical, compare_outputs, worst
from graphbisect.text.printable import shown

__all__ = ["Audit", "BundleFiles", "Claim", "audit_files", "normalize_message"]

#: Bundles with more nodes than this are not checked for 1-minimality (one removal costs an oracle and a
#: target run); the claim is then "not established" and says so.
MAX_REMOVALS = 64
#: Fresh target runs that decide the flakiness claim (the first is also the failure's run).
FRESH_RUNS = 3
#: The reference backend that stands for the ONNX specification.
REFERENCE = "reference"


@dataclass(frozen=True)
class Claim:
    """One statement of a bundle, and what the checker found."""

    id: str  # stable key: failure, expected_outputs, identity, magnitude, one_minimal, flaky, lowest_level, ...
    statement: str  # what the bundle says, in words
    holds: bool | None  # None: not established
    evidence: str
    #: 1-minimal: the nodes whose removal still fails, another way (1-minimal holds for the recorded failure only)
    fail_otherwise: tuple[str, ...] = ()
    #: a claim over several configurations (:func:`~graphbisect.checker.configurations.check_configurations`):
    #: whether each, in order, showed its verdict (None: undecided); empty for a bundle's claims
    each: tuple[bool | None, ...] = ()

    @property
    def verdict(self) -> str:
        return {True: "holds", False: "does not hold", None: "not established"}[self.holds]

    def to_json(self) -> dict[str, Any]:
        record = {"id": self.id, "claim": self.statement, "holds": self.holds, "evidence": self.evidence}
        return {**record, "fail_otherwise": list(self.fail_otherwise)} if self.fail_otherwise else record


@dataclass(frozen=True)
class Audit:
    """Every claim checked, with the runs it took."""

    bundle: str
    claims: tuple[Claim, ...]
    #: role -> {"runs", "compiles"}: every backend call the checker made (oracle, target, reference)
    calls: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def runs(self) -> dict[str, int]:
        """{role: runs}."""
        return {role: int(calls["runs"]) for role, calls in self.calls.items()}

    @property
    def holds(self) -> bool | None:
        """False when any claim does not hold; True when every one holds; None otherwise."""
        if any(c.holds is False for c in self.claims):
            return False
        return True if all(c.holds for c in self.claims) else None

    def claim(self, claim_id: str) -> Claim | None:
        return next((c for c in self.claims if c.id == claim_id), None)

    def to_json(self) -> dict[str, Any]:
        return {"bundle": self.bundle, "holds": self.holds, "claims": [c.to_json() for c in self.claims],
                "runs": self.runs, "calls": {role: dict(c) for role, c in self.calls.items()},
                "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class BundleFiles:
    """What the checker reads of a bundle: its folder, report, specs and values (as written, unparsed)."""

    folder: Path
    report: Mapping[str, Any]
    oracle: BackendSpec
    target: BackendSpec
    inputs: Mapping[str, Any]
    oracle_outputs: Mapping[str, Any]
    target_outputs: Mapping[str, Any]

    @property
    def model_path(self) -> Path:
        return self.folder / "model.onnx"


def normalize_message(text: str, names: Sequence[str] = ()) -> str:
    """A crash message's stable part: the model's names, quoted strings, paths, addresses and numbers replaced,
    spaces collapsed, lower case."""
    # a damaged model's protobuf may hand over a name as bytes (not UTF-8): no message shows it as text
    for name in sorted((n for n in names if isinstance(n, str) and len(n) > 2), key=len, reverse=True):
        text = text.replace(name, "<name>")
    text = re.sub(r"0x[0-9a-fA-F]+", "#", text)
    text = re.sub(r"(?<![\w.\-/])(?:[A-Za-z]:)?(?:[\w.\-]*/)+([\w.\-]+)", r"\1", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'?'", text)
    text = re.sub(r"[\w.\-]+\.onnx\b", "model.onnx", text)
    text = re.sub(r"\d+", "#", text)
    return re.sub(r"\s+", " ", text).strip().lower()


# ------------------------------------------------------------------------------------------------ the failure
@dataclass(frozen=True)
class _Expected:
    """The recorded failure, read from report.json."""

    kind: str  # mismatch | nan | structure | crash-load | crash-run | unsupported | timeout | regex | ...
    value_class: str | None  # mismatch: "mismatch" (float), "exact", "rooted" or "check" (see _value_class)
    outputs: frozenset[str]  # the outputs recorded as failing
    score: float | None  # the worst recorded score
    message: str | None  # a crash's recorded message
    regex: str | None
    compiled_kind: str | None
    made_by: str | None
    disable: tuple[str, ...] = ()  # the target's disabled= names of made_by, where they are not made_by itself
    release: str | None = None  # the target library's version that recorded the failure (report.json versions)

    @classmethod
    def of(cls, report: Mapping[str, Any]) -> _Expected:
        signature = report.get("signature") or {}
        kind = str(signature.get("kind", ""))
        detail = str(signature.get("detail") or "")
        rows = [row for row in report.get("outputs") or [] if isinstance(row, Mapping) and not row.get("passed")]
        scores = [float(row["score"]) for row in rows if isinstance(row.get("score"), (int, float))]
        identity = report.get("identity") or {}
        disable = identity.get("disable")
        return cls(kind, _value_class(detail) if kind == "mismatch" else None,
                   frozenset(str(row.get("name")) for row in rows), max(scores) if scores else None,
                   report.get("target_message") or (detail if kind in _CRASHES else None),
                   detail if kind == "regex" else None, identity.get("compiled_kind"), identity.get("made_by"),
                   tuple(str(n) for n in disable) if isinstance(disable, list) else (), _release_of(report))

    @property
    def by_check(self) -> bool:
        """Whether a Python output check judged the failure (``graphbisect.reduce(check=...)``)."""
        return self.kind == "mismatch" and self.value_class == "check"

    @property
    def by_values(self) -> bool:
        return self.kind in ("mismatch", "nan", "structure")


_CRASHES = ("crash-load", "crash-run", "unsupported", "timeout")


def _release_of(report: Mapping[str, Any]) -> str | None:
    versions = report.get("versions")
    target = versions.get("target") if isinstance(versions, Mapping) else None
    version = target.get("library_version") if isinstance(target, Mapping) else None
    return version if isinstance(version, str) else None


def _other_release(expected: _Expected, run: Run) -> str | None:
    """The library version ``run`` ran where it is not the one that recorded the failure (both known), else None.
    Another release may name a pass or an error type otherwise while the failure stays: what rests on a name
    alone is then not established by the checker (never "the same")."""
    ran = {**run.result.info, **run.result.ran_with}.get("library_version")
    if not isinstance(ran, str) or expected.release is None or ran == expected.release:
        return None
    return ran


def _without_status(message: str) -> str:
    """A normalized crash message without a leading error type and status (``… [onnxruntimeerror] : # : fail :``)."""
    return re.sub(r"^.*?\[\w*error\] : # : \w+ : ", "", message)
#: A Python output check: ``check(outputs, expected)`` is True when the target's outputs are acceptable.
OutputCheck = Callable[[dict[str, Any], dict[str, Any]], bool]


def _value_class(detail: str) -> str:
    """A mismatch's class from its recorded detail: ``exact`` (integer or boolean values differ), ``rooted`` (an
    integer error and the float error computed from it: either is that failure), else ``mismatch`` (floats)."""
    if detail.startswith("integer/boolean"):
        return "rooted" if "float values computed from them" in detail else "exact"
    return "check" if detail == "the Python check rejected the outputs" else "mismatch"


@dataclass(frozen=True)
class _Seen:
    """How one target run compares with the recorded failure."""

    fails: bool
    same: bool | None  # None: the compiled graph would decide, and the target did not describe it
    text: str


class _Judge:
    """Judges target runs against the oracle's and the recorded failure."""

    def __init__(self, expected: _Expected, limits: Limits, names: Sequence[str],
                 check: OutputCheck | None = None) -> None:
        self.expected, self.limits, self.names, self.check = expected, limits, names, check

    def judge(self, oracle: Mapping[str, Any], run: Run, *, outputs: frozenset[str] | None = None,
              floor: Floor | None = None) -> _Seen:
        """``run`` against ``oracle``'s outputs. ``outputs``: the outputs that must fail for the same failure
        (default: the recorded ones; a removal's are its own). ``floor``: the target's noise floor measured on the
        same model, above which alone an output fails (None: the tolerance alone)."""
        e = self.expected
        if not run.ok:
            text = run.crash_text()
            if e.regex is not None:
                return _Seen(True, bool(re.search(e.regex, text + "\n" + run.result.log)), _short(text))
            if not e.by_values and e.kind in _CRASHES:
                same: bool | None = self._same_crash(run)
                other = _other_release(e, run)
                if not same and other is not None and e.message is not None and self._same_crash(run, _without_status):
                    return _Seen(True, None, f"{_short(text)}; on release {other} (recorded on {e.release}) the "
                                 "message is the recorded one under another error type or status: not established")
                return _Seen(True, same, _short(text))
            return _Seen(True, False, f"{_phase(run)}: {_short(text)}")
        if e.regex is not None:
            return _Seen(bool(re.search(e.regex, run.result.log)), bool(re.search(e.regex, run.result.log)),
                         "completed")
        if e.by_check and self.check is not None:
            try:
                rejected = not self.check(dict(run.outputs), dict(oracle))
            except Exception as exc:  # a user's check written for the whole model's outputs, on a removal's
                return _Seen(True, None, f"the Python check raised {type(exc).__name__}: {_short(str(exc), 120)}")
            return _Seen(rejected, rejected, "the Python check " + ("rejects" if rejected else "accepts") +
                         " the outputs")
        differences = compare_outputs(oracle, run.outputs, self.limits)
        noisy: list[str] = []
        if floor is not None:
            noisy = [d.name for d in differences if d.failed and not floor.counts(d)]
            differences = floor.above(differences)
        bad = worst(differences)
        if bad is None:
            top = max((d.score for d in differences), default=0.0)
            if noisy:
                return _Seen(False, False, f"beyond the tolerance only within the target's noise floor on "
                             f"{', '.join(map(shown, noisy))} (worst score {top:.3g})")
            return _Seen(False, False, f"within tolerance (worst score {top:.3g})")
        text = "; ".join(d.describe() for d in differences if d.failed)
        if not e.by_values:
            return _Seen(True, False, text)
        failing = frozenset(d.name for d in differences if d.failed)
        same_kind = bad.kind in (("exact", "mismatch") if e.value_class == "rooted" else (e.value_class or e.kind,))
        same_place = failing == (e.outputs if outputs is None else outputs)
        same_size = _within_decade(bad.score, e.score)
        same = same_kind and same_place and same_size
        if same and e.compiled_kind is not None:
            return self._compiled_as(run, text)
        return _Seen(True, same, text)

    def _compiled_as(self, run: Run, text: str) -> _Seen:
        """A run failing as recorded, judged by what the target compiled the region as (where it was recorded)."""
        e = self.expected
        if run.compiled is None:
            return _Seen(True, None, text + "; the target did not describe what it compiled")
        made = [n for k, n in run.compiled if k == e.compiled_kind and (not e.made_by or e.made_by in n)]
        other = _other_release(e, run)
        if not made and other is not None and any(kind == e.compiled_kind for kind, _ in run.compiled):
            return _Seen(True, None, f"{text}; on release {other} (recorded on {e.release}) a {e.compiled_kind} "
                         f"is compiled, none named {e.made_by}: which pass made it is not established")
        if not made:
            kinds = sorted({kind for kind, _ in run.compiled})
            return _Seen(True, False, f"{text}; compiled without a {_compiled(e)} (compiled kinds: "
                         f"{', '.join(kinds[:8])}{' …' if len(kinds) > 8 else ''})")
        return _Seen(True, True, text)

    def _same_crash(self, run: Run, stable: Callable[[str], str] = lambda message: message) -> bool:
        e = self.expected
        if e.kind == "timeout":
            return run.result.status.value == "timeout"
        if e.kind == "crash-load" and run.result.phase is not Phase.LOAD:
            return False
        if e.kind == "crash-run" and run.result.phase is not Phase.RUN:
            return False
        return stable(normalize_message(run.crash_text(), self.names)) == \
            stable(normalize_message(e.message or "", self.names))


def _compiled(e: _Expected) -> str:
    """``LayerNormalization made by LayerNormFusion (disabled=LayerNormFusionL1;LayerNormFusionL2)``: the pass as the
    compiled node names it, and as the target's disabled= takes it where that differs."""
    names = f" (disabled={';'.join(e.disable)})" if e.disable and e.disable != (e.made_by,) else ""
    return f"{e.compiled_kind}" + (f" made by {e.made_by}{names}" if e.made_by else "")


def _within_decade(observed: float, recorded: float | None) -> bool:
    if recorded is None:
        return True
    if math.isinf(observed) or math.isinf(recorded):
        return math.isinf(observed) and math.isinf(recorded)
    if observed <= 0 or recorded <= 0:
        return observed == recorded
    return abs(math.log10(observed) - math.log10(recorded)) <= 1.0


def _no_floor(why: str | None) -> str:
    return f"the noise floor the bundle states cannot be measured again ({why}), and it decides this"


def _phase(run: Run) -> str:
    return f"crash at {run.result.phase.value}" if run.result.phase else run.result.status.value


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ------------------------------------------------------------------------------------------------ the audit
def audit_files(files: BundleFiles, *, progress: Callable[[str], None] | None = None,
                max_removals: int = MAX_REMOVALS, workdir: Path | None = None,
                check: OutputCheck | None = None) -> Audit:
    """Every claim of the bundle ``files``, checked with plain runs (see the module docstring). Scratch files
    and workers' folders go in ``workdir`` (default: the system's temporary folder) and are removed after.
    ``check``: the Python output check a bundle reduced with ``reduce(check=...)`` was judged by (a bundle cannot
    hold it); without it the claims that check decided are not established."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="graphbisect-audit-", dir=workdir) as scratch:
        checker = _Checker(files, Path(scratch), progress or (lambda _text: None), check)
        try:
            claims = checker.claims(max_removals)
        finally:
            checker.close()
    return Audit(str(files.folder), tuple(claims), dict(checker.calls), time.monotonic() - started)


class _Checker:
    """One audit: the bundle, its two runners, and the runs counted per role."""

    def __init__(self, files: BundleFiles, scratch: Path, say: Callable[[str], None],
                 check: OutputCheck | None = None) -> None:
        self.files, self.scratch, self.say = files, scratch, say
        self.expected = _Expected.of(files.report)
        self.limits = Limits.from_report(files.report.get("tolerance"))
        self.model = onnx.load(str(files.model_path))
        names = [n for node in self.model.graph.node for n in (node.name, *node.output, *node.input) if n]
        self.judge = _Judge(self.expected, self.limits, names, check)
        self.describe = self.expected.compiled_kind is not None
        self.oracle = Runner(files.oracle, folder=scratch)
        self.target = Runner(files.target, describe=self.describe, folder=scratch)
        judged_by_values = self.expected.by_values and not self.expected.by_check and self.expected.regex is None
        #: the noise floor the bundle states (its spec run again by the checker: :mod:`.floor`)
        self.rule = floor_rule(files.report, files.target) if judged_by_values else FloorRule(None)
        self.floor_runner = Runner(self.rule.spec, folder=scratch) if self.rule.spec is not None else None
        #: the floor measured on model.onnx (None: no floor, or it could not be measured: ``floor_missing``)
        self.floor: Floor | None = None
        self.floor_missing: str | None = self.rule.why_not
        self.calls: dict[str, dict[str, int]] = {}

    def close(self) -> None:
        for role, runner in (("oracle", self.oracle), ("target", self.target), ("target", self.floor_runner)):
            if runner is not None:
                self._count(role, runner)
                runner.close()

    def _measure_floor(self, model: Path, feeds: Mapping[str, Any], oracle: Mapping[str, Any]) -> Floor | str:
        """The target's noise floor on ``model`` (fed ``feeds``; ``oracle``: the plain oracle's outputs there): a
        plain run of the floor spec the bundle states, or why it could not be measured."""
        assert self.floor_runner is not None
        run = self.floor_runner.run(model, dict(feeds))
        if not run.ok:
            return f"the target with its optimizations off ({self.rule.spec}) does not run: {_short(run.crash_text())}"
        return self.rule.measure(oracle, run.outputs, self.limits)

    def _count(self, role: str, runner: Runner) -> None:
        calls = self.calls.setdefault(role, {"runs": 0, "compiles": 0})
        calls["runs"] += runner.runs
        calls["compiles"] += runner.compiles

    def claims(self, max_removals: int) -> list[Claim]:
        files, report = self.files, self.files.report
        self.say(f"running the oracle {files.oracle} and the target {files.target} on model.onnx (plain runs)")
        self.plain = plain = self.oracle.run(files.model_path, dict(files.inputs))
        runs = [self.target.fresh(files.model_path, dict(files.inputs))]
        if isinstance(report.get("flaky"), bool):
            self.say(f"running the target {FRESH_RUNS - 1} more times, each in a fresh worker")
            runs += [self.target.fresh(files.model_path, dict(files.inputs)) for _ in range(FRESH_RUNS - 1)]
        self.first, self.target_runs = runs[0], runs
        differ = _differing(runs)
        if self.floor_runner is not None and plain.ok:
            self.say(f"measuring the target's noise floor again: {self.rule.spec} on model.onnx (a plain run)")
            measured = self._measure_floor(files.model_path, files.inputs, plain.outputs)
            self.floor, self.floor_missing = (measured, None) if isinstance(measured, Floor) else (None, measured)
        #: why one run of the target cannot decide a claim (None: it can)
        self.undecidable: str | None = None
        if self.expected.by_check and self.judge.check is None:
            self.undecidable = ("the recorded failure is a Python check's verdict (graphbisect.reduce(check=...)), "
                                "which a bundle cannot hold")
        elif differ or report.get("flaky") is True:
            how = f"run {differ[0] + 1} of {len(runs)} differs from the first" if differ else "as the bundle says"
            self.undecidable = f"the target is flaky ({how}): one run of it decides nothing"
        claims = [self._expected_outputs(), *self._failure()]
        if isinstance(report.get("flaky"), bool):
            claims.append(_flaky(bool(report["flaky"]), runs, differ))
        if not plain.ok:
            return claims
        if report.get("one_minimal") is True:
            self.say(f"removing each of the {len(self.model.graph.node)} nodes in turn (an oracle and a target run "
                     "each)")
            claims.append(self._one_minimal(max_removals))
        levels = report.get("optimization_levels")
        if isinstance(levels, Mapping) and levels.get("lowest_failing"):
            self.say("running the target at each optimization level up to the recorded lowest failing one")
            claims.append(self._lowest_level(str(levels["lowest_failing"])))
        spec_check = report.get("spec_check")
        if isinstance(spec_check, Mapping) and isinstance(spec_check.get("agrees_with_oracle"), bool):
            self.say("running the ONNX specification's reference (onnx.reference)")
            claims.append(self._specification(spec_check))
        return claims

    # ------------------------------------------------------------------------------------------- claims
    def _expected_outputs(self) -> Claim:
        files, plain = self.files, self.plain
        statement = "oracle_outputs.npz holds what the oracle computes on model.onnx"
        if not plain.ok:
            return Claim("expected_outputs", statement, False,
                         f"the oracle {files.oracle} does not run model.onnx: {_short(plain.crash_text())}")
        if not files.oracle_outputs:
            return Claim("expected_outputs", statement, None, "the bundle holds no oracle_outputs.npz")
        recorded = dict(files.oracle_outputs)
        if bit_identical(recorded, {k: plain.outputs.get(k) for k in recorded}):
            return Claim("expected_outputs", statement, True, "a plain oracle run gives the same values, bit for bit")
        differences = compare_outputs(plain.outputs, recorded, self.limits)
        bad = worst(differences)
        if bad is not None:
            return Claim("expected_outputs", statement, False,
                         f"a plain oracle run computes other values: {bad.describe()} against the recorded ones")
        top = max((d.score for d in differences), default=0.0)
        return Claim("expected_outputs", statement, True,
                     f"a plain oracle run agrees within tolerance, not bit for bit (worst score {top:.3g})")

    def _failure(self) -> list[Claim]:
        e, plain = self.expected, self.plain
        statement = f"the target fails on model.onnx ({e.kind})"
        where = f" on {', '.join(sorted(e.outputs))}" if e.outputs else ""
        compiled = f", compiled as {_compiled(e)}" if e.compiled_kind else ""
        identity = f"it fails as recorded{where}{compiled}"
        said = re.search(r"~1e(-?\d+)× tolerance", str(self.files.report.get("headline") or ""))
        magnitude = f"the error is ~1e{said.group(1)}× tolerance" if e.by_values and said is not None else None
        if self.expected.by_check and magnitude is not None:  # the tolerance's word, which judged nothing here
            magnitude = None
        if not plain.ok or self.floor_missing is not None or (self.undecidable is not None and e.by_check):
            why = ("the oracle does not run model.onnx, so nothing decides" if not plain.ok else
                   _no_floor(self.floor_missing) if self.floor_missing is not None else str(self.undecidable))
            return [Claim(i, text, None, why) for i, text in
                    (("failure", statement), ("identity", identity), ("magnitude", magnitude)) if text]
        seen = [self.judge.judge(plain.outputs, run, floor=self.floor) for run in self.target_runs]
        kinds = [s.fails and (run.ok if e.by_values else not run.ok if e.kind in _CRASHES else True)
                 for s, run in zip(seen, self.target_runs)]
        shown = next((s for s, k in zip(seen, kinds) if k), seen[0])
        runs = f"{len(seen)} plain runs" if len(seen) > 1 else "plain runs"
        floor = f"; noise floor ({self.rule.spec}) measured again: {self.floor.describe()}" if self.floor else ""
        claims = [Claim("failure", statement, self._decided(any(kinds)), f"{runs}: {shown.text}{floor}")]
        same = [s.same for s in seen if s.fails]
        held = True if True in same else None if None in same else False
        claims.append(Claim("identity", identity, self._decided(held) if held is not None else None,
                            _identity_evidence(e, shown)))
        if magnitude is not None:
            claims.append(self._magnitude(int(said.group(1)), magnitude))  # type: ignore[union-attr]
        return claims

    def _decided(self, held: bool) -> bool | None:
        """A claim decided by the target's runs: what they show, except that a flaky target's runs establish
        only what some run showed (a fault they did not show may still be there)."""
        return held if held or self.undecidable is None else None

    def _magnitude(self, decade: int, statement: str) -> Claim:
        """The title's "error ~1eN× tolerance": N is the nearest power of ten of this model's worst score."""
        scores = []
        for run in self.target_runs:
            differences = compare_outputs(self.plain.outputs, run.outputs, self.limits) if run.ok else []
            bad = worst(self.floor.above(differences) if self.floor is not None else differences)
            if bad is not None and math.isfinite(bad.score) and bad.score > 0:
                scores.append((bad.score, bad.name))
        if not scores:
            return Claim("magnitude", statement, self._decided(False),
                         "no run of the target failed with a finite score")
        seen = sorted({round(math.log10(score)) for score, _ in scores})
        score, name = scores[0]
        evidence = f"worst score {score:.4g} ({shown(name)}): ~1e{round(math.log10(score))}× tolerance" + (
            f"; over {len(scores)} runs ~1e{seen[0]}..1e{seen[-1]}×" if len(seen) > 1 else "")
        return Claim("magnitude", statement, self._decided(decade in seen), evidence)

    def _one_minimal(self, max_removals: int) -> Claim:
        model = self.model
        statement = "1-minimal: removing any one node makes the recorded failure disappear"
        count = len(model.graph.node)
        if count > max_removals:
            return Claim("one_minimal", statement, None, f"{count} nodes: the checker runs single removals of "
                         f"bundles of at most {max_removals} nodes")
        if count == 1:
            return Claim("one_minimal", statement, True, "one node: removing it leaves nothing to run")
        if self.undecidable is not None or self.floor_missing is not None:
            return Claim("one_minimal", statement, None, self.undecidable or _no_floor(self.floor_missing))
        values = self._intermediates()
        if isinstance(values, str):
            return Claim("one_minimal", statement, None, values)
        same: list[str] = []
        other: list[str] = []
        untested: list[str] = []
        for index in range(count):
            outcome = self._removal(index, values)
            {"same": same, "other": other, "gone": []}.get(outcome[0], untested).append(outcome[1])
        evidence = f"{count - len(untested)} of {count} single removals built and run"
        if same:
            return Claim("one_minimal", statement, False,
                         f"{evidence}; still failing as recorded without: {', '.join(same)}")
        if other:
            evidence += f"; {len(other)} fail another way (without {', '.join(other)}): true for the recorded " \
                "failure only"
        if untested:
            return Claim("one_minimal", statement, None, f"{evidence}; not tested: {'; '.join(untested)}",
                         tuple(other))
        return Claim("one_minimal", statement, True, evidence, tuple(other))

    def _intermediates(self) -> Mapping[str, Any] | str:
        """The oracle's value of every intermediate tensor, or why it cannot be had."""
        names = produced_names(self.model)
        if not names:
            return {}
        path = self.scratch / "exposed.onnx"
        onnx.save(exposed(self.model, names), str(path))
        probe = self.oracle.run(path, dict(self.files.inputs))
        if not probe.ok:
            return ("the oracle cannot output the model's intermediate tensors (which feed the removals): "
                    f"{_short(probe.crash_text())}")
        if not bit_identical({k: probe.outputs.get(k) for k in self.plain.outputs}, self.plain.outputs):
            return ("the oracle computes other outputs when it also outputs the intermediate tensors, so their "
                    "values cannot feed the removals")
        return probe.outputs

    def _removal(self, index: int, values: Mapping[str, Any]) -> tuple[str, str]:
        """``(same | other | gone | untested, what to say)`` of the model without node ``index``."""
        cut = removal(self.model, index, self.files.inputs, values)
        if cut.why_not is not None:
            return "untested", f"{cut.node} ({cut.why_not})"
        if cut.model is None:
            return "gone", cut.node
        path = self.scratch / f"removal-{index}.onnx"
        onnx.save(cut.model, str(path))
        expected = self.oracle.run(path, dict(cut.feeds))
        if not expected.ok:
            return "untested", f"{cut.node} (the oracle: {_short(expected.crash_text(), 120)})"
        floor = None
        if self.floor_runner is not None:  # the removal's own noise floor, measured on it
            measured = self._measure_floor(path, cut.feeds, expected.outputs)
            if isinstance(measured, str):
                return "untested", f"{cut.node} ({_short(measured, 120)})"
            floor = measured
        must_fail = self.expected.outputs & frozenset(expected.outputs)
        seen = self.judge.judge(expected.outputs, self.target.run(path, dict(cut.feeds)),
                                outputs=must_fail or frozenset(expected.outputs), floor=floor)
        if seen.same is None:
            return "untested", f"{cut.node} (it fails; only the compiled graph, not described, would tell which way)"
        return ("same" if seen.same else "other" if seen.fails else "gone"), cut.node

    def _lowest_level(self, lowest: str) -> Claim:
        files = self.files
        statement = f"the lowest optimization level that fails the same way is opt_level={lowest}"
        _, row = resolve(files.target, require_available=False)
        if lowest not in row.opt_levels:
            return Claim("lowest_level", statement, None, f"{row.name} has no opt_level {lowest!r}")
        if self.undecidable is not None or self.floor_missing is not None:
            return Claim("lowest_level", statement, None, self.undecidable or _no_floor(self.floor_missing))
        order = list(row.opt_levels)
        checked: list[str] = []
        holds: bool | None = True
        for level in order[: order.index(lowest) + 1]:
            with Runner(files.target.with_options(opt_level=level), describe=self.describe,
                        folder=self.scratch) as runner:
                seen = self.judge.judge(self.plain.outputs, runner.run(files.model_path, dict(files.inputs)),
                                        floor=self.floor)
                self._count("target", runner)
            checked.append(f"{level}: " + ("fails the same way" if seen.same else "passes" if not seen.fails
                                           else "fails another way" if seen.same is False else
                                           "fails (which way: not described)"))
            fails_same = seen.same if seen.fails else False
            if level == lowest:
                holds = None if fails_same is None or holds is None else holds and fails_same
            elif fails_same is not False:
                holds = False if fails_same else None if holds else holds
        return Claim("lowest_level", statement, holds, "plain runs: " + "; ".join(checked))

    def _specification(self, spec_check: Mapping[str, Any]) -> Claim:
        with_oracle, with_target = bool(spec_check["agrees_with_oracle"]), bool(spec_check.get("agrees_with_target"))
        statement = (f"onnx.reference {'agrees' if with_oracle else 'disagrees'} with the oracle and "
                     f"{'agrees' if with_target else 'disagrees'} with the target")
        flip = spec_check.get("rounding") if spec_check.get("verdict") == "rounding" else None
        if isinstance(flip, Mapping):
            statement += (f"; the difference starts as a rounding flip of the {flip.get('side')} at "
                          f"{flip.get('op')} {flip.get('node')!r}")
        with Runner(BackendSpec(REFERENCE), folder=self.scratch) as runner:
            reference = runner.run(self.files.model_path, dict(self.files.inputs))
            claim = self._agreements(statement, with_oracle, with_target, reference)
            if claim.holds and isinstance(flip, Mapping):
                claim = self._flip(claim, flip, runner, reference)
            self._count("reference", runner)
        return claim

    def _agreements(self, statement: str, with_oracle: bool, with_target: bool, reference: Run) -> Claim:
        """Whether onnx.reference's plain run agrees with the oracle's and the target's as recorded."""
        if not reference.ok:
            return Claim("spec_check", statement, None,
                         f"onnx.reference does not run model.onnx: {_short(reference.crash_text())}")
        oracle_bad = worst(compare_outputs(reference.outputs, self.plain.outputs, self.limits))
        target_bad = worst(compare_outputs(reference.outputs, self.first.outputs, self.limits)) \
            if self.first.ok else None
        agrees_oracle, agrees_target = oracle_bad is None, self.first.ok and target_bad is None
        evidence = (f"oracle: {oracle_bad.describe() if oracle_bad else 'agrees'}; target: "
                    + (target_bad.describe() if target_bad else "agrees" if self.first.ok else "did not complete"))
        if agrees_oracle != with_oracle:
            return Claim("spec_check", statement, False, evidence)
        if self.undecidable is not None:  # the target's half
            return Claim("spec_check", statement, None, f"{evidence}; {self.undecidable}")
        return Claim("spec_check", statement, agrees_target == with_target, evidence)

    def _flip(self, claim: Claim, flip: Mapping[str, Any], reference_runner: Runner, reference: Run) -> Claim:
        """The recorded rounding flip (:mod:`.rounding`), re-established with the accused side's runs."""
        side = flip.get("side")
        if side not in ("oracle", "target"):
            return Claim("spec_check", claim.statement, False, f"{claim.evidence}; the flip names no side ({side!r})")
        plain, runner = (self.plain, self.oracle) if side == "oracle" else (self.first, self.target)
        holds, evidence = check_flip(self.model, flip, side=runner, reference=reference_runner,
                                     feeds=self.files.inputs, plain=(plain.outputs, reference.outputs),
                                     limits=self.limits, scratch=self.scratch)
        return Claim("spec_check", claim.statement, holds, f"{claim.evidence}; the rounding flip: {evidence}")


def _differing(runs: Sequence[Run]) -> list[int]:
    """The runs (indices) whose outcome differs from the first's: other output values, a crash against a
    completed run, or another crash."""
    first = runs[0]
    return [i for i, run in enumerate(runs[1:], 1)
            if run.ok != first.ok or (run.ok and not bit_identical(run.outputs, first.outputs))
            or (not run.ok and normalize_message(run.crash_text()) != normalize_message(first.crash_text()))]


def _flaky(recorded: bool, runs: Sequence[Run], differ: Sequence[int]) -> Claim:
    """Flaky only from differing outcomes (:func:`_differing`): runs that differ establish it, and refute "not
    flaky"; runs that agree establish "not flaky" as far as they go, and leave "flaky" not established (a fault
    at rate p hides from n runs with probability (1-p)^n)."""
    statement = "the target is flaky" if recorded else "the target is not flaky"
    first = runs[0]
    same = "the same outputs, bit for bit" if first.ok else "the same crash"
    evidence = f"{len(runs)} runs, each in a fresh worker: " + (
        f"run {differ[0] + 1} differs from the first" if differ else same)
    holds = (True if differ else None) if recorded else not differ
    return Claim("flaky", statement, holds, evidence)


def _identity_evidence(expected: _Expected, seen: _Seen) -> str:
    if expected.kind in _CRASHES or expected.regex is not None:
        return f"matched by the normalized message: {seen.text}"
    scope = "class, failing outputs and score within a decade"
    if expected.compiled_kind:
        scope += ", and what the target compiled"
    else:
        scope += " (no compiled region recorded: no location inside the model is matched)"
    return f"matched by {scope}: {seen.text}"

