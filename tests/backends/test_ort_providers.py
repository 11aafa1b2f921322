"""ONNX Runtime provider options in a spec (``<ep>.<key>=<value>``): parsing, checks on real ORT, what reaches
``InferenceSession``.

The CPU wheel here has no provider that takes options: its CPU provider ignores every one (ORT 1.32 reports
``{}`` for it after a session is created, whatever it was given), so real-ORT tests check the refusals; what a
CUDA option does on its way to the session is shown through :class:`CudaStandInOrt`, a clearly named stand-in
for a CUDA build, and for real by the ``gpu`` test where a CUDA provider can be created.
"""

from __future__ import annotations

import dataclasses
import json
import runpy
import sys
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx
import onnxruntime
import pytest

from graphbisect.artifacts import write_bundle
from graphbisect.artifacts.repro import repro_options
from graphbisect.artifacts.repro_min import render_repro_min
from graphbisect.backends import BackendProcess, BackendSpec
from graphbisect.backends.onnxruntime import OnnxRuntime
from graphbisect.backends.ort_providers import provider_options
from graphbisect.backends.registry import get, resolve
from graphbisect.errors import BackendUnavailableError, SpecError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "artifacts"))
from artifacts_builders import LN_INPUT, MISMATCH_TARGET, build_content, layernorm_model

CUDA_SPEC = "onnxruntime:providers=CUDAExecutionProvider,cuda.use_tf32=0,opt_level=all"


# ------------------------------------------------------------------------------------------ the spec
def test_provider_options_are_part_of_the_spec_string() -> None:
    spec, _ = resolve("ort:providers=TensorrtExecutionProvider;CUDAExecutionProvider,trt.trt_fp16_enable=1,"
                      "cuda.use_tf32=0", require_available=False)
    assert str(spec) == ("onnxruntime:cuda.use_tf32=0,providers=TensorrtExecutionProvider;CUDAExecutionProvider,"
                         "trt.trt_fp16_enable=1")
    assert BackendSpec.parse(str(spec)) == spec
    assert spec.scoped_options() == {"cuda": {"use_tf32": "0"}, "trt": {"trt_fp16_enable": "1"}}
    options = {o.spec_key: (o.provider, o.key, o.inert) for o in provider_options(spec.options)}
    assert options == {"cuda.use_tf32": ("CUDAExecutionProvider", "use_tf32", True),
                       "trt.trt_fp16_enable": ("TensorrtExecutionProvider", "trt_fp16_enable", True)}


def test_options_that_name_files_are_not_inert() -> None:
    """A bundle's spec is data: a TensorRT cache path writes files, a plugin path loads code (trust check)."""
    spec = BackendSpec.parse("ort:providers=TensorrtExecutionProvider,trt.trt_engine_cache_path=/tmp/x,"
                             "trt.trt_extra_plugin_lib_paths=/tmp/evil.so,trt.trt_unheard_of=1")
    by_key = {o.key: o for o in provider_options(spec.options)}
    assert not any(o.inert for o in by_key.values())
    assert "writes" in (by_key["trt_engine_cache_path"].unsafe_reason or "")
    assert "loads" in (by_key["trt_extra_plugin_lib_paths"].unsafe_reason or "")
    assert by_key["trt_unheard_of"].unsafe_reason is None  # unknown: not inert either


@pytest.mark.parametrize(("spec", "says", "hint"), [
    ("ort:cuda.use_tf32=0", "CUDAExecutionProvider, which providers= does not list", "providers=CUDAExecutionProvider"),
    ("ort:providers=CUDAExecutionProvider,cdua.use_tf32=0", "'cdua' names no execution provider", "cuda."),
    ("ort:providers=CUDAExecutionProvider,CUDA.use_tf32=0", "lower case", "cuda.use_tf32"),
    ("ort:providers=TensorrtExecutionProvider,trt.device_id=0,tensorrt.device_id=1", "given twice", "keep one"),
])
def test_bad_provider_options_are_refused_by_name_before_anything_runs(spec: str, says: str, hint: str) -> None:
    with pytest.raises(SpecError) as err:
        resolve(spec, require_available=False)
    assert says in err.value.message and hint in (err.value.hint or "")


def test_the_accelerator_follows_the_device_id_option() -> None:
    ort = get("onnxruntime")
    assert ort.accelerator(BackendSpec.parse("ort:providers=CUDAExecutionProvider,cuda.device_id=1")) == "gpu:1"
    assert ort.accelerator(BackendSpec.parse("ort:providers=TensorrtExecutionProvider,trt.device_id=2")) == "gpu:2"
    assert ort.accelerator(BackendSpec.parse("ort:providers=CUDAExecutionProvider")) == "gpu:0"


# ------------------------------------------------------------------------------------ real ONNX Runtime
def test_an_option_the_cpu_provider_would_ignore_is_refused(models: dict[str, Path], x23: np.ndarray,
                                                            tmp_path: Path) -> None:
    """ORT 1.32's Python API creates the CPU provider from the session options alone: a provider option given
    to it is accepted and ignored (the session reports {} for it). graphbisect refuses it, naming the key."""
    with BackendProcess("onnxruntime:cpu.use_arena=0", workdir=tmp_path) as process, \
            pytest.raises(SpecError) as err:
        process.run(models["relu_add"], {"x": x23})
    assert "cpu.use_arena=0" in err.value.message and "reports no provider options" in err.value.message
    assert "remove cpu.use_arena" in (err.value.hint or "")


# ---------------------------------------------------------------------------- through a CUDA stand-in
class CudaStandInOrt:
    """STAND-IN for the ``onnxruntime`` module of a CUDA build, on a machine without a GPU.

    It lists ``CUDAExecutionProvider``, records the arguments of every ``InferenceSession``, and builds the
    session on the real CPU provider, reporting the CUDA provider and its options the way ORT 1.31's CUDA
    provider does (``get_providers``, ``get_provider_options``; an unknown option raises as ORT's option parser
    does). It shows what graphbisect hands to ORT, nothing about CUDA's numbers.
    """

    CUDA_OPTIONS: ClassVar[dict[str, str]] = {
        "device_id": "0", "use_tf32": "1", "cudnn_conv_algo_search": "EXHAUSTIVE", "gpu_mem_limit": "0",
        "prefer_nhwc": "0", "enable_cuda_graph": "0"}

    def __init__(self) -> None:
        self.sessions: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(onnxruntime, name)

    def get_available_providers(self) -> list[str]:
        return ["CUDAExecutionProvider", *onnxruntime.get_available_providers()]

    def InferenceSession(self, model: Any, so: Any = None, providers: Any = None, **kwargs: Any) -> Any:
        self.sessions.append({"providers": providers, **kwargs})
        given = dict(p if isinstance(p, tuple) else (p, {}) for p in providers or [])
        unknown = set(given.get("CUDAExecutionProvider", {})) - set(self.CUDA_OPTIONS)
        if unknown:
            raise RuntimeError(f'[ONNXRuntimeError] : 1 : FAIL : Unknown provider option: "{min(unknown)}".')
        session = onnxruntime.InferenceSession(model, so, providers=["CPUExecutionProvider"],
                                               disabled_optimizers=kwargs.get("disabled_optimizers"))
        return _StandInSession(session, {**self.CUDA_OPTIONS, **given.get("CUDAExecutionProvider", {})})


class _StandInSession:
    """A real CPU session that reports itself as CUDAExecutionProvider + CPUExecutionProvider."""

    def __init__(self, session: Any, cuda_options: dict[str, str]) -> None:
        self._session, self._cuda = session, cuda_options

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def get_providers(self) -> list[str]:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return {"CUDAExecutionProvider": dict(self._cuda), "CPUExecutionProvider": {}}


@pytest.fixture
def cuda_stand_in(monkeypatch: pytest.MonkeyPatch) -> CudaStandInOrt:
    stand_in = CudaStandInOrt()
    monkeypatch.setitem(sys.modules, "onnxruntime", stand_in)
    return stand_in


def test_cuda_options_reach_every_session_through_the_stand_in(cuda_stand_in: CudaStandInOrt,
                                                                models: dict[str, Path], x23: np.ndarray,
                                                                tmp_path: Path) -> None:
    runtime = OnnxRuntime(BackendSpec.parse(CUDA_SPEC).options, str(tmp_path))
    runtime.validate()  # a probe session with the options, checked against what the provider reports
    runtime.load(str(models["relu_add"]), None)
    np.testing.assert_array_equal(runtime.run({"x": x23})["y"], np.maximum(x23, 0) + 1)
    assert [call["providers"] for call in cuda_stand_in.sessions] == [
        [("CUDAExecutionProvider", {"use_tf32": "0"})]] * 2  # the probe, then the model's session
    assert all(call["enable_fallback"] == 0 for call in cuda_stand_in.sessions)  # never silently on the CPU
    assert runtime.info()["provider_options"] == {"cuda.use_tf32": "0"}  # as the session reports it


def test_an_option_the_provider_rejects_is_a_spec_error_naming_it(cuda_stand_in: CudaStandInOrt,
                                                                  tmp_path: Path) -> None:
    runtime = OnnxRuntime({"providers": "CUDAExecutionProvider", "cuda.use_tf33": "0"}, str(tmp_path))
    with pytest.raises(SpecError) as err:
        runtime.validate()
    assert "cuda.use_tf33" in err.value.message and 'Unknown provider option: "use_tf33"' in err.value.message
    assert err.value.__cause__ is not None


def test_bundle_repro_and_repro_min_apply_the_provider_options(cuda_stand_in: CudaStandInOrt,
                                                                tmp_path: Path) -> None:
    """A bundle whose target spec has provider options (its runs made on this CPU, then the spec swapped for the
    CUDA one: the stand-in of a GPU run) records the spec everywhere, and its repro.py and repro_min.py (written
    by the maintainer facts of a reduction; rendered here) create their sessions with the options."""
    content = build_content(layernorm_model(), {"x": LN_INPUT}, tmp_path / "case", target=MISMATCH_TARGET)
    assert content.signature.failed
    bundle = write_bundle(dataclasses.replace(content, target=BackendSpec.parse(CUDA_SPEC)), tmp_path / "bundle")

    spec = "onnxruntime:cuda.use_tf32=0,opt_level=all,providers=CUDAExecutionProvider"
    assert json.loads((bundle / "report.json").read_text())["target"] == spec
    config = json.loads((bundle / "repro_config.json").read_text())
    assert config["target_spec"] == spec
    assert config["options"]["provider_options"] == {"CUDAExecutionProvider": {"use_tf32": "0"}}
    assert config["options"] == repro_options(BackendSpec.parse(spec))

    script = runpy.run_path(str(bundle / "repro.py"), run_name="repro")
    script["import_library"](config["options"])
    script["load_target"](bundle / "model.onnx", config["options"])
    assert cuda_stand_in.sessions[-1]["providers"] == [("CUDAExecutionProvider", {"use_tf32": "0"})]
    assert cuda_stand_in.sessions[-1]["enable_fallback"] == 0

    model = onnx.ModelProto()
    model.CopyFrom(content.model)
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 4  # repro_min.py's checker wants a shape
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 4
    text, why = render_repro_min(model, {"x": LN_INPUT}, oracle=content.oracle, target=BackendSpec.parse(spec),
                                 tolerance=content.tolerance, crash=False, title="LayerNorm on CUDA")
    assert text is not None, why
    assert "providers=[('CUDAExecutionProvider', {'use_tf32': '0'})]" in text
    (tmp_path / "repro_min.py").write_text(text)
    with pytest.raises(AssertionError):  # the stand-in computes on the CPU, where the LayerNorm bug shows
        runpy.run_path(str(tmp_path / "repro_min.py"), run_name="__main__")
    assert cuda_stand_in.sessions[-1]["providers"] == [("CUDAExecutionProvider", {"use_tf32": "0"})]


def test_repro_cannot_run_where_the_provider_falls_back(cuda_stand_in: CudaStandInOrt, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where ORT cannot create the CUDA provider it carries on on the CPU alone: repro.py says it cannot run
    (exit 2) instead of judging a CPU run."""
    content = build_content(layernorm_model(), {"x": LN_INPUT}, tmp_path / "case", target=MISMATCH_TARGET)
    bundle = write_bundle(dataclasses.replace(content, target=BackendSpec.parse(CUDA_SPEC)), tmp_path / "bundle")
    script = runpy.run_path(str(bundle / "repro.py"), run_name="repro")
    monkeypatch.setattr(_StandInSession, "get_providers", lambda self: ["CPUExecutionProvider"])
    with pytest.raises(script["CannotRun"], match="could not create"):
        script["load_target"](bundle / "model.onnx", script["read_config"]()["options"])


# ---------------------------------------------------------------------------------------- a real GPU
@pytest.mark.gpu
def test_cuda_use_tf32_reaches_a_real_cuda_session(models: dict[str, Path], tmp_path: Path) -> None:
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has no CUDAExecutionProvider")
    feeds = {"a": np.ones((64, 64), np.float32), "b": np.full((64, 64), 0.5, np.float32)}
    with BackendProcess("onnxruntime:providers=CUDAExecutionProvider,cuda.use_tf32=0", workdir=tmp_path) as process:
        try:
            result = process.run(models["matmul"], feeds)
        except BackendUnavailableError as exc:
            pytest.skip(f"the CUDA provider cannot be created here: {exc.message[-300:]}")
    assert result.ok, result.describe()
    assert result.info["providers"][0] == "CUDAExecutionProvider"
    assert result.info["provider_options"] == {"cuda.use_tf32": "0"}
    np.testing.assert_allclose(result.outputs["y"], np.full((64, 64), 32.0, np.float32))
    bad = "onnxruntime:providers=CUDAExecutionProvider,cuda.use_tf33=0"
    with BackendProcess(bad, workdir=tmp_path / "bad") as process, pytest.raises(SpecError, match="use_tf33"):
        process.validate()
