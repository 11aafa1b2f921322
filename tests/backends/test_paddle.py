"""The paddle runtime (Paddle Inference on the original model), in-process against ORT on the conversion.

Real Paddle 3.x (CPU), real paddle2onnx, small models with random weights. Verified facts these tests
pin (Paddle 3.3.1): oneDNN is on by default on x86 CPU builds; conv2d_bias_bn_onednn_fuse_pass fires on
conv(+bias)→batch_norm; the pass logged as conv_activation_mkldnn_fuse_pass is deleted only by the name
conv_activation_onednn_fuse_pass; PIR output names equal the ONNX output names, legacy ones do not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("paddle")
pytest.importorskip("paddle2onnx")
pytest.importorskip("onnxruntime")

from graphbisect.backends.paddle import PaddleInference, normalize_pass_name, parse_pass_log
from graphbisect.errors import InputError, ModelError, SpecError
from graphbisect.model.paddle import convert_paddle_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paddle_models import CONV_NET_INPUT, export_conv_net, export_mobilenet_v2, ort_run

pytestmark = pytest.mark.paddle

BN_FUSE = "conv2d_bias_bn_onednn_fuse_pass"
ACT_FUSE = "conv_activation_onednn_fuse_pass"  # logged as conv_activation_mkldnn_fuse_pass


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("work"))


@pytest.fixture(scope="module")
def inputs() -> dict[str, np.ndarray]:
    name, shape = CONV_NET_INPUT
    return {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


@pytest.fixture(scope="module")
def conv_net(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(Paddle PIR prefix, converted ONNX path)."""
    prefix = export_conv_net(tmp_path_factory.mktemp("pir"))
    onnx_path, _ = convert_paddle_model(prefix, cache_dir=tmp_path_factory.mktemp("cache"))
    return prefix, onnx_path


@pytest.fixture(scope="module")
def oracle(conv_net: tuple[Path, Path], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return ort_run(conv_net[1], inputs)


@pytest.fixture(scope="module")
def default_run(conv_net: tuple[Path, Path], inputs: dict[str, np.ndarray], workdir: str) -> PaddleInference:
    runtime = PaddleInference({}, workdir)
    runtime.load(str(conv_net[0]), None)
    return runtime


def _assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], atol: float = 1e-4) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].shape == value.shape and got[name].dtype == value.dtype, name
        np.testing.assert_allclose(got[name], value, atol=atol, rtol=1e-4, err_msg=name)


def test_outputs_match_ort_on_converted_model(
    default_run: PaddleInference, inputs: dict[str, np.ndarray], oracle: dict[str, np.ndarray]
) -> None:
    _assert_close(dict(default_run.run(inputs)), oracle)
    info = default_run.info()
    assert info["ir"] == "pir"
    assert info["output_names"] == {"fetch_name_0": "fetch_name_0", "fetch_name_1": "fetch_name_1"}
    assert info["input_names"] == ["x"]


def test_reports_fired_passes_with_deletable_names(default_run: PaddleInference) -> None:
    info = default_run.info()
    assert info["mkldnn"] is True, "oneDNN is Paddle's default on x86 CPU builds"
    assert info["fired_passes_known"] is True
    assert {BN_FUSE, ACT_FUSE, "conv2d_bias_fuse_pass"} <= set(info["fired_passes"])
    assert set(info["fired_passes"]) <= set(info["passes_run"])
    assert "matmul_scale_fuse_pass" in info["passes_run"]  # ran, matched nothing
    assert "matmul_scale_fuse_pass" not in info["fired_passes"]
    assert not [p for p in info["passes_run"] if "mkldnn" in p], "names are normalized for delete_pass"
    assert info["pass_matches"][ACT_FUSE] == 2  # both conv+relu pairs


def test_delete_pass_removes_a_fired_pass(
    conv_net: tuple[Path, Path], inputs: dict[str, np.ndarray], oracle: dict[str, np.ndarray], workdir: str
) -> None:
    runtime = PaddleInference({"delete_pass": BN_FUSE}, workdir)
    runtime.load(str(conv_net[0]), None)
    info = runtime.info()
    assert BN_FUSE not in info["passes_run"] and BN_FUSE not in info["fired_passes"]
    assert info["deleted_passes"] == [BN_FUSE] and info["deleted_but_ran"] == []
    _assert_close(dict(runtime.run(inputs)), oracle)  # still correct, just unfused


def test_delete_pass_accepts_the_logged_mkldnn_name(conv_net: tuple[Path, Path], workdir: str) -> None:
    runtime = PaddleInference({"delete_pass": "conv_activation_mkldnn_fuse_pass"}, workdir)
    runtime.load(str(conv_net[0]), None)
    info = runtime.info()
    assert info["deleted_passes"] == [ACT_FUSE]
    assert ACT_FUSE not in info["passes_run"] and info["deleted_but_ran"] == []


def test_opt_level_zero_and_mkldnn_off_reduce_passes(
    conv_net: tuple[Path, Path], inputs: dict[str, np.ndarray], oracle: dict[str, np.ndarray], workdir: str
) -> None:
    runtime = PaddleInference({"opt_level": "0", "mkldnn": "0", "threads": "1"}, workdir)
    runtime.load(str(conv_net[0]), None)
    info = runtime.info()
    assert info["mkldnn"] is False and info["opt_level"] == 0
    assert not {BN_FUSE, ACT_FUSE} & set(info["passes_run"])
    assert len(info["passes_run"]) < 10
    _assert_close(dict(runtime.run(inputs)), oracle)


def test_intermediates_are_refused_at_load(conv_net: tuple[Path, Path], workdir: str) -> None:
    runtime = PaddleInference({}, workdir)
    with pytest.raises(ModelError, match=r"cannot expose intermediate tensors: p2o\.pd_op\.relu\.0\.0") as info:
        runtime.load(str(conv_net[0]), ["fetch_name_0", "p2o.pd_op.relu.0.0"])
    assert "intermediates" in (info.value.hint or "")


def test_selected_outputs_only(
    default_run: PaddleInference, conv_net: tuple[Path, Path], inputs: dict[str, np.ndarray], workdir: str
) -> None:
    runtime = PaddleInference({}, workdir)
    runtime.load(str(conv_net[0].with_suffix(".json")), ["fetch_name_1"])
    assert list(runtime.run(inputs)) == ["fetch_name_1"]


def test_legacy_program_outputs_renamed_to_onnx_names(
    tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, np.ndarray], workdir: str
) -> None:
    prefix = export_conv_net(tmp_path_factory.mktemp("legacy"), legacy=True)
    onnx_path, program = convert_paddle_model(prefix, cache_dir=tmp_path_factory.mktemp("cache-legacy"))
    runtime = PaddleInference({}, workdir)
    runtime.load(str(program), None)
    info = runtime.info()
    assert info["ir"] == "legacy"
    assert list(info["output_names"]) == ["fetch_name_0", "fetch_name_1"]
    assert all(paddle_name != onnx_name for onnx_name, paddle_name in info["output_names"].items())
    assert info["fired_passes"], "legacy IR passes are reported too"
    _assert_close(dict(runtime.run(inputs)), ort_run(onnx_path, inputs))
    # The Paddle spelling of an output is accepted as an alias.
    paddle_name = info["output_names"]["fetch_name_1"]
    runtime.load(str(program), [paddle_name])
    assert list(runtime.run(inputs)) == [paddle_name]


def test_input_names_are_checked(default_run: PaddleInference, inputs: dict[str, np.ndarray]) -> None:
    with pytest.raises(InputError, match="missing: x"):
        default_run.run({})
    with pytest.raises(InputError, match="unknown: y"):
        default_run.run({**inputs, "y": inputs["x"]})


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"device": "tpu"}, "device"),
        ({"opt_level": "7"}, "out of range"),
        ({"mkldnn": "maybe"}, "boolean"),
        ({"colour": "1"}, "no option"),
    ],
)
def test_bad_options(options: dict[str, str], match: str, workdir: str) -> None:
    with pytest.raises(SpecError, match=match):
        PaddleInference(options, workdir)


def test_mobilenet_v2_matches_ort(tmp_path_factory: pytest.TempPathFactory, workdir: str) -> None:
    prefix = export_mobilenet_v2(tmp_path_factory.mktemp("mobilenet"), size=64)
    onnx_path, _ = convert_paddle_model(prefix, cache_dir=tmp_path_factory.mktemp("cache-mobilenet"))
    feed = {"x": np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype(np.float32)}
    runtime = PaddleInference({}, workdir)
    runtime.load(str(prefix.parent), None)
    want = ort_run(onnx_path, feed)
    _assert_close(dict(runtime.run(feed)), want, atol=1e-3)
    assert {"depthwise_conv_onednn_pass", "conv2d_bn_onednn_fuse_pass"} <= set(runtime.info()["fired_passes"])


def test_parse_pass_log_pir_and_legacy() -> None:
    pir = parse_pass_log(
        "\x1b[1m\x1b[35m--- Running PIR pass [constant_folding_pass]\x1b[0m\n"
        "I1121 06:21:27.242841 5482 print_statistics.cc:44] --- detected [15, 32] subgraphs!\n"
        "\x1b[1m\x1b[35m--- Running PIR pass [conv_concat_activation_mkldnn_fuse_pass]\x1b[0m\n"
        "\x1b[1m\x1b[35m--- Running PIR pass [fc_onednn_enable_pass]\x1b[0m\n"
        "I1121 print_statistics.cc:50] --- detected [1] subgraphs!\n"
        "\x1b[1m\x1b[35m--- Running PIR pass [fc_onednn_enable_pass]\x1b[0m\n"
    )
    assert pir.ir == "pir" and pir.saw_match_lines
    assert pir.passes_run == [
        "constant_folding_pass",
        "conv_concat_activation_onednn_fuse_pass",
        "fc_onednn_enable_pass",
    ]
    assert pir.matches == {
        "constant_folding_pass": 15,
        "conv_concat_activation_onednn_fuse_pass": 0,
        "fc_onednn_enable_pass": 1,
    }
    legacy = parse_pass_log(
        "\x1b[32m--- Running IR pass [batch_norm_act_fuse_pass]\x1b[0m\n"
        "I1121 fuse_pass_base.cc:55] ---  detected 1 subgraphs\n"
        "\x1b[37m---    fused 1 batch norm with relu activation\x1b[0m\n"
        "\x1b[32m--- Running IR pass [squeeze2_transpose2_onednn_fuse_pass]\x1b[0m\n"
        "\x1b[37m--- fused 0 squeeze2 with transpose2\x1b[0m\n"
    )
    assert legacy.ir == "legacy"
    assert legacy.fired_passes == ["batch_norm_act_fuse_pass"]
    assert legacy.matches["batch_norm_act_fuse_pass"] == 1, "'detected' and 'fused' lines are one match"
    quiet = parse_pass_log("--- Running PIR pass [inplace_pass]\n")
    assert quiet.passes_run == ["inplace_pass"] and not quiet.saw_match_lines


def test_normalize_pass_name() -> None:
    assert normalize_pass_name(" conv_activation_mkldnn_fuse_pass ") == ACT_FUSE
    assert normalize_pass_name(BN_FUSE) == BN_FUSE
