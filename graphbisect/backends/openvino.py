"""OpenVINO Runtime on an ONNX model (CPU plugin here; any OpenVINO device by name).

Runs inside a worker process: imports only the standard library and numpy at module level, OpenVINO
lazily in :meth:`OpenVino.load`.

**Precision.** OpenVINO's CPU plugin computes in bf16 by default on CPUs that have it (AVX512-BF16/AMX:
``Core().get_property("CPU", "INFERENCE_PRECISION_HINT")`` says ``bfloat16`` there), which would make
every comparison against an f32 oracle "fail". The runtime therefore asks for ``f32`` unless the spec
says ``precision=f16|bf16``, and reports the precision the compiled model actually uses.

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

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from graphbisect.errors import BackendError, InputError, ModelError, SpecError

__all__ = ["OpenVino"]

logger = logging.getLogger(__name__)

_OPTIONS = ("device", "precision", "threads", "report_exec", "report_tactics", "tactics")
_PRECISIONS = {"f32": "f32", "fp32": "f32", "f16": "f16", "fp16": "f16", "bf16": "bf16"}
_SINK_SUFFIX = "/sink_port_0"  # the ONNX frontend names a graph output's Result node "<name>/sink_port_0"


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
    ``INFERENCE_PRECISION_HINT``), ``threads`` (``INFERENCE_NUM_THREADS``), ``report_exec`` (1: put the
    execution graph in ``info()["exec_graph"]``).
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
        self._report_exec = options.get("report_exec", "0").strip().lower() in ("1", "true", "yes", "on")
        self._report_tactics = options.get("report_tactics", "0").strip().lower() in ("1", "true", "yes", "on")
        self._tactics_path = Path(options["tactics"]) if options.get("tactics") else None
        if self._tactics_path is not None and not self._tactics_path.is_file():
            raise SpecError(f"openvino option tactics={self._tactics_path}: no such file",
                            hint="give a record written by `graphbisect tactics record` (an absolute path)")
        self._compiled: Any = None
        self._request: Any = None
        self._inputs: list[tuple[Any, set[str]]] = []  # (input port, its names)
        self._outputs: dict[str, int] = {}  # returned name -> compiled output index
        self._info: dict[str, Any] = {}

    def validate(self) -> None:
        """Check that the device exists here (called by the host before the first run)."""
        import openvino as ov

        available = ov.Core().available_devices
        base = self._device.split(".")[0].split(":")[0]
        if base.upper() not in ("AUTO", "HETERO", "MULTI", "BATCH") and not any(
            d == self._device or d.split(".")[0] == base for d in available
        ):
            raise SpecError(
                f"openvino device {self._device!r} is not available here",
                hint=f"available devices: {', '.join(available) or 'none'}",
            )

    def load(self, model: str, outputs: Sequence[str] | None) -> None:
        """Read the ONNX model, expose ``outputs`` (any tensor names; None = the model's outputs), compile."""
        import openvino as ov

        core = ov.Core()
        ov_model = core.read_model(model)
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

        compiled = self._compile(core, ov_model)
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
        try:
            hint = compiled.get_property("INFERENCE_PRECISION_HINT")
            actual_precision: str | None = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
        except Exception:  # devices without the property
            actual_precision = None
        self._info = {
            "openvino_version": ov.get_version(),
            "device": self._device,
            "precision": self._precision,
            "inference_precision": actual_precision,
            "threads": self._threads,
            "outputs": {name: sorted(compiled.outputs[i].get_names()) for name, i in selected.items()},
        }
        self._info.update(tactics)
        if self._report_exec:
            self._info["exec_graph"] = _exec_graph(compiled)

    def _compile(self, core: Any, ov_model: Any) -> Any:
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": self._precision}
        if self._threads is not None:
            config["INFERENCE_NUM_THREADS"] = self._threads
        return core.compile_model(ov_model, self._device, config)

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
        from graphbisect.tactics.openvino import onnx_names, pins_for
        from graphbisect.tactics.record import load_record

        names = onnx_names(model)
        actual = self._record(compiled, names)
        facts: dict[str, Any] = {}
        if self._tactics_path is not None:
            wanted = load_record(self._tactics_path)
            pins = pins_for(wanted, actual)
            if pins:
                compiled = self._compile(core, self._pinned_model(core, ov_model, pins))
                actual = self._record(compiled, names)
            facts["tactics_pinned"] = dict(pins)
            facts["tactics_not_applied"] = [c.to_json() for c in unapplied(wanted, actual)]
            if facts["tactics_not_applied"]:
                logger.warning("OpenVINO did not apply %d requested kernel choice(s): %s",
                               len(facts["tactics_not_applied"]), facts["tactics_not_applied"][:5])
        facts["tactic_record"] = actual.to_json()
        return compiled, facts

    def _pinned_model(self, core: Any, ov_model: Any, pins: dict[str, str]) -> Any:
        """The model with ``primitives_priority`` written into its IR XML (the only way the plugin honours it)."""
        import openvino as ov

        from graphbisect.tactics.openvino import pin_ir_xml

        folder = self._workdir / "tactics-ir"
        folder.mkdir(parents=True, exist_ok=True)
        plain, pinned = folder / "model.xml", folder / "pinned.xml"
        ov.save_model(ov_model, str(plain), compress_to_fp16=False)
        missing = pin_ir_xml(plain, pinned, pins)
        if missing:
            raise BackendError(f"OpenVINO's IR has no layer named {', '.join(missing[:5])}",
                               hint="the execution graph named a layer the saved IR does not have; report it")
        pinned_model = core.read_model(str(pinned), str(folder / "model.bin"))
        if len(pinned_model.outputs) != len(ov_model.outputs):
            raise BackendError("the pinned IR has a different number of outputs than the model",
                               hint="report it with the model; replay without tactics= meanwhile")
        return pinned_model

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
            feed[port] = np.ascontiguousarray(inputs[name])
        extra = sorted(set(inputs) - used)
        if missing or extra:
            raise InputError(
                f"OpenVINO model inputs are {', '.join(p.get_any_name() for p, _ in self._inputs)}"
                + (f"; missing: {', '.join(missing)}" if missing else "")
                + (f"; unknown: {', '.join(extra)}" if extra else ""),
                hint="feed exactly the model's graph inputs",
            )
        self._request.infer(feed)
        return {name: np.array(self._request.get_output_tensor(i).data, copy=True) for name, i in self._outputs.items()}

    def info(self) -> dict[str, Any]:
        """Facts about the last load: version, device, requested and actual precision, output names, exec graph."""
        return dict(self._info)
