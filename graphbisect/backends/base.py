"""The backend contract: spec strings, capabilities, the runtime protocol and run results.

A backend has two halves:

* the **host** half (this module, :mod:`.registry`, :mod:`.process`) parses specs, checks availability and
  sends requests to an isolated worker process;
* the **runtime** half (one module per backend, e.g. :mod:`.onnxruntime`) is a class implementing
  :class:`Runtime`. It is instantiated *inside* the worker process, possibly under another Python
  interpreter, so runtime modules import only the standard library, numpy and their own backend library
  at module level (never onnx-heavy graphbisect modules), and import their backend library lazily.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from graphbisect.compare.metrics import TensorStats
from graphbisect.errors import SpecError
from graphbisect.text.printable import plural

__all__ = [
    "RAN_WITH",
    "BackendSpec",
    "Capability",
    "Phase",
    "RunResult",
    "RunStatus",
    "Runtime",
    "UnsupportedType",
    "brief_spec",
    "cause_line",
    "message_cause",
]

class UnsupportedType(NotImplementedError):
    """A runtime cannot pass a value of this element type to or from its library without changing it.

    Raised by ``Runtime.run`` instead of handing over a value the library would read wrongly: the run is a
    crash whose message names the tensor and its type and says "not supported", so ``compare`` classifies
    it ``target-unsupported`` (or ``oracle-unsupported``), never a divergence.
    """

    def __init__(self, backend: str, role: str, name: str, type_name: str, why: str) -> None:
        super().__init__(f"{backend} {role} {name!r} of type {type_name} is not supported: {why}")


# What makes a backend's error message unstable or unreadable, cut before anything else looks at it.
_MODEL_DUMP = re.compile(r"^[ \t]*(?:ir_version|opset_import|producer_name|graph)[ \t]*[:{]", re.MULTILINE)
_QUOTED = r"(?:'[^'\n]*'|\"[^\"\n]*\")"
_NAME_LIST = re.compile(rf"[\[{{(]\s*{_QUOTED}(?:\s*[,:]\s*{_QUOTED})*\s*,?\s*[\]}})]")
_LOCATION_ONLY = re.compile(r"^(?:Exception from )?\S+:\d+:?$")  # OpenVINO's "Exception from src/x.cpp:84:"


def message_cause(message: str | None, *, limit: int = 4000) -> str:
    """The part of a backend's error message that says what failed, without what varies with model size.

    Its first paragraph (OpenVINO separates the failures of several ops by blank lines; the first one is the
    cause), with model dumps cut (onnx.reference appends the whole ``ModelProto``) and lists of quoted names
    collapsed to ``[...]`` (onnx.reference lists every known tensor name, so removing any node would change
    the message), at most ``limit`` characters. Lines are kept: OpenVINO's first line is only a source
    location, its cause is below.

    Example:
        >>> message_cause("Unable to find input 'x' in known results ['', 'a', 'b'], proto is\\nir_version: 8")
        "Unable to find input 'x' in known results [...], proto is"
    """
    text = (message or "").strip()
    dump = _MODEL_DUMP.search(text)
    if dump is not None:
        text = text[: dump.start()]
    text = _NAME_LIST.sub("[...]", text)
    paragraph = re.split(r"\n[ \t]*\n", text.strip(), maxsplit=1)[0]
    lines = [line.rstrip() for line in paragraph.splitlines() if line.strip()]
    joined = "\n".join(lines)
    return joined if len(joined) <= limit else joined[:limit].rstrip() + " ..."


def cause_line(message: str | None, limit: int = 600) -> str:
    """:func:`message_cause` on one line for humans, without location-only lines such as OpenVINO's
    ``Exception from src/inference/src/cpp/core.cpp:84:``, cut at ``limit`` characters."""
    lines = message_cause(message).splitlines()
    shown = [line.strip() for line in lines if not _LOCATION_ONLY.match(line.strip())] or lines
    cause = " ".join(shown)
    return cause if len(cause) <= limit else cause[:limit].rstrip() + " ..."


class Capability(str, enum.Enum):
    """What a backend can do beyond running a model; strategies ask for these, never for names. A backend
    declares them in its row (:class:`~graphbisect.backends.registry.BackendInfo`), a custom one in its
    runtime's ``capabilities`` attribute or :func:`~graphbisect.backends.registry.register_backend`'s
    ``capabilities`` (default: ``onnx-input`` alone). Each value, what a backend declaring it promises, and
    what graphbisect does with it:

    * ``onnx-input`` — its runtime loads ONNX files (the candidates graphbisect writes). Enables ``reduce``
      (its target and its oracle both need it), the reduction under culprit passes and ``precision``'s
      emulated pins; without it (Paddle) ``compare``, ``passes`` and ``precision``'s own pins run the model in
      its own format.
    * ``intermediates`` — ``load(model, outputs)`` returns any tensor named in ``outputs``, not only the
      graph's outputs. Enables layerwise evidence: the oracle's capture (the values a candidate's cut points
      are fed), ``compare``'s per-tensor table and first divergence, and in ``reduce`` the first candidates
      from the target's evidence and the failure's identity (where it first goes wrong), so a candidate that
      fails elsewhere is not accepted. Without it a reduction matches failures by their kind only.
    * ``compiled-graph`` — with its row's ``compiled_option`` set in the spec (a custom runtime: the
      ``compiled_option = (OPTION, VALUE)`` class attribute, e.g. ``("save_optimized", "1")``), ``info()``
      describes the graph it compiled: ``optimized_model`` (the path of the optimized ONNX model it ran),
      ``exec_graph`` (execution nodes with ``originalLayersNames``) or ``layers`` (engine layers naming their
      ONNX nodes); :mod:`graphbisect.localize.compiled` reads them. Enables the probe that exposes only the
      tensors surviving in that graph (a bug inside a fusion stays visible), "compiled as" in ``compare``,
      and the identity's compiled node and the pass that made it: what keeps a reduction, and ``verify``,
      on the bug that was reported rather than another failure at the same place (a sibling fusion, a
      kernel's noise). Without it the identity is the first divergent tensor alone.
    * ``passes`` — options list the optimization passes that fired and disable them by name; needs a row of
      :data:`graphbisect.strategies.passes.PASS_CONTROLS` (a custom runtime: a ``family`` of a built-in
      backend, :func:`~graphbisect.backends.registry.register_row`). Enables ``passes``, ``reduce --passes``
      and triage's pass search; ``reduce`` also names the pass that made the compiled node as ``disabled=``
      takes it.
    * ``tactics`` — with ``report_tactics=1`` its ``info()`` holds ``tactic_record``, and ``tactics=PATH``
      forces a recorded set of per-node kernel choices. Enables ``tactics record|replay|diff|isolate``.
    * ``precision`` — honours per-node precision pins (``keep_fp32=``). Shown by ``graphbisect backends``;
      ``precision`` measures whether the pins took effect rather than trusting it.
    * ``foreign-python`` — its runtime can run in a worker under another interpreter. Enables the spec
      option ``python=PATH`` (another release of its library in another environment, ``graphbisect
      releases``); refused for a backend without it.
    * ``needs-gpu`` — a run needs a GPU. Executors ask Ray for one GPU per task (``--executor ray``, triage).
    """

    INTERMEDIATES = "intermediates"
    PASSES = "passes"
    PRECISION = "precision"
    TACTICS = "tactics"
    FOREIGN_PYTHON = "foreign-python"
    ONNX_INPUT = "onnx-input"
    COMPILED_GRAPH = "compiled-graph"
    NEEDS_GPU = "needs-gpu"


class RunStatus(str, enum.Enum):
    OK = "ok"
    CRASH = "crash"  # exception, signal or non-zero exit of the backend
    TIMEOUT = "timeout"


class Phase(str, enum.Enum):
    """Where a crash happened: building the session/engine, or running it."""

    LOAD = "load"
    RUN = "run"


@dataclass(frozen=True)
class BackendSpec:
    """A parsed backend spec: ``NAME[:key=value,key=value,...]``.

    Values may not contain ``,``; lists inside a value use ``;`` (``disabled=A;B``).

    Example:
        >>> spec = BackendSpec.parse("onnxruntime:opt_level=all,disabled=LayerNormFusionL1;GeluFusionL1")
        >>> spec.name, spec.options["opt_level"], spec.option_list("disabled")
        ('onnxruntime', 'all', ['LayerNormFusionL1', 'GeluFusionL1'])
        >>> str(spec)
        'onnxruntime:disabled=LayerNormFusionL1;GeluFusionL1,opt_level=all'

    ``written`` is the text it was parsed from, kept through :func:`~graphbisect.backends.registry.resolve` and
    through :meth:`with_options` calls that only add options the text did not set (``save_optimized=1`` for a
    described run): an error names the spec as the user wrote it (:meth:`as_written`), never options they
    did not write. Not part of the spec's identity (equality, hash, ``str``).

        >>> BackendSpec.parse("ort:opt_level=max").with_options(save_optimized="1").as_written()
        'ort:opt_level=max'
    """

    name: str
    options: Mapping[str, str] = field(default_factory=dict)
    written: str | None = field(default=None, compare=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> BackendSpec:
        text = text.strip()
        if not text:
            raise SpecError("empty backend spec", hint="write NAME[:key=value,...], e.g. onnxruntime:opt_level=all")
        name, _, rest = text.partition(":")
        options: dict[str, str] = {}
        # python=/path may contain ':' (Windows drives); split options on ',' only.
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise SpecError(
                    f"backend spec {text!r}: option {item!r} is not key=value",
                    hint="write options as NAME:key=value,key=value (lists inside a value use ';')",
                )
            if key in options:
                raise SpecError(f"backend spec {text!r}: option {key!r} given twice")
            options[key.strip()] = value.strip()
        return cls(name.strip().lower(), dict(sorted(options.items())), written=text)

    def option_list(self, key: str) -> list[str]:
        """The ``;``-separated list stored under ``key`` (empty when absent)."""
        return [v for v in self.options.get(key, "").split(";") if v]

    def scoped_options(self) -> dict[str, dict[str, str]]:
        """The options whose key is ``SCOPE.NAME``, by scope: ONNX Runtime's provider options (``cuda.use_tf32=0``,
        see :mod:`graphbisect.backends.ort_providers`), which act inside a library's component rather than on
        the session. A trust check lists them apart: some name files or libraries.

        Example:
            >>> BackendSpec.parse("ort:providers=CUDAExecutionProvider,cuda.use_tf32=0").scoped_options()
            {'cuda': {'use_tf32': '0'}}
        """
        scoped: dict[str, dict[str, str]] = {}
        for key, value in self.options.items():
            scope, dot, name = key.partition(".")
            if dot:
                scoped.setdefault(scope, {})[name] = value
        return scoped

    def with_options(self, **changes: str | None) -> BackendSpec:
        """A copy with options set (``None`` removes one)."""
        options = dict(self.options)
        for key, value in changes.items():
            if value is None:
                options.pop(key, None)
            else:
                options[key] = value
        written = self.written
        if written is not None and any(key in BackendSpec.parse(written).options for key in changes):
            written = None  # it changes what the user wrote: the text no longer says what runs
        return dataclasses.replace(self, options=dict(sorted(options.items())), written=written)

    def as_written(self) -> str:
        """The spec as the user wrote it where it was parsed from their text, else its canonical form."""
        return self.written if self.written is not None else str(self)

    def __str__(self) -> str:
        if not self.options:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in self.options.items())


#: Options whose ';'-list names passes (ONNX Runtime's and onnxoptimizer's ``disabled=``, Paddle's ``delete_pass=``).
_PASS_LISTS = frozenset({"disabled", "delete_pass", "passes"})


def brief_spec(spec: BackendSpec | str, *, where: str | None = None, items: int = 4) -> str:
    """``spec`` for a line of text: an option listing more than ``items`` names is shown as their count. A
    search under only the culprit passes runs a spec with every other optimizer disabled (~70 names on ONNX
    Runtime, ~1,900 characters): printed whole, one terminal line held it. ``where`` names where the full
    spec is, said only when something was left out.

    Example:
        >>> brief_spec("onnxruntime:disabled=A;B;C;D;E,opt_level=disable", where="report.json")
        'onnxruntime:disabled=<5 passes>,opt_level=disable (the full spec: report.json)'
        >>> brief_spec("ort:disabled=LayerNormFusionL1;GeluFusionL1")
        'ort:disabled=LayerNormFusionL1;GeluFusionL1'
    """
    text = str(spec)  # a BackendSpec as it runs (canonical), as these lines showed it before
    try:
        parsed = BackendSpec.parse(text)
    except SpecError:
        return text
    long = {key for key in parsed.options if len(parsed.option_list(key)) > items}
    if not long:
        return text
    shown = [f"{key}=<{plural(len(parsed.option_list(key)), 'pass' if key in _PASS_LISTS else 'name')}>"
             if key in long else f"{key}={value}" for key, value in parsed.options.items()]
    return f"{parsed.name}:{','.join(shown)}" + (f" (the full spec: {where})" if where else "")


@dataclass(frozen=True)
class RunResult:
    """What one backend invocation produced. A crash is a result, not an exception.

    ``outputs`` maps tensor names to arrays (memory-mapped from the worker's output files when large).
    ``info`` holds backend-specific facts about the run, e.g. ``{"fired_passes": [...]}`` or the path of
    the optimized model; ``log`` is the tail of what the backend printed during this invocation.
    ``ran_with`` says what ran it, measured in the worker that did (keys :data:`RAN_WITH`): the backend
    library's version and location, the interpreter and its numpy — under ``python=`` those of the other
    interpreter, never this process's. Set for crashes and timeouts too (the worker that died); empty for
    ``command`` (an external program: its version is unknown, and the launching worker did not run it) unless
    ``package=`` names its library: then that distribution as the program's interpreter has it, measured there.
    ``stats``: for a run asked to compare with the oracle's store (``BackendProcess.run(compare_to=...)``),
    each compared tensor's statistics, measured in the worker; those tensors are not in ``outputs``.
    ``compiles``: the builds of a model this invocation made (0 when it reused an earlier session; more than 1
    when the backend compiled variants to report what fired), ``compile_cache_hits`` those served from the
    compile cache instead, as its worker counted them (:mod:`graphbisect.backends.cost`). ``peak_memory``: an
    upper bound of the resident bytes the worker and a child of it (a compiler it ran) held at once up to this
    call, as the worker measured them (:func:`graphbisect.backends.worker.peak_memory`); None when it could
    not (a worker that died, a platform without ``resource``).
    """

    status: RunStatus
    outputs: Mapping[str, np.ndarray] = field(default_factory=dict)
    phase: Phase | None = None
    error_type: str | None = None
    message: str | None = None
    exit_code: int | None = None
    log: str = ""
    info: Mapping[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    ran_with: Mapping[str, Any] = field(default_factory=dict)
    stats: Mapping[str, TensorStats] = field(default_factory=dict)
    compiles: int = 0
    compile_cache_hits: int = 0
    peak_memory: int | None = None

    @property
    def ok(self) -> bool:
        return self.status is RunStatus.OK

    def describe(self, limit: int = 600) -> str:
        """One line for humans: ``ok`` or ``crash at load: Fail: ...`` with the message's cause.

        The cause is :func:`message_cause` on one line, without OpenVINO's location-only first line
        (``Exception from src/inference/src/cpp/core.cpp:84:`` says nothing about what failed).
        """
        if self.ok:
            return "ok"
        where = f" at {self.phase.value}" if self.phase else ""
        what = ": ".join(x for x in (self.error_type, cause_line(self.message, limit) or None) if x)
        return f"{self.status.value}{where}" + (f": {what}" if what else "")


#: The facts of :attr:`RunResult.ran_with`, as the worker measures them at start. ``patched``: where graphbisect
#: changes what the library computes (a runtime's optional ``patched()``; absent when nothing is).
RAN_WITH: tuple[str, ...] = ("library", "library_version", "library_path", "python", "python_version", "numpy",
                             "patched")


class Runtime(Protocol):
    """The runtime half of a backend, instantiated inside an isolated worker process.

    ``options`` are the spec's options minus the host-level ones (``python``, ``timeout``).
    ``load`` builds a session/engine for ``model`` (an ONNX path, or a Paddle model prefix for Paddle)
    producing ``outputs`` (tensor names; ``None`` = the model's own outputs): any exception raised here is
    reported as a crash in :attr:`Phase.LOAD`. ``run`` executes it; exceptions become crashes in
    :attr:`Phase.RUN`. ``info`` returns JSON-serializable facts about the last load/run (fired passes,
    tactic choices, optimized model path...).

    Optional methods: ``validate()`` checks option values before the first load; ``registered_passes()``
    lists every optimization pass the runtime could run under its options (for a pass search on a target
    that crashes before it reports which passes fired); ``known_passes(names)`` says which of ``names`` it
    could run, where that is cheaper than listing them all (ONNX Runtime); ``load_key()`` returns what besides
    the model file decides the build (the worker rebuilds when it changes: Paddle's ``keep_fp32=@FILE`` op
    types, rewritten between the runs of one model by a precision search); ``patched()`` lists where graphbisect
    changes what the library computes (onnx.reference's bfloat16 rounding), reported in every ``ran_with``; ``cost()``
    returns the builds it made itself since it was created, ``{"compiles": n, "compile_cache_hits": m}`` (a
    compiler that compiles variants in one load, or serves them from a cache); without it every ``load`` the
    worker calls counts as one compile (:mod:`graphbisect.backends.cost`); ``measured()`` returns what runs its
    work where that is not the worker's interpreter (an external program's, ``command:package=``), in
    :data:`RAN_WITH`'s keys: reported as ``ran_with`` instead of the worker's own.

    Class attributes :func:`~graphbisect.backends.registry.register_backend` reads (each optional): ``name``,
    ``capabilities`` (:class:`Capability` values: what the backend promises, and what that enables),
    ``options`` (spec option → what it does), ``inert_options`` (their trust rules) and ``compiled_option``
    (the option that makes ``info()`` describe the compiled graph, with ``compiled-graph``).
    """

    def __init__(self, options: Mapping[str, str], workdir: str) -> None: ...

    def load(self, model: str, outputs: Sequence[str] | None) -> None: ...

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]: ...

    def info(self) -> dict[str, Any]: ...
