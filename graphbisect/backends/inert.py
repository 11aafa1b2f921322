"""Which options of a recorded spec are inert: their values cannot run a program, load a library or write a file.

A bundle is a download, so its recorded target (``report.json``) and the settings ``repro.py`` applies
(``repro_config.json``) are data chosen by whoever wrote it. They run without ``--trust`` only when every
option is known to be inert. This is an **allow-list**: each backend's row in the table
(:attr:`~graphbisect.backends.registry.BackendInfo.inert_options`) gives a rule for the options it knows to
be inert, and an option without a rule is not inert. So an option added later (an execution provider's
``trt.engine_cache_path``), a custom backend's options and an unknown session config key all need
``--trust`` until someone reads what they do and lists them.

A rule is plain JSON, because ``repro.py`` carries the rules of its backend and the source of
:func:`untrusted_values` (it cannot import graphbisect):

* :data:`ANY` — any value is inert (a level, a count, a device, a list of names);
* :data:`NAMES` — a ``;``-list of names is inert, ``@FILE`` is not (a file read at every load);
* :data:`BUNDLE_FILE` — a file the bundle holds is inert (its own tactic record), any other path is not;
* :func:`never` — no value is inert (the program a ``command`` runs and the environment it runs with, the
  interpreter of ``python=``);
* :func:`entries` — ``key=value;...`` entries (ONNX Runtime's session config) whose keys are all listed;
* :func:`flags` — compiler flags (``iree-compile``) whose names are all listed;
* :func:`nested` — a mapping of settings, each with its own rule (``repro.py``'s onnxoptimizer section).

Example:
    >>> rules = {"opt_level": ANY, "config": ORT_SESSION_CONFIG}
    >>> [(option, value) for option, value, why in untrusted_values(
    ...     rules, {"opt_level": "all", "config": "session.disable_prepacking=1;ep.context_file_path=/x"})]
    [('config', 'ep.context_file_path=/x')]
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ANY",
    "BUNDLE_FILE",
    "COMMAND_ENVIRONMENT",
    "COMMAND_PROGRAM",
    "IREE_FLAGS",
    "NAMES",
    "OPENVINO_CONFIG",
    "ORT_SESSION_CONFIG",
    "PYTHON_INTERPRETER",
    "Rule",
    "Untrusted",
    "entries",
    "flags",
    "nested",
    "never",
    "untrusted_values",
]

logger = logging.getLogger(__name__)

#: A rule for one option's values, saying which of them are inert (cannot run a program, load a library or
#: write a file), in JSON (``repro.py`` carries the rules of its backend): ``"any"`` (every value), ``"names"``
#: (a ``;``-list of names, not ``@FILE``), ``"bundle-file"`` (a file the bundle holds), or a mapping made by
#: ``never(why)``, ``entries(keys, why)``, ``flags(names, why)`` or ``nested(rules)`` of this module.
Rule = str | Mapping[str, Any]

ANY: Rule = "any"
NAMES: Rule = "names"
BUNDLE_FILE: Rule = "bundle-file"


def never(why: str) -> Rule:
    """No value of the option is inert; ``why`` says what it runs."""
    return {"never": why}


def entries(keys: Iterable[str], why: str) -> Rule:
    """``key=value`` entries (``;``-separated, or ``[key, value]`` pairs) are inert when every key is listed."""
    return {"entries": sorted(set(keys)), "why": why}


def flags(names: Iterable[str], why: str) -> Rule:
    """Command-line flags (``;``-separated, or a list) are inert when every flag's name (without its leading
    dashes and ``=value``) is listed."""
    return {"flags": sorted(set(names)), "why": why}


def nested(rules: Mapping[str, Rule]) -> Rule:
    """A mapping of settings, each inert by its own rule."""
    return {"options": dict(rules)}


COMMAND_PROGRAM = never("is the program the backend runs")
COMMAND_ENVIRONMENT = never("is the environment whose programs the command runs (its bin/ first on PATH)")
PYTHON_INTERPRETER = never("is the Python interpreter the backend runs under")

#: ONNX Runtime session config keys whose values cannot name a file, a folder or a library (from ORT's
#: ``onnxruntime_session_options_config_keys.h``). Left out on purpose, among others:
#: ``session.collect_node_memory_stats_to_file``, ``session.debug_layout_transformation`` (writes models into
#: the working folder), ``session.node_partition_config_file``, ``session.resource_cuda_partitioning_settings``,
#: ``session.optimized_model_external_initializers_file_name``,
#: ``session.model_external_initializers_file_folder_path``,
#: ``session.save_external_prepacked_constant_initializers``, ``session.load_model_format``,
#: ``session.use_ort_model_bytes_directly`` and every ``ep.context_*`` key.
ORT_SESSION_CONFIG = entries({
    "session.disable_prepacking", "session.use_env_allocators", "session.set_denormal_as_zero",
    "session.disable_quant_qdq", "session.enable_quant_qdq", "session.disable_double_qdq_remover",
    "session.enable_quant_qdq_cleanup", "session.disable_aot_function_inlining",
    "session.graph_optimizations_loop_level", "session.use_device_allocator_for_initializers",
    "session.inter_op.allow_spinning", "session.intra_op.allow_spinning", "session.force_spinning_stop",
    "session.qdqisint8allowed", "session.x64quantprecision", "session.dynamic_block_base",
    "session.strict_shape_type_inference", "session.allow_released_opsets_only",
    "session.intra_op_thread_affinities", "session.disable_cpu_ep_fallback",
    "session.qdq_matmulnbits_accuracy_level", "session.disable_model_compile",
    "session.fail_on_suboptimal_compiled_model", "session.record_ep_graph_assignment_info",
    "optimization.enable_gelu_approximation", "optimization.enable_cast_chain_elimination",
    "optimization.disable_specified_optimizers",
    "mlas.enable_gemm_fastmath_arm64_bfloat16", "mlas.use_lut_gemm",
}, "is not a session config key known to be inert (ONNX Runtime's keys can name files it reads or writes)")

#: OpenVINO properties (``openvino:config=KEY=VALUE;...``) whose values cannot name a file, a folder or a
#: library: precision and execution hints, dynamic quantization, KV-cache precision, streams, threads and
#: scheduling, logging to stderr (the CPU plugin's read-write properties in OpenVINO 2026.4, but
#: ``ENABLE_WEIGHTLESS``, and the GPU plugin's precision hints). Not inert, among others: ``CACHE_DIR`` (writes
#: compiled blobs into a folder), ``CACHE_MODE``, ``WEIGHTS_PATH``, ``COMPILED_BLOB``, ``ENABLE_WEIGHTLESS``,
#: ``ENABLE_MMAP`` and every key not listed here.
OPENVINO_CONFIG = entries({
    "INFERENCE_PRECISION_HINT", "EXECUTION_MODE_HINT", "PERFORMANCE_HINT", "PERFORMANCE_HINT_NUM_REQUESTS",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE", "KV_CACHE_PRECISION", "KEY_CACHE_PRECISION", "VALUE_CACHE_PRECISION",
    "KEY_CACHE_GROUP_SIZE", "VALUE_CACHE_GROUP_SIZE", "NUM_STREAMS", "INFERENCE_NUM_THREADS",
    "ENABLE_CPU_PINNING", "ENABLE_CPU_RESERVATION", "ENABLE_HYPER_THREADING", "SCHEDULING_CORE_TYPE",
    "MODEL_DISTRIBUTION_POLICY", "ENABLE_TENSOR_PARALLEL", "TBB_PARTITIONER", "CPU_DENORMALS_OPTIMIZATION",
    "CPU_SPARSE_WEIGHTS_DECOMPRESSION_RATE", "PERF_COUNT", "LOG_LEVEL", "DEVICE_ID", "MODEL_PRIORITY",
    "GPU_ENABLE_LOOP_UNROLLING", "GPU_DISABLE_WINOGRAD_CONVOLUTION", "ACTIVATIONS_SCALE_FACTOR",
}, "is not an OpenVINO property known to be inert (properties can name a folder it writes, e.g. CACHE_DIR)")

#: ``iree-compile`` flags whose values cannot name a program, a library, a file or a folder (IREE 3.13's
#: ``--help-hidden``): the features ``disabled=`` switches off (``backends/iree.py`` FEATURES, a test keeps
#: them here), optimization and numerics switches, the target CPU, and MLIR diagnostics printed to stderr.
#: Not inert, among others: ``--iree-llvmcpu-embedded-linker-path`` (runs the program as the linker),
#: ``--iree-hal-dump-executable-*-to`` and ``--mlir-print-ir-tree-dir`` (write folders), ``-o``.
IREE_FLAGS = flags({
    "iree-opt-const-eval", "iree-opt-const-expr-hoisting", "iree-opt-data-tiling",
    "iree-dispatch-creation-enable-aggressive-fusion", "iree-dispatch-creation-fuse-multi-use",
    "iree-global-opt-propagate-transposes", "iree-flow-enable-pad-handling", "iree-input-demote-f64-to-f32",
    "iree-llvmcpu-enable-ukernels", "iree-llvmcpu-loop-vectorization", "iree-llvmcpu-slp-vectorization",
    "iree-llvmcpu-disable-vector-peeling", "iree-llvmcpu-reassociate-fp-reductions",
    "iree-llvmcpu-use-fast-min-max-ops",
    "iree-opt-level", "iree-opt-strip-assertions", "iree-opt-numeric-precision-reduction",
    "iree-opt-aggressively-propagate-transposes", "iree-dispatch-creation-data-tiling",
    "iree-input-demote-i64-to-i32", "iree-input-demote-f32-to-f16", "iree-input-promote-f16-to-f32",
    "iree-input-promote-bf16-to-f32", "iree-llvmcpu-target-cpu", "iree-llvmcpu-target-cpu-features",
    "mlir-disable-threading", "mlir-print-debuginfo", "mlir-print-op-on-diagnostic",
    "mlir-print-stacktrace-on-diagnostic", "mlir-print-ir-after-all", "mlir-print-ir-before-all",
    "mlir-print-ir-after-change", "mlir-print-ir-after-failure", "mlir-elide-elementsattrs-if-larger",
    "mlir-timing",
}, "is not an iree-compile flag known to be inert (flags can name a program it runs or a folder it writes)")


@dataclass(frozen=True)
class Untrusted:
    """One option (or one entry of it) that is not known to be inert, and why."""

    option: str  # the option's name; ``a.b`` for setting ``b`` of a nested ``a``
    value: str  # the option's value, or the one entry or flag of it that is not inert
    why: str

    def describe(self) -> str:
        """``config=session.collect_node_memory_stats_to_file=/x: is not a session config key ...``"""
        return f"{self.option}={self.value}: {self.why}"


# The function below is self-contained (builtins and json only): repro.py carries its source, so the
# standalone script decides as graphbisect does. Keep it that way (tests/backends/test_inert.py checks).
def untrusted_values(rules: Mapping[str, Any], options: Any, own_files: Any = ()) -> list[tuple[str, str, str]]:
    """``[(option, value, why), ...]`` for each option of ``options`` that ``rules`` does not know to be inert
    (an allow-list: an option without a rule is not inert); empty when every option is inert.

    ``options``: a spec's options (strings) or the settings repro.py applies (JSON values). ``rules``: option
    name -> rule (see graphbisect.backends.inert). ``own_files``: the files of the bundle that a
    ``bundle-file`` option may name.
    """
    if not isinstance(options, dict):
        return [("options", json.dumps(options), "is not a mapping of option names to values")]
    found: list[tuple[str, str, str]] = []
    for name, value in options.items():
        rule: Any = rules.get(name)
        kind = rule if isinstance(rule, str) else next(
            (key for key in ("never", "entries", "flags", "options") if key in rule), None) if rule else None
        shown = value if isinstance(value, str) else json.dumps(value)
        items: Any = value.split(";") if isinstance(value, str) else value
        if kind == "any":
            continue
        if kind == "never":
            found.append((name, shown, rule["never"]))
        elif kind == "bundle-file":
            if value not in (None, "") and value not in own_files:
                found.append((name, shown, "names a file outside the bundle"))
        elif kind == "names":
            if value is None:
                continue
            if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
                found.append((name, shown, "is not a list of names"))
            elif any(item.strip().startswith("@") for item in items):
                found.append((name, shown, "names a file to read (@FILE)"))
        elif kind == "entries":  # "k=v;k=v" in a spec, [[k, v], ...] in repro_config.json
            if isinstance(value, str):
                items = [item.partition("=")[::2] for item in items if item.strip()]
            for item in items if isinstance(items, list) else [items]:
                if not isinstance(item, (list, tuple)) or len(item) != 2 or not all(isinstance(i, str) for i in item):
                    found.append((name, json.dumps(item), "is not a key=value entry"))
                elif item[0].strip() not in rule["entries"]:
                    found.append((name, f"{item[0].strip()}={item[1].strip()}", rule["why"]))
        elif kind == "flags":  # "--a=1;--b" in a spec, ["--a=1", "--b"] in repro_config.json
            if isinstance(value, str):
                items = [item.strip() for item in items if item.strip()]
            for item in items if isinstance(items, list) else [items]:
                if not isinstance(item, str) or not item.startswith("-"):
                    found.append((name, item if isinstance(item, str) else json.dumps(item), "is not a flag"))
                elif item.lstrip("-").partition("=")[0] not in rule["flags"]:
                    found.append((name, item, rule["why"]))
        elif kind == "options":
            if not isinstance(value, dict):
                found.append((name, shown, "is not a mapping of settings"))
                continue
            found += [(f"{name}.{inner}", text, why)
                      for inner, text, why in untrusted_values(rule["options"], value, own_files)]
        else:  # no rule: not known to be inert
            found.append((name, shown, "is not an option known to be inert: it may run a program, load a library "
                          "or write a file"))
    return found
