"""TensorRT (≥ 10.8, GPU only) on an ONNX model through its ONNX parser.

Runs inside a worker process: imports only the standard library and numpy at module level; TensorRT and
a CUDA memory provider are imported in :meth:`TensorRT.load`.

*Untested on a GPU in this repository so far* (no GPU or TensorRT on the development machines); see
``tests/backends/test_tensorrt.py``, which runs where both exist.

How one invocation works:

1. ``trt.OnnxParser`` fills a network from the ONNX file (external data resolved next to it). Parser
   errors become a :class:`TensorRTBuildError` naming the node, operator and TensorRT's description.
2. Requested ``outputs`` that are not network outputs are marked with ``network.mark_output`` (an
   intermediate is found by tensor name among layer outputs; a graph input asked as output is returned
   as fed, because TensorRT cannot mark an input as an output).
3. The builder config gets ``fp16``/``bf16``/``tf32``, ``opt_level`` (builder optimization level) and
   ``workspace``; inputs with dynamic dims get one optimization profile with min = opt = max = the shape
   from ``shapes=`` or, when absent, from the first run's inputs (the engine is then built at the first
   ``run`` and rebuilt if a later run feeds other shapes; ``info()["built_at"]`` says which).
4. ``build_serialized_network`` → ``deserialize_cuda_engine`` → ``create_execution_context``; a failed
   build becomes a :class:`TensorRTBuildError` quoting TensorRT's error log.
5. ``run`` copies inputs to device memory, sets tensor addresses, ``execute_async_v3`` on a stream,
   synchronizes and copies the selected outputs back. Device memory comes from ``cuda.bindings.runtime``
   (``cuda-python``; older ``cuda.cudart`` also accepted) or, failing that, from torch.

``report_layers=1`` builds with detailed profiling verbosity and puts the engine inspector's JSON
(layers, fused ONNX nodes, chosen tactics/precisions) into ``info()["layers"]``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from graphbisect.backends.worker import option_flag, option_int
from graphbisect.errors import BackendError, BackendUnavailableError, InputError, ModelError, SpecError

__all__ = ["TensorRT", "TensorRTBuildError"]

logger = logging.getLogger(__name__)

MIN_VERSION = (10, 8)
_OPTIONS = ("fp16", "bf16", "tf32", "opt_level", "workspace", "shapes", "device", "report_layers", "typed")


class TensorRTBuildError(RuntimeError):
    """TensorRT rejected the model: the ONNX parser failed or the engine build returned nothing.

    Raised at load (or at the first run of a dynamic-shape model); the worker records it as a crash, whose
    message (first line: what failed; then TensorRT's own error lines) is the failure signature.
    """


def parse_shapes(text: str) -> dict[str, tuple[int, ...]]:
    """Parse ``shapes=x:1x3x224x224;mask:1x128`` into ``{name: shape}``.

    Example:
        >>> parse_shapes("x:1x3x224x224;mask:1x128")
        {'x': (1, 3, 224, 224), 'mask': (1, 128)}
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, dims = item.rpartition(":")
        if not sep or not name or not re.fullmatch(r"\d+(x\d+)*|", dims):
            raise SpecError(
                f"tensorrt option shapes: {item!r} is not NAME:DxDxD",
                hint="e.g. shapes=x:1x3x224x224;mask:1x128 (a scalar input is NAME:)",
            )
        shapes[name] = tuple(int(d) for d in dims.split("x")) if dims else ()
    return shapes


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


class _CudaMemory:
    """Device memory, copies and one stream through ``cuda.bindings.runtime`` or torch (whichever imports)."""

    def __init__(self, device: int) -> None:
        self.provider: str
        self._cudart: Any = None
        self._torch: Any = None
        try:
            try:
                from cuda.bindings import runtime as cudart
            except ImportError:
                from cuda import cudart  # cuda-python < 12.6
            self._cudart = cudart
            self.provider = "cuda-python"
        except ImportError:
            try:
                import torch
            except ImportError as exc:
                raise BackendUnavailableError(
                    "the tensorrt backend needs cuda-python or torch to move tensors to the GPU; neither imports",
                    hint="pip install cuda-python (matching your CUDA major version), or install torch with CUDA",
                ) from exc
            self._torch = torch
            self.provider = "torch"
        count = self._count()
        if count == 0:
            raise BackendUnavailableError(
                "the tensorrt backend needs an NVIDIA GPU, and CUDA sees none here",
                hint="run it on a machine with a GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)",
            )
        if device >= count:
            raise SpecError(f"tensorrt option device={device}, but CUDA sees {count} GPU(s)")
        if self._cudart is not None:
            self._call(self._cudart.cudaSetDevice, device)
            self._stream = self._call(self._cudart.cudaStreamCreate)
        else:
            self._torch.cuda.set_device(device)
            self._stream = self._torch.cuda.Stream()
        self._buffers: dict[int, Any] = {}  # address -> torch tensor keeping it alive

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call a cuda-python function returning ``(err, *values)``; raise on error."""
        result = fn(*args)
        err, values = result[0], result[1:]
        if err != self._cudart.cudaError_t.cudaSuccess:
            name = self._cudart.cudaGetErrorName(err)[1]
            text = self._cudart.cudaGetErrorString(err)[1]
            raise RuntimeError(f"{fn.__name__} failed: {name!r}: {text!r}")
        return values[0] if len(values) == 1 else (values or None)

    def _count(self) -> int:
        if self._cudart is not None:
            try:
                return int(self._call(self._cudart.cudaGetDeviceCount))
            except RuntimeError:
                return 0
        return int(self._torch.cuda.device_count()) if self._torch.cuda.is_available() else 0

    @property
    def stream_handle(self) -> int:
        if self._cudart is not None:
            return int(self._stream)
        return int(self._stream.cuda_stream)

    def alloc(self, nbytes: int) -> int:
        nbytes = max(int(nbytes), 1)
        if self._cudart is not None:
            return int(self._call(self._cudart.cudaMalloc, nbytes))
        tensor = self._torch.empty(nbytes, dtype=self._torch.uint8, device="cuda")
        self._buffers[tensor.data_ptr()] = tensor
        return int(tensor.data_ptr())

    def free(self, address: int) -> None:
        if self._cudart is not None:
            self._call(self._cudart.cudaFree, address)
        else:
            self._buffers.pop(address, None)

    def to_device(self, address: int, array: np.ndarray) -> None:
        if array.nbytes == 0:
            return
        if self._cudart is not None:
            kind = self._cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
            self._call(self._cudart.cudaMemcpy, address, array.ctypes.data, array.nbytes, kind)
        else:
            host = self._torch.from_numpy(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
            with self._torch.cuda.stream(self._stream):
                self._buffers[address][: array.nbytes].copy_(host)

    def to_host(self, address: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        if out.nbytes == 0:
            return out
        if self._cudart is not None:
            kind = self._cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
            self._call(self._cudart.cudaMemcpy, out.ctypes.data, address, out.nbytes, kind)
        else:
            raw = self._buffers[address][: out.nbytes].cpu().numpy()
            out = raw.view(dtype).reshape(shape).copy()
        return out

    def synchronize(self) -> None:
        if self._cudart is not None:
            self._call(self._cudart.cudaStreamSynchronize, self._stream)
        else:
            self._stream.synchronize()


class TensorRT:
    """TensorRT runtime (see the module docstring).

    Options: ``fp16``/``bf16`` (1: allow those kernels), ``tf32`` (0: forbid TF32, which TensorRT allows
    by default for FP32 math on Ampere and newer), ``opt_level`` (builder optimization level 0-5),
    ``workspace`` (MiB), ``shapes`` (``x:1x3x224x224;...`` for inputs with dynamic dims), ``device``
    (GPU index, default 0), ``report_layers`` (1: engine inspector JSON in ``info()["layers"]``),
    ``typed`` (1: a strongly typed network; precisions come from the model's types, e.g. Cast islands).
    """

    def __init__(self, options: Mapping[str, str], workdir: str) -> None:
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise SpecError(
                f"tensorrt backend has no option(s) {', '.join(unknown)}", hint=f"valid: {', '.join(_OPTIONS)}"
            )
        self._workdir = Path(workdir)
        self._fp16 = option_flag(options, "fp16")
        self._bf16 = option_flag(options, "bf16")
        self._tf32 = option_flag(options, "tf32", None)
        self._opt_level = option_int(options, "opt_level", 0, 5)
        self._workspace_mib = option_int(options, "workspace", 1)
        self._shapes = parse_shapes(options.get("shapes", ""))
        self._device = option_int(options, "device", 0) or 0
        self._report_layers = option_flag(options, "report_layers")
        self._typed = option_flag(options, "typed")
        if self._typed and (self._fp16 or self._bf16):
            raise SpecError("tensorrt: typed=1 (a strongly typed network) takes its precisions from the ONNX "
                            "types; fp16/bf16 builder flags do not apply",
                            hint="drop fp16=/bf16=, and put Cast nodes in the model (graphbisect precision "
                            "writes mixed_precision_typed.onnx)")
        self._trt: Any = None
        self._log: Any = None
        self._cuda: _CudaMemory | None = None
        self._model = ""
        self._requested: list[str] | None = None
        # TensorRT objects kept alive together (a network must not outlive its builder and parser).
        self._builder: Any = None
        self._network: Any = None
        self._parser: Any = None
        self._runtime: Any = None
        self._engine: Any = None
        self._context: Any = None
        self._built_shapes: dict[str, tuple[int, ...]] | None = None
        self._input_passthrough: list[str] = []  # requested outputs that are graph inputs
        self._info: dict[str, Any] = {}

    # -- load -------------------------------------------------------------------------------------------
    def validate(self) -> None:
        """Check that TensorRT (new enough), a CUDA memory provider and a GPU are here."""
        _import_tensorrt()
        if self._cuda is None:
            self._cuda = _CudaMemory(self._device)

    def load(self, model: str, outputs: Sequence[str] | None) -> None:
        """Parse ``model``, mark ``outputs`` and build the engine (deferred to the first run when inputs
        have dynamic dims that ``shapes=`` does not pin)."""
        trt = _import_tensorrt()
        self._trt = trt
        self._log = _make_logger(trt)
        if self._cuda is None:
            self._cuda = _CudaMemory(self._device)
        self._model = model
        self._requested = list(outputs) if outputs is not None else None
        self._engine = self._context = self._built_shapes = None
        self._info = {
            "tensorrt_version": trt.__version__,
            "memory": self._cuda.provider,
            "device": self._device,
            "fp16": self._fp16,
            "bf16": self._bf16,
            "tf32": self._tf32,
            "opt_level": self._opt_level,
            "typed": self._typed,
        }
        # Parse once now so parser errors are load crashes even when the build must wait for shapes.
        network, dynamic = self._parse()
        if not dynamic:
            self._build(network, {})
        else:
            self._info["built_at"] = None
            logger.info("inputs %s have dynamic dims and no shapes=: building at the first run", dynamic)

    def _parse(self) -> tuple[Any, list[str]]:
        """A parsed network with the requested outputs marked, and its inputs still dynamic after ``shapes=``."""
        trt = self._trt
        self._log.clear()
        builder = trt.Builder(self._log)
        # Explicit batch is the only mode since TensorRT 10; strongly typed: every tensor keeps its ONNX type
        # (TensorRT 11 removed per-layer precision flags, so Cast nodes in the model decide precision).
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if self._typed else 0
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, self._log)
        if not parser.parse_from_file(str(self._model)):
            errors = []
            for i in range(parser.num_errors):
                err = parser.get_error(i)
                where = ", ".join(
                    x for x in (_call_or_none(err, "node_name"), _call_or_none(err, "node_operator")) if x
                )
                errors.append(f"{err.code()}: {err.desc()}" + (f" (node {where})" if where else ""))
            raise TensorRTBuildError(
                f"TensorRT's ONNX parser rejected {Path(self._model).name}:\n  "
                + "\n  ".join(errors or ["(no detail)"])
            )
        self._builder, self._network, self._parser = builder, network, parser  # keep alive together
        input_names = [network.get_input(i).name for i in range(network.num_inputs)]
        present = {network.get_output(i).name for i in range(network.num_outputs)}
        self._input_passthrough = []
        if self._requested is not None:
            tensors: dict[str, Any] = {}
            for i in range(network.num_layers):
                layer = network.get_layer(i)
                for j in range(layer.num_outputs):
                    tensor = layer.get_output(j)
                    tensors.setdefault(tensor.name, tensor)
            unknown = []
            for name in self._requested:
                if name in present:
                    continue
                if name in input_names:
                    self._input_passthrough.append(name)
                elif name in tensors:
                    network.mark_output(tensors[name])
                    present.add(name)
                else:
                    unknown.append(name)
            if unknown:
                raise ModelError(
                    f"TensorRT's network of {Path(self._model).name} has no tensor named "
                    f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}",
                    hint="the ONNX parser folds constants and some subgraphs; expose a tensor that survives "
                    "parsing, or compare that one on onnxruntime",
                )
        dynamic = [
            network.get_input(i).name
            for i in range(network.num_inputs)
            if any(d < 0 for d in network.get_input(i).shape) and network.get_input(i).name not in self._shapes
        ]
        return network, dynamic

    def _builder_config(self) -> Any:
        """The builder config for the spec's flags (fp16/bf16/tf32, optimization level, workspace)."""
        trt = self._trt
        config = self._builder.create_builder_config()
        if self._fp16:
            config.set_flag(trt.BuilderFlag.FP16)
        if self._bf16:
            config.set_flag(trt.BuilderFlag.BF16)
        if self._tf32 is False:
            config.clear_flag(trt.BuilderFlag.TF32)
        elif self._tf32 is True:
            config.set_flag(trt.BuilderFlag.TF32)
        if self._opt_level is not None:
            config.builder_optimization_level = self._opt_level
        if self._workspace_mib is not None:
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, self._workspace_mib << 20)
        if self._report_layers:
            config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
        return config

    def _build(self, network: Any, run_shapes: Mapping[str, tuple[int, ...]]) -> None:
        trt = self._trt
        builder = self._builder
        config = self._builder_config()
        shapes = {**self._shapes, **run_shapes}
        profile = None
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            if all(d >= 0 for d in tensor.shape):
                continue
            shape = shapes.get(tensor.name)
            if shape is None:
                raise InputError(
                    f"TensorRT input {tensor.name} has dynamic shape {tuple(tensor.shape)} and no concrete shape",
                    hint=f"give it with the backend option shapes={tensor.name}:DxDx...",
                )
            if profile is None:
                profile = builder.create_optimization_profile()
            profile.set_shape(tensor.name, shape, shape, shape)
        if profile is not None:
            config.add_optimization_profile(profile)
        self._log.clear()
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise TensorRTBuildError(
                f"TensorRT could not build an engine for {Path(self._model).name}:\n  "
                + "\n  ".join(self._log.errors() or ["(TensorRT logged no error)"])
            )
        runtime = trt.Runtime(self._log)
        engine = runtime.deserialize_cuda_engine(serialized)
        if engine is None:
            raise TensorRTBuildError(
                "TensorRT could not deserialize the engine it just built:\n  " + "\n  ".join(self._log.errors())
            )
        self._runtime = runtime
        self._engine = engine
        self._context = engine.create_execution_context()
        self._built_shapes = dict(run_shapes)
        self._info["built_at"] = "run" if run_shapes else "load"
        self._info["engine_bytes"] = int(serialized.nbytes)
        if self._report_layers:
            inspector = engine.create_engine_inspector()
            text = inspector.get_engine_information(trt.LayerInformationFormat.JSON)
            try:
                self._info["layers"] = json.loads(text).get("Layers", [])
            except (ValueError, AttributeError):
                self._info["layers"] = text

    # -- run --------------------------------------------------------------------------------------------
    def _io_names(self) -> tuple[list[str], list[str]]:
        trt = self._trt
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        inputs = [n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        return inputs, outputs

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """Copy inputs to the GPU, execute, and return the selected outputs (host copies)."""
        if self._trt is None or self._cuda is None:
            raise BackendError("TensorRT.run called before load", hint="call load(model, outputs) first")
        if self._engine is None or self._needs_rebuild(inputs):
            self._build_for(inputs)
        cuda = self._cuda
        input_names, output_names = self._io_names()
        _check_feeds(input_names, inputs)
        allocations: list[int] = []
        try:
            self._bind_inputs(input_names, inputs, allocations)
            out_buffers = self._bind_outputs(output_names, allocations)
            if not self._context.execute_async_v3(cuda.stream_handle):
                raise RuntimeError("TensorRT execute_async_v3 returned False:\n  " + "\n  ".join(self._log.errors()))
            cuda.synchronize()
            wanted = self._requested if self._requested is not None else output_names
            results: dict[str, np.ndarray] = {}
            for name in wanted:
                if name in self._input_passthrough:
                    results[name] = np.array(inputs[name], copy=True)
                else:
                    address, shape, dtype = out_buffers[name]
                    results[name] = cuda.to_host(address, shape, dtype)
            return results
        finally:
            for address in allocations:
                cuda.free(address)

    def _build_for(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Build the engine for the shapes of ``inputs`` on the network's dynamic inputs."""
        network, _ = self._parse()
        run_shapes = {
            network.get_input(i).name: tuple(np.shape(inputs[network.get_input(i).name]))
            for i in range(network.num_inputs)
            if any(d < 0 for d in network.get_input(i).shape) and network.get_input(i).name in inputs
        }
        self._build(network, run_shapes)

    def _bind_inputs(self, input_names: list[str], inputs: Mapping[str, np.ndarray], allocations: list[int]) -> None:
        """Copy each input, in the engine's dtype, to a device buffer (appended to ``allocations``) and bind it."""
        trt, cuda, context = self._trt, self._cuda, self._context
        assert cuda is not None  # run() checked
        for name in input_names:
            dtype = np.dtype(trt.nptype(self._engine.get_tensor_dtype(name)))
            array = np.asarray(inputs[name], order="C")  # keeps 0-d (np.ascontiguousarray makes it [1])
            if array.dtype != dtype:
                logger.debug("casting input %s from %s to the engine's %s", name, array.dtype, dtype)
                array = np.ascontiguousarray(array.astype(dtype))
            if not context.set_input_shape(name, tuple(array.shape)):
                raise InputError(
                    f"TensorRT refused shape {tuple(array.shape)} for input {name} "
                    f"(engine shape {tuple(self._engine.get_tensor_shape(name))})",
                    hint="feed the shape the engine was built for, or set shapes= accordingly",
                )
            address = cuda.alloc(array.nbytes)
            allocations.append(address)
            cuda.to_device(address, array)
            context.set_tensor_address(name, address)

    def _bind_outputs(self, output_names: list[str], allocations: list[int]
                      ) -> dict[str, tuple[int, tuple[int, ...], np.dtype[Any]]]:
        """Bind a device buffer (appended to ``allocations``) to each output, once the input shapes are set;
        return each output's (address, shape, dtype)."""
        trt, cuda, context = self._trt, self._cuda, self._context
        assert cuda is not None  # run() checked
        out_buffers: dict[str, tuple[int, tuple[int, ...], np.dtype[Any]]] = {}
        for name in output_names:
            shape = tuple(context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise TensorRTBuildError(
                    f"output {name} has a data-dependent shape {shape}, which this runtime does not support yet"
                )
            dtype = np.dtype(trt.nptype(self._engine.get_tensor_dtype(name)))
            address = cuda.alloc(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
            allocations.append(address)
            context.set_tensor_address(name, address)
            out_buffers[name] = (address, shape, dtype)
        return out_buffers

    def _needs_rebuild(self, inputs: Mapping[str, np.ndarray]) -> bool:
        if not self._built_shapes:
            return False
        return any(tuple(np.shape(inputs[n])) != s for n, s in self._built_shapes.items() if n in inputs)

    def info(self) -> dict[str, Any]:
        """Facts about the last load/build: versions, flags, when the engine was built, layer report."""
        return dict(self._info)


def _import_tensorrt() -> Any:
    """The tensorrt module, or :class:`BackendUnavailableError` when it is missing or older than 10.8."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise BackendUnavailableError(
            "the tensorrt backend needs the tensorrt Python package", hint="pip install 'graphbisect[tensorrt]'"
        ) from exc
    if _version_tuple(trt.__version__) < MIN_VERSION:
        raise BackendUnavailableError(
            f"TensorRT {trt.__version__} is too old for graphbisect (needs >= {'.'.join(map(str, MIN_VERSION))})",
            hint="pip install -U 'tensorrt>=10.8'",
        )
    return trt


def _call_or_none(obj: Any, method: str) -> str | None:
    fn = getattr(obj, method, None)
    if fn is None:
        return None
    try:
        value = fn()
    except Exception:  # an accessor missing from this TensorRT build
        return None
    return str(value) if value not in (None, "") else None


def _make_logger(trt: Any) -> Any:
    """A ``trt.ILogger`` that keeps warnings/errors (for crash messages) and forwards to :mod:`logging`."""
    severity = trt.ILogger.Severity
    levels = {
        severity.INTERNAL_ERROR: logging.ERROR,
        severity.ERROR: logging.ERROR,
        severity.WARNING: logging.WARNING,
        severity.INFO: logging.DEBUG,
        severity.VERBOSE: logging.DEBUG,
    }

    class _Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: list[tuple[Any, str]] = []

        def log(self, sev: Any, msg: str) -> None:
            level = levels.get(sev, logging.DEBUG)
            if level >= logging.WARNING:
                self.messages.append((sev, msg))
            logger.log(level, "TensorRT: %s", msg)

        def errors(self) -> list[str]:
            return [msg for sev, msg in self.messages if sev in (severity.ERROR, severity.INTERNAL_ERROR)]

        def clear(self) -> None:
            self.messages.clear()

    return _Logger()


def _check_feeds(input_names: list[str], inputs: Mapping[str, np.ndarray]) -> None:
    """Refuse feeds that are not exactly the engine's inputs."""
    missing = [n for n in input_names if n not in inputs]
    extra = [n for n in inputs if n not in input_names]
    if missing or extra:
        raise InputError(
            f"TensorRT engine inputs are {', '.join(input_names)}"
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + (f"; unknown: {', '.join(extra)}" if extra else ""),
            hint="feed exactly the model's graph inputs",
        )
