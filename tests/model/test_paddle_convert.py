"""graphbisect.model.paddle: recognizing Paddle models, resolving their files, converting with a cache.

Real Paddle and paddle2onnx, small models exported with random weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("paddle")
pytest.importorskip("paddle2onnx")
onnx = pytest.importorskip("onnx")

from graphbisect.errors import ModelError  # noqa: E402
from graphbisect.model import paddle as gb_paddle  # noqa: E402
from graphbisect.model.paddle import (  # noqa: E402
    DEFAULT_OPSET,
    cache_root,
    convert_paddle_model,
    is_paddle_model,
    resolve_paddle_model,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paddle_models import export_conv_net  # noqa: E402

pytestmark = pytest.mark.paddle


@pytest.fixture(scope="module")
def pir_prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_conv_net(tmp_path_factory.mktemp("pir"))


@pytest.fixture(scope="module")
def legacy_prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_conv_net(tmp_path_factory.mktemp("legacy"), legacy=True)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("p2o-cache")


@pytest.fixture(scope="module")
def converted(pir_prefix: Path, cache_dir: Path) -> tuple[Path, Path]:
    return convert_paddle_model(pir_prefix, cache_dir=cache_dir)


def test_exported_files(pir_prefix: Path, legacy_prefix: Path) -> None:
    assert pir_prefix.with_suffix(".json").is_file() and pir_prefix.with_suffix(".pdiparams").is_file()
    assert legacy_prefix.with_suffix(".pdmodel").is_file() and legacy_prefix.with_suffix(".pdiparams").is_file()


@pytest.mark.parametrize("form", ["folder", "prefix", "program", "params"])
def test_is_paddle_model_accepts_every_spelling(pir_prefix: Path, legacy_prefix: Path, form: str) -> None:
    for prefix, program_suffix in ((pir_prefix, ".json"), (legacy_prefix, ".pdmodel")):
        path = {
            "folder": prefix.parent,
            "prefix": prefix,
            "program": prefix.with_suffix(program_suffix),
            "params": prefix.with_suffix(".pdiparams"),
        }[form]
        assert is_paddle_model(path), path
        assert resolve_paddle_model(path) == (prefix.with_suffix(program_suffix), prefix.with_suffix(".pdiparams"))


def test_is_paddle_model_rejects_other_things(tmp_path: Path, converted: tuple[Path, Path]) -> None:
    onnx_path, _ = converted
    (tmp_path / "config.json").write_text('{"not": "a paddle program"}')
    (tmp_path / "config.pdiparams").write_bytes(b"\0")
    assert not is_paddle_model(onnx_path)
    assert not is_paddle_model(tmp_path)  # a JSON without the PIR magic is not a program
    assert not is_paddle_model(tmp_path / "config.json")
    assert not is_paddle_model(tmp_path / "missing")


def test_resolve_names_missing_params(tmp_path: Path, pir_prefix: Path) -> None:
    lonely = tmp_path / "inference.json"
    lonely.write_bytes(pir_prefix.with_suffix(".json").read_bytes())
    with pytest.raises(ModelError, match=r"no parameters file inference\.pdiparams") as info:
        resolve_paddle_model(lonely)
    assert info.value.hint


def test_resolve_empty_folder_lists_contents(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(ModelError, match=r"no Paddle inference model.*readme\.txt"):
        resolve_paddle_model(tmp_path)


def test_resolve_prefers_pir_over_legacy(tmp_path: Path, pir_prefix: Path, legacy_prefix: Path) -> None:
    for suffix in (".json", ".pdiparams"):
        (tmp_path / f"inference{suffix}").write_bytes(pir_prefix.with_suffix(suffix).read_bytes())
    (tmp_path / "inference.pdmodel").write_bytes(legacy_prefix.with_suffix(".pdmodel").read_bytes())
    assert resolve_paddle_model(tmp_path)[0] == tmp_path / "inference.json"


def test_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GRAPHBISECT_CACHE", str(tmp_path))
    assert cache_root() == tmp_path / "paddle2onnx"
    assert cache_root(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("GRAPHBISECT_CACHE")
    assert cache_root() == Path.home() / ".cache" / "graphbisect" / "paddle2onnx"


def test_convert_writes_valid_onnx_in_cache(converted: tuple[Path, Path], pir_prefix: Path, cache_dir: Path) -> None:
    onnx_path, program = converted
    assert onnx_path.parent == cache_dir and onnx_path.suffix == ".onnx"
    assert program == pir_prefix.with_suffix(".json")
    model = onnx.load(str(onnx_path))
    onnx.checker.check_model(model)
    assert [o.name for o in model.graph.output] == ["fetch_name_0", "fetch_name_1"]
    assert [i.name for i in model.graph.input] == ["x"]
    assert max(op.version for op in model.opset_import if op.domain in ("", "ai.onnx")) >= DEFAULT_OPSET
    assert not list(cache_dir.glob("*.tmp")), "no temporary files left behind"
    assert not list(pir_prefix.parent.glob("*.onnx")), "the user's folder is never written"


def test_convert_second_time_is_a_cache_hit(
    converted: tuple[Path, Path], pir_prefix: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_conversion(*args: object, **kwargs: object) -> None:
        raise AssertionError("converted again instead of using the cache")

    monkeypatch.setattr(gb_paddle.subprocess, "run", no_conversion)
    mtime = converted[0].stat().st_mtime_ns
    assert convert_paddle_model(pir_prefix.parent, cache_dir=cache_dir) == converted
    assert converted[0].stat().st_mtime_ns == mtime


def test_cache_key_includes_opset(pir_prefix: Path, cache_dir: Path, converted: tuple[Path, Path]) -> None:
    onnx_path, _ = convert_paddle_model(pir_prefix, cache_dir=cache_dir, opset=13)
    assert onnx_path != converted[0]
    model = onnx.load(str(onnx_path))
    assert min(op.version for op in model.opset_import if op.domain in ("", "ai.onnx")) >= 13


def test_legacy_program_converts_with_fetch_names(legacy_prefix: Path, cache_dir: Path) -> None:
    onnx_path, program = convert_paddle_model(legacy_prefix, cache_dir=cache_dir)
    assert program.suffix == ".pdmodel"
    # Legacy programs fetch variables like linear_0.tmp_1, but paddle2onnx names outputs fetch_name_<i>;
    # the paddle runtime renames by position to match (see backends/paddle.py).
    assert [o.name for o in onnx.load(str(onnx_path)).graph.output] == ["fetch_name_0", "fetch_name_1"]


def test_conversion_failure_quotes_converter(tmp_path: Path, pir_prefix: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "inference.json").write_text('{"base_code":{"magic":"pir","version":4},"program":{"garbage":1}}')
    (broken / "inference.pdiparams").write_bytes(pir_prefix.with_suffix(".pdiparams").read_bytes())
    with pytest.raises(ModelError, match=r"paddle2onnx .* could not convert .*inference\.json") as info:
        convert_paddle_model(broken, cache_dir=tmp_path / "cache")
    assert "full converter log" in (info.value.hint or "")
    logs = list((tmp_path / "cache").glob("*.log"))
    assert len(logs) == 1 and logs[0].read_text()
    assert not list((tmp_path / "cache").glob("*.onnx")), "a failure caches nothing"
