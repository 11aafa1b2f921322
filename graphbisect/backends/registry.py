"""The one table of backends. It drives spec validation, ``graphbisect backends``, the CLI help and the docs.

Adding a backend = one runtime module implementing :class:`~graphbisect.backends.base.Runtime` plus one
row here. Nothing else dispatches on backend names.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from graphbisect.backends.base import BackendSpec, Capability
from graphbisect.errors import BackendUnavailableError, SpecError

__all__ = [
    "BACKENDS",
    "DEFAULT_ORACLE",
    "DEFAULT_TARGET",
    "HOST_OPTIONS",
    "Availability",
    "BackendInfo",
    "get",
    "resolve",
    "spec_timeout",
]

C = Capability

#: Used when the user names no backend: ONNX Runtime with every optimization, against no optimization.
DEFAULT_TARGET = "onnxruntime:opt_level=all"
DEFAULT_ORACLE = "onnxruntime:opt_level=disable"

#: Options every backend accepts; the host consumes them, the runtime never sees them.
HOST_OPTIONS: Mapping[str, str] = {
    "python": "run the backend under this Python interpreter (another venv), e.g. python=/opt/ort120/bin/python",
    "timeout": "seconds one invocation may take before it is killed and recorded as a timeout (default 600)",
}


@dataclass(frozen=True)
class Availability:
    available: bool
    version: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class BackendInfo:
    """One row of the backend table."""

    name: str
    summary: str
    runtime: str  # "module:Class" of the Runtime, imported inside the worker
    import_name: str | None  # the library the runtime needs; None = nothing beyond the core
    distributions: tuple[str, ...]  # pip distributions that provide it (the first found gives the version)
    extra: str | None  # pip extra that installs it: pip install graphbisect[extra]
    capabilities: frozenset[Capability]
    options: Mapping[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    #: The option (name, value) that makes a run describe what it compiled (Capability.COMPILED_GRAPH);
    #: graphbisect.localize.compiled reads the description from the run info.
    compiled_option: tuple[str, str] | None = None

    def has(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def availability(self) -> Availability:
        """Whether this backend's library imports here, with its version, or why not (cheap: no import)."""
        if self.import_name is None:
            return Availability(True, None)
        if importlib.util.find_spec(self.import_name) is None:
            how = f"pip install 'graphbisect[{self.extra}]'" if self.extra else f"install {self.import_name}"
            return Availability(False, None, f"Python module {self.import_name!r} is not installed ({how})")
        for dist in self.distributions:
            try:
                return Availability(True, importlib.metadata.version(dist))
            except importlib.metadata.PackageNotFoundError:
                continue
        return Availability(True, None)

    def load_runtime_class(self) -> type:
        module_name, _, class_name = self.runtime.partition(":")
        return getattr(importlib.import_module(module_name), class_name)


BACKENDS: tuple[BackendInfo, ...] = (
    BackendInfo(
        name="onnxruntime",
        aliases=("ort",),
        summary="ONNX Runtime InferenceSession (CPU here; CUDA/TensorRT execution providers where installed)",
        runtime="graphbisect.backends.onnxruntime:OnnxRuntime",
        import_name="onnxruntime",
        distributions=("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino"),
        extra=None,
        capabilities=frozenset({C.INTERMEDIATES, C.PASSES, C.FOREIGN_PYTHON, C.ONNX_INPUT, C.COMPILED_GRAPH}),
        compiled_option=("save_optimized", "1"),
        options={
            "providers": "execution providers in priority order, ';'-separated (default CPUExecutionProvider)",
            "opt_level": "graph optimization level: disable|basic|extended|layout|all (default all)",
            "disabled": "optimizers to disable, ';'-separated; names are validated (ORT ignores unknown ones)",
            "threads": "intra-op thread count (default: ORT's choice)",
            "config": "session config entries, ';'-separated key=value pairs "
            "(e.g. config=session.disable_prepacking=1;session.intra_op.allow_spinning=0)",
            "save_optimized": "1 to save the optimized model and report its path in the run info",
            "report_passes": "1 to report the transformers and rewrite rules that modified the graph "
            "(run info fired_passes; slower: verbose logging and a few extra sessions)",
        },
    ),
    BackendInfo(
        name="reference",
        aliases=("ref", "onnx-reference"),
        summary="onnx.reference.ReferenceEvaluator: the ONNX specification in pure numpy (slow, exact)",
        runtime="graphbisect.backends.reference:Reference",
        import_name="onnx",
        distributions=("onnx",),
        extra=None,
        capabilities=frozenset({C.INTERMEDIATES, C.FOREIGN_PYTHON, C.ONNX_INPUT}),
    ),
    BackendInfo(
        name="paddle",
        aliases=("paddle-inference",),
        summary="Paddle Inference on the original Paddle model (CPU here, GPU where present)",
        runtime="graphbisect.backends.paddle:PaddleInference",
        import_name="paddle",
        distributions=("paddlepaddle", "paddlepaddle-gpu"),
        extra="paddle",
        capabilities=frozenset({C.PASSES, C.FOREIGN_PYTHON}),
        options={
            "device": "cpu (default), gpu or gpu:N",
            "opt_level": "Paddle's optimization level 0-3 (Config.set_optimization_level; 2 is Paddle's default, "
            "0 keeps only bookkeeping passes); switch_ir_optim(False) alone does not stop PIR fusion passes",
            "ir_optim": "0 to call switch_ir_optim(False) (default: Paddle's, on)",
            "delete_pass": "passes to delete, ';'-separated (Config.delete_pass), as reported in fired_passes; "
            "logged *_mkldnn_* names are translated to the *_onednn_* names Paddle registers",
            "threads": "CPU math library threads (set_cpu_math_library_num_threads)",
            "mkldnn": "1 to enable oneDNN, 0 to disable it (default: Paddle's own, enabled on x86 CPU builds "
            "of Paddle 3.x; the run info reports the effective value)",
        },
    ),
    BackendInfo(
        name="onnxoptimizer",
        aliases=("onnx-optimizer",),
        summary="onnxoptimizer's graph passes, then ONNX Runtime with its own optimizations off (CPU)",
        runtime="graphbisect.backends.onnxoptimizer:OnnxOptimizer",
        import_name="onnxoptimizer",
        distributions=("onnxoptimizer",),
        extra="optimizer",
        capabilities=frozenset({C.PASSES, C.ONNX_INPUT, C.INTERMEDIATES, C.FOREIGN_PYTHON, C.COMPILED_GRAPH}),
        compiled_option=("save_optimized", "1"),
        options={
            "passes": "passes to apply in order, ';'-separated (default: onnxoptimizer's fuse-and-elimination list); "
            "names are validated against onnxoptimizer.get_available_passes()",
            "disabled": "passes to leave out of that list, ';'-separated (validated)",
            "threads": "intra-op thread count of the ONNX Runtime session that runs the optimized model",
            "save_optimized": "1 to report the optimized model's path in the run info",
        },
    ),
    BackendInfo(
        name="openvino",
        aliases=("ov",),
        summary="OpenVINO Runtime on the ONNX model (CPU plugin here)",
        runtime="graphbisect.backends.openvino:OpenVino",
        import_name="openvino",
        distributions=("openvino",),
        extra="openvino",
        capabilities=frozenset({C.INTERMEDIATES, C.PRECISION, C.TACTICS, C.FOREIGN_PYTHON, C.ONNX_INPUT,
                                C.COMPILED_GRAPH}),
        compiled_option=("report_exec", "1"),
        options={
            "device": "OpenVINO device name (default CPU)",
            "precision": "inference precision hint: f32|f16|bf16 (default f32, so comparisons are exact)",
            "threads": "inference threads (INFERENCE_NUM_THREADS)",
            "report_exec": "1 to report the compiled execution graph (kernel, runtime precision, fused nodes) "
            "in the run info",
            "report_tactics": "1 to report the build's per-node kernel choices as a tactic record (run info "
            "tactic_record)",
            "tactics": "a tactic record file (absolute path) to replay: its kernel choices are pinned through "
            "primitives_priority and verified (run info tactics_not_applied); nodes the model lacks are ignored",
            "keep_fp32": "ONNX nodes to keep in FP32 under precision=bf16|f16, ';'-separated, or @FILE (absolute path, "
            "one name per line; read at every load): OpenVINO's DisablePrecisionConversion on their ops, checked "
            "against the execution graph (run info keep_fp32.not_applied); nodes the model lacks are ignored",
        },
    ),
    BackendInfo(
        name="tensorrt",
        aliases=("trt",),
        summary="TensorRT (GPU only) via its ONNX parser",
        runtime="graphbisect.backends.tensorrt:TensorRT",
        import_name="tensorrt",
        distributions=("tensorrt", "tensorrt-cu12", "tensorrt-cu13"),
        extra="tensorrt",
        capabilities=frozenset(
            {C.INTERMEDIATES, C.PRECISION, C.TACTICS, C.FOREIGN_PYTHON, C.ONNX_INPUT, C.NEEDS_GPU, C.COMPILED_GRAPH}
        ),
        compiled_option=("report_layers", "1"),
        options={
            "fp16": "1 to allow FP16 kernels",
            "bf16": "1 to allow BF16 kernels",
            "tf32": "0 to forbid TF32 for FP32 math (TensorRT allows it by default on Ampere and newer)",
            "opt_level": "builder optimization level 0-5",
            "workspace": "workspace size in MiB",
            "shapes": "input shapes for inputs with dynamic dims, e.g. shapes=x:1x3x224x224;mask:1x128 "
            "(default: the first run's shapes; the engine is then built at that run)",
            "device": "GPU index (default 0)",
            "report_layers": "1 to report the engine's layers (fused nodes, tactics, precisions) in the run info",
            "typed": "1 for a strongly typed network (NetworkDefinitionCreationFlag.STRONGLY_TYPED): precisions come "
            "from the ONNX types (Cast islands), the way TensorRT 11 does mixed precision; excludes fp16=/bf16=",
        },
    ),
    BackendInfo(
        name="command",
        aliases=("cmd",),
        summary="an external program: cmd='python run.py {model} {inputs} {outputs}' reads the model and an "
        ".npz of inputs and writes an .npz of outputs; exit code and stderr become a crash signature",
        runtime="graphbisect.backends.command:Command",
        import_name=None,
        distributions=(),
        extra=None,
        capabilities=frozenset({C.ONNX_INPUT}),
        options={
            "cmd": "the command template; {model}, {inputs} and {outputs} are substituted (shell-quoted); "
            "it cannot contain ',': put a longer command line in a script",
            "shell": "1 to run the command through the shell (default 0)",
        },
    ),
)


def get(name: str) -> BackendInfo:
    """The table row for a backend name or alias.

    Example:
        >>> get("ort").name
        'onnxruntime'
    """
    key = name.strip().lower()
    for info in BACKENDS:
        if key == info.name or key in info.aliases:
            return info
    known = ", ".join(info.name for info in BACKENDS)
    raise SpecError(f"unknown backend {name!r}", hint=f"choose one of: {known} (see `graphbisect backends`)")


def resolve(spec: BackendSpec | str, *, require_available: bool = True) -> tuple[BackendSpec, BackendInfo]:
    """Canonicalize a spec (aliases → names), validate its option keys, and check availability.

    Option *values* are validated by the runtime (e.g. ORT optimizer names need the library itself).
    """
    if isinstance(spec, str):
        spec = BackendSpec.parse(spec)
    info = get(spec.name)
    spec = BackendSpec(info.name, spec.options)
    allowed = {**HOST_OPTIONS, **info.options}
    for key in spec.options:
        if key not in allowed:
            valid = ", ".join(sorted(allowed))
            raise SpecError(f"backend {info.name!r} has no option {key!r}", hint=f"valid options: {valid}")
    spec_timeout(spec, None)  # a bad timeout= is refused before anything runs
    if require_available and "python" not in spec.options:
        avail = info.availability()
        if not avail.available:
            raise BackendUnavailableError(f"backend {info.name!r} is not available: {avail.reason}")
    return spec, info


def spec_timeout(spec: BackendSpec, default: float | None, *, fallback: float = 600.0) -> float:
    """Seconds one invocation of ``spec`` may take: its ``timeout=`` option, else ``default``, else ``fallback``.

    Raises :class:`SpecError` unless the option is a finite number > 0 (``inf`` or ``nan`` would let a hung
    backend block the run forever).
    """
    text = spec.options.get("timeout")
    if text is None:
        return float(default) if default is not None else fallback
    try:
        value = float(text)
    except ValueError as exc:
        raise SpecError(f"backend spec {spec}: timeout={text!r} is not a number",
                        hint="give seconds, e.g. timeout=120") from exc
    if not math.isfinite(value) or value <= 0:
        raise SpecError(f"backend spec {spec}: timeout={text!r} is not a finite number of seconds > 0",
                        hint="give seconds, e.g. timeout=120")
    return value
