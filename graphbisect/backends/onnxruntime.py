"""ONNX Runtime as a backend (runs inside a worker; imports only stdlib, numpy and, lazily, onnxruntime).

Spec options (see the registry): ``providers``, ``opt_level``, ``disabled``, ``threads``, ``config``,
``save_optimized``, ``report_passes``, and provider options ``<ep>.<key>=<value>`` (:mod:`.ort_providers`).

**Provider options** reach ``InferenceSession(..., providers=[(name, {key: value}), ...])``. ORT's Python API
does not refuse what a provider ignores (the CPU provider takes none: ORT 1.32 reports ``{}`` for it whatever
it was given), so :meth:`OnnxRuntime.validate` creates a probe session with them and refuses, as a
:class:`~graphbisect.errors.SpecError` naming the key, an option the provider rejects or does not report back
(``get_provider_options()``). **No silent fallback:** ``InferenceSession`` retries on the CPU provider alone
when a provider fails to be created (an option value it rejects, missing CUDA libraries) and carries on, so a
"CUDA" target would compute on the CPU. Sessions are made with ``enable_fallback=0`` (ORT 1.23+; older
releases ignore it) and every requested provider must be among the session's providers, else the load is a
:class:`~graphbisect.errors.BackendUnavailableError` carrying ORT's own reason.

**Optimizer names.** ``disabled=`` goes to ``InferenceSession(disabled_optimizers=...)``, which silently
ignores names it does not know, so a typo would disable nothing and the pass search would draw wrong
conclusions. The names also differ from the C++ class names and change between versions (on ORT 1.31:
``LayerNormFusionL1``/``LayerNormFusionL2`` but no ``LayerNormFusion``; rewrite rules ``Pad_Fusion``,
``MatMul_BatchNormalization_Fusion``, ``ClipQuantRewrite``). :func:`optimizer_catalog` therefore asks the
installed ORT itself:

* graph transformers: a session on a one-node probe model at ``ORT_ENABLE_ALL`` with verbose logging logs
  every transformer that ran (``GraphTransformer <name> modified: 0``, the one line every ORT release
  writes: 1.17-1.22 have no ``Applying graph transformer`` lines), for the same providers and session config
  as the spec (both change which transformers exist). A second session with all of them disabled tells the
  ones ``disabled_optimizers`` switches off (their count of lines drops) from those that run whatever the
  options say (``MemcpyTransformer``, the first of the two ``EnsureUniqueDQForNodeUnit`` runs);
* rewrite rules are not logged individually, but a ``LevelN_RuleBasedTransformer`` is dropped when all its
  rules are disabled. So with ``covered(S)`` = "the rule transformer vanishes when S is disabled", the rules
  are found by adaptive group testing over the identifier-like strings of ORT's binary (~19,000; ~400 probe
  sessions, ~5 s on ORT 1.32 on a 2-core machine).

The catalogue is cached per ORT build, providers and config (in memory and under
``$GRAPHBISECT_CACHE/onnxruntime-optimizers``, default ``~/.cache/graphbisect``). It is listed only where every
name is needed (a pass search's space); whether a few given names are valid (a spec's ``disabled=``, the pass
that made a compiled node) is asked of ORT directly, a handful of probe sessions (:func:`optimizer_names_among`:
about 0.3 s, against ~400 sessions and ~5 s for the catalogue on a fresh machine). An unknown name is a
:class:`~graphbisect.errors.SpecError` (with close matches and the valid names in its hint), raised by
:meth:`OnnxRuntime.validate`, which :class:`~graphbisect.backends.process.BackendProcess` calls before the
first run, so a bad spec fails before any model is touched.

**No spinning.** ONNX Runtime's intra-op threads busy-wait after each parallel section by default, which
buys latency for back-to-back runs of one session. graphbisect runs a session once or a few times and then
builds the next candidate's, so the spinning only burns a core the next build needs: on PP-OCRv4 rec int8
candidates ~90 ms of the worker's ~250 ms of CPU per run (benchmarks/README.md, issue 14). Sessions are
therefore made with ``session.intra_op.allow_spinning=0`` unless the spec's ``config`` sets it; it decides
how idle threads wait, not which kernels run or how work is split (outputs measured bit-identical).

**Fired passes** (``report_passes=1``): session creation runs with verbose logging and every
``GraphTransformer <name> modified: 1`` line counts. When a rule-based transformer modified the graph,
the rules responsible are found by isolating subsets of its rules (group testing, a few extra sessions at
that rule's level); a rule that only fires after another one fired is attributed to that other rule.

**Compiles** (:mod:`graphbisect.backends.cost`): every ``InferenceSession`` built of the model is one, the
run's own and each one made only to find what fired: :meth:`OnnxRuntime.cost` counts them. Sessions of the
one-node probe model that learn what the installed ORT is (the optimizer names, once per build and then read
from the disk cache; whether it takes the provider options) are not the target's work on any model: they are
counted apart (:func:`probe_sessions`) and logged, never as the target's compiles (the first bundle on a fresh
machine said "target 4 (414 compiles)" for four runs of a 9-node model).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import importlib
import io
import json
import logging
import os
import re
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from graphbisect.backends.ort_providers import (
    CPU_PROVIDERS,
    ProviderOption,
    provider_options,
    providers_of,
    session_providers,
)
from graphbisect.backends.worker import close_names, option_flag, select_feeds, unknown_names_hint
from graphbisect.errors import BackendError, BackendUnavailableError, InputError, ModelError, SpecError
from graphbisect.storage.values import (
    EXTENSION_TYPES,
    elem_type_of,
    encode_tensor,
    from_raw_bytes,
    pack,
    sub_byte_bits,
    to_memory,
)

__all__ = ["OnnxRuntime", "OptimizerCatalog", "OrtOptions", "capture_fd2", "check_optimizer_names",
           "check_provider_options", "create_session", "disableable_transformers", "optimizer_catalog",
           "optimizer_names_among", "probe_sessions", "require_providers", "session_config", "sessions_created"]

logger = logging.getLogger(__name__)

OPT_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",
    "all": "ORT_ENABLE_ALL",
}
_OPTIONS = ("providers", "opt_level", "disabled", "threads", "config", "save_optimized", "report_passes")

# Relu(x: float[1]) -> y, IR 7, opset 13: the probe model of the optimizer catalogue (built with
# onnx.helper; embedded because the runtime must not import onnx).
_PROBE_MODEL = (
    b"\x08\x07\x12\x0bgraphbisect:7\n\x0c\n\x01x\x12\x01y\"\x04Relu\x12\x05probeZ\x0f\n\x01x\x12\n\n\x08\x08"
    b"\x01\x12\x04\n\x02\x08\x01b\x0f\n\x01y\x12\n\n\x08\x08\x01\x12\x04\n\x02\x08\x01B\x04\n\x00\x10\r"
)
_RAN = re.compile(r"GraphTransformer (\S+) modified:")
_MODIFIED = re.compile(r"GraphTransformer (\S+) modified: (?:1|true)\b")
_RULE_SET = re.compile(r"Level(\d+)_RuleBasedTransformer")
_VERBOSE_LINE = re.compile(r"\[[VI]:onnxruntime:")
_IDENTIFIER = re.compile(rb"(?<=\x00)[A-Za-z][A-Za-z0-9_]{2,80}(?=\x00)")


# -------------------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class OrtOptions:
    """The runtime options of an ``onnxruntime`` spec, parsed and checked (without importing ORT).

    Example:
        >>> o = OrtOptions.parse({"opt_level": "basic", "config": "session.a=1;session.b=x=y"})
        >>> o.opt_level, o.config, o.providers
        ('basic', (('session.a', '1'), ('session.b', 'x=y')), ('CPUExecutionProvider',))
        >>> OrtOptions.parse({"providers": "CUDAExecutionProvider", "cuda.use_tf32": "0"}).session_providers()
        [('CUDAExecutionProvider', {'use_tf32': '0'})]
    """

    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    opt_level: str = "all"
    disabled: tuple[str, ...] = ()
    threads: int | None = None
    config: tuple[tuple[str, str], ...] = ()
    save_optimized: bool = False
    report_passes: bool = False
    provider_options: tuple[ProviderOption, ...] = ()  # <ep>.<key>=<value> (graphbisect.backends.ort_providers)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> OrtOptions:
        unknown = sorted(key for key in set(options) - set(_OPTIONS) if "." not in key)
        if unknown:
            raise SpecError(f"onnxruntime has no option {', '.join(unknown)}",
                            hint=f"valid: {', '.join(_OPTIONS)}, and provider options <ep>.<key>=<value>")
        level = options.get("opt_level", "all").strip().lower()
        if level not in OPT_LEVELS:
            raise SpecError(f"opt_level={level!r} is not an ONNX Runtime optimization level",
                            hint=f"choose one of {'|'.join(OPT_LEVELS)}")
        return cls(
            providers=providers_of(options),
            opt_level=level,
            disabled=tuple(dict.fromkeys(_split(options.get("disabled", "")))),
            threads=_threads(options.get("threads")),
            config=_config(options.get("config", "")),
            save_optimized=option_flag(options, "save_optimized"),
            report_passes=option_flag(options, "report_passes"),
            provider_options=provider_options(options),
        )

    def session_providers(self) -> list[str | tuple[str, dict[str, str]]]:
        """``InferenceSession``'s ``providers`` argument: names, with ``(name, {key: value})`` for the providers
        the spec gives options."""
        return session_providers(self.providers, self.provider_options)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(";") if part.strip()]


def _threads(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.strip().isdigit():
        raise SpecError(f"threads={text!r} is not a non-negative integer", hint="e.g. threads=4 (0 = ORT's choice)")
    return int(text)


def _config(text: str) -> tuple[tuple[str, str], ...]:
    entries = []
    for item in _split(text):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"config entry {item!r} is not key=value",
                            hint="write config=key=value;key=value, e.g. config=session.disable_prepacking=1")
        entries.append((key.strip(), value.strip()))
    return tuple(entries)


# ------------------------------------------------------------------------------------------ log capture
@dataclass
class Captured:
    """Text written to fd 2 inside :func:`capture_fd2` (filled when the block exits)."""

    text: str = ""


@contextlib.contextmanager
def capture_fd2(forward: Callable[[str], bool] | None = None) -> Iterator[Captured]:
    """Capture what is written to file descriptor 2 (ORT's C++ logger) inside the block.

    Lines for which ``forward`` is true are written to the real fd 2 afterwards, so warnings and errors
    still reach the worker log while verbose chatter does not.
    """
    captured = Captured()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.text = tmp.read().decode("utf-8", errors="replace")
            kept = [line for line in captured.text.splitlines(keepends=True) if forward and forward(line)]
            if kept:
                os.write(2, "".join(kept).encode("utf-8"))


def _not_verbose(line: str) -> bool:
    return _VERBOSE_LINE.search(line) is None


def _session_log(ort: Any, model: str | bytes, options: OrtOptions, level: str,
                 disabled: Iterable[str]) -> str:
    """The verbose log of creating one session (a failure is logged too, so it is not raised)."""
    so = _session_options(ort, options, level)
    so.log_severity_level = 0
    with capture_fd2() as log:
        try:
            create_session(ort, model, so, options, sorted(disabled))
        except Exception as exc:
            logger.debug("probe session failed: %s", exc)
    return log.text


_SESSIONS = [0]  # every session creation this process attempted (create_session): the compiles it made
_PROBES = [0]  # of those, the sessions that learnt what ORT is (_learning): no model's compiles
_SESSIONS_LOCK = threading.Lock()


def sessions_created() -> int:
    """How many ``InferenceSession`` creations of models this process attempted so far (one compile each,
    failed or not); the probe sessions that learn what the installed ORT is are not among them."""
    with _SESSIONS_LOCK:
        return _SESSIONS[0] - _PROBES[0]


def probe_sessions() -> int:
    """How many sessions this process made only to learn what the installed ORT is (its optimizer names, the
    provider options it takes): not compiles of any model (module docstring, "Compiles")."""
    with _SESSIONS_LOCK:
        return _PROBES[0]


_NESTED = threading.local()  # _learning blocks open in this thread: an inner one's sessions are the outer's


@contextlib.contextmanager
def _learning(what: str) -> Iterator[None]:
    """Count the sessions created inside the block as probe sessions (:func:`probe_sessions`), not compiles;
    a block inside another is counted by the outer one alone."""
    depth = getattr(_NESTED, "depth", 0)
    _NESTED.depth = depth + 1
    with _SESSIONS_LOCK:
        before = _SESSIONS[0]
    try:
        yield
    finally:
        _NESTED.depth = depth
        if depth == 0:
            with _SESSIONS_LOCK:
                made = _SESSIONS[0] - before
                _PROBES[0] += made
            logger.info("%s: %d probe session(s), not counted as compiles", what, made)


def create_session(ort: Any, model: str | bytes, so: Any, options: OrtOptions, disabled: Sequence[str]) -> Any:
    """An ``InferenceSession`` on the spec's providers with their provider options, never on fewer providers.

    ORT retries on the CPU provider alone when creating a session with another one raises (a provider option
    it rejects), and skips a provider it cannot create (missing CUDA libraries: a logged warning), both
    without an error. ``enable_fallback=0`` stops the first (ORT 1.23+; older releases ignore the argument);
    a requested provider missing from the session's providers catches both, as a
    :class:`BackendUnavailableError` carrying what ORT printed about it.
    """
    accelerated = any(p not in CPU_PROVIDERS for p in options.providers)
    with _SESSIONS_LOCK:  # counted before: a build that raises was compiled as far as it got
        _SESSIONS[0] += 1
    with _ort_messages(accelerated) as said:
        session = ort.InferenceSession(model, so, providers=options.session_providers(),
                                       disabled_optimizers=list(disabled), enable_fallback=0)
    require_providers(ort, session, options, said)
    return session


def require_providers(ort: Any, session: Any, options: OrtOptions, said: Sequence[str] = ()) -> None:
    """Raise :class:`BackendUnavailableError` when ``session`` lacks a provider the spec asks for (ORT fell back)."""
    running = list(session.get_providers())
    missing = [p for p in options.providers if p not in running]
    if not missing:
        return
    reason = "\n".join(said)[-3000:] or "ORT printed no reason (see the worker log)"
    raise BackendUnavailableError(
        f"onnxruntime {ort.__version__} could not create {', '.join(missing)}: the session fell back to "
        f"{';'.join(running)}, so it would not compute on what the spec asks. What ONNX Runtime said:\n{reason}",
        hint="check the provider options and that this machine has the provider's device and libraries (CUDA/cuDNN "
        "of the version the onnxruntime-gpu build needs); `graphbisect backends` shows which onnxruntime imports")


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_PROVIDER_TROUBLE = re.compile(r"\[[EW]:onnxruntime|EP Error|Falling back|Failed to|fail", re.IGNORECASE)


@contextlib.contextmanager
def _ort_messages(capture: bool) -> Iterator[list[str]]:
    """Collect what ORT prints about providers it could not create (its C++ log on fd 2, its Python ``print``
    on stdout) inside the block; everything still reaches the worker log. Nothing is captured unless asked."""
    said: list[str] = []
    if not capture:
        yield said
        return
    printed = io.StringIO()
    try:
        with capture_fd2(forward=lambda line: True) as log, contextlib.redirect_stdout(printed):
            yield said
    finally:
        sys.stdout.write(printed.getvalue())
        lines = [*printed.getvalue().splitlines(), *log.text.splitlines()]
        said.extend(_plain(line).strip() for line in lines if _PROVIDER_TROUBLE.search(line))


def _plain(text: str) -> str:
    """``text`` without terminal colour codes (ORT colours its console log)."""
    return _COLOUR.sub("", text)


_PROVIDERS_CHECKED: set[str] = set()


def check_provider_options(ort: Any, options: OrtOptions) -> None:
    """Refuse, as a :class:`SpecError` naming the key, a provider option the installed ORT rejects or would
    ignore: a probe session (one Relu) is created with the spec's providers and options, and every option
    must be among those ``get_provider_options()`` reports for its provider afterwards (cached per build).
    """
    if not options.provider_options:
        return
    key = json.dumps([ort.__version__, options.session_providers()], sort_keys=True)
    if key in _PROVIDERS_CHECKED:
        return
    probe = dataclasses.replace(options, threads=1, config=())
    keys = ", ".join(o.spec_key for o in options.provider_options)
    try:
        with _learning("checking the provider options"):
            session = create_session(ort, _PROBE_MODEL, _session_options(ort, probe, "disable"), probe, ())
    except BackendUnavailableError:
        raise
    except Exception as exc:
        raise SpecError(f"onnxruntime {ort.__version__} could not create a session on {';'.join(options.providers)} "
                        f"with the provider options {keys}: {type(exc).__name__}: {_plain(str(exc)).strip()}",
                        hint="<ep>.<key>: <key> is ONNX Runtime's own option name, verbatim (e.g. cuda.use_tf32, "
                        "trt.trt_fp16_enable; see the provider's documentation for values); a provider whose "
                        "libraries are missing fails the same way without options") from exc
    reported = session.get_provider_options()
    for option in options.provider_options:
        known = reported.get(option.provider) or {}
        if option.key in known:
            continue
        if not known:
            why = (" (its Python API creates the CPU provider from the session options alone)"
                   if option.provider == "CPUExecutionProvider" else "")
            raise SpecError(
                f"provider option {option.spec_key}={option.value}: {option.provider} of onnxruntime "
                f"{ort.__version__} reports no provider options after a session is created, so it cannot be "
                f"checked and ORT would ignore it silently{why}",
                hint=f"remove {option.spec_key}; session settings go in config=key=value;... and threads=")
        raise SpecError(
            f"provider option {option.spec_key}={option.value}: {option.provider} of onnxruntime {ort.__version__} "
            f"has no option {option.key!r}",
            hint=close_names(option.key, sorted(known)) + f". Its options: {', '.join(sorted(known))}")
    _PROVIDERS_CHECKED.add(key)


_SPIN = "session.intra_op.allow_spinning"


def session_config(options: OrtOptions) -> list[tuple[str, str]]:
    """The session config entries a session of ``options`` gets, in order: idle intra-op threads block
    instead of spinning unless ``config`` says otherwise (module docstring, "No spinning"), then ``config``.
    ``repro.py`` builds its session from the same list.

    Example:
        >>> session_config(OrtOptions.parse({"config": "session.disable_prepacking=1"}))
        [('session.intra_op.allow_spinning', '0'), ('session.disable_prepacking', '1')]
    """
    default = [] if any(key == _SPIN for key, _ in options.config) else [(_SPIN, "0")]
    return [*default, *options.config]


def _session_options(ort: Any, options: OrtOptions, level: str) -> Any:
    """The spec's session options (:func:`session_config` for the config entries)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = _opt_level(ort, level)
    if options.threads is not None:
        so.intra_op_num_threads = options.threads
    for key, value in session_config(options):
        so.add_session_config_entry(key, value)
    return so


def _opt_level(ort: Any, level: str) -> Any:
    value = getattr(ort.GraphOptimizationLevel, OPT_LEVELS[level], None)
    if value is None:
        raise SpecError(f"onnxruntime {ort.__version__} has no {OPT_LEVELS[level]} optimization level",
                        hint="use opt_level=all (it includes layout optimizations) or a newer onnxruntime")
    return value


# ----------------------------------------------------------------------------------- optimizer catalogue
@dataclass(frozen=True)
class OptimizerCatalog:
    """The optimizer names ``disabled=`` accepts for one ORT build, provider list and session config."""

    version: str
    transformers: tuple[str, ...]  # graph transformers, in registration order
    rules: Mapping[str, tuple[str, ...]]  # rule-based transformer -> its rewrite rules
    unverified: tuple[str, ...] = ()  # rule-based transformers whose rules could not be enumerated

    def names(self) -> list[str]:
        """Every valid name: transformers, then rewrite rules."""
        return list(dict.fromkeys([*self.transformers, *(r for rules in self.rules.values() for r in rules)]))

    def check(self, names: Iterable[str]) -> None:
        """Raise :class:`SpecError` for names this ORT would silently ignore."""
        known = set(self.names())
        unknown = [name for name in names if name not in known]
        if not unknown:
            return
        if self.unverified:
            logger.warning("cannot verify optimizer names %s: the rewrite rules of %s could not be enumerated",
                           unknown, ", ".join(self.unverified))
            return
        raise SpecError(
            f"onnxruntime {self.version} has no optimizer named {', '.join(map(repr, unknown))} "
            "(ORT silently ignores unknown names in disabled_optimizers, so nothing would be disabled)",
            hint=unknown_names_hint(unknown, self.names(), "`graphbisect backends --passes onnxruntime`"),
        )


_CATALOGS: dict[str, OptimizerCatalog] = {}


def optimizer_catalog(options: OrtOptions) -> OptimizerCatalog:
    """The valid ``disabled=`` names of the installed ORT for ``options``' providers and config (cached)."""
    ort = importlib.import_module("onnxruntime")
    key, binary, path = _catalog_key(ort, options)
    if key in _CATALOGS:
        return _CATALOGS[key]
    catalog = _read_catalog(path)
    if catalog is None:
        with _learning(f"listing the optimizer names of onnxruntime {ort.__version__}"):
            catalog = _discover(ort, binary, options)
        _write_catalog(path, catalog)
    _CATALOGS[key] = catalog
    return catalog


def _catalog_key(ort: Any, options: OrtOptions) -> tuple[str, Path, Path]:
    """The catalogue's cache key for this ORT build, providers and config; ORT's binary; the cache file."""
    binary = Path(importlib.import_module("onnxruntime.capi.onnxruntime_pybind11_state").__file__ or "")
    st = binary.stat()
    key_data = {"version": ort.__version__, "binary": [str(binary), st.st_size, st.st_mtime_ns],
                "providers": options.session_providers(), "config": [list(e) for e in options.config], "format": 2}
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:16]
    return key, binary, _cache_dir() / f"{ort.__version__}-{key}.json"


#: Up to this many names that are no graph transformer, some of them rewrite rules, are checked one by one
#: (:func:`optimizer_names_among`); more, and the whole catalogue is listed once (and cached).
FEW_NAMES = 12

_KNOWN: dict[str, dict[str, bool]] = {}  # catalogue key -> {name: whether disabled= takes it}, this process


def optimizer_names_among(options: OrtOptions, names: Iterable[str]) -> tuple[list[str], list[str]]:
    """The names among ``names`` that this ORT's ``disabled=`` takes, and the rule sets whose rules could not be
    enumerated (a name that may be one of theirs is then not known), without listing every optimizer.

    The whole catalogue (:func:`optimizer_catalog`) costs ~400 probe sessions on a fresh machine: its rewrite
    rules are found by group testing over the binary's ~19,000 identifiers. Whether some given names are
    valid costs a handful: the graph transformers (2 sessions), and, for the names that are none of them,
    whether each rule set still runs with every identifier but those names disabled (one session per rule
    set); only where it does not (some name is one of its rules) is each name tried, or, for more than
    :data:`FEW_NAMES`, the catalogue listed. A catalogue already cached answers alone. Probe sessions are
    counted apart (:func:`probe_sessions`), never as compiles.
    """
    ort = importlib.import_module("onnxruntime")
    wanted = _unique(names)
    key, binary, path = _catalog_key(ort, options)
    catalog = _CATALOGS.get(key) or _read_catalog(path)
    known = _KNOWN.setdefault(key, {})
    asked = [n for n in wanted if n not in known]
    unverified: list[str] | None = []
    if catalog is None and asked:
        with _learning(f"checking {len(asked)} optimizer name(s) of onnxruntime {ort.__version__}"):
            unverified = _check_names(ort, binary, options, asked, known)
        if unverified is None:
            catalog = optimizer_catalog(options)
    if catalog is not None:
        _CATALOGS[key] = catalog
        valid = set(catalog.names())
        return [n for n in wanted if n in valid], list(catalog.unverified)
    return [n for n in wanted if known.get(n)], list(unverified or ())


_TRANSFORMERS: dict[str, tuple[str, ...]] = {}  # catalogue key -> the graph transformers, this process


def disableable_transformers(options: OrtOptions) -> tuple[str, ...]:
    """The graph transformers ``disabled=`` switches off (rule sets included, not their rules): the catalogue's
    when it is cached, else two probe sessions (:func:`_disableable_transformers`), kept for this process."""
    ort = importlib.import_module("onnxruntime")
    key, _, path = _catalog_key(ort, options)
    if key not in _TRANSFORMERS:
        catalog = _CATALOGS.get(key) or _read_catalog(path)
        if catalog is not None:
            _TRANSFORMERS[key] = catalog.transformers
        else:
            with _learning(f"listing the graph transformers of onnxruntime {ort.__version__}"):
                _TRANSFORMERS[key] = tuple(_disableable_transformers(ort, dataclasses.replace(options, threads=1)))
    return _TRANSFORMERS[key]


def _check_names(ort: Any, binary: Path, options: OrtOptions, asked: Sequence[str],
                 known: dict[str, bool]) -> list[str] | None:
    """Record in ``known`` whether each of ``asked`` is a graph transformer or a rewrite rule. Returns the rule
    sets whose rules the binary's identifiers do not cover (nothing can be said of their rules), or None when
    more than :data:`FEW_NAMES` names are tried one by one (the catalogue is cheaper)."""
    probe = dataclasses.replace(options, threads=1)
    transformers = disableable_transformers(options)
    rest = [n for n in asked if n not in transformers]
    known.update({n: True for n in asked if n in transformers})
    rules: set[str] = set()
    unverified = []
    candidates = _binary_identifiers(binary) if rest else []
    for rule_set in (t for t in transformers if _RULE_SET.fullmatch(t)) if rest else ():

        def covered(disabled: Sequence[str], rule_set: str = rule_set) -> bool:
            return rule_set not in _RAN.findall(_session_log(ort, _PROBE_MODEL, probe, "all", disabled))

        if not covered(candidates):
            unverified.append(rule_set)
        elif not covered([c for c in candidates if c not in set(rest)]):  # some asked name is one of its rules
            if len(rest) > FEW_NAMES:
                return None
            rules.update(n for n in rest if not covered([c for c in candidates if c != n]))
    known.update({n: True for n in rules})
    if not unverified:
        known.update({n: n in rules for n in rest})
    return unverified


def check_optimizer_names(options: OrtOptions, names: Sequence[str]) -> None:
    """Raise :class:`SpecError` for names of ``names`` this ORT would silently ignore (see
    :meth:`OptimizerCatalog.check`), listing the whole catalogue only for a hint when one is unknown."""
    known, unverified = optimizer_names_among(options, names)
    unknown = [n for n in names if n not in known]
    if not unknown:
        return
    if unverified:
        logger.warning("cannot verify optimizer names %s: the rewrite rules of %s could not be enumerated",
                       unknown, ", ".join(unverified))
        return
    optimizer_catalog(options).check(unknown)


def _cache_dir() -> Path:
    base = os.environ.get("GRAPHBISECT_CACHE") or str(Path.home() / ".cache" / "graphbisect")
    return Path(base) / "onnxruntime-optimizers"


def _read_catalog(path: Path) -> OptimizerCatalog | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return OptimizerCatalog(data["version"], tuple(data["transformers"]),
                                {k: tuple(v) for k, v in data["rules"].items()}, tuple(data["unverified"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_catalog(path: Path, catalog: OptimizerCatalog) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(catalog), indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        logger.debug("cannot cache the optimizer catalogue in %s: %s", path, exc)


def _discover(ort: Any, binary: Path, options: OrtOptions) -> OptimizerCatalog:
    logger.info("discovering the optimizer names of onnxruntime %s (once per version)", ort.__version__)
    probe = dataclasses.replace(options, threads=1)
    transformers = _disableable_transformers(ort, probe)
    candidates = _binary_identifiers(binary)
    rules: dict[str, tuple[str, ...]] = {}
    unverified = []
    for rule_set in (t for t in transformers if _RULE_SET.fullmatch(t)):

        def covered(disabled: Sequence[str], rule_set: str = rule_set) -> bool:
            return rule_set not in _RAN.findall(_session_log(ort, _PROBE_MODEL, probe, "all", disabled))

        if covered(candidates):
            rules[rule_set] = tuple(_group_search(candidates, covered))
        else:
            unverified.append(rule_set)
    return OptimizerCatalog(ort.__version__, tuple(transformers), rules, tuple(unverified))


def _disableable_transformers(ort: Any, probe: OrtOptions) -> list[str]:
    """The graph transformers that ``disabled_optimizers`` switches off, in the order they ran.

    Rule-based transformers stay while any of their rules is enabled; they are kept here (their rules are
    enumerated by the caller). Raises :class:`BackendError` when the verbose log names no transformer at all:
    an empty catalogue would make every fired pass look impossible to disable.
    """
    ran = Counter(_RAN.findall(_session_log(ort, _PROBE_MODEL, probe, "all", ())))
    if not ran:
        raise BackendError(
            f"cannot list the graph transformers of onnxruntime {ort.__version__}: its verbose session log has "
            "no 'GraphTransformer <name> modified:' lines",
            hint="report this with the onnxruntime version; pass searches and disabled= checks need that log")
    still = Counter(_RAN.findall(_session_log(ort, _PROBE_MODEL, probe, "all", list(ran))))
    return [name for name in ran if still[name] < ran[name] or _RULE_SET.fullmatch(name)]


@functools.lru_cache(maxsize=2)
def _binary_identifiers(binary: Path) -> list[str]:
    """Identifier-like NUL-terminated strings of ORT's binary, plus their suffixes at capital letters.

    Suffixes cover linkers that merge a string literal into the tail of a longer one.
    """
    found = {s.decode() for s in _IDENTIFIER.findall(binary.read_bytes())}
    suffixes = {s[i:] for s in found for i in range(1, len(s) - 2) if s[i].isupper()}
    return sorted(found | suffixes)


def _group_search(candidates: list[str], covered: Callable[[Sequence[str]], bool]) -> list[str]:
    """The hidden set R ⊆ ``candidates``, given ``covered(S)`` ⟺ R ⊆ S (adaptive group testing).

    Precondition: ``covered(candidates)``. Costs about 2·|R|·log2(len(candidates)) calls.
    """

    def find(fixed: list[str], pool: list[str]) -> list[str]:
        if covered(fixed):
            return []
        if len(pool) == 1:
            return pool
        first, second = pool[: len(pool) // 2], pool[len(pool) // 2 :]
        found = find(fixed + second, first)
        return found + find(fixed + found, second)

    return find([], candidates)


def _unique(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


# ------------------------------------------------------------------------------- types numpy lacks
#: ORT's type strings of the element types numpy lacks (``NodeArg.type``), e.g. ``tensor(float8e4m3fn)``.
_EXTENSION_TYPE_NAMES = frozenset(f"tensor({t.onnx_name.lower()})" for t in EXTENSION_TYPES.values()) | {
    "tensor(float4e2m1)", "tensor(float8e8m0)"}


def _extension_code(value: Any) -> int:
    """The ONNX element type of ``value`` when it is a tensor of a type numpy lacks, else 0."""
    if not isinstance(value, np.ndarray):
        return 0
    code = elem_type_of(value)
    return code if code in EXTENSION_TYPES else 0


def _ort_buffer(array: np.ndarray, code: int) -> np.ndarray:
    """The array ``OrtValue.ortvalue_from_numpy_with_onnx_type`` reads: one of ``array``'s shape whose buffer
    starts with the tensor's bytes (ORT takes the shape from it and reads 4-bit types packed)."""
    if not sub_byte_bits(EXTENSION_TYPES[code]):
        return np.asarray(encode_tensor(array)[0], order="C")
    buffer = np.zeros(array.shape, np.uint8)
    packed = pack(array)
    buffer.reshape(-1)[:packed.size] = packed
    return buffer


def _from_ortvalue(value: Any) -> Any:
    """An output ``OrtValue`` as graphbisect's in-memory value."""
    if not value.is_tensor():
        return to_memory(value.numpy())
    code = value.element_type()
    ext = EXTENSION_TYPES.get(code)
    if ext is None:
        return to_memory(value.numpy())
    data = np.frombuffer(ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes()), np.uint8)
    return from_raw_bytes(data, code, tuple(value.shape()))


# ---------------------------------------------------------------------------------------------- runtime
class OnnxRuntime:
    """An ``onnxruntime.InferenceSession`` behind the :class:`~graphbisect.backends.base.Runtime` protocol.

    Example (inside a worker, or directly):
        >>> rt = OnnxRuntime({"opt_level": "basic"}, "/tmp")          # doctest: +SKIP
        >>> rt.load("model.onnx", None); rt.run({"x": x})["y"]         # doctest: +SKIP
    """

    def __init__(self, options: Mapping[str, str], workdir: str) -> None:
        import onnxruntime

        self._ort: Any = onnxruntime
        self.options = OrtOptions.parse(options)
        self.workdir = Path(workdir)
        _opt_level(onnxruntime, self.options.opt_level)  # a missing level fails at once
        available = onnxruntime.get_available_providers()
        missing = [p for p in self.options.providers if p not in available]
        if missing:
            raise SpecError(f"execution provider {', '.join(missing)} is not available in onnxruntime "
                            f"{onnxruntime.__version__}", hint=f"available here: {';'.join(available)}")
        self._session: Any = None
        self._outputs: list[str] = []
        self._required: list[str] = []
        self._feedable: set[str] = set()
        self._typed_outputs = False
        self._info: dict[str, Any] = {}
        self._sessions_before = sessions_created()

    def cost(self) -> dict[str, int]:
        """The sessions created since this runtime was made (:mod:`graphbisect.backends.cost`): one per build,
        and with ``report_passes=1`` every probe session that finds which rules fired."""
        return {"compiles": sessions_created() - self._sessions_before, "compile_cache_hits": 0}

    def validate(self) -> None:
        """Check provider options and ``disabled=`` names against this ORT (see the module docstring)."""
        check_provider_options(self._ort, self.options)
        if self.options.disabled:
            check_optimizer_names(self.options, self.options.disabled)

    def registered_passes(self) -> list[str]:
        """Every optimizer name this ORT accepts in ``disabled=`` for these providers and config (its catalogue)."""
        return optimizer_catalog(self.options).names()

    def known_passes(self, names: Sequence[str]) -> list[str]:
        """The names among ``names`` that ``disabled=`` accepts, without listing the whole catalogue
        (:func:`optimizer_names_among`)."""
        return optimizer_names_among(self.options, names)[0]

    def load(self, model: str, outputs: Sequence[str] | None) -> None:
        """Create the session; ``outputs`` must be graph outputs of ``model`` (a probe model for intermediates)."""
        self.validate()
        self._session = None
        so = _session_options(self._ort, self.options, self.options.opt_level)
        if self.options.save_optimized:
            so.optimized_model_filepath = str(self.workdir / "optimized.onnx")
            # Weights go to a side file: a model over 2 GB cannot be serialized inline, and the graph is
            # what callers read (load_external_data=False).
            so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                        "optimized.weights")
            so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        fired: dict[str, list[str]] = {}
        if self.options.report_passes:
            so.log_severity_level = 0
            with capture_fd2(forward=_not_verbose) as log:
                session = self._create(model, so)
            fired = self._fired_passes(model, log.text)
        else:
            session = self._create(model, so)
        self._bind(model, session, outputs)
        self._info = {"providers": session.get_providers(), **fired}
        if self.options.provider_options:  # what the session took, as it reports the options the spec set
            reported = session.get_provider_options()
            self._info["provider_options"] = {
                o.spec_key: (reported.get(o.provider) or {}).get(o.key) for o in self.options.provider_options}
        if self.options.save_optimized:
            self._info["optimized_model"] = so.optimized_model_filepath

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Run the session; feeds the model does not declare are ignored, missing ones are an InputError.

        Tensors of the types numpy lacks (bfloat16, float8, int4...) travel as ``OrtValue``s holding their
        raw bits with the ONNX element type: ``InferenceSession.run`` refuses them, or returns float8 as
        untyped ``uint8``.
        """
        feed = select_feeds(inputs, self._required, self._feedable)
        if self._typed_outputs:
            return self._run_typed(feed)
        # run() takes OrtValues among numpy arrays, strings and lists (sequences), but returns only numpy
        feed = {name: self._ort_value(value) if _extension_code(value) else value for name, value in feed.items()}
        values = self._session.run(self._outputs, feed)
        self._check_no_fallback()
        return {name: to_memory(value) for name, value in zip(self._outputs, values, strict=True)}

    def _check_no_fallback(self) -> None:
        """ORT before 1.23 re-creates a session on the CPU provider when a run fails in another one (``EPFail``)
        and returns that run's outputs: refused like a session created on fewer providers."""
        if any(p not in CPU_PROVIDERS for p in self.options.providers):
            require_providers(self._ort, self._session, self.options)

    def _ort_value(self, value: np.ndarray) -> Any:
        code = _extension_code(value)
        return self._ort.OrtValue.ortvalue_from_numpy_with_onnx_type(_ort_buffer(value, code), code)

    def _run_typed(self, feed: Mapping[str, Any]) -> dict[str, Any]:
        """Outputs of types numpy lacks come back only as OrtValues, through ``run_with_ort_values``, whose
        inputs must all be OrtValues: numeric tensors (not strings, sequences or optionals)."""
        values = {}
        for name, value in feed.items():
            if _extension_code(value):
                values[name] = self._ort_value(value)
            elif isinstance(value, np.ndarray) and value.dtype.kind not in "OUS":
                values[name] = self._ort.OrtValue.ortvalue_from_numpy(value)
            else:
                raise InputError(f"input {name!r} is a string tensor, a sequence or an optional, which graphbisect "
                                 "cannot feed to ONNX Runtime in a run that returns bfloat16/float8/int4 outputs",
                                 hint="expose a Cast of those outputs to float instead")
        results = self._session.run_with_ort_values(self._outputs, values)
        self._check_no_fallback()
        return {name: _from_ortvalue(result) for name, result in zip(self._outputs, results, strict=True)}

    def info(self) -> dict[str, Any]:
        """Version, options, providers used; ``fired_passes``/``fired_required`` and ``optimized_model`` on request."""
        return {"library": "onnxruntime", "library_version": self._ort.__version__,
                "opt_level": self.options.opt_level, "disabled": list(self.options.disabled), **self._info}

    def _create(self, model: str, so: Any) -> Any:
        return create_session(self._ort, model, so, self.options, self.options.disabled)

    def _bind(self, model: str, session: Any, outputs: Sequence[str] | None) -> None:
        names = [o.name for o in session.get_outputs()]
        requested = list(outputs) if outputs is not None else names
        known = set(names)
        absent = [name for name in requested if name not in known]
        if absent:
            raise ModelError(f"{model}: {', '.join(map(repr, absent[:5]))} are not outputs of the model"
                             + (f" (and {len(absent) - 5} more)" if len(absent) > 5 else ""),
                             hint="ONNX Runtime returns only graph outputs: run a probe model that exposes the "
                             "intermediate tensors (Model.with_outputs)")
        self._session, self._outputs = session, requested
        declared = {o.name: o.type for o in session.get_outputs()}
        self._typed_outputs = any(declared.get(name) in _EXTENSION_TYPE_NAMES for name in requested)
        self._required = [i.name for i in session.get_inputs()]
        self._feedable = set(self._required) | {i.name for i in session.get_overridable_initializers()}

    def _fired_passes(self, model: str, log: str) -> dict[str, list[str]]:
        """The passes that modified the graph (``log``: the session's verbose log), the rules of a rule set that
        did found by :meth:`_firing_rules`; the whole catalogue is listed only when a rule set modified it."""
        modified = _unique(_MODIFIED.findall(log))
        catalog = optimizer_catalog(self.options) if any(_RULE_SET.fullmatch(n) for n in modified) else None
        transformers = catalog.transformers if catalog is not None else disableable_transformers(self.options)
        fired: list[str] = []
        required: list[str] = []
        for name in modified:
            if catalog is not None and name in catalog.rules:
                fired += self._firing_rules(model, name, catalog.rules[name]) or [name]
            elif name in transformers:
                fired.append(name)
            else:
                required.append(name)  # runs whatever the options say (e.g. InsertCastTransformer)
        return {"fired_passes": _unique(fired), "fired_required": required}

    def _firing_rules(self, model: str, rule_set: str, rules: Sequence[str]) -> list[str]:
        """Which rules of ``rule_set`` modified the graph, by enabling only subsets of them."""
        match = _RULE_SET.fullmatch(rule_set)
        level = {"1": "basic", "2": "extended"}.get(match.group(1) if match else "", self.options.opt_level)
        pool = [rule for rule in rules if rule not in self.options.disabled]
        user_disabled = set(self.options.disabled)

        def fires(enabled: Sequence[str]) -> bool:
            disabled = user_disabled | (set(pool) - set(enabled))
            return rule_set in _MODIFIED.findall(_session_log(self._ort, model, self.options, level, disabled))

        def search(subset: list[str], known: bool = False) -> list[str]:
            if not subset or not (known or fires(subset)):
                return []
            if len(subset) == 1:
                return subset
            half = len(subset) // 2
            return search(subset[:half]) + search(subset[half:])

        return search(pool, known=True)
