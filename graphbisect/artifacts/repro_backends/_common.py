"""What several ``repro.py`` backend sections share: the :class:`ReproBackend` record, option helpers and
the ONNX Runtime ``run_target`` snippet (onnxruntime and onnxoptimizer both run on ORT).

Nothing here imports :mod:`graphbisect.artifacts.repro`: that module imports this package, never the reverse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from graphbisect.backends.inert import ANY, ORT_SESSION_CONFIG, Rule
from graphbisect.backends.onnxruntime import OPT_LEVELS, OrtOptions, session_config
from graphbisect.backends.ort_providers import inert_session_options
from graphbisect.backends.worker import option_flag

#: The bundle file holding the target's tactic record, restricted to the bundle model.
TACTICS_FILE = "tactics.json"


@dataclass(frozen=True)
class ReproBackend:
    """How ``repro.py`` drives one backend type."""

    name: str
    label: str  # the libraries the script needs, for its docstring
    library: str | None  # the importable library whose version is reported
    options: Any  # (runtime options) -> JSON-able settings for the script
    #: load_target / run_target / import_library for this backend, or the function that makes it (called once
    #: a script is rendered: IREE's reads its pipeline's source, too slow for every import); None: no script
    code: str | Callable[[], str] | None
    #: The trust rule for those settings (repro_config.json ``options``): setting -> which of its values are
    #: inert (:mod:`graphbisect.backends.inert`, the same rules as the backend's row); the script refuses any
    #: other setting without ``--trust``.
    inert: Mapping[str, Rule] = field(default_factory=dict)

    def source(self) -> str | None:
        """The script's section for this backend (``code``, made now when it is a function)."""
        return self.code() if callable(self.code) else self.code


def _ort_options(options: Mapping[str, str]) -> dict[str, Any]:
    """The session settings graphbisect's ONNX Runtime backend derives from these options."""
    parsed = OrtOptions.parse(options)
    return {
        "providers": list(parsed.providers),
        # <ep>.<key>=<value> of the spec, by provider: InferenceSession(providers=[(name, {key: value})])
        "provider_options": {p: {o.key: o.value for o in parsed.provider_options if o.provider == p}
                             for p in parsed.providers if any(o.provider == p for o in parsed.provider_options)},
        "graph_optimization_level": OPT_LEVELS[parsed.opt_level],
        "disabled_optimizers": list(parsed.disabled),
        "intra_op_num_threads": parsed.threads,
        "session_config": [list(entry) for entry in session_config(parsed)],  # the runtime's, defaults included
    }


#: Which settings of :func:`_ort_options` are inert: the session config keys of the onnxruntime row's rule.
_ORT_INERT: Mapping[str, Rule] = {"providers": ANY, "graph_optimization_level": ANY, "disabled_optimizers": ANY,
                                  "intra_op_num_threads": ANY, "session_config": ORT_SESSION_CONFIG,
                                  "provider_options": inert_session_options()}


def _tri_state(options: Mapping[str, str], key: str) -> bool | None:
    return option_flag(options, key) if key in options else None


def _no_options(options: Mapping[str, str]) -> dict[str, Any]:
    return {}


def _raw_options(options: Mapping[str, str]) -> dict[str, Any]:
    return dict(options)


#: The one ONNX Runtime session and run of every section that runs on ORT (onnxruntime, onnxoptimizer):
#: ``check_ort`` for ``import_library``, ``ort_session`` for ``load_target``, ``run_target``.
_ORT_RUN_TARGET = r'''

def check_ort(onnxruntime, session):
    """The session settings ``session`` (from ``_ort_options``) are available in this onnxruntime."""
    available = onnxruntime.get_available_providers()
    missing = [p for p in session["providers"] if p not in available]
    if missing:
        raise CannotRun(f"execution provider(s) {missing} are not available in onnxruntime "
                        f"{onnxruntime.__version__} (available: {available})")
    if not hasattr(onnxruntime.GraphOptimizationLevel, session["graph_optimization_level"]):
        raise CannotRun(f"onnxruntime {onnxruntime.__version__} has no {session['graph_optimization_level']}")


def ort_session(model, session, optimized=None):
    """An ONNX Runtime session exactly as graphbisect created it: same providers and provider options,
    optimization level, disabled optimizers, intra-op threads and session config entries, and no silent
    fallback to the CPU provider (ORT retries there, or skips a provider it cannot create, without an error:
    this machine cannot run the case then). ``model``: a path or the serialized model; ``optimized``: where to
    save the optimized model too (weights of 1 KiB and more beside it)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if optimized is not None:
        so.optimized_model_filepath = optimized
        so.log_severity_level = 3  # not the warning that an optimized model may be machine-specific
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.weights")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, session["graph_optimization_level"])
    if session["intra_op_num_threads"] is not None:
        so.intra_op_num_threads = session["intra_op_num_threads"]
    for key, value in session["session_config"]:
        so.add_session_config_entry(key, value)
    options = session.get("provider_options") or {}
    providers = [(p, options[p]) if options.get(p) else p for p in session["providers"]]
    created = ort.InferenceSession(model, so, providers=providers, disabled_optimizers=session["disabled_optimizers"],
                                   enable_fallback=0)
    missing = [p for p in session["providers"] if p not in created.get_providers()]
    if missing:
        raise CannotRun(f"onnxruntime {ort.__version__} could not create {missing} here (the session fell back to "
                        f"{created.get_providers()}; ONNX Runtime's messages above say why)")
    return created


def run_target(session, inputs, output_names):
    """Run once; feed only what the session accepts (cut tensors may be initializers it overrides).
    Tensors of types numpy lacks (bfloat16, float8, int4...) travel as OrtValues of raw bits, which
    InferenceSession.run cannot take or give."""
    accepted = {i.name for i in session.get_inputs()} | {i.name for i in session.get_overridable_initializers()}
    feed = {name: value for name, value in inputs.items() if name in accepted}
    declared = {o.name: o.type for o in session.get_outputs()}
    typed_out = any(declared.get(name, "").replace("tensor(", "").rstrip(")").upper() in ORT_NAMES
                    for name in output_names)
    if not typed_out and not any(extension_code(value) for value in feed.values()):
        return dict(zip(output_names, session.run(output_names, feed)))
    import onnxruntime as ort

    values = {}
    for name, value in feed.items():
        code = extension_code(value)
        if code:
            raw = np.asarray(encode(value), order="C")
            if code in PACKED_BITS:  # ORT takes the shape from the array and reads the bytes packed
                packed, raw = pack(raw, code), np.zeros(value.shape, np.uint8)
                raw.reshape(-1)[:packed.size] = packed
            values[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, code)
        else:
            values[name] = ort.OrtValue.ortvalue_from_numpy(value)
    results = session.run_with_ort_values(output_names, values)
    return {name: from_ortvalue(result) for name, result in zip(output_names, results)}


def from_ortvalue(value):
    import ctypes

    code = value.element_type() if value.is_tensor() else None
    if code not in ELEM_TYPES:
        return value.numpy()
    shape = tuple(value.shape())
    data = np.frombuffer(ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes()), np.uint8)
    if code in PACKED_BITS:
        return typed(unpack(data, code, shape), code)
    return typed(data.view(STORAGE[code]).reshape(shape), code)
'''


#: Where a module's code stops being what a standalone script embeds (:func:`embedded_source`).
EMBED_END = "\n# ---- end of what a standalone script embeds"


def embedded_source(module: ModuleType) -> str:
    """``module``'s code as a standalone script (``repro.py``, a backend's section of it) embeds it: without its
    ``from __future__`` line (the script starts with its own), up to :data:`EMBED_END` where the module has one
    (graphbisect's own helpers follow it), else to its end. The module must import nothing of graphbisect's."""
    text = Path(str(module.__file__)).read_text(encoding="utf-8")
    start = "\nfrom __future__ import annotations\n"
    code = text[text.index(start) + len(start):]
    end = code.find(EMBED_END)
    return (code if end < 0 else code[:end]).rstrip() + "\n"
