"""Fixtures for the bundle tests: real bundle contents for the two ONNX Runtime bugs (see artifacts_builders)."""

from __future__ import annotations

import pytest
from artifacts_builders import (
    CLIP_INPUT,
    CRASH_TARGET,
    HOSTILE,
    LN_INPUT,
    MISMATCH_TARGET,
    build_content,
    layernorm_model,
    relu_clip_model,
)

from graphbisect.artifacts import BundleContent


@pytest.fixture(scope="session")
def mismatch_content(tmp_path_factory: pytest.TempPathFactory) -> BundleContent:
    content = build_content(layernorm_model(), {"x": LN_INPUT}, tmp_path_factory.mktemp("ln"),
                            target=MISMATCH_TARGET)
    assert content.signature.kind.value == "mismatch", content.signature
    return content


@pytest.fixture(scope="session")
def crash_content(tmp_path_factory: pytest.TempPathFactory) -> BundleContent:
    content = build_content(relu_clip_model(), {"x": CLIP_INPUT}, tmp_path_factory.mktemp("clip"),
                            target=CRASH_TARGET)
    assert content.signature.kind.value == "crash-load", content.signature
    assert "Unexpected data type for Clip 'min' input of 11" in (content.target_message or "")
    return content


@pytest.fixture(scope="session")
def hostile_content(tmp_path_factory: pytest.TempPathFactory) -> BundleContent:
    content = build_content(layernorm_model(HOSTILE), {HOSTILE["x"]: LN_INPUT}, tmp_path_factory.mktemp("hostile"),
                            target=MISMATCH_TARGET)
    assert content.signature.kind.value == "mismatch", content.signature
    return content
