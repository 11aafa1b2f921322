"""ONNX Runtime execution providers in an ``onnxruntime`` spec: ``providers=`` and provider options.

Standard library only: the host (registry, reports, ``repro.py``'s settings) reads specs with it without
importing ONNX Runtime, and the runtime (:mod:`graphbisect.backends.onnxruntime`) in its worker.

**Syntax.** A provider option is a spec option ``<ep>.<key>=<value>``:

* ``<ep>`` names an execution provider of the spec's ``providers=``: its ONNX Runtime name without the
  ``ExecutionProvider`` suffix, in lower case (``cpu``, ``cuda``, ``tensorrt``, ``openvino``, ``dml``,
  ``migraphx``, ``qnn``, ``coreml``, ...; ``trt`` is short for ``tensorrt``). The rule covers any provider,
  a plugin's too: ``providers=FooExecutionProvider,foo.level=2``;
* ``<key>`` is ONNX Runtime's own name of the option, verbatim, as the provider's documentation and
  ``InferenceSession.get_provider_options()`` spell it (``use_tf32``, ``trt_fp16_enable``, ``device_id``);
* values cannot contain ``,`` (the spec's separator).

Example: ``onnxruntime:providers=CUDAExecutionProvider,cuda.use_tf32=0`` creates its sessions with
``providers=[("CUDAExecutionProvider", {"use_tf32": "0"})]`` (ORT appends the CPU provider itself).

**Trust.** A bundle is data, and some provider options act outside the session: they name files ORT writes
or reads (TensorRT's engine and timing caches, subgraph dumps, calibration tables), libraries it loads
(``trt_extra_plugin_lib_paths``, ``trt_engine_decryption_lib_path``) or raw memory addresses it uses
(CUDA's ``user_compute_stream``, ``gpu_external_alloc``). :attr:`ProviderOption.inert` is true only for the
keys of :data:`INERT_OPTIONS`, which change how the provider computes and nothing else; every other key,
unknown ones included, is one a recorded spec should run only when the user trusts the bundle.
:data:`UNSAFE_OPTIONS` says why for the known ones.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from graphbisect.errors import SpecError

__all__ = [
    "ALIASES",
    "CPU_PROVIDERS",
    "DEFAULT_PROVIDERS",
    "INERT_OPTIONS",
    "KNOWN_PROVIDERS",
    "UNSAFE_OPTIONS",
    "ProviderOption",
    "SessionProviders",
    "provider_options",
    "providers_of",
    "session_providers",
    "short_name",
]

logger = logging.getLogger(__name__)

DEFAULT_PROVIDERS: tuple[str, ...] = ("CPUExecutionProvider",)

#: ONNX Runtime 1.32's ``get_all_providers()`` (the names it knows, available or not) and two plugin/older ones:
#: for error messages about an option of a provider that ``providers=`` does not list.
KNOWN_PROVIDERS: tuple[str, ...] = (
    "TensorrtExecutionProvider", "CUDAExecutionProvider", "MIGraphXExecutionProvider", "OpenVINOExecutionProvider",
    "DnnlExecutionProvider", "VitisAIExecutionProvider", "QNNExecutionProvider", "NnapiExecutionProvider",
    "VSINPUExecutionProvider", "JsExecutionProvider", "CoreMLExecutionProvider", "DmlExecutionProvider",
    "RknpuExecutionProvider", "WebNNExecutionProvider", "WebGpuExecutionProvider", "XnnpackExecutionProvider",
    "CANNExecutionProvider", "AzureExecutionProvider", "CPUExecutionProvider", "NvTensorRTRTXExecutionProvider",
    "ROCMExecutionProvider",
)

#: Execution providers that compute on the CPU; any other one is taken to use a GPU (``device_id``, else 0).
CPU_PROVIDERS = frozenset({"CPUExecutionProvider", "DnnlExecutionProvider", "XnnpackExecutionProvider",
                           "ACLExecutionProvider", "ArmNNExecutionProvider", "AzureExecutionProvider"})

#: Short prefixes besides :func:`short_name`'s.
ALIASES: Mapping[str, str] = {"trt": "tensorrt"}

_SUFFIX = "ExecutionProvider"

#: Provider options that only change how the provider computes (precision, kernels, memory, partitioning):
#: safe to run from a bundle nobody vouched for. Keys of ONNX Runtime 1.31/1.32 (the CUDA provider's
#: ``provider_option_names``, the TensorRT provider's documented options).
INERT_OPTIONS: Mapping[str, frozenset[str]] = {
    "CUDAExecutionProvider": frozenset({
        "device_id", "gpu_mem_limit", "arena_extend_strategy", "cudnn_conv_algo_search", "do_copy_in_default_stream",
        "cudnn_conv_use_max_workspace", "enable_cuda_graph", "cudnn_conv1d_pad_to_nc1d", "tunable_op_enable",
        "tunable_op_tuning_enable", "tunable_op_max_tuning_duration_ms", "enable_skip_layer_norm_strict_mode",
        "prefer_nhwc", "use_ep_level_unified_stream", "use_tf32", "fuse_conv_bias", "sdpa_kernel"}),
    "TensorrtExecutionProvider": frozenset({
        "device_id", "trt_max_partition_iterations", "trt_min_subgraph_size", "trt_max_workspace_size",
        "trt_fp16_enable", "trt_bf16_enable", "trt_int8_enable", "trt_int8_use_native_calibration_table",
        "trt_dla_enable", "trt_dla_core", "trt_force_sequential_engine_build", "trt_context_memory_sharing_enable",
        "trt_layer_norm_fp32_fallback", "trt_detailed_build_log", "trt_build_heuristics_enable",
        "trt_sparsity_enable", "trt_builder_optimization_level", "trt_auxiliary_streams", "trt_cuda_graph_enable"}),
}

#: Known provider options that act outside the session, and what they do: never inert.
UNSAFE_OPTIONS: Mapping[str, Mapping[str, str]] = {
    "CUDAExecutionProvider": {
        "user_compute_stream": "a raw address ORT uses as a CUDA stream",
        "has_user_compute_stream": "makes ORT use user_compute_stream",
        "gpu_external_alloc": "a raw address ORT calls as a function",
        "gpu_external_free": "a raw address ORT calls as a function",
        "gpu_external_empty_cache": "a raw address ORT calls as a function",
    },
    "TensorrtExecutionProvider": {
        "user_compute_stream": "a raw address ORT uses as a CUDA stream",
        "has_user_compute_stream": "makes ORT use user_compute_stream",
        "trt_engine_cache_enable": "writes engine files (into trt_engine_cache_path, else the working directory)",
        "trt_engine_cache_path": "a folder ORT writes engine files into",
        "trt_engine_cache_prefix": "names the engine files ORT writes",
        "trt_timing_cache_enable": "writes a timing cache file (into trt_timing_cache_path)",
        "trt_timing_cache_path": "a folder ORT writes the timing cache into",
        "trt_force_timing_cache": "makes ORT use a timing cache file read from disk",
        "trt_dump_subgraphs": "writes the TensorRT subgraphs as files into the working directory",
        "trt_dump_ep_context_model": "writes an EP-context model file",
        "trt_ep_context_file_path": "a path ORT writes or reads an EP-context model at",
        "trt_ep_context_embed_mode": "how an EP-context model file is written",
        "trt_int8_calibration_table_name": "a calibration table file ORT reads",
        "trt_engine_decryption_enable": "makes ORT load trt_engine_decryption_lib_path",
        "trt_engine_decryption_lib_path": "a shared library ORT loads and runs",
        "trt_extra_plugin_lib_paths": "shared libraries ORT loads and runs",
        "trt_onnx_model_folder_path": "a folder ORT reads model files from",
        "trt_weight_stripped_engine_enable": "makes ORT refit engines from model files on disk",
    },
}


@dataclass(frozen=True)
class ProviderOption:
    """One ``<ep>.<key>=<value>`` of a spec.

    Example:
        >>> option = provider_options({"providers": "CUDAExecutionProvider", "cuda.use_tf32": "0"})[0]
        >>> option.provider, option.key, option.value, option.inert
        ('CUDAExecutionProvider', 'use_tf32', '0', True)
    """

    spec_key: str  # as written in the spec: "cuda.use_tf32"
    provider: str  # "CUDAExecutionProvider"
    key: str  # ONNX Runtime's name: "use_tf32"
    value: str

    @property
    def inert(self) -> bool:
        """Whether the option only changes how the provider computes (:data:`INERT_OPTIONS`): unknown keys and
        the keys of :data:`UNSAFE_OPTIONS` are not."""
        return self.key in INERT_OPTIONS.get(self.provider, frozenset())

    @property
    def unsafe_reason(self) -> str | None:
        """What the option does outside the session (:data:`UNSAFE_OPTIONS`); None when inert or unknown."""
        return UNSAFE_OPTIONS.get(self.provider, {}).get(self.key)


def inert_spec_options() -> dict[str, str]:
    """The spec options ``<ep>.<key>`` of :data:`INERT_OPTIONS` under every prefix that names their provider
    (the trust rule's allow-list of the onnxruntime row: each maps to the rule ``"any"``)."""
    prefixes = {provider: [short_name(provider), *(a for a, full in ALIASES.items() if full == short_name(provider))]
                for provider in INERT_OPTIONS}
    return {f"{prefix}.{key}": "any" for provider, keys in INERT_OPTIONS.items()
            for prefix in prefixes[provider] for key in sorted(keys)}


def inert_session_options() -> dict[str, object]:
    """The same allow-list for ``repro_config.json``'s ``provider_options`` (provider -> key -> value)."""
    return {"options": {provider: {"options": dict.fromkeys(sorted(keys), "any")}
                        for provider, keys in INERT_OPTIONS.items()}}


def short_name(provider: str) -> str:
    """The ``<ep>`` prefix of a provider's options: its name without ``ExecutionProvider``, in lower case.

    Example:
        >>> short_name("CUDAExecutionProvider"), short_name("TensorrtExecutionProvider")
        ('cuda', 'tensorrt')
    """
    base = provider[: -len(_SUFFIX)] if provider.endswith(_SUFFIX) and provider != _SUFFIX else provider
    return base.lower()


def providers_of(options: Mapping[str, str]) -> tuple[str, ...]:
    """The spec's ``providers=`` in priority order (``;``-separated; default the CPU provider).

    Example:
        >>> providers_of({"providers": "CUDAExecutionProvider;CPUExecutionProvider"})
        ('CUDAExecutionProvider', 'CPUExecutionProvider')
    """
    listed = tuple(p.strip() for p in options.get("providers", "").split(";") if p.strip())
    return listed or DEFAULT_PROVIDERS


def provider_options(options: Mapping[str, str]) -> tuple[ProviderOption, ...]:
    """The provider options of an ``onnxruntime`` spec's options (every key with a ``.``), checked against its
    ``providers=``; raises :class:`SpecError` naming the key for a prefix that names none of them.

    Example:
        >>> [o.key for o in provider_options({"providers": "TensorrtExecutionProvider", "trt.trt_fp16_enable": "1",
        ...                                   "opt_level": "all"})]
        ['trt_fp16_enable']
    """
    providers = providers_of(options)
    by_prefix = {short_name(p): p for p in providers}
    found: dict[tuple[str, str], ProviderOption] = {}
    for spec_key, value in options.items():
        if "." not in spec_key:
            continue
        prefix, _, key = spec_key.partition(".")
        provider = by_prefix.get(ALIASES.get(prefix, prefix))
        if provider is None:
            raise _unknown_prefix(spec_key, prefix, providers)
        if not key.strip():
            raise SpecError(f"provider option {spec_key!r} names no option of {provider}",
                            hint=f"write {prefix}.<key>=<value> with ONNX Runtime's name of the option")
        if (provider, key) in found:
            raise SpecError(f"provider option {key!r} of {provider} is given twice ({found[provider, key].spec_key} "
                            f"and {spec_key})", hint="keep one of them")
        found[provider, key] = ProviderOption(spec_key, provider, key, value)
    return tuple(found.values())


#: ``InferenceSession``'s ``providers`` argument.
SessionProviders = list[str | tuple[str, dict[str, str]]]


def session_providers(providers: Sequence[str], options: Sequence[ProviderOption]) -> SessionProviders:
    """The ``providers`` argument of ``InferenceSession``: a provider's name, or ``(name, {key: value})`` when the
    spec gives it options.

    Example:
        >>> opts = provider_options({"providers": "CUDAExecutionProvider", "cuda.use_tf32": "0"})
        >>> session_providers(["CUDAExecutionProvider"], opts)
        [('CUDAExecutionProvider', {'use_tf32': '0'})]
    """
    result: SessionProviders = []
    for provider in providers:
        given = {o.key: o.value for o in options if o.provider == provider}
        result.append((provider, given) if given else provider)
    return result


def _unknown_prefix(spec_key: str, prefix: str, providers: Sequence[str]) -> SpecError:
    listed = ", ".join(f"{short_name(p)}. ({p})" for p in providers)
    known = {short_name(p): p for p in KNOWN_PROVIDERS}
    target = known.get(ALIASES.get(prefix, prefix))
    if target is not None:
        return SpecError(f"provider option {spec_key!r} is an option of {target}, which providers= does not list "
                         f"(providers: {';'.join(providers)})",
                         hint=f"add it in priority order, e.g. providers={target}, or drop {spec_key}")
    lowered = known.get(prefix.lower()) or next((p for p in providers if short_name(p) == prefix.lower()), None)
    if lowered is not None:
        return SpecError(f"provider option {spec_key!r}: the prefix is written in lower case",
                         hint=f"write {short_name(lowered)}.{spec_key.partition('.')[2]}")
    close = difflib.get_close_matches(prefix, [*known, *ALIASES, *(short_name(p) for p in providers)], n=3)
    return SpecError(
        f"option {spec_key!r}: {prefix!r} names no execution provider of this spec (an option with a '.' is a "
        "provider option <ep>.<key>=<value>)",
        hint=(f"did you mean {' or '.join(c + '.' for c in close)}? " if close else "")
        + f"the spec's providers take {listed}; <ep> is the provider's name without ExecutionProvider, in lower "
        "case (trt for tensorrt), <key> ONNX Runtime's own option name")
