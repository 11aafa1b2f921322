"""The packages `graphbisect releases` installs (graphbisect.releases.packages): what each release's environment
holds, how a worker's reported version is read, and which releases the package index has for this Python."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

import pytest

from graphbisect.cli.main import main
from graphbisect.errors import InputError
from graphbisect.releases.environments import prepare_environments
from graphbisect.releases.packages import PACKAGES, recipe_of, release_versions


def test_each_package_installs_its_distributions_at_the_release_and_runs_its_backend() -> None:
    assert recipe_of("iree").requirements("3.12.0")[:2] == ["iree-base-compiler==3.12.0", "iree-base-runtime==3.12.0"]
    assert "onnx==1.17.0" in recipe_of("iree").requirements("3.12.0")  # its worker reads the model with onnx
    assert {name: r.backends for name, r in PACKAGES.items()} == {
        "onnxruntime": ("onnxruntime",), "onnxruntime-gpu": ("onnxruntime",), "openvino": ("openvino",),
        "iree": ("iree",), "paddlepaddle": ("paddle",), "onnx": ("reference",)}
    with pytest.raises(InputError, match="no backend of its own for 'tensorrt'"):
        recipe_of("tensorrt")  # only with a command: target
    command = recipe_of("tensorrt", command=True)  # the package alone, numpy beside it for the program's .npz
    assert (command.backends, command.requirements("10.8.0.43")) == (("command",), ["tensorrt==10.8.0.43", "numpy"])
    assert recipe_of("onnxruntime", command=True) is PACKAGES["onnxruntime"]  # a package in the table keeps its row
    with pytest.raises(InputError, match="not a distribution's name"):
        recipe_of("../x", command=True)  # it names a folder of the cache


def test_a_release_is_read_in_the_version_its_library_reports() -> None:
    openvino = recipe_of("openvino")
    assert openvino.reports("2024.6.0", "2024.6.0-17404-4c0f47d2335-releases/2024/6")
    assert not openvino.reports("2024.6.0", "2025.0.0-17942-1f68be9f594-releases/2025/0")
    assert recipe_of("onnx").reports("1.17.0", "1.17.0") and not recipe_of("onnx").reports("1.17.0", "1.16.2")


def test_the_command_offers_every_package_of_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["releases", "--help"]) == 0
    text = "".join(capsys.readouterr().out.split())  # argparse wraps lines, at hyphens too
    for name, recipe in PACKAGES.items():
        assert "".join(f"{name}: {recipe.summary}, target {recipe.target}".split()) in text


def test_uv_asked_for_where_there_is_none_is_refused_with_how_to_get_it(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    environments = importlib.import_module("graphbisect.releases.environments")  # graphbisect.releases: the API
    monkeypatch.setattr(environments, "find_uv", lambda: None)  # nor the uv package
    with pytest.raises(InputError, match="no uv here") as refused:
        prepare_environments("openvino", ["2024.6.0"], cache=tmp_path, use_host=False, installer="uv")
    assert "graphbisect[releases]" in (refused.value.hint or "")


@pytest.mark.parametrize(("package", "present", "absent"), [
    ("openvino", {"2023.3.0", "2024.6.0", "2025.0.0"}, set()),
    ("onnx", {"1.16.2", "1.17.0"}, set()),
    ("onnxruntime-gpu", {"1.20.0", "1.22.0"}, set()),
    ("paddlepaddle", {"3.0.0", "3.3.1"}, set()),
    # iree-base-compiler 3.7.1 has no iree-base-runtime 3.7.1: not a release of the pair
    ("iree", {"3.12.0", "3.13.0"}, {"3.7.1"}),
])
def test_the_index_lists_the_releases_of_each_package_for_this_python(package: str, present: set[str],
                                                                      absent: set[str]) -> None:
    try:
        listed = release_versions(recipe_of(package))
    except InputError as exc:
        pytest.skip(f"no package index: {exc}")
    assert present <= set(listed), listed
    assert not absent & set(listed)


def test_the_guide_lists_every_package_of_the_table_as_it_installs_it() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "releases.md").read_text()
    rows = {cells[0].strip("`"): cells for line in guide.splitlines() if line.startswith("| `")
            for cells in [[cell.strip() for cell in line.strip("|").split("|")]]}
    assert set(rows) >= set(PACKAGES), f"docs/guide/releases.md lacks {set(PACKAGES) - set(rows)}"
    for name, recipe in PACKAGES.items():
        installed, beside, target = rows[name][1:4]
        assert installed == ", ".join(f"`{dist}==V`" for dist in recipe.distributions), name
        assert beside == ", ".join(f"`{extra}`" for extra in recipe.extras).replace("`numpy`", "`numpy<2`"), name
        assert target.split()[0] == f"`{recipe.target}`", name


def test_uv_makes_an_environment_that_runs_the_release(tmp_path: Path) -> None:
    """Where uv is there (``graphbisect[releases]``), ``auto`` takes it: one onnx release made with it (~15 MB,
    from uv's wheel cache when it has them), whose interpreter imports that release, and found, not made, again."""
    from graphbisect.releases.environments import find_uv

    if find_uv() is None:
        pytest.skip("no uv here (pip install 'graphbisect[releases]')")
    try:
        release_versions(recipe_of("onnx"))
    except InputError as exc:
        pytest.skip(f"no package index: {exc}")
    made = prepare_environments("onnx", ["1.16.2"], cache=tmp_path, use_host=False)["1.16.2"]
    assert made.error is None and made.installed and made.installer == "uv" and made.python is not None
    ran = subprocess.run([str(made.python), "-c", "import onnx, numpy; print(onnx.__version__, numpy.__version__)"],
                         capture_output=True, text=True, check=True)
    assert ran.stdout.split()[0] == "1.16.2"
    again = prepare_environments("onnx", ["1.16.2"], cache=tmp_path, use_host=False)["1.16.2"]
    assert not again.installed and again.python == made.python


def test_a_uv_error_wrapped_at_the_terminals_width_is_read_whole(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """uv wraps its ``cause:`` line at ``COLUMNS`` (pytest's terminal is narrow): the reason keeps the wrapped part."""
    from graphbisect.releases.environments import find_uv

    if find_uv() is None:
        pytest.skip("no uv here")
    monkeypatch.setenv("COLUMNS", "60")
    error = prepare_environments("onnxruntime", ["1.14.1"], cache=tmp_path, use_host=False,
                                 installer="uv")["1.14.1"].error or ""
    if "No solution found" not in error:
        pytest.skip(f"no package index: {error}")
    assert "has no wheels with a matching Python ABI tag" in error, error
