"""`compare` on real models: Paddle Inference vs ORT, the ONNX zoo models, a 2,000+ node transformer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from graphbisect.cli.main import main
from graphbisect.examples import light_models, transformer, transformer_inputs
from graphbisect.model import load_model
from graphbisect.workflows.compare import compare_models
from tests.cpu_premises import onnxruntime_nchwc_block_size


@pytest.mark.parametrize("name", ["resnet50", "densenet121", "shufflenet", "inception_v1"])
def test_zoo_models_compare_clean_with_every_layer(name: str) -> None:
    """The onnx wheel's "light" models (real architectures, constant weights): loading, probing, comparing."""
    if name not in light_models():
        pytest.skip(f"this onnx wheel ships no light_{name}.onnx")
    model = load_model(light_models()[name])
    result = compare_models(model)  # ORT all vs ORT disable, seeded random inputs
    assert result.passed
    assert result.layerwise is not None and result.layerwise.first_divergence is None
    # Every tensor that survives ONNX Runtime's fusions (NCHWc-renamed ones included) is compared.
    assert result.compiled is not None and result.layerwise.compared >= len(result.compiled.surviving) - 1
    assert result.layerwise.compared > len(result.compiled.nodes) // 2
    # The target's probe is a replay of ORT's saved optimized model although these IR 3 models list their
    # initializers as inputs (ORT keeps the inputs of those it folded away, 251 in shufflenet, which no node
    # reads and the replay drops), except where NCHWc Convs keep surviving tensors in their blocked layout.
    probe = result.target_probe
    assert probe is not None
    assert probe.ran == "replay" or (probe.fallback is not None and "NCHWc" in probe.fallback), probe
    if name != "shufflenet":
        return
    # Which of its Convs ONNX Runtime blocks depends on MLAS's NCHWc block size. With 16 (AVX-512F) only the
    # depthwise ones, whose readers (1x1 Convs of 4 groups) are not: each is reordered back, and the replay runs.
    # With 8 (AVX2 only) also the first Conv (24 channels) and the 1x1 Convs after the last depthwise ones (136
    # channels a group): r2, r170, r182 and r194 stay blocked between two NCHWc nodes, and the probe model runs.
    if onnxruntime_nchwc_block_size() != 8:
        assert probe.ran == "replay", probe
        return
    assert probe.ran == "probe model" and probe.fallback is not None and "NCHWc" in probe.fallback, probe
    # The replay of this IR 3 model still runs where ONNX Runtime keeps the layout (no NCHWc below opt_level=all)
    extended = compare_models(model, target="onnxruntime:opt_level=extended")
    assert extended.passed and extended.target_probe is not None and extended.target_probe.ran == "replay", extended
    assert extended.layerwise is not None and extended.compiled is not None
    assert extended.layerwise.compared >= len(extended.compiled.surviving) - 1


def test_transformer_with_2000_nodes_localizes_an_embedded_bug() -> None:
    """A 40-layer encoder (2,252 nodes) with the keepdims=0 LayerNorm bug in layer 0, at opt_level=basic.

    Probing every tensor blocks LayerNormFusion (probe masking, which compare reports); probing only the
    tensors that survive ONNX Runtime's optimization keeps it, and the first divergence is the fused node.
    """
    model = load_model(transformer(num_layers=40, seq=16, bug_layer=0))
    assert len(model.nodes) >= 2000
    result = compare_models(model, target="onnxruntime:opt_level=basic", inputs=transformer_inputs(seq=16))
    assert not result.passed and not result.probe_masking
    assert result.layerwise is not None and result.layerwise.compared >= 900  # 923 survive ORT basic
    first = result.layerwise.first_divergence
    assert first is not None and first.compiled_as is not None and first.compiled_as.kind == "LayerNormalization"
    assert len(first.compiled_as.originals) >= 9 and result.layerwise.root_causes[0].compiled_as == first.compiled_as
    masked = compare_models(model, target="onnxruntime:opt_level=basic", inputs=transformer_inputs(seq=16),
                            all_tensors=True)
    assert not masked.passed and masked.probe_masking
    assert masked.layerwise is not None and masked.layerwise.compared >= 2000


@pytest.fixture(scope="module")
def paddle_net(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("paddle")
    pytest.importorskip("paddle2onnx")
    from tests.paddle_models import export_conv_net

    return export_conv_net(tmp_path_factory.mktemp("paddle"))


@pytest.mark.paddle
def test_paddle_inference_against_ort_on_the_converted_model(paddle_net: Path, tmp_path: Path) -> None:
    model = load_model(paddle_net)
    assert model.paddle_source is not None
    result = compare_models(model, oracle="onnxruntime:opt_level=disable", target="paddle")
    assert result.passed, result.to_json()["outputs"]
    # Paddle's output hooks return the optimized program's tensors from its one run: no probe run.
    assert result.layerwise is not None and result.layerwise.compared >= 4 and result.layerwise_note is None
    # ... and the oracle's one run is its capture of every intermediate.
    assert result.invocations == {"oracle": 1, "target": 1}
    no_layers = compare_models(model, oracle="onnxruntime:opt_level=disable", target="paddle", layerwise=False)
    assert no_layers.layerwise is None and no_layers.invocations == {"oracle": 1, "target": 1}


@pytest.mark.paddle
def test_paddle_delete_pass_through_the_cli(paddle_net: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code = main(["compare", str(paddle_net), "--target", "paddle:delete_pass=conv2d_bias_bn_onednn_fuse_pass",
                 "--oracle", "ort:opt_level=disable", "--json", str(out)])
    data = json.loads(out.read_text())
    assert code == 0 and data["verdict"] == "pass"
    assert np.isfinite(data["outputs"][0]["max_abs"])
