"""The ``tensorrt`` section of ``repro.py``: a TensorRT engine built from the model on an NVIDIA GPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphbisect.artifacts.repro_backends._common import ReproBackend, _tri_state
from graphbisect.backends.inert import ANY
from graphbisect.backends.tensorrt import parse_shapes
from graphbisect.backends.worker import option_flag


def _tensorrt_options(options: Mapping[str, str]) -> dict[str, Any]:
    def number(key: str) -> int | None:
        return int(options[key]) if key in options else None

    return {
        "fp16": option_flag(options, "fp16"),
        "bf16": option_flag(options, "bf16"),
        "tf32": _tri_state(options, "tf32"),
        "opt_level": number("opt_level"),
        "workspace_mib": number("workspace"),
        "shapes": {name: list(dims) for name, dims in parse_shapes(options.get("shapes", "")).items()},
        "device": number("device") or 0,
    }


_TENSORRT_CODE = r'''
# ------------------------------------------------------------------------ the target: TensorRT (GPU)
def import_library(options):
    """Import tensorrt and a CUDA memory provider (cuda-python, else torch); returns TensorRT's version."""
    try:
        import tensorrt
    except ImportError as exc:
        raise CannotRun(f"tensorrt is not installed ({exc}); pip install tensorrt") from exc
    cuda_memory()
    return tensorrt.__version__


def cuda_memory():
    """(malloc, copy_in, copy_out, free, synchronize) on the GPU, via cuda-python or torch."""
    try:
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            from cuda import cudart

        def call(fn, *args):
            err, *values = fn(*args)
            if err != cudart.cudaError_t.cudaSuccess:
                raise RuntimeError(f"{fn.__name__} failed: {cudart.cudaGetErrorString(err)[1]!r}")
            return values[0] if len(values) == 1 else None

        h2d, d2h = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        return (lambda n: int(call(cudart.cudaMalloc, max(n, 1))),
                lambda ptr, a: a.nbytes and call(cudart.cudaMemcpy, ptr, a.ctypes.data, a.nbytes, h2d),
                lambda a, ptr: a.nbytes and call(cudart.cudaMemcpy, a.ctypes.data, ptr, a.nbytes, d2h),
                lambda ptr: call(cudart.cudaFree, ptr), lambda: call(cudart.cudaDeviceSynchronize))
    except ImportError:
        pass
    try:
        import torch
    except ImportError as exc:
        raise CannotRun("TensorRT needs cuda-python (pip install cuda-python) or torch for GPU memory") from exc
    buffers = {}

    def malloc(n):
        t = torch.empty(max(n, 1), dtype=torch.uint8, device="cuda")
        buffers[t.data_ptr()] = t
        return t.data_ptr()

    def copy_in(ptr, a):
        buffers[ptr][: a.nbytes].copy_(torch.from_numpy(a.reshape(-1).view(np.uint8)))

    def copy_out(a, ptr):
        a.reshape(-1).view(np.uint8)[:] = buffers[ptr][: a.nbytes].cpu().numpy()

    return malloc, copy_in, copy_out, lambda ptr: buffers.pop(ptr, None), torch.cuda.synchronize


class TensorRTBuildError(RuntimeError):
    """TensorRT rejected the model (same class name and first line as graphbisect's runtime)."""


def load_target(model_path, options):
    """Parse the ONNX model; the engine is built at the first run (for the fed shapes of dynamic inputs)."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(model_path)):
        errors = [f"{parser.get_error(i).code()}: {parser.get_error(i).desc()}" for i in range(parser.num_errors)]
        raise TensorRTBuildError(f"TensorRT's ONNX parser rejected {model_path.name}:\n  " + "\n  ".join(errors))
    return {"trt": trt, "logger": logger, "builder": builder, "network": network, "parser": parser,
            "options": options}


def build_engine(target, inputs):
    """Build with the spec's flags; inputs with dynamic dims get a profile pinned to the fed shapes."""
    trt, builder, network, options = target["trt"], target["builder"], target["network"], target["options"]
    config = builder.create_builder_config()
    if options["fp16"]:
        config.set_flag(trt.BuilderFlag.FP16)
    if options["bf16"]:
        config.set_flag(trt.BuilderFlag.BF16)
    if options["tf32"] is False:
        config.clear_flag(trt.BuilderFlag.TF32)
    if options["opt_level"] is not None:
        config.builder_optimization_level = options["opt_level"]
    if options["workspace_mib"] is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options["workspace_mib"] << 20)
    profile = None
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        if any(d < 0 for d in tensor.shape):
            shape = tuple(options["shapes"].get(tensor.name) or np.shape(inputs[tensor.name]))
            profile = profile or builder.create_optimization_profile()
            profile.set_shape(tensor.name, shape, shape, shape)
    if profile is not None:
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise TensorRTBuildError("TensorRT could not build an engine for model.onnx:")
    return trt.Runtime(target["logger"]).deserialize_cuda_engine(serialized)


def run_target(target, inputs, output_names):
    """Build the engine, copy the inputs to the GPU, execute, copy the outputs back."""
    trt = target["trt"]
    engine = build_engine(target, inputs)
    context = engine.create_execution_context()
    malloc, copy_in, copy_out, free, synchronize = cuda_memory()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    is_input = {name: engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT for name in names}
    pointers, outputs = {}, {}
    try:
        for name in (n for n in names if is_input[n]):
            array = np.ascontiguousarray(inputs[name], dtype=trt.nptype(engine.get_tensor_dtype(name)))
            context.set_input_shape(name, array.shape)
            pointers[name] = malloc(array.nbytes)
            copy_in(pointers[name], array)
            context.set_tensor_address(name, pointers[name])
        for name in (n for n in names if not is_input[n]):
            shape = tuple(context.get_tensor_shape(name))
            outputs[name] = np.empty(shape, dtype=trt.nptype(engine.get_tensor_dtype(name)))
            pointers[name] = malloc(outputs[name].nbytes)
            context.set_tensor_address(name, pointers[name])
        context.execute_async_v3(0)
        synchronize()
        for name, array in outputs.items():
            copy_out(array, pointers[name])
    finally:
        for pointer in pointers.values():
            free(pointer)
    # TensorRT cannot return a graph input as an output: such outputs are the fed values.
    return {**{name: inputs[name] for name in output_names if name in inputs}, **outputs}

'''


BACKEND = ReproBackend("tensorrt", "tensorrt and cuda-python (or torch) on an NVIDIA GPU", "tensorrt",
                       _tensorrt_options, _TENSORRT_CODE,
                       dict.fromkeys(("fp16", "bf16", "tf32", "opt_level", "workspace_mib", "shapes", "device"), ANY))
