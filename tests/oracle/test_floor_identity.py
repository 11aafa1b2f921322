"""The noise floor and a failure's identity, as rules (their use by the workflows:
tests/workflows/test_failure_identity.py)."""

from __future__ import annotations

import math

import numpy as np
from onnx import helper

from graphbisect.backends import resolve
from graphbisect.backends.base import BackendSpec
from graphbisect.compare import MismatchKind, TensorStats
from graphbisect.examples.tf32_target import round_tf32
from graphbisect.localize.compiled import CompiledGraph, CompiledNode
from graphbisect.oracle.floor import NoiseFloor, floor_spec
from graphbisect.oracle.identity import Identity, IdentityCheck, pass_of


def _stats(name: str, score: float, kind: MismatchKind = MismatchKind.MISMATCH) -> TensorStats:
    return TensorStats(name, kind if score > 1.0 or kind is not MismatchKind.MISMATCH else MismatchKind.OK,
                       score=score)


def test_a_value_fails_only_beyond_the_margin_over_its_floor() -> None:
    floor = NoiseFloor("ort:opt_level=disable", {"mm": 2.1, "ln": 0.01}, "measured", measured=True)
    assert not floor.exceeds(_stats("mm", 2.1)) and floor.at_floor(_stats("mm", 2.1))  # TF32 noise
    assert floor.exceeds(_stats("mm", 30.0))  # an order of magnitude above the kernels' own error
    assert floor.exceeds(_stats("ln", 1.5))  # a floor within the tolerance leaves the tolerance in charge
    assert floor.exceeds(_stats("unmeasured", 1.5))
    # a NaN or a wrong shape is never kernel precision, whatever the floor there
    assert floor.exceeds(_stats("mm", math.inf, MismatchKind.NAN))
    assert floor.exceeds(TensorStats("mm", MismatchKind.SHAPE, score=math.inf))


def test_a_kernel_computing_wrong_with_every_optimization_off_is_no_floor() -> None:
    """ORT's int64 Pow is wrong at opt_level=disable too: a bug of its kernel, which the floor must not hide."""
    floor = NoiseFloor("ort:opt_level=disable", {"pow": math.inf, "big": 500.0, "tf32": 3.0}, "m", measured=True)
    assert floor.exceeds(_stats("pow", math.inf)) and floor.exceeds(_stats("big", 400.0))
    assert not floor.exceeds(_stats("tf32", 20.0))
    assert floor.above_tolerance() == [("tf32", 3.0)]  # what the "noise floor" sentence names: precision only


def test_the_floor_is_the_target_with_its_optimizations_off_unless_that_is_the_oracle() -> None:
    target, info = resolve("ort:opt_level=all,providers=CUDAExecutionProvider,save_optimized=1",
                           require_available=False)
    spec = floor_spec(target, info, BackendSpec.parse("onnxruntime:opt_level=disable"))
    assert isinstance(spec, BackendSpec)
    assert dict(spec.options) == {"providers": "CUDAExecutionProvider", "opt_level": "disable"}
    same, info = resolve("onnxruntime:opt_level=all", require_available=False)
    zero = floor_spec(same, info, BackendSpec.parse("onnxruntime:opt_level=disable"))
    assert isinstance(zero, NoiseFloor) and not zero.measured and "is the oracle" in zero.note
    lowest, info = resolve("onnxruntime:opt_level=disable,threads=1", require_available=False)
    none = floor_spec(lowest, info, BackendSpec.parse("reference"))
    assert isinstance(none, NoiseFloor) and "its kernels are what is tested" in none.note
    ov, info = resolve("openvino", require_available=False)
    assert isinstance(floor_spec(ov, info, BackendSpec.parse("reference")), NoiseFloor)


def test_tf32_rounding_keeps_ten_mantissa_bits_to_nearest_even() -> None:
    values = np.array([1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-10, -(1 + 2**-11 + 2**-20), np.inf, np.nan], np.float32)
    rounded = round_tf32(values)
    assert rounded[:3].tolist() == [1.0, 1 + 2**-9, 1 + 2**-10]
    assert rounded[3] == -(1 + 2**-10)  # above the tie: away from it
    assert np.isinf(rounded[4]) and np.isnan(rounded[5])
    assert np.all(round_tf32(rounded[:4]) == rounded[:4])  # idempotent


def test_pass_names_come_from_ort_fused_node_names() -> None:
    assert pass_of("/blk10/norm/Mul/LayerNormFusion/") == "LayerNormFusion"
    assert pass_of("/blk10/norm/Mul/SimplifiedLayerNormFusion/") == "SimplifiedLayerNormFusion"
    assert pass_of("/blk0/ln/LayerNormalization") is None and pass_of("Gelu_token_48") is None


def _chain() -> list:  # a -> [sub, div] -> y ; b -> other (a branch beside it)
    return [helper.make_node("Relu", ["x"], ["a"], name="relu"),
            helper.make_node("Sub", ["a", "m"], ["s"], name="sub"),
            helper.make_node("Div", ["s", "v"], ["d"], name="div"),
            helper.make_node("Neg", ["d"], ["y"], name="neg"),
            helper.make_node("Abs", ["x"], ["other"], name="abs")]


def test_a_candidate_failing_beside_or_before_the_recorded_divergence_is_another_failure() -> None:
    identity = Identity("div", "d", 3, ("sub", "div"))
    check = IdentityCheck(identity, _chain())
    assert check.after == {"s", "d", "y"}
    same = [_stats("y", 2e3)]
    assert check.differs(same, {s.name: s for s in same}) is None
    beside = [_stats("y", 2e3), _stats("other", 5.0)]
    assert "'other'" in (check.differs(beside, {s.name: s for s in beside}) or "")
    before = [_stats("a", 3.0)]
    assert check.differs(before, {s.name: s for s in before}) is not None
    # the recorded tensor exposed: it must fail, and in the same band (±1)
    weak = [_stats("d", 2.0), _stats("y", 2.0)]
    assert "not ~1e3" in (check.differs(weak, {s.name: s for s in weak}) or "")
    quiet = [_stats("y", 2e3)]
    assert "does not fail here" in (check.differs(quiet, {"d": _stats("d", 0.1), "y": quiet[0]}) or "")


def test_a_sibling_pass_making_another_node_of_the_region_is_another_failure() -> None:
    identity = Identity("div", "d", 3, ("sub", "div"), "LayerNormalization", "/div/LayerNormFusion/",
                        "LayerNormFusion", "optimized model")
    check = IdentityCheck(identity, _chain())
    failing = [_stats("d", 3e3)]
    compared = {s.name: s for s in failing}
    made = CompiledGraph("optimized model", (CompiledNode("/div/LayerNormFusion/", "LayerNormalization",
                                                          ("sub", "div"), ("d",)),))
    sibling = CompiledGraph("optimized model", (
        CompiledNode("sub", "Sub", ("sub",), ("s",)),
        CompiledNode("/div/SimplifiedLayerNormFusion/", "SimplifiedLayerNormalization", ("div",), ("d",))))
    assert check.differs(failing, compared, made) is None
    why = check.differs(failing, compared, sibling) or ""
    assert "SimplifiedLayerNormalization made by SimplifiedLayerNormFusion" in why
    assert "not LayerNormalization made by LayerNormFusion" in why


def test_a_bundle_records_what_lies_after_the_divergence() -> None:
    identity = Identity("div", "d", 3, ("sub", "div"))
    record = {"matched_by": "identity", **identity.to_json(), "after": ["d"]}
    check = IdentityCheck.of_bundle(record)
    assert check is not None and check.after == {"d"} and check.identity == identity
    assert IdentityCheck.of_bundle({"matched_by": "kind"}) is None
