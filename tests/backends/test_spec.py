"""Spec parsing, the registry contract and the import constraints of the backend package."""

from __future__ import annotations

import subprocess
import sys

import pytest

from graphbisect import backends
from graphbisect.backends import BackendProcess, BackendSpec, get, resolve
from graphbisect.backends.onnxruntime import OrtOptions
from graphbisect.errors import SpecError


def test_public_api_is_pinned() -> None:
    assert sorted(backends.__all__) == sorted([
        "BACKENDS", "BackendInfo", "BackendProcess", "BackendSpec", "Capability", "Phase", "RunResult",
        "RunStatus", "get", "resolve",
    ])
    for name in backends.__all__:
        assert getattr(backends, name) is not None


def test_config_values_may_contain_equals_signs() -> None:
    spec, _ = resolve("ort:config=session.a=1;optimization.b=x=y,opt_level=basic")
    assert spec.options["config"] == "session.a=1;optimization.b=x=y"
    parsed = OrtOptions.parse({k: v for k, v in spec.options.items()})
    assert parsed.config == (("session.a", "1"), ("optimization.b", "x=y"))


def test_registry_documents_the_onnxruntime_options() -> None:
    options = get("onnxruntime").options
    assert "report_passes" in options
    assert "config=session.disable_prepacking=1" in options["config"]


def test_unknown_option_names_the_valid_ones() -> None:
    with pytest.raises(SpecError) as err:
        resolve("onnxruntime:opt_levl=basic")
    assert "opt_level" in (err.value.hint or "")


@pytest.mark.parametrize(("options", "needle"), [
    ({"opt_level": "fast"}, "disable|basic|extended|layout|all"),
    ({"threads": "many"}, "threads=4"),
    ({"config": "session.no_value"}, "config=key=value"),
    ({"save_optimized": "maybe"}, "save_optimized=1"),
])
def test_bad_onnxruntime_option_values_say_how_to_fix_them(options: dict[str, str], needle: str) -> None:
    with pytest.raises(SpecError) as err:
        OrtOptions.parse(options)
    assert needle in (err.value.hint or "")


def test_host_options_are_checked_on_the_host() -> None:
    with pytest.raises(SpecError, match="timeout"):
        BackendProcess("onnxruntime:timeout=soon")
    with pytest.raises(SpecError, match="another interpreter"):
        BackendProcess(f"command:cmd=true,python={sys.executable}")


def test_spec_roundtrip_keeps_canonical_name() -> None:
    spec, info = resolve(BackendSpec.parse("REF"))
    assert (str(spec), info.name) == ("reference", "reference")


def test_worker_side_modules_import_without_onnx_or_backends() -> None:
    """Workers may run under an interpreter that has only numpy (plus the one backend library)."""
    code = (
        "import sys\n"
        "for blocked in ('onnx', 'onnxruntime', 'paddle', 'openvino', 'tensorrt'):\n"
        "    sys.modules[blocked] = None\n"
        "import graphbisect.backends, graphbisect.backends.worker, graphbisect.backends.process\n"
        "import graphbisect.backends.onnxruntime, graphbisect.backends.reference, graphbisect.backends.command\n"
        "assert 'onnx' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_resolving_a_spec_and_a_worker_start_do_not_import_importlib_metadata() -> None:
    # importlib.metadata (email, zipfile, csv, ...) costs ~30 ms of CPU in each process: the main process of
    # compare and both of its workers. resolve() only asks whether the library is there; the worker reads a
    # distribution's version only for a module without __version__.
    code = (
        "import sys\n"
        "from graphbisect.backends.registry import resolve\n"
        "from graphbisect.backends.worker import library_version\n"
        "import graphbisect.backends.onnxruntime, graphbisect.workflows.compare\n"
        "resolve('onnxruntime:opt_level=all'); resolve('ort')\n"
        "assert library_version('onnxruntime', ['onnxruntime'])['library_version']\n"
        "assert 'importlib.metadata' not in sys.modules, 'importlib.metadata was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert get("onnxruntime").availability().version  # asked for, the version is read as before
