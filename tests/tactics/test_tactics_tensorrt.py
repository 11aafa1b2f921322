"""TensorRT timing-cache tactics, through ``StandInTensorRT`` (a stand-in, not TensorRT) and, on a GPU, for real."""

from __future__ import annotations

import importlib.util
import shutil

import pytest
from trt_standin import BuilderFlag, IBuilderConfig, StandInTensorRT

from graphbisect.tactics import unapplied
from graphbisect.tactics.tensorrt import configure_record, configure_replay, keys_to_layers, record_from_cache

LAYERS = {"conv1": [7, 3, 9], "gemm": [12, 5], "softmax": [2]}


def _record_build(layers: dict[str, list[int]]):  # type: ignore[no-untyped-def]
    config = IBuilderConfig(builder_optimization_level=0)
    cache = configure_record(StandInTensorRT, config)
    log = StandInTensorRT.build(config, layers)
    return config, record_from_cache(cache, keys_to_layers(log), version="stand-in", device="none")


def test_record_maps_keys_to_layers() -> None:
    config, rec = _record_build(LAYERS)
    assert BuilderFlag.EDITABLE_TIMING_CACHE in config.flags and config.builder_optimization_level >= 1
    assert [(c.node, c.choice) for c in rec.choices] == [
        ("conv1", "0x0000000000000003"), ("gemm", "0x0000000000000005"), ("softmax", "0x0000000000000002")]
    assert all(c.key and c.key.startswith("0x") for c in rec.choices)


def test_replay_forces_the_recorded_tactics_and_errors_on_a_miss() -> None:
    _, rec = _record_build(LAYERS)
    forced = rec.with_choices({"conv1": "0x0000000000000009"})
    config = IBuilderConfig()
    cache = configure_replay(StandInTensorRT, config, forced)
    assert BuilderFlag.ERROR_ON_TIMING_CACHE_MISS in config.flags
    log = StandInTensorRT.build(config, LAYERS)
    again = record_from_cache(cache, keys_to_layers(log), version="stand-in", device="none")
    assert again.choice_of("conv1") == "0x0000000000000009" and not unapplied(forced, again)
    with pytest.raises(RuntimeError, match="miss"):
        StandInTensorRT.build(config, {**LAYERS, "new_layer": [1]})


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is None or shutil.which("nvidia-smi") is None,
                    reason="needs TensorRT and an NVIDIA GPU")
def test_real_tensorrt_timing_cache_api_names() -> None:
    import tensorrt as trt

    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    config = builder.create_builder_config()
    cache = configure_record(trt, config)
    assert cache.queryKeys() == [] or isinstance(cache.queryKeys(), list)
    assert hasattr(trt, "TimingCacheKey") and hasattr(trt.BuilderFlag, "ERROR_ON_TIMING_CACHE_MISS")
