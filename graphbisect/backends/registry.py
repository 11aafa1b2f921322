"""The one table of backends. It drives spec validation, ``graphbisect backends``, the CLI help and the docs.

Adding a backend = one runtime module implementing :class:`~graphbisect.backends.base.Runtime` plus one
row here. Nothing else dispatches on backend names.

Backends outside graphbisect (a compiler team's own runtime) join the table without editing it: a Python
entry point in the group ``graphbisect.backends`` (its name is the backend name, its object a Runtime
class or a :class:`BackendInfo`), or :func:`register_backend` at run time. Their rows get everything the
built-in ones get: isolated workers, specs, every command. A worker imports the runtime by module path,
so the row records where the module lives (:attr:`BackendInfo.path`); a class defined in a script is
imported from the script's file, which must keep its own work under ``if __name__ == "__main__":`` (the
rule ``multiprocessing`` has for the same reason).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import logging
import math
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from graphbisect.backends import ort_providers
from graphbisect.backends.base import BackendSpec, Capability
from graphbisect.backends.inert import (
    ANY,
    BUNDLE_FILE,
    COMMAND_ENVIRONMENT,
    COMMAND_PROGRAM,
    IREE_FLAGS,
    NAMES,
    OPENVINO_CONFIG,
    ORT_SESSION_CONFIG,
    PYTHON_INTERPRETER,
    Rule,
    Untrusted,
    untrusted_values,
)
from graphbisect.errors import BackendUnavailableError, SpecError
from graphbisect.settings.options import MAX_SECONDS, parses

__all__ = [
    "BACKENDS",
    "BACKEND_SPEC",
    "DEFAULT_ORACLE",
    "DEFAULT_TARGET",
    "ENTRY_POINT_GROUP",
    "HOST_INERT",
    "HOST_OPTIONS",
    "UNKNOWN_DEVICE",
    "Availability",
    "BackendInfo",
    "all_backends",
    "custom_origin",
    "get",
    "how_to_register",
    "import_runtime",
    "register_backend",
    "register_row",
    "require_backend",
    "resolve",
    "shared_accelerator",
    "spec_timeout",
    "unregister_backend",
    "untrusted_options",
]

log = logging.getLogger(__name__)

#: The entry point group of backends installed by other distributions.
ENTRY_POINT_GROUP = "graphbisect.backends"

C = Capability

#: Used when the user names no backend: ONNX Runtime with every optimization, against no optimization.
DEFAULT_TARGET = "onnxruntime:opt_level=all"
DEFAULT_ORACLE = "onnxruntime:opt_level=disable"

#: Options every backend accepts; the host consumes them, the runtime never sees them.
HOST_OPTIONS: Mapping[str, str] = {
    "python": "run the backend under this Python interpreter (another venv), e.g. python=/opt/ort120/bin/python",
    "timeout": "seconds one invocation may take before it is killed and recorded as a timeout (default 600)",
}

#: Which host options are inert (:mod:`~graphbisect.backends.inert`): ``python=`` names an interpreter to run.
HOST_INERT: Mapping[str, Rule] = {"python": PYTHON_INTERPRETER, "timeout": ANY}


#: The accelerator of a backend that cannot tell which device a spec uses (an external program, a custom
#: runtime that does not declare ``device_of``): assumed to be the one any other accelerator backend uses.
UNKNOWN_DEVICE = "unknown"


def _undeclared(options: Mapping[str, str]) -> str | None:
    return UNKNOWN_DEVICE


def _cpu_only(options: Mapping[str, str]) -> str | None:
    return None


def _ort_device(options: Mapping[str, str]) -> str | None:
    """The GPU of the first provider that is not a CPU one (:data:`~.ort_providers.CPU_PROVIDERS`): its
    ``device_id`` provider option (``cuda.device_id=1``), else ORT's default 0."""
    accelerated = [p for p in ort_providers.providers_of(options) if p not in ort_providers.CPU_PROVIDERS]
    if not accelerated:
        return None
    prefix = ort_providers.short_name(accelerated[0])
    aliases = [alias for alias, name in ort_providers.ALIASES.items() if name == prefix]
    device = next((options[f"{p}.device_id"] for p in (prefix, *aliases) if f"{p}.device_id" in options), "0")
    return f"gpu:{device.strip() or 0}"


def _paddle_device(options: Mapping[str, str]) -> str | None:
    kind, _, index = options.get("device", "cpu").strip().lower().partition(":")
    return None if kind == "cpu" else f"gpu:{index or 0}"


def _openvino_device(options: Mapping[str, str]) -> str | None:
    device = options.get("device", "CPU").strip().upper()
    if device == "CPU":
        return None
    kind, _, index = device.partition(".")
    # GPU.1 is the second GPU; AUTO, MULTI:..., HETERO:..., NPU may pick a GPU: taken as GPU 0
    return f"gpu:{index}" if kind == "GPU" and index.isdigit() else "gpu:0"


def _tensorrt_device(options: Mapping[str, str]) -> str | None:
    return f"gpu:{options.get('device', '0').strip() or 0}"


@dataclass(frozen=True)
class Availability:
    """Whether a backend's library is there, and what ``import`` of it gives (``graphbisect backends``).

    ``version``: the imported module's ``__version__`` where it was measured by importing it
    (:func:`graphbisect.backends.process.availability_under`), else the version of the distribution whose files
    are found; ``location``: the folder it imports from; ``distribution``: whose files those are;
    ``installed``: every distribution with files there (:class:`~graphbisect.backends.installed.Install` as
    dicts: ``onnxruntime`` and ``onnxruntime-gpu`` share one folder); ``note``: what to say when several are.
    """

    available: bool
    version: str | None = None
    reason: str | None = None
    location: str | None = None
    distribution: str | None = None
    installed: tuple[Mapping[str, str], ...] = ()
    note: str | None = None


@dataclass(frozen=True)
class BackendInfo:
    """One row of the backend table (``graphbisect backends`` lists them; :func:`register_backend` returns the
    row it added): the backend's ``name`` and ``aliases`` in a spec, the ``runtime`` class its workers import
    (``"module:Class"``), the library and distributions it needs, its ``capabilities`` (what it promises, and
    what graphbisect does with each: :class:`~graphbisect.backends.base.Capability`), its documented spec
    ``options`` (others are refused), ``compiled_option`` (the option that makes a run describe the graph it
    compiled), ``opt_levels`` from none to all, and ``inert_options``: the options a downloaded bundle may set
    without ``--trust``, each with its :data:`~graphbisect.backends.inert.Rule`.
    """

    name: str
    summary: str
    runtime: str  # "module:Class" of the Runtime, imported inside the worker
    import_name: str | None  # the library the runtime needs; None = nothing beyond the core
    distributions: tuple[str, ...]  # pip distributions that provide it (the first found gives the version)
    extra: str | None  # pip extra that installs it: pip install graphbisect[extra]
    capabilities: frozenset[Capability]
    options: Mapping[str, str] = field(default_factory=dict)
    #: Families of options whose key is ``SCOPE.NAME`` (ONNX Runtime's provider options ``<ep>.<key>``), by the
    #: pattern shown in the docs: any key with a ``.`` is then accepted by :func:`resolve` and checked by
    #: :attr:`check_options` (the runtime checks the rest against its library).
    scoped_options: Mapping[str, str] = field(default_factory=dict)
    #: Checks a spec's options on the host, without the backend's library (:func:`resolve`); raises SpecError.
    check_options: Callable[[Mapping[str, str]], object] | None = None
    aliases: tuple[str, ...] = ()
    #: The option (name, value) that makes a run describe what it compiled (Capability.COMPILED_GRAPH);
    #: graphbisect.localize.compiled reads the description from the run info.
    compiled_option: tuple[str, str] | None = None
    #: That description is made when the model is built, and a run reports that very one: a build's info
    #: (``BackendProcess.compile``) then holds what the run's would. ONNX Runtime and onnxoptimizer save the
    #: optimized model when the session is created, OpenVINO reads its execution graph once the model is compiled
    #: (a run reports the same, the last load's), IREE dumps its dispatches while it compiles. Not Paddle (its hooks
    #: see ops as they run) nor TensorRT (an engine of dynamic inputs is built at its first run; and only a
    #: stand-in runs here). A reduction then decides a candidate whose build compiled the failing region otherwise
    #: without running it (:class:`~graphbisect.oracle.tester.CandidateTester`).
    described_at_build: bool = False
    path: tuple[str, ...] = ()  # folders a worker appends to sys.path to import ``runtime`` (custom backends)
    #: What the ``keep_fp32`` option names: ``node`` (ONNX node names, pinned per node: OpenVINO) or
    #: ``op_type`` (the target's own op types, pinned per type: Paddle's set_bfloat16_op). The precision
    #: workflow asks a ``op_type`` target which types it computed in reduced precision (run info
    #: ``keep_fp32.low_precision_op_types``) and searches over those.
    pin_unit: str = "node"
    #: Values of the ``opt_level`` option from none to all (a bundle reports the lowest that fails).
    opt_levels: tuple[str, ...] = ()
    #: A running worker may re-create its runtime with other options (same interpreter) instead of a new
    #: process being started: the runtime keeps no process-wide state from its options
    #: (:meth:`~graphbisect.backends.process.BackendProcess.reconfigure`; the pass search's candidates).
    reconfigurable: bool = False
    #: Where the row is not ``reconfigurable`` as a whole, the options a running worker may still change in place:
    #: a spec that differs from the worker's in these alone (and in at least one) re-creates the runtime there.
    #: Paddle: ``delete_pass``, a setting of one predictor's analysis (its other options set process-wide state,
    #: e.g. the CPU math library's threads); 18 ``delete_pass`` specs of MobileNetV2 on Paddle 3.3.1 (two whose
    #: predictor fails to build among them) gave in one worker the outputs, bit for bit, and the passes run,
    #: fired and matched of a fresh worker each, in 4.3 s against 15.6 s. Only on the CPU (``device_of`` None):
    #: that is where it was checked.
    reconfigurable_options: frozenset[str] = frozenset()
    #: The backend computes the graph as written, without rewriting it (``onnx.reference``): what it
    #: computes cannot depend on which tensors a run exposes. A backend with ``opt_levels`` does so at its
    #: lowest level (:meth:`computes_as_written`).
    rewrites_graph: bool = True
    #: Element types the backend rewrites around even at its lowest ``opt_level``: ONNX Runtime's CPU EP inserts
    #: casts around float16/bfloat16 nodes it has no kernel for and removes float32→float16→float32 pairs, which
    #: an exposed float16 tensor keeps (a mixed-precision model's oracle computed other outputs in its capture
    #: than in its plain run: issue 35, case 1). A model holding one of them is not computed as written.
    rewrites_types: frozenset[int] = frozenset()
    #: The accelerator a run uses, from the spec's options: ``"gpu:N"``, None for the CPU only, or
    #: :data:`UNKNOWN_DEVICE` (the default: a row that does not say). :meth:`accelerator`.
    device_of: Callable[[Mapping[str, str]], str | None] = _undeclared
    #: The backend may compute with numpy's BLAS (``onnx.reference``; the default, also for a program the
    #: worker runs). A row that says False computes on its own library's threads, and its worker's numpy
    #: only moves and compares values: that worker gets one OpenBLAS thread (``OPENBLAS_NUM_THREADS=1``
    #: unless the environment sets it), since an idle OpenBLAS thread spins after numpy's import (~20-30 ms
    #: of CPU per worker, on the core the other backend's worker needs).
    numpy_blas: bool = True
    #: Modules of the backend library the zygote its workers are forked from imports before it forks
    #: (:mod:`~graphbisect.backends.zygote`), so that no worker imports them again: only modules that start no
    #: thread and whose import builds no runtime (no session, kernel cache, device context), which the
    #: worker still builds after the fork. ``reference``: onnx's Python operators and ml_dtypes, ~0.07 s of CPU
    #: (~0.55 s with ml_dtypes 0.7.0, which pyproject.toml keeps out).
    zygote_imports: tuple[str, ...] = ()
    #: The built-in backend this row's runtime derives from (a subclass of its runtime, sharing its options): the
    #: per-backend tables (pass controls, replay options) then apply to it too. None: the row's own name.
    family: str | None = None

    @property
    def kin(self) -> str:
        """The name per-backend tables are keyed by: :attr:`family`, else :attr:`name`."""
        return self.family or self.name
    #: The allow-list of the trust rule (:func:`untrusted_options`): option -> the rule saying which of its
    #: values are inert, i.e. cannot run a program, load a library or write a file
    #: (:mod:`~graphbisect.backends.inert`). An option without a rule is not inert: a recorded spec that sets
    #: it runs only with ``--trust``. A custom backend's row has none unless it declares them.
    inert_options: Mapping[str, Rule] = field(default_factory=dict)

    def has(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def accelerator(self, spec: BackendSpec) -> str | None:
        """The accelerator a run of ``spec`` computes on (None: the CPU only), e.g. ``"gpu:0"`` for
        ``tensorrt`` or ``onnxruntime:providers=CUDAExecutionProvider``. Two runs on one accelerator at once
        distort each other's timings and memory (:func:`shared_accelerator`).

        Example:
            >>> get("trt").accelerator(BackendSpec.parse("tensorrt:device=1"))
            'gpu:1'
            >>> get("ort").accelerator(BackendSpec.parse("onnxruntime:opt_level=all")) is None
            True
        """
        return self.device_of(spec.options)

    def computes_as_written(self, spec: BackendSpec, elem_types: Iterable[int] = ()) -> bool:
        """Whether a run of ``spec`` computes the graph as written, so exposing its intermediate tensors
        cannot change its outputs (``reference``; ``onnxruntime:opt_level=disable`` on a model whose
        ``elem_types`` (:func:`graphbisect.model.normalize.elem_types`) hold none of :attr:`rewrites_types`).
        Only then may one run exposing every tensor serve as its plain run as well (``compare``'s oracle)."""
        if not self.rewrites_graph:
            return True
        if self.rewrites_types and not self.rewrites_types.isdisjoint(elem_types):
            return False
        return bool(self.opt_levels) and spec.options.get("opt_level") == self.opt_levels[0]

    def availability(self, *, version: bool = True) -> Availability:
        """Whether this backend's library is installed here, with its version, or why not (no import).

        The version is that of the distribution whose files ``import`` would load, found without importing
        (:func:`~graphbisect.backends.installed.installs_of` on the module's file): never merely the first of
        :attr:`distributions` that is installed (with onnxruntime and onnxruntime-gpu both installed, that
        named the CPU wheel while the GPU one's files were imported). What ``import`` gives, ``__version__``
        included, is measured in a child process by
        :func:`~graphbisect.backends.process.availability_under`. ``version=False`` leaves the version out
        (None): reading it needs ``importlib.metadata``, ~30 ms of imports that a process checking only that
        the library is there (:func:`resolve`) does not need."""
        if self.import_name is None:
            return Availability(True, None)
        try:
            found = importlib.util.find_spec(self.import_name)
        except ModuleNotFoundError:  # a dotted name (iree.compiler) whose parent package is missing
            found = None
        if found is None:
            how = f"pip install 'graphbisect[{self.extra}]'" if self.extra else f"install {self.import_name}"
            return Availability(False, None, f"Python module {self.import_name!r} is not installed ({how})")
        if not version or not found.origin:
            return Availability(True, None)
        from graphbisect.backends import installed  # here: see above

        installs = installed.installs_of(self.import_name, Path(found.origin))
        owners = [i for i in installs if i.state == "imported"]
        return Availability(True, owners[0].version if len(owners) == 1 else None,
                            location=str(Path(found.origin).parent), distribution=" or ".join(i.name for i in owners)
                            or None, installed=tuple(dataclasses.asdict(i) for i in installs),
                            note=installed.note(self.import_name, installs))


BACKENDS: tuple[BackendInfo, ...] = (
    BackendInfo(
        name="onnxruntime",
        aliases=("ort",),
        summary="ONNX Runtime InferenceSession (CPU here; CUDA/TensorRT execution providers where installed)",
        runtime="graphbisect.backends.onnxruntime:OnnxRuntime",
        import_name="onnxruntime",
        distributions=("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino"),
        extra=None,
        opt_levels=("disable", "basic", "extended", "all"),
        rewrites_types=frozenset({10, 16}),  # TensorProto.FLOAT16, BFLOAT16 (onnx is not imported here)
        capabilities=frozenset({C.INTERMEDIATES, C.PASSES, C.FOREIGN_PYTHON, C.ONNX_INPUT, C.COMPILED_GRAPH}),
        compiled_option=("save_optimized", "1"),
        described_at_build=True,
        reconfigurable=True,  # every option is a SessionOptions field or an argument of InferenceSession
        device_of=_ort_device,
        numpy_blas=False,
        options={
            "providers": "execution providers in priority order, ';'-separated (default CPUExecutionProvider)",
            "opt_level": "graph optimization level: disable|basic|extended|layout|all (default all)",
            "disabled": "optimizers to disable, ';'-separated; names are validated (ORT ignores unknown ones)",
            "threads": "intra-op thread count (default: ORT's choice)",
            "config": "session config entries, ';'-separated key=value pairs "
            "(e.g. config=session.disable_prepacking=1); session.intra_op.allow_spinning is 0 unless set here",
            "save_optimized": "1 to save the optimized model and report its path in the run info",
            "report_passes": "1 to report the transformers and rewrite rules that modified the graph "
            "(run info fired_passes; slower: verbose logging and a few extra sessions)",
        },
        scoped_options={
            "<ep>.<key>": "an option of a provider in providers=, passed as InferenceSession(providers=[(name, "
            "{key: value})]): <ep> is the provider's name without ExecutionProvider, in lower case (cuda, tensorrt "
            "or trt, openvino, dml, any other), <key> ONNX Runtime's own option name, verbatim; checked on a probe "
            "session (an option ORT rejects or does not report back is refused: the CPU provider takes none)",
            "cuda.<key>": "CUDAExecutionProvider, e.g. cuda.use_tf32=0 (the CUDA provider allows TF32 in MatMul/Conv "
            "by default), cuda.device_id=1, cuda.cudnn_conv_algo_search=DEFAULT",
            "trt.<key>": "TensorrtExecutionProvider, e.g. trt.trt_fp16_enable=1, trt.trt_max_workspace_size=2147483648",
        },
        check_options=ort_providers.provider_options,
        inert_options={
            "providers": ANY, "opt_level": ANY, "disabled": ANY, "threads": ANY, "config": ORT_SESSION_CONFIG,
            "save_optimized": ANY, "report_passes": ANY,  # written into graphbisect's own work folder
            # execution provider options (<prefix>.<key>): only those known to be inert; any other one
            # (trt.engine_cache_path, a provider's dump or library path) needs --trust
            **ort_providers.inert_spec_options(),
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
        rewrites_graph=False,
        device_of=_cpu_only,
        zygote_imports=("onnx.reference", "onnx.reference.ops"),
    ),
    BackendInfo(
        name="paddle",
        aliases=("paddle-inference",),
        summary="Paddle Inference on the original Paddle model (CPU here, GPU where present)",
        runtime="graphbisect.backends.paddle:PaddleInference",
        import_name="paddle",
        distributions=("paddlepaddle", "paddlepaddle-gpu"),
        extra="paddle",
        capabilities=frozenset({C.PASSES, C.FOREIGN_PYTHON, C.COMPILED_GRAPH, C.PRECISION}),
        compiled_option=("hooks", "1"),
        reconfigurable_options=frozenset({"delete_pass"}),  # the pass search's candidates share a worker
        pin_unit="op_type",
        device_of=_paddle_device,
        options={
            "device": "cpu (default), gpu or gpu:N",
            "hooks": "1 to return every op output of the optimized program too (output hooks; run info hooked), "
            "which compare maps to the converted ONNX model's tensors",
            "bf16": "1 for oneDNN bf16 kernels (enable_mkldnn_bfloat16; CPUs with AVX512-BF16 or AMX)",
            "precision": "f32 (default) or bf16 (the same as bf16=1)",
            "keep_fp32": "Paddle op types (of the optimized program, e.g. fused_conv2d) to keep in FP32 under bf16, "
            "';'-separated, or @FILE (absolute path, one type per line; read at every load): set_bfloat16_op with "
            "every other type; checked with a dtype output hook (run info keep_fp32.not_applied). Legacy programs "
            "(.pdmodel) only: Paddle 3.3 PIR programs ignore the op list",
            "opt_level": "Paddle's optimization level 0-3 (Config.set_optimization_level; 2 is Paddle's default, "
            "0 keeps only bookkeeping passes); switch_ir_optim(False) alone does not stop PIR fusion passes",
            "ir_optim": "0 to call switch_ir_optim(False) (default: Paddle's, on)",
            "delete_pass": "passes to delete, ';'-separated (Config.delete_pass), as reported in fired_passes; "
            "logged *_mkldnn_* names are translated to the *_onednn_* names Paddle registers",
            "threads": "CPU math library threads (set_cpu_math_library_num_threads)",
            "mkldnn": "1 to enable oneDNN, 0 to disable it (default: Paddle's own, enabled on x86 CPU builds "
            "of Paddle 3.x; the run info reports the effective value)",
        },
        inert_options={
            "device": ANY, "hooks": ANY, "bf16": ANY, "precision": ANY, "keep_fp32": NAMES, "opt_level": ANY,
            "ir_optim": ANY, "delete_pass": ANY, "threads": ANY, "mkldnn": ANY,
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
        described_at_build=True,
        reconfigurable=True,  # onnxoptimizer.optimize's arguments and ONNX Runtime's session options, per build
        device_of=_cpu_only,  # ONNX Runtime's CPU provider runs the optimized model
        numpy_blas=False,
        options={
            "passes": "passes to apply in order, ';'-separated (default: onnxoptimizer's fuse-and-elimination list); "
            "names are validated against onnxoptimizer.get_available_passes()",
            "disabled": "passes to leave out of that list, ';'-separated (validated)",
            "threads": "intra-op thread count of the ONNX Runtime session that runs the optimized model",
            "save_optimized": "1 to report the optimized model's path in the run info",
        },
        inert_options={"passes": ANY, "disabled": ANY, "threads": ANY, "save_optimized": ANY},
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
        described_at_build=True,
        device_of=_openvino_device,
        numpy_blas=False,
        options={
            "device": "OpenVINO device name (default CPU)",
            "precision": "inference precision hint: f32|f16|bf16 (default f32; int8-weight layers may still run "
            "in i8: see config=)",
            "threads": "inference threads (INFERENCE_NUM_THREADS)",
            "config": "other OpenVINO properties for compile_model, ';'-separated KEY=VALUE pairs, e.g. "
            "config=DYNAMIC_QUANTIZATION_GROUP_SIZE=0 (the CPU plugin quantizes the activations of int8-weight "
            "FullyConnected layers to i8 by default) or EXECUTION_MODE_HINT=ACCURACY; checked on a probe "
            "compile, and the run info reports each key's value as compiled",
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
        inert_options={
            "device": ANY, "precision": ANY, "threads": ANY, "config": OPENVINO_CONFIG, "report_exec": ANY,
            "report_tactics": ANY, "tactics": BUNDLE_FILE, "keep_fp32": NAMES,
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
        device_of=_tensorrt_device,
        numpy_blas=False,
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
        inert_options=dict.fromkeys(("fp16", "bf16", "tf32", "opt_level", "workspace", "shapes", "device",
                                     "report_layers", "typed"), ANY),
    ),
    BackendInfo(
        name="iree",
        aliases=("iree-cpu",),
        summary="IREE, an ML compiler: ONNX import -> iree-compile for llvm-cpu -> iree.runtime (CPU); import and "
        "compile failures are crashes at load with the compiler's stable diagnostic (an ONNX op the importer "
        "cannot convert: unsupported)",
        runtime="graphbisect.backends.iree:Iree",
        import_name="iree.compiler",
        distributions=("iree-base-compiler",),
        extra="iree",
        capabilities=frozenset({C.INTERMEDIATES, C.PASSES, C.FOREIGN_PYTHON, C.ONNX_INPUT, C.COMPILED_GRAPH}),
        compiled_option=("report_dispatches", "1"),
        described_at_build=True,
        device_of=_cpu_only,  # llvm-cpu
        numpy_blas=False,
        options={
            "cpu": "target CPU for --iree-llvmcpu-target-cpu (default host; generic for a portable module)",
            "flags": "extra iree-compile flags, ';'-separated "
            "(e.g. flags=--iree-opt-level=O0;--iree-opt-data-tiling=false)",
            "opset": "upgrade the model to this ONNX opset before import (iree-import-onnx --opset-version)",
            "device": "runtime device: local-task (multi-threaded, default) or local-sync",
            "disabled": "compiler features to switch off, ';'-separated: const-eval, data-tiling, aggressive-fusion, "
            "demote-f64-to-f32, ukernels, ... (each one stands for its iree-compile flag; see `passes`)",
            "report_passes": "1 to report the features whose flag changes this compiled module (run info fired_passes; "
            "one extra compile per feature)",
            "report_dispatches": "1 to dump the executable sources and report which ONNX nodes each dispatch holds "
            "(run info dispatches)",
        },
        inert_options={  # report_dispatches dumps into graphbisect's own work folder
            "cpu": ANY, "flags": IREE_FLAGS, "opset": ANY, "device": ANY, "disabled": ANY, "report_passes": ANY,
            "report_dispatches": ANY,
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
            "typed": "1: the program reads graphbisect's typed .npz (__values__.json: bfloat16, float8, int4 "
            "stored as raw bits or values); without it such inputs are refused as unsupported",
            "venv": "run the program with this environment first: its bin/ at the start of PATH (python and its "
            "console scripts are the environment's), VIRTUAL_ENV set",
            "package": "the distribution that is the program's library: its version, measured by the python on "
            "the program's PATH (importlib.metadata), is reported as what ran",
        },
        inert_options={"cmd": COMMAND_PROGRAM, "shell": ANY, "typed": ANY, "venv": COMMAND_ENVIRONMENT,
                       "package": ANY},
    ),
)


def shared_accelerator(first: BackendSpec, second: BackendSpec) -> str | None:
    """The accelerator runs of both specs would use at once (None when they share none and may overlap): the
    same device, or one whose device is unknown (:data:`UNKNOWN_DEVICE`) beside one on any accelerator.

    Example:
        >>> shared_accelerator(BackendSpec.parse("tensorrt"),
        ...                    BackendSpec.parse("onnxruntime:providers=CUDAExecutionProvider"))
        'gpu:0'
        >>> shared_accelerator(BackendSpec.parse("tensorrt"), BackendSpec.parse("onnxruntime")) is None
        True
    """
    a = get(first.name).accelerator(first)
    b = get(second.name).accelerator(second)
    if a is None or b is None or (a != b and UNKNOWN_DEVICE not in (a, b)):
        return None
    return b if a == UNKNOWN_DEVICE else a


def get(name: str) -> BackendInfo:
    """The table row for a backend name or alias (built-in, registered, or from an entry point).

    Example:
        >>> get("ort").name
        'onnxruntime'
    """
    key = name.strip().lower()
    for info in BACKENDS:
        if key == info.name or key in info.aliases:
            return info
    for info in (*_REGISTERED.values(), *_entry_point_backends()):
        if key == info.name or key in info.aliases:
            return info
    known = ", ".join(info.name for info in all_backends())
    raise SpecError(f"unknown backend {name!r}", hint=f"choose one of: {known} (see `graphbisect backends`; a "
                    f"custom backend is registered with graphbisect.register_backend or an entry point in the "
                    f"{ENTRY_POINT_GROUP!r} group)")


# ---------------------------------------------------------------------------------------- custom backends
_REGISTERED: dict[str, BackendInfo] = {}


def all_backends() -> tuple[BackendInfo, ...]:
    """Every backend: the built-in table, then entry points, then those registered in this process."""
    rows = {info.name: info for info in (*_entry_point_backends(), *_REGISTERED.values())}
    builtin = {info.name for info in BACKENDS}
    return (*BACKENDS, *(info for name, info in rows.items() if name not in builtin))


def register_backend(
    runtime: type | str,
    *,
    name: str | None = None,
    summary: str | None = None,
    capabilities: Iterable[Capability | str] | None = None,
    options: Mapping[str, str] | None = None,
    aliases: Iterable[str] = (),
    import_name: str | None = None,
    distributions: Iterable[str] = (),
    replace: bool = False,
    inert_options: Mapping[str, Rule] | None = None,
) -> BackendInfo:
    """Add a backend to the table of this process: a class implementing
    :class:`~graphbisect.backends.base.Runtime`, or its ``"module:Class"`` path.

    Defaults come from the class: ``name`` (its ``name`` attribute, else the class name in lower case),
    ``summary`` (the first docstring line), ``capabilities`` (its ``capabilities`` attribute, else
    ``{onnx-input}``: it runs ONNX models) and ``options`` (its ``options`` attribute: documented spec
    options; others are refused). The worker process imports the class by its module path, found through
    the folder the module was loaded from; a class defined in a script is imported from the script's file.
    ``inert_options`` (default: its ``inert_options`` attribute, else none) are the options whose values cannot
    run a program, load a library or write a file, with their rules (:mod:`~graphbisect.backends.inert`): a
    bundle's recorded spec setting any other option runs only with ``--trust`` (:func:`untrusted_options`).
    A runtime declaring ``compiled-graph`` sets ``compiled_option`` too (its class attribute: the spec option
    that makes its ``info()`` describe the graph it compiled; see :class:`~graphbisect.backends.base.Capability`).

    Example:
        >>> class Doubling:
        ...     \"\"\"ONNX Runtime, with every output doubled (a deliberately wrong backend).\"\"\"
        >>> info = register_backend(Doubling, name="doubling")        # doctest: +SKIP
        >>> resolve("doubling")[1].runtime                              # doctest: +SKIP
        '/path/to/script.py:Doubling'
    """
    info = _row(runtime, name=name, summary=summary, capabilities=capabilities, options=options, aliases=aliases,
                import_name=import_name, distributions=distributions, inert_options=inert_options)
    return register_row(info, replace=replace)


def register_row(info: BackendInfo, *, replace: bool = False) -> BackendInfo:
    """Add a whole :class:`BackendInfo` row to the table of this process (what an entry point may also give):
    for a runtime that shares a built-in row's options, levels and capabilities, e.g. a subclass of it.

    Example:
        >>> import dataclasses
        >>> row = dataclasses.replace(get("ort"), name="myort", aliases=(), runtime="mypkg.rt:MyOrt")
        >>> register_row(row).opt_levels                                   # doctest: +SKIP
        ('disable', 'basic', 'extended', 'all')
    """
    if any(info.name == row.name or info.name in row.aliases for row in BACKENDS):
        raise SpecError(f"backend name {info.name!r} is taken by a built-in backend", hint="choose another name")
    if info.name in _REGISTERED and not replace and _REGISTERED[info.name] != info:
        raise SpecError(f"backend {info.name!r} is already registered ({_REGISTERED[info.name].runtime})",
                        hint="pass replace=True to register another runtime under this name")
    _REGISTERED[info.name] = info
    return info


def unregister_backend(name: str) -> None:
    """Remove a backend registered with :func:`register_backend` (entry points stay)."""
    _REGISTERED.pop(name.strip().lower(), None)


def import_runtime(runtime: str, path: Iterable[str] = ()) -> type:
    """Import a runtime class from ``"module:Class"`` or ``"/path/to/script.py:Class"`` (what workers do).

    ``path`` folders are appended to ``sys.path`` first (appended: they must not shadow installed libraries).
    """
    for folder in path:
        if folder not in sys.path:
            sys.path.append(folder)
    module_name, _, class_name = runtime.rpartition(":")
    is_script = module_name.endswith(".py")
    module = _import_script(Path(module_name)) if is_script else importlib.import_module(module_name)
    target: object = module
    for part in class_name.split("."):
        target = getattr(target, part)
    if not isinstance(target, type):
        raise SpecError(f"runtime {runtime!r} is not a class", hint="register a class implementing Runtime")
    return target


#: The module name a script's runtime is imported under in a worker (not ``__main__``: the worker is that).
_SCRIPT_MODULE = "__graphbisect_script__"


def _import_script(path: Path) -> ModuleType:
    if _SCRIPT_MODULE in sys.modules and getattr(sys.modules[_SCRIPT_MODULE], "__file__", None) == str(path):
        return sys.modules[_SCRIPT_MODULE]
    spec = importlib.util.spec_from_file_location(_SCRIPT_MODULE, path)
    if spec is None or spec.loader is None:
        raise SpecError(f"cannot import the runtime's script {path}", hint="register a class from a module or script")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_SCRIPT_MODULE] = module
    spec.loader.exec_module(module)
    return module


def _runtime_path(cls: type) -> tuple[str, tuple[str, ...]]:
    """``("module:Class", folders)`` or ``("/abs/script.py:Class", ())`` for a class defined in a script."""
    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    if cls.__module__ in ("__main__", _SCRIPT_MODULE):
        if not file:
            raise SpecError(f"runtime class {cls.__qualname__} is defined interactively: a worker process cannot "
                            "import it", hint="define it in a module or a script file")
        return f"{Path(file).resolve()}:{cls.__qualname__}", ()
    if "<locals>" in cls.__qualname__:
        raise SpecError(f"runtime class {cls.__qualname__} is defined inside a function: a worker process cannot "
                        "import it", hint="define it at the top level of a module")
    folders: tuple[str, ...] = ()
    if file:
        root = Path(file).resolve().parent
        for _ in range(cls.__module__.count(".") + (Path(file).name == "__init__.py")):
            root = root.parent
        folders = (str(root),)
    return f"{cls.__module__}:{cls.__qualname__}", folders


def _row(runtime: type | str, *, name: str | None, summary: str | None,
         capabilities: Iterable[Capability | str] | None, options: Mapping[str, str] | None, aliases: Iterable[str],
         import_name: str | None, distributions: Iterable[str],
         inert_options: Mapping[str, Rule] | None = None) -> BackendInfo:
    cls = import_runtime(runtime) if isinstance(runtime, str) else runtime
    path, folders = (runtime, ()) if isinstance(runtime, str) else _runtime_path(cls)
    name = (name or getattr(cls, "name", None) or cls.__name__).strip().lower()
    if not name or ":" in name or "," in name:
        raise SpecError(f"backend name {name!r} cannot be used in a spec", hint="use letters, digits, '-' and '_'")
    doc = (cls.__doc__ or "").strip().splitlines()
    caps = capabilities if capabilities is not None else getattr(cls, "capabilities", (Capability.ONNX_INPUT,))
    options = dict(options if options is not None else getattr(cls, "options", {}))
    return BackendInfo(
        name=name, summary=summary or (doc[0] if doc else f"custom backend {path}"), runtime=path,
        import_name=import_name, distributions=tuple(distributions), extra=None,
        capabilities=frozenset(Capability(c) for c in caps), options=options,
        aliases=tuple(a.lower() for a in aliases), path=folders,
        inert_options=dict(inert_options if inert_options is not None else getattr(cls, "inert_options", {})),
        compiled_option=_compiled_option(cls, name, frozenset(Capability(c) for c in caps), options),
    )


def _compiled_option(cls: type, name: str, caps: frozenset[Capability], options: Mapping[str, str],
                     ) -> tuple[str, str] | None:
    """A custom runtime's ``compiled_option`` class attribute: the spec option (name, value) that makes a run
    describe what it compiled. ``compiled-graph`` without it described nothing, and said nothing of it."""
    found = getattr(cls, "compiled_option", None)
    if Capability.COMPILED_GRAPH not in caps:
        return None
    fix = ("set the runtime's class attribute compiled_option = (OPTION, VALUE): the spec option that makes its "
           "info() describe the graph it compiled (optimized_model, exec_graph or layers; see Capability), e.g. "
           "(\"save_optimized\", \"1\"), with OPTION among its options")
    if not (isinstance(found, (tuple, list)) and len(found) == 2 and all(isinstance(v, str) for v in found)):
        raise SpecError(f"backend {name!r} declares compiled-graph without a compiled_option", hint=fix)
    if found[0] not in options:
        raise SpecError(f"backend {name!r}: its compiled_option {found[0]!r} is not one of its options", hint=fix)
    return (found[0], found[1])


def custom_origin(name: str) -> dict[str, Any] | None:
    """How the custom backend ``name`` came into this process's table, for a bundle to say how to get it back in
    another process (:func:`how_to_register`); None for a built-in backend.

    ``registered``: ``"entry point"`` (an installed distribution declares it: ``entry_point``, ``distribution``)
    or ``"register_backend"`` (a script registered it at run time: only that script's processes know it);
    ``runtime`` and ``path``: the class a worker imports and the folders it imports it from.

    Example:
        >>> custom_origin("onnxruntime") is None
        True
    """
    info = get(name)
    if any(info is row for row in BACKENDS):
        return None
    origin: dict[str, Any] = {"name": info.name, "runtime": info.runtime, "path": list(info.path),
                              "registered": "register_backend", "entry_point": None, "distribution": None}
    if _REGISTERED.get(info.name) is not info:
        from importlib import metadata

        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name.strip().lower() == info.name:
                origin.update(registered="entry point", entry_point=f"{ep.name} = {ep.value}",
                              distribution=ep.dist.name if ep.dist else None)
                break
    return origin


def how_to_register(origin: Mapping[str, Any], bundle: str) -> str:
    """What to run so that ``graphbisect verify bundle`` finds the custom backend :func:`custom_origin` recorded:
    install the distribution that declares its entry point, or register its class in the process that verifies
    (a backend registered by a script is known to that script's processes only). Values are a bundle's data:
    quoted for the shell and for Python, never pasted raw.

    Example:
        >>> print(how_to_register({"name": "team", "registered": "entry point", "distribution": "team-backend",
        ...                        "entry_point": "team = team_backend:TeamRuntime"}, "bug"))
        install the distribution that declares it ('team-backend', entry point 'team = team_backend:TeamRuntime' in \
the 'graphbisect.backends' group), then: graphbisect verify bug
    """
    name, command = str(origin.get("name", "")), f"graphbisect verify {shlex.quote(bundle)}"
    if origin.get("registered") == "entry point":
        dist = f"{str(origin.get('distribution'))!r}, " if origin.get("distribution") else ""
        return (f"install the distribution that declares it ({dist}entry point {str(origin.get('entry_point'))!r} "
                f"in the {ENTRY_POINT_GROUP!r} group), then: {command}")
    runtime, path = str(origin.get("runtime", "")), [str(p) for p in origin.get("path") or ()]
    code = ("import sys, graphbisect; from graphbisect.backends.registry import import_runtime; "
            "from graphbisect.cli.main import main; "
            f"graphbisect.register_backend(import_runtime({json.dumps(runtime)}, {json.dumps(path)}), "
            f"name={json.dumps(name)}); "
            "sys.exit(main([\"verify\", *sys.argv[1:]]))")
    return (f"the backend {name!r} was registered at run time (graphbisect.register_backend, class {runtime!r}): "
            f"only the process that registered it knows it. Register it, then verify, in one process:\n"
            f"    python -c {shlex.quote(code)} {shlex.quote(bundle)}\n"
            f"(an entry point in the {ENTRY_POINT_GROUP!r} group of an installed distribution makes it known to "
            f"every process: then {command})")


def require_backend(spec: BackendSpec, origin: Mapping[str, Any] | None, bundle: str) -> None:
    """Raise :class:`SpecError` when ``spec``'s backend is not in this process's table; where the bundle recorded the
    custom backend's ``origin`` (:func:`custom_origin`, repro_config.json ``custom_backend``), the hint says how to
    register it (:func:`how_to_register`): a backend a script registered is known to that script alone, and
    ``graphbisect verify`` elsewhere said only "unknown backend" (issue 35)."""
    try:
        get(spec.name)
    except SpecError as exc:
        if origin is None or str(origin.get("name", "")).lower() != spec.name.lower():
            raise
        raise SpecError(f"{exc.message}: the bundle's {spec.name!r} is a custom backend this process has not "
                        "registered", hint=how_to_register(origin, bundle)) from exc


def _entry_point_backends() -> list[BackendInfo]:
    """Rows of the backends other distributions declare in the ``graphbisect.backends`` entry point group."""
    from importlib import metadata  # here: only when a name is not built in (~30 ms of imports)

    rows = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if isinstance(obj, BackendInfo):
                rows.append(obj)
            else:
                rows.append(_row(obj, name=ep.name, summary=None, capabilities=None, options=None, aliases=(),
                                 import_name=None, distributions=(ep.dist.name,) if ep.dist else ()))
        except Exception as exc:  # a broken plug-in must not break graphbisect
            log.warning("ignoring the %s entry point %r (%s): %s: %s", ENTRY_POINT_GROUP, ep.name, ep.value,
                        type(exc).__name__, exc)
    return rows


def resolve(spec: BackendSpec | str, *, require_available: bool = True) -> tuple[BackendSpec, BackendInfo]:
    """Canonicalize a spec (aliases → names), validate its option keys, and check availability.

    Option *values* are validated by the runtime (e.g. ORT optimizer names need the library itself).
    """
    if isinstance(spec, str):
        spec = BackendSpec.parse(spec)
    info = get(spec.name)
    spec = BackendSpec(info.name, spec.options, written=spec.written)
    allowed = {**HOST_OPTIONS, **info.options}
    for key in spec.options:
        if key not in allowed and not ("." in key and info.scoped_options):
            valid = ", ".join([*sorted(allowed), *info.scoped_options])
            raise SpecError(f"backend {info.name!r} has no option {key!r}", hint=f"valid options: {valid}")
    if info.check_options is not None:
        info.check_options({k: v for k, v in spec.options.items() if k not in HOST_OPTIONS})
    spec_timeout(spec, None)  # a bad timeout= is refused before anything runs
    _check_threads(spec)
    if require_available and "python" not in spec.options:
        avail = info.availability(version=False)
        if not avail.available:
            raise BackendUnavailableError(f"backend {info.name!r} is not available: {avail.reason}")
    return spec, info


def untrusted_options(spec: BackendSpec | str, *, own_files: Iterable[str] = ()) -> list[Untrusted]:
    """The trust rule: the options of a recorded ``spec`` that are not known to be inert (they may run a
    program, load a library or write a file), each with why; empty when the spec may run without ``--trust``.

    The spec's name is resolved through the table first (``cmd`` is ``command``), and its options are checked
    against that row's allow-list (:attr:`BackendInfo.inert_options`, :data:`HOST_INERT`): an option without
    a rule is not inert, whatever its value. ``own_files``: paths the bundle holds, which a file option
    (``openvino:tactics=``) may name. Used by ``verify`` for the recorded target; ``repro.py`` applies the
    same rules to ``repro_config.json`` (:func:`~graphbisect.backends.inert.untrusted_values`).
    Raises :class:`SpecError` for an unknown backend.

    Example:
        >>> [u.describe() for u in untrusted_options("cmd:cmd=./run.sh {model} {inputs} {outputs}")]
        ['cmd=./run.sh {model} {inputs} {outputs}: is the program the backend runs']
        >>> untrusted_options("ort:opt_level=all,config=session.disable_prepacking=1")
        []
    """
    if isinstance(spec, str):
        spec = BackendSpec.parse(spec)
    info = get(spec.name)
    rules = {**info.inert_options, **HOST_INERT}  # a row cannot make python= inert
    return [Untrusted(option, value, why)
            for option, value, why in untrusted_values(rules, dict(spec.options), tuple(own_files))]


#: A backend spec option's values (``ReduceOptions.target``, ``--target``): a known backend and option keys
#: (whether it is installed here is checked when it runs).
BACKEND_SPEC = parses(lambda text: resolve(text, require_available=False), "a backend spec NAME[:key=value,...]",
                      "'onnxruntime:opt_level=all'")


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
    if not math.isfinite(value) or value <= 0 or value > MAX_SECONDS:
        raise SpecError(f"backend spec {spec}: timeout={text!r} is not a number of seconds > 0 and <= "
                        f"{MAX_SECONDS:.0e}", hint="give seconds, e.g. timeout=120")
    return value


#: The most threads a ``threads=`` option may ask for: a larger count is a typo, and the libraries take it
#: as a C int or crash (``threads=99999999999`` was reported as the target's crash, issue 24).
MAX_THREADS = 4096


def _check_threads(spec: BackendSpec) -> None:
    text = spec.options.get("threads")
    if text is None:
        return
    if not text.strip().isdigit() or int(text) > MAX_THREADS:
        raise SpecError(f"backend spec {spec}: threads={text!r} is not a whole number from 0 to {MAX_THREADS}",
                        hint="give a thread count, e.g. threads=4 (0 or no threads=: the library's choice)")
