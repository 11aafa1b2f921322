"""OpenVINO Runtime on an ONNX model (CPU plugin here; any OpenVINO device by name).

Runs inside a worker process: imports only the standard library and numpy at module level, OpenVINO
lazily in :meth:`OpenVino.load`.

**Precision.** OpenVINO's CPU plugin computes in bf16 by default on CPUs that have it (AVX512-BF16/AMX:
``Core().get_property("CPU", "INFERENCE_PRECISION_HINT")`` says ``bfloat16`` there), which would make
every comparison against an f32 oracle "fail". The runtime therefore asks for ``f32`` unless the spec
says ``precision=f16|bf16``, and reports the precision the compiled model actually uses. A precision the
device does not compute in is refused by :meth:`OpenVino.validate`, before any run: this CPU plugin
compiles ``precision=f16`` requests in bf16 on an AVX512-BF16 CPU without FP16 support, and
``precision=bf16`` in f32 on a CPU without BF16, silently (``INFERENCE_PRECISION_HINT`` of the compiled
model tells), which made ``graphbisect precision`` answer "no node needs FP32" about what never ran.

**Config keys.** ``config=KEY=VALUE;KEY=VALUE`` passes OpenVINO properties to ``compile_model`` as
they are (``config=DYNAMIC_QUANTIZATION_GROUP_SIZE=0``: the CPU plugin's default dynamic quantization
computes a FullyConnected with int8 weights in i8, group size 32, which errs hundreds of tolerances on an
int8-weight transformer; ``EXECUTION_MODE_HINT=ACCURACY``; ``NUM_STREAMS=1``). :meth:`OpenVino.validate`
compiles a probe with them, so a key or value the device refuses is a ``SpecError`` before any run, and
``info()["config"]`` gives each key's value as the compiled model reports it. ``INFERENCE_PRECISION_HINT``
and ``INFERENCE_NUM_THREADS`` are ``precision=`` and ``threads=`` (checked there), never config entries.

**Intermediates.** ``load(model, outputs)`` accepts any tensor names: names that are already outputs of
the model (e.g. a probe ONNX model whose graph outputs the host extended) are taken as they are, other
names are added with ``Model.add_outputs(name)``. Results are matched to names by output *index*, not
by ``get_names()`` of the compiled model: compilation merges tensor names across fused nodes (the
compiled output of a Conv+Add fusion carries both ``conv_out`` and ``add_out``), so names on compiled
ports are ambiguous while indices are stable (verified on OpenVINO 2026.4: values by index match
ONNX Runtime for every exposed tensor).

**Execution graph.** With ``report_exec=1``, ``info()["exec_graph"]`` lists the compiled model's nodes
with their ``layerType``, ``primitiveType`` (kernel, e.g. ``jit_avx512_f32``), ``runtimePrecision`` and
``originalLayersNames`` (the model nodes fused into it).

**FP32 pins.** ``keep_fp32=A;B`` (ONNX node names) or ``keep_fp32=@FILE`` (an absolute path; one name per
line, or a JSON list; read again at every model load, so a driver such as ``graphbisect precision`` can
change it between models) keeps those nodes in FP32 while the rest runs at ``precision=bf16|f16``. The
mechanism is OpenVINO's own: the ``DisablePrecisionConversion`` runtime attribute, which the CPU plugin
honours per node (its nodes built from an op so marked keep their original precision). Two facts shape
how it is applied (verified on OpenVINO 2026.4.1, CPU with AVX512-BF16):

* the attribute is a typed object that Python cannot create, and ``rt_info`` strings set from Python are
  ignored; the IR reader creates it from ``<attribute name="DisablePrecisionConversion" version="0"
  value="dynamic:dynamic"/>`` in a layer's ``<rt_info>``, so the model is saved as IR, edited, read back;
* it is *not copyable*: an op that a transformation replaces loses it (a Conv fused with its
  BatchNormalization becomes a new ``Multiply_NNN`` Convolution). So the common transformations
  (``apply_moc_transformations``: Conv+BN, Conv+Multiply, ... fusions) run first, then every resulting op
  whose fused names include a pinned ONNX node is marked, then the plugin compiles the marked IR. The
  plugin's own later rewrites still drop marks: MatMul + bias Add becomes a new FullyConnected, an
  attention block a ScaledDotProductAttention, and those run in bf16 whatever was asked.

So every build with ``keep_fp32`` is checked against the execution graph: ``info()["keep_fp32"]`` gives
the requested nodes the model lacks (``missing``, ignored like the tactic records' missing nodes), the
IR layers marked, and the pinned nodes whose kernels still compute and write in bf16/f16
(``not_applied``), that still compute in bf16/f16 somewhere but keep an f32 result (``partly_applied``:
a node fused as a post-op into an unpinned neighbour's kernel, a MatMul + bias rewritten into one bf16
FullyConnected), or that left no trace in the execution graph (``unverified``: folded, or merged into an
op the plugin renamed, like the MatMul of that FullyConnected, named after its bias Add).

**Tactics.** ``report_tactics=1`` puts the build's kernel choices, mapped to ONNX node names, in
``info()["tactic_record"]`` (a :class:`graphbisect.tactics.record.TacticRecord` as JSON). ``tactics=PATH``
replays a record file: the choices that differ from the unpinned build are written as
``primitives_priority`` into the IR XML of the model, which is read back and compiled; the build is then
re-recorded and ``info()["tactics_not_applied"]`` lists the choices the plugin silently replaced. Nodes
of the record that the model does not have are ignored, so a record of the full model pins the kernels of
every reduced candidate (see :mod:`graphbisect.tactics.openvino`).

Example (inside a worker):
    >>> rt = OpenVino({"precision": "f32"}, "/tmp/w")  # doctest: +SKIP
    >>> rt.load("probe.onnx", ["conv_out", "logits"])  # doctest: +SKIP
    >>> sorted(rt.run({"x": x}))  # doctest: +SKIP
    ['conv_out', 'logits']
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphbisect.backends.base import UnsupportedType
from graphbisect.errors import BackendError, InputError, ModelError, SpecError
from graphbisect.storage.values import EXTENSION_TYPES, elem_type_of, from_raw_bytes, raw_bytes

__all__ = ["OpenVino", "config_entries", "ir_layers", "ov_layer_nodes", "pin_fp32_ir_xml"]

logger = logging.getLogger(__name__)

_OPTIONS = ("device", "precision", "threads", "config", "report_exec", "report_tactics", "tactics", "keep_fp32")
#: Config keys that other options set (and check): ``config=`` may not set them a second way.
_OWN_KEYS = {"INFERENCE_PRECISION_HINT": "precision=f32|f16|bf16", "INFERENCE_NUM_THREADS": "threads=N"}
_PRECISIONS = {"f32": "f32", "fp32": "f32", "f16": "f16", "fp16": "f16", "bf16": "bf16"}
_SINK_SUFFIX = "/sink_port_0"  # the ONNX frontend names a graph output's Result node "<name>/sink_port_0"
_PIN_ATTRIBUTE = "DisablePrecisionConversion"
_PIN_VALUE = "dynamic:dynamic"  # from any element type to any: covers bf16 and f16
_NOT_COMPUTE = frozenset({"Parameter", "Result", "Constant"})
_LOW = frozenset({"bf16", "f16"})
_STORAGE_ONLY = frozenset({
    "Input", "Output", "Const", "Reorder", "Reshape", "Transpose", "Split", "Concatenation", "Gather",
    "StridedSlice", "Broadcast", "Tile", "ShapeOf",
})
"""Execution node types whose precision is storage, not arithmetic: left out of the pin check."""


#: ONNX element types numpy lacks → the OpenVINO element type holding the same bits. Checked on OpenVINO
#: 2026.4 (CPU) against onnx.reference (tests/backends/test_openvino.py): the 4-bit types packed low nibble
#: first, as in ONNX. Its ``.data`` shows a bf16 tensor as float16 and an i4 one as packed int8, so values
#: cross as bytes, never as ``.data``'s dtype. FNUZ float8s, int2 and the unchecked f4e2m1/f8e8m0 are refused.
_OV_TYPES = {16: "bf16", 17: "f8e4m3", 19: "f8e5m2", 21: "u4", 22: "i4"}
_ONNX_OF_OV = {name: code for code, name in _OV_TYPES.items()}


def _to_ov(name: str, value: Any) -> Any:
    """An input as OpenVINO takes it: a numpy array, or an ``ov.Tensor`` of the bits of a type numpy lacks."""
    array = np.asarray(value, order="C")  # keeps 0-d; np.ascontiguousarray makes it [1]
    code = elem_type_of(array)
    ext = EXTENSION_TYPES.get(code) if code is not None else None
    if ext is None:
        return array
    if code not in _OV_TYPES:
        raise UnsupportedType("OpenVINO", "input", name, ext.onnx_name,
                              "graphbisect knows no OpenVINO element type with the same bits")
    import openvino as ov

    return ov.Tensor(raw_bytes(array), ov.Shape(list(array.shape)), getattr(ov.Type, _OV_TYPES[code]))


def _from_ov(name: str, tensor: Any) -> np.ndarray:
    """A copy of an output tensor; a type numpy lacks becomes its ``ml_dtypes`` array (from its bytes)."""
    type_name = tensor.get_element_type().get_type_name()
    code = _ONNX_OF_OV.get(type_name)
    if code is not None:
        shape = tuple(int(d) for d in tensor.get_shape())
        return from_raw_bytes(np.array(tensor.data, copy=True).reshape(-1).view(np.uint8), code, shape)
    if type_name in ("f4e2m1", "f8e8m0", "nf4", "u1", "u2", "u3", "u6"):
        raise UnsupportedType("OpenVINO", "output", name, type_name,
                              "graphbisect does not read OpenVINO tensors of this element type")
    return np.array(tensor.data, copy=True)


def _precision_probe() -> Any:
    """A one-op OpenVINO model (Relu on f32): what a device computes it in is its inference precision. Its opset
    module is ``openvino.opset13`` from OpenVINO 2025.0, ``openvino.runtime.opset13`` before (2023.2 to 2024.6)."""
    import openvino as ov

    try:
        import openvino.opset13 as ops
    except ImportError:
        import openvino.runtime.opset13 as ops

    x = ops.parameter([1, 8], ov.Type.f32, name="x")
    return ov.Model([ops.relu(x)], [x], "precision_probe")


def _inference_precision(compiled: Any) -> str | None:
    """``f32``/``bf16``/``f16``: the compiled model's ``INFERENCE_PRECISION_HINT`` (None: not reported)."""
    try:
        hint = compiled.get_property("INFERENCE_PRECISION_HINT")
    except Exception:  # devices without the property
        return None
    return str(hint.get_type_name()) if hasattr(hint, "get_type_name") else str(hint)


def config_entries(text: str) -> tuple[tuple[str, str], ...]:
    """``config=KEY=VALUE;KEY=VALUE`` as ``((KEY, VALUE), ...)``, refusing what is not an entry and the keys
    other options set.

    Example:
        >>> config_entries("DYNAMIC_QUANTIZATION_GROUP_SIZE=0; NUM_STREAMS=1")
        (('DYNAMIC_QUANTIZATION_GROUP_SIZE', '0'), ('NUM_STREAMS', '1'))
    """
    entries: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise SpecError(f"openvino config entry {item!r} is not KEY=VALUE",
                            hint="write config=KEY=VALUE;KEY=VALUE, e.g. config=DYNAMIC_QUANTIZATION_GROUP_SIZE=0")
        if key in _OWN_KEYS:
            raise SpecError(f"openvino config entry {item!r} sets what option {_OWN_KEYS[key].split('=')[0]}= sets",
                            hint=f"write {_OWN_KEYS[key]} instead (checked against what the device computes)")
        if key in entries:
            raise SpecError(f"openvino config key {key} given twice")
        entries[key] = value
    return tuple(entries.items())


def _property_text(value: Any) -> str:
    """A property value as text: ``<Type: 'float32'>`` as ``f32``, an enum as its name, others as ``str``."""
    if hasattr(value, "get_type_name"):
        return str(value.get_type_name())
    name = getattr(value, "name", None)
    return str(name) if isinstance(name, str) else str(value)


def _group_size(compiled: Any) -> int | None:
    """The compiled model's ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` (None where the device has no such property)."""
    try:
        return int(compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE"))
    except Exception:  # not every device reports it
        return None


#: /proc/cpuinfo flags of the integer dot products OpenVINO's CPU plugin quantizes activations with: its oneDNN
#: FullyConnected executor does it only with ``mayiuse(avx2_vnni) || mayiuse(avx512_core_vnni)`` (an AMX CPU has
#: AVX512-VNNI too); elsewhere it decompresses int8 weights and computes in f32 whatever the group size.
_VNNI_FLAGS = frozenset({"avx_vnni", "avx512_vnni"})


def _cpu_quantizes_dynamically(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU has what OpenVINO's dynamic quantization needs (None: its flags cannot be read, e.g. not
    Linux or not x86). ``cpuinfo``: the text of ``/proc/cpuinfo`` (read when None).

    Example:
        >>> _cpu_quantizes_dynamically("flags : fpu avx2 fma"), _cpu_quantizes_dynamically("flags : avx2 avx_vnni")
        (False, True)
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return bool(_VNNI_FLAGS.intersection(line.partition(":")[2].split()))
    return None


def _last_line(text: str) -> str:
    """The informative line of an OpenVINO exception (the others name its source files)."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("Exception from ")]
    return lines[-1] if lines else text.strip()


def _writable_properties(core: Any, device: str) -> str:
    try:
        supported = core.get_property(device, "SUPPORTED_PROPERTIES")
        return ", ".join(sorted(k for k, mode in supported.items() if mode == "RW" and k not in _OWN_KEYS))
    except Exception:  # not every device reports them
        return "unknown"


def _device_name(core: Any, device: str) -> str:
    try:
        return str(core.get_property(device, "FULL_DEVICE_NAME"))
    except Exception:  # not every device reports it
        return device


def _capabilities(core: Any, device: str) -> str:
    try:
        return ", ".join(core.get_property(device, "OPTIMIZATION_CAPABILITIES"))
    except Exception:
        return "unknown"


def _exec_graph(compiled: Any) -> list[dict[str, Any]]:
    """The compiled model's nodes with OpenVINO's runtime facts (kernel, precision, fused originals)."""
    nodes: list[dict[str, Any]] = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        rt_info = op.get_rt_info()
        facts = {key: rt_info[key].astype(str) for key in rt_info.keys()}  # noqa: SIM118 (not a dict)
        originals = [name for name in facts.get("originalLayersNames", "").split(",") if name]
        nodes.append(
            {
                "name": op.get_friendly_name(),
                "layer_type": facts.get("layerType"),
                "primitive_type": facts.get("primitiveType"),
                "runtime_precision": facts.get("runtimePrecision"),
                "output_precisions": facts.get("outputPrecisions"),
                "original_layers": originals,
                "exec_order": int(facts["execOrder"]) if facts.get("execOrder", "").lstrip("-").isdigit() else None,
            }
        )
    return nodes


class OpenVino:
    """OpenVINO runtime (see the module docstring).

    Options: ``device`` (default ``CPU``), ``precision`` (``f32`` default, ``f16``, ``bf16``: the
    ``INFERENCE_PRECISION_HINT``), ``threads`` (``INFERENCE_NUM_THREADS``), ``config`` (other properties,
    ``KEY=VALUE;...``), ``report_exec`` (1: put the execution graph in ``info()["exec_graph"]``).
    """

    def __init__(self, options: Mapping[str, str], workdir: str) -> None:
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise SpecError(
                f"openvino backend has no option(s) {', '.join(unknown)}", hint=f"valid: {', '.join(_OPTIONS)}"
            )
        self._workdir = Path(workdir)
        self._device = options.get("device", "CPU").strip() or "CPU"
        precision = options.get("precision", "f32").strip().lower()
        if precision not in _PRECISIONS:
            raise SpecError(
                f"openvino option precision={precision!r} is not one of f32, f16, bf16",
                hint="precision=f32 (default) makes OpenVINO compute like the oracle",
            )
        self._precision = _PRECISIONS[precision]
        self._threads: int | None = None
        if "threads" in options:
            try:
                self._threads = int(options["threads"])
            except ValueError as exc:
                raise SpecError(f"openvino option threads={options['threads']!r} is not an integer") from exc
            if self._threads < 1:
                raise SpecError(f"openvino option threads={self._threads} must be >= 1")
        self._config = config_entries(options.get("config", ""))
        self._report_exec = options.get("report_exec", "0").strip().lower() in ("1", "true", "yes", "on")
        self._report_tactics = options.get("report_tactics", "0").strip().lower() in ("1", "true", "yes", "on")
        self._tactics_path = Path(options["tactics"]) if options.get("tactics") else None
        if self._tactics_path is not None and not self._tactics_path.is_file():
            raise SpecError(f"openvino option tactics={self._tactics_path}: no such file",
                            hint="give a record written by `graphbisect tactics record` (an absolute path)")
        self._keep_fp32 = options.get("keep_fp32")
        if self._keep_fp32 is not None and self._keep_fp32.startswith("@"):
            pin_file = Path(self._keep_fp32[1:])
            if not pin_file.is_absolute() or not pin_file.is_file():
                raise SpecError(f"openvino option keep_fp32={self._keep_fp32}: no such file (or not an absolute path)",
                                hint="write keep_fp32=@/abs/path.txt (one ONNX node name per line) or "
                                "keep_fp32=NODE;NODE")
        self._compiled: Any = None
        self._request: Any = None
        self._compiles = 0  # every compile_model call (cost())
        self._inputs: list[tuple[Any, set[str]]] = []  # (input port, its names)
        self._outputs: dict[str, int] = {}  # returned name -> compiled output index
        self._info: dict[str, Any] = {}

    def validate(self) -> None:
        """Check that the device exists here and computes in the requested precision (called by the host
        before the first run, so every command refuses a precision this machine would not run)."""
        import openvino as ov

        core = ov.Core()
        available = core.available_devices
        base = self._device.split(".")[0].split(":")[0]
        if base.upper() not in ("AUTO", "HETERO", "MULTI", "BATCH") and not any(
            d == self._device or d.split(".")[0] == base for d in available
        ):
            raise SpecError(
                f"openvino device {self._device!r} is not available here",
                hint=f"available devices: {', '.join(available) or 'none'}",
            )
        try:
            probe = self._compile(core, _precision_probe())
        except RuntimeError as exc:  # OpenVINO's own words name the key or value it refuses
            if not self._config:
                raise
            raise SpecError(
                f"openvino config={';'.join(f'{k}={v}' for k, v in self._config)} is refused by {self._device}: "
                f"{_last_line(str(exc))}",
                hint=f"config entries are {self._device} properties, KEY=VALUE as compile_model takes them "
                f"(e.g. config=DYNAMIC_QUANTIZATION_GROUP_SIZE=0); properties this device accepts: "
                f"{_writable_properties(core, self._device)}") from exc
        actual = _inference_precision(probe)
        if actual is not None and actual != self._precision:
            raise SpecError(
                f"precision={self._precision} is not what {self._device} computes here: its compiled "
                f"models report INFERENCE_PRECISION_HINT={actual} ({_device_name(core, self._device)}), so "
                f"results would measure {actual}, not {self._precision}",
                hint=f"ask for precision={actual} (what this device runs), or use a device with native "
                f"{self._precision} (OpenVINO CPU capabilities here: {_capabilities(core, self._device)})",
            )

    def load(self, model: str, outputs: Sequence[str] | None) -> None:
        """Read the ONNX model, expose ``outputs`` (any tensor names; None = the model's outputs), compile."""
        import openvino as ov

        core = ov.Core()
        ov_model = core.read_model(model)
        selected = self._select_outputs(ov_model, outputs, model)
        pins: _Pins | None = None
        if self._keep_fp32 is not None:
            ov_model, pins = self._pinned_fp32(core, ov_model, model)
        compiled = self._compile(core, ov_model)
        if pins is not None:
            pins.check(_exec_graph(compiled))
            dropped = pins.not_applied + pins.partly_applied
            if dropped:
                logger.info("OpenVINO computes %d pinned node(s) in %s anyway (all or partly): %s", len(dropped),
                            self._precision, dropped[:5])
        tactics: dict[str, Any] = {}
        if self._report_tactics or self._tactics_path is not None:
            compiled, tactics = self._tactics(core, ov_model, compiled, model)
        if len(compiled.outputs) != len(ov_model.outputs):
            raise BackendError(
                f"OpenVINO compiled {len(compiled.outputs)} outputs for a model with {len(ov_model.outputs)}",
                hint="this breaks the index mapping of outputs; please report it with the model",
            )
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        self._inputs = [(port, set(port.get_names())) for port in compiled.inputs]
        self._outputs = selected
        actual_precision = _inference_precision(compiled)
        if actual_precision is not None and actual_precision != self._precision:
            logger.warning("OpenVINO compiled %s in %s although precision=%s was asked", Path(model).name,
                           actual_precision, self._precision)
        self._info = {
            "openvino_version": ov.get_version(),
            "device": self._device,
            "precision": self._precision,
            "inference_precision": actual_precision,  # what the compiled model computes in (validate refuses
            "precision_as_requested": actual_precision in (None, self._precision),  # a mismatch up front)
            "threads": self._threads,
            "config": self._config_facts(compiled),
            # OpenVINO's execution graph says runtimePrecision i8 for an int8-weight FullyConnected whether it
            # quantizes the activations (group size > 0, the CPU default) or decompresses the weights (0)
            "dynamic_quantization_group_size": _group_size(compiled),
            # ...and only where the CPU has VNNI: without it the group size is set and nothing is quantized
            "dynamic_quantization_cpu": _cpu_quantizes_dynamically() if self._device == "CPU" else None,
            "outputs": {name: sorted(compiled.outputs[i].get_names()) for name, i in selected.items()},
        }
        self._info.update(tactics)
        if pins is not None:
            self._info["keep_fp32"] = pins.facts()
        if self._report_exec:
            self._info["exec_graph"] = _exec_graph(compiled)

    def _select_outputs(self, ov_model: Any, outputs: Sequence[str] | None, model: str) -> dict[str, int]:
        """``name -> output index`` for ``outputs`` (None: the model's own outputs), adding outputs as needed."""
        index: dict[str, int] = {}
        for i, port in enumerate(ov_model.outputs):
            for name in port.get_names():
                index.setdefault(name, i)

        if outputs is None:
            selected = {
                self._output_name(result, port): i
                for i, (result, port) in enumerate(zip(ov_model.get_results(), ov_model.outputs, strict=True))
            }
        else:
            selected = {}
            unknown: list[str] = []
            for name in outputs:
                if name not in index:
                    try:
                        ov_model.add_outputs(name)
                    except Exception as exc:  # OpenVINO raises RuntimeError subclasses with C++ text
                        logger.debug("add_outputs(%r) failed: %s", name, exc)
                        unknown.append(name)
                        continue
                    new = len(ov_model.outputs) - 1
                    for alias in ov_model.outputs[new].get_names():
                        index.setdefault(alias, new)
                    index.setdefault(name, new)
                selected[name] = index[name]
            if unknown:
                raise ModelError(
                    f"OpenVINO's model of {Path(model).name} has no tensor named {', '.join(unknown[:5])}"
                    f"{' ...' if len(unknown) > 5 else ''}",
                    hint="OpenVINO's ONNX frontend may have folded it away (constants, Identity chains); "
                    "expose the nearest surviving tensor instead, or compare it on onnxruntime",
                )
        return selected

    def cost(self) -> dict[str, int]:
        """The ``compile_model`` calls since this runtime was made (:mod:`graphbisect.backends.cost`): one per
        build, one more for a build whose tactic record pins kernels, and the precision probe of ``config=``."""
        return {"compiles": self._compiles, "compile_cache_hits": 0}

    def _compile(self, core: Any, ov_model: Any) -> Any:
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": self._precision, **dict(self._config)}
        if self._threads is not None:
            config["INFERENCE_NUM_THREADS"] = self._threads
        self._compiles += 1  # before: a compile that raises was made as far as it got
        return core.compile_model(ov_model, self._device, config)

    def _config_facts(self, compiled: Any) -> dict[str, str]:
        """Each ``config=`` key's value as the compiled model reports it (what ran, not what was asked)."""
        facts: dict[str, str] = {}
        for key, value in self._config:
            try:
                facts[key] = _property_text(compiled.get_property(key))
            except Exception:  # a key the compiled model does not report back
                facts[key] = f"{value} (not reported back)"
        return facts

    def keep_fp32_names(self) -> list[str]:
        """The ONNX node names of option ``keep_fp32`` (the file is read now, see the module docstring)."""
        value = self._keep_fp32 or ""
        if not value.startswith("@"):
            return [name.strip() for name in value.split(";") if name.strip()]
        path = Path(value[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise SpecError(f"openvino option keep_fp32: cannot read {path}: {exc}") from exc
        if text.lstrip().startswith("["):
            try:
                names = json.loads(text)
            except json.JSONDecodeError as exc:
                raise SpecError(f"openvino option keep_fp32: {path} is not a JSON list of node names: {exc}",
                                hint="write one node name per line, or a JSON list of strings") from exc
            return [str(name) for name in names]
        return [line.strip() for line in text.splitlines() if line.strip()]

    def _pinned_fp32(self, core: Any, ov_model: Any, model: str) -> tuple[Any, _Pins]:
        """``ov_model`` fused by the common transformations, with the ``keep_fp32`` nodes' ops marked FP32."""
        from openvino._offline_transformations import apply_moc_transformations

        from graphbisect.tactics.openvino import onnx_names

        names = onnx_names(model)
        wanted = set(self.keep_fp32_names())
        missing = sorted(wanted - names.nodes) if names.nodes else []
        if missing:
            logger.info("keep_fp32: %d node(s) are not in %s: %s", len(missing), Path(model).name, missing[:5])
        apply_moc_transformations(ov_model, cf=False)
        pins = _Pins(names, ov_layer_nodes(ov_model, names), frozenset(wanted - set(missing)), missing)
        return self._read_pinned_ir(core, ov_model, pins.layers()), pins

    def _read_pinned_ir(self, core: Any, ov_model: Any, layers: set[str]) -> Any:
        """Save ``ov_model`` as IR, mark ``layers`` in the XML, read it back (weights copied into memory)."""
        import openvino as ov

        self._workdir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self._workdir, prefix="keep-fp32-") as folder:
            xml_path, weights = Path(folder) / "model.xml", Path(folder) / "model.bin"
            ov.save_model(ov_model, str(xml_path), compress_to_fp16=False)
            text = pin_fp32_ir_xml(xml_path.read_text(encoding="utf-8"), layers)
            data = np.fromfile(weights, dtype=np.uint8) if weights.is_file() else np.zeros(0, np.uint8)
        pinned = core.read_model(text, ov.Tensor(data))
        if len(pinned.outputs) != len(ov_model.outputs):
            raise BackendError("the FP32-pinned IR has a different number of outputs than the model",
                               hint="report it with the model; run without keep_fp32= meanwhile")
        return pinned

    def _record(self, compiled: Any, names: Any) -> Any:
        import openvino as ov

        from graphbisect.tactics.openvino import record_from_exec_graph

        try:
            device = f"{self._device}: {compiled.get_property('FULL_DEVICE_NAME')}"
        except Exception:  # not every device reports it
            device = self._device
        return record_from_exec_graph(_exec_graph(compiled), names, version=ov.get_version(), device=device)

    def _tactics(self, core: Any, ov_model: Any, compiled: Any, model: str) -> tuple[Any, dict[str, Any]]:
        """Record the build's kernels; with ``tactics=``, rebuild with the record's differing choices pinned."""
        from graphbisect.tactics.diff import unapplied
        from graphbisect.tactics.openvino import onnx_names
        from graphbisect.tactics.record import load_record

        names = onnx_names(model)
        actual = self._record(compiled, names)
        facts: dict[str, Any] = {}
        if self._tactics_path is not None:
            wanted = load_record(self._tactics_path)
            pinned_model, pins, unmapped = self._pinned_model(core, ov_model, wanted, actual, names)
            if pins:
                compiled = self._compile(core, pinned_model)
                actual = self._record(compiled, names)
            facts["tactics_pinned"] = dict(pins)
            facts["tactics_unmapped"] = unmapped  # nodes no IR layer stands for: not pinned
            facts["tactics_not_applied"] = [c.to_json() for c in unapplied(wanted, actual)]
            if facts["tactics_not_applied"]:
                logger.warning("OpenVINO did not apply %d requested kernel choice(s): %s",
                               len(facts["tactics_not_applied"]), facts["tactics_not_applied"][:5])
        facts["tactic_record"] = actual.to_json()
        return compiled, facts

    def _pinned_model(self, core: Any, ov_model: Any, wanted: Any, actual: Any,
                      names: Any) -> tuple[Any, dict[str, str], list[str]]:
        """``(model, pins, unmapped)``: the model with ``primitives_priority`` written into its IR XML (the only
        way the plugin honours it) for the choices of ``wanted`` that differ from ``actual``.

        Layers are looked up in the model as read; a kernel for a node the plugin fused (Conv +
        BatchNormalization runs as a plugin-made ``Multiply_NNN`` Convolution) exists only after OpenVINO's
        common fusions, so when some choice has no layer the pins go into a fused copy of the model
        (``apply_moc_transformations``, as ``keep_fp32=`` does).
        """
        import openvino as ov
        from openvino._offline_transformations import apply_moc_transformations

        from graphbisect.tactics.openvino import ir_pins, pin_ir_xml

        chosen = ov_model
        pins, unmapped = ir_pins(wanted, actual, ir_layers(ov_model, names))
        if unmapped:
            fused = ov_model.clone()
            apply_moc_transformations(fused, cf=False)
            fused_pins, fused_unmapped = ir_pins(wanted, actual, ir_layers(fused, names))
            if len(fused_unmapped) < len(unmapped):
                chosen, pins, unmapped = fused, fused_pins, fused_unmapped
        if unmapped:
            logger.warning("no IR layer stands for %s: their kernel choices are not pinned", unmapped[:5])
        if not pins:
            return ov_model, pins, unmapped
        folder = self._workdir / "tactics-ir"
        folder.mkdir(parents=True, exist_ok=True)
        plain, pinned = folder / "model.xml", folder / "pinned.xml"
        ov.save_model(chosen, str(plain), compress_to_fp16=False)
        missing = pin_ir_xml(plain, pinned, pins)
        if missing:
            raise BackendError(f"OpenVINO's saved IR has no layer named {', '.join(missing[:5])}",
                               hint="the model's own op names were lost on saving; report it with the model")
        pinned_model = core.read_model(str(pinned), str(folder / "model.bin"))
        if len(pinned_model.outputs) != len(ov_model.outputs):
            raise BackendError("the pinned IR has a different number of outputs than the model",
                               hint="report it with the model; replay without tactics= meanwhile")
        return pinned_model, pins, unmapped

    @staticmethod
    def _output_name(result: Any, port: Any) -> str:
        """The ONNX name of a graph output: the Result's ``<name>/sink_port_0``, else the port's one name."""
        names = set(port.get_names())
        friendly = result.get_friendly_name()
        if friendly.endswith(_SINK_SUFFIX) and friendly[: -len(_SINK_SUFFIX)] in names:
            return friendly[: -len(_SINK_SUFFIX)]
        if not names:
            return friendly
        if len(names) > 1:
            logger.warning("output %s has several names %s; using %s", friendly, sorted(names), min(names))
        return min(names)

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """Run one inference; return copies of the selected outputs keyed by the requested names."""
        if self._request is None:
            raise BackendError("OpenVino.run called before load", hint="call load(model, outputs) first")
        feed: dict[Any, np.ndarray] = {}
        used: set[str] = set()
        missing: list[str] = []
        for port, names in self._inputs:
            name = next((n for n in sorted(names) if n in inputs), None)
            if name is None:
                missing.append(port.get_any_name())
                continue
            used.add(name)
            feed[port] = _to_ov(name, inputs[name])
        extra = sorted(set(inputs) - used)
        if missing or extra:
            raise InputError(
                f"OpenVINO model inputs are {', '.join(p.get_any_name() for p, _ in self._inputs)}"
                + (f"; missing: {', '.join(missing)}" if missing else "")
                + (f"; unknown: {', '.join(extra)}" if extra else ""),
                hint="feed exactly the model's graph inputs",
            )
        self._request.infer(feed)
        return {name: _from_ov(name, self._request.get_output_tensor(i)) for name, i in self._outputs.items()}

    def info(self) -> dict[str, Any]:
        """Facts about the last load: version, device, requested and actual precision, output names, exec graph."""
        return dict(self._info)


def ov_layer_nodes(ov_model: Any, names: Any) -> dict[str, set[str]]:
    """For each computing op of ``ov_model``: the ONNX nodes it stands for (from its fused names).

    ``names`` is a :class:`graphbisect.tactics.openvino.NodeNames` of the ONNX file; an op's fused names
    (``rt_info["fused_names_0"]``, comma-separated, kept by OpenVINO through fusions) and its own friendly
    name are mapped with :func:`graphbisect.tactics.openvino.onnx_node_of`.
    """
    from graphbisect.tactics.openvino import onnx_node_of

    layers: dict[str, set[str]] = {}
    for op in ov_model.get_ops():
        if op.get_type_name() in _NOT_COMPUTE:
            continue
        originals = {op.get_friendly_name()}
        rt_info = op.get_rt_info()
        if "fused_names_0" in rt_info:
            originals.update(n for n in rt_info["fused_names_0"].astype(str).split(",") if n)
        nodes = {node for name in originals if (node := onnx_node_of(name, names)) is not None}
        layers.setdefault(op.get_friendly_name(), set()).update(nodes)
    return layers


def ir_layers(ov_model: Any, names: Any) -> dict[str, tuple[str, frozenset[str]]]:
    """For each computing op of ``ov_model``: its op type and the ONNX nodes it stands for
    (:func:`ov_layer_nodes`), what :func:`graphbisect.tactics.openvino.ir_pins` looks layers up in."""
    types = {op.get_friendly_name(): op.get_type_name() for op in ov_model.get_ops()}
    return {name: (types.get(name, ""), frozenset(nodes)) for name, nodes in ov_layer_nodes(ov_model, names).items()}


def pin_fp32_ir_xml(text: str, layers: set[str]) -> str:
    """IR XML ``text`` with ``DisablePrecisionConversion`` (any type to any) added to the named layers."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(text)
    for layer in root.iter("layer"):
        if layer.get("name") not in layers:
            continue
        rt_info = layer.find("rt_info")
        if rt_info is None:
            rt_info = ET.SubElement(layer, "rt_info")
        for old in [a for a in rt_info.findall("attribute") if a.get("name") == _PIN_ATTRIBUTE]:
            rt_info.remove(old)
        ET.SubElement(rt_info, "attribute", {"name": _PIN_ATTRIBUTE, "version": "0", "value": _PIN_VALUE})
    return ET.tostring(root, encoding="unicode")


@dataclass
class _Pins:
    """One build's FP32 pins: which IR layers carry them, and afterwards which did not take effect."""

    names: Any  # graphbisect.tactics.openvino.NodeNames of the ONNX file
    layer_nodes: Mapping[str, set[str]]
    wanted: frozenset[str]
    missing: list[str]
    not_applied: list[str] = field(default_factory=list)
    partly_applied: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)

    def layers(self) -> set[str]:
        """The IR layers to mark: those standing for at least one pinned ONNX node."""
        return {layer for layer, nodes in self.layer_nodes.items() if nodes & self.wanted}

    def check(self, exec_graph: list[dict[str, Any]]) -> None:
        """Fill ``not_applied``, ``partly_applied`` and ``unverified`` from the compiled model's execution graph.

        For each pinned node, the arithmetic kernels that compute it (by name or among their original
        layers), each with the precision it computes in and the one it writes its output in:
        ``not_applied`` when every such kernel computes and writes in bf16/f16 (nothing changed);
        ``partly_applied`` when none computes in f32 but one writes f32, or some do and some do not (a node
        fused as a post-op into an unpinned neighbour's kernel: the pin keeps its result f32, the kernel
        still computes in bf16; a MatMul + bias Add rewritten into one bf16 FullyConnected);
        ``unverified`` when no kernel names it (folded away, or merged into an op that kept neither the
        mark nor its name, like the MatMul of that FullyConnected, which is named after the Add).
        """
        seen: set[str] = set()
        kernels: list[tuple[Mapping[str, Any], dict[str, int]]] = []
        for node in exec_graph:
            originals = {node["name"], *node["original_layers"]}
            seen.update(originals)
            if node["layer_type"] not in _STORAGE_ONLY:
                kernels.append((node, self._computed(originals)))
        # Only the kernels reached with the fewest ".N" suffixes removed compute a node: an f64 output's
        # Convert back "c.0" runs in f32 whatever the Convolution "c" computed in.
        fewest: dict[str, int] = {}
        for _, computed in kernels:
            for name, removed in computed.items():
                fewest[name] = min(removed, fewest.get(name, removed))
        low_compute: set[str] = set()
        f32_output: set[str] = set()
        f32_compute: set[str] = set()
        for kernel, computed in kernels:
            names = {name for name, removed in computed.items() if removed == fewest[name]}
            if kernel["runtime_precision"] not in _LOW:
                f32_compute.update(names)
                continue
            low_compute.update(names)
            if not set(str(kernel.get("output_precisions") or "").split(",")) & _LOW:
                f32_output.update(names)
        self.not_applied = sorted(low_compute - f32_compute - f32_output)
        self.partly_applied = sorted(low_compute - set(self.not_applied))
        shown = {n for layer, nodes in self.layer_nodes.items() if layer in seen for n in nodes}
        self.unverified = sorted(self.wanted - shown - low_compute - f32_compute)

    def _computed(self, originals: set[str]) -> dict[str, int]:
        """The pinned nodes an execution node's names stand for, each with the ``.N`` suffixes removed to
        find it (:func:`graphbisect.tactics.openvino.mapping_of`; 0 for an IR layer's own nodes)."""
        from graphbisect.tactics.openvino import mapping_of

        computed: dict[str, int] = {}
        for original in originals:
            nodes = self.layer_nodes.get(original)
            if nodes is not None:
                found = {name: 0 for name in nodes & self.wanted}
            else:  # an op the plugin made: map its name like the tactic records do
                name, removed = mapping_of(original, self.names)
                found = {name: removed} if name is not None and name in self.wanted else {}
            for name, removed in found.items():
                computed[name] = min(removed, computed.get(name, removed))
        return computed

    def facts(self) -> dict[str, Any]:
        """``info()["keep_fp32"]``: ``requested``, ``missing``, ``pinned_layers``, ``not_applied``,
        ``partly_applied``, ``unverified`` (see :meth:`check`)."""
        return {"requested": len(self.wanted) + len(self.missing), "missing": list(self.missing),
                "pinned_layers": len(self.layers()), "not_applied": list(self.not_applied),
                "partly_applied": list(self.partly_applied), "unverified": list(self.unverified)}
