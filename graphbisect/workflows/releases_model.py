"""A model's failure as the reference a release search judges each release against (``graphbisect releases
MODEL``).

A bundle carries its reference: the oracle's recorded outputs and the failure's signature and identity. A model
has none, so one is made here, once, by the compare machinery (:func:`~graphbisect.workflows.compare.compare_models`)
on one release, the *baseline*: the oracle runs there, once, and its outputs are the fixed expectation of every
release; the baseline's target run gives the failure's signature and, for a wrong result, its identity (the first
divergence above the target's noise floor, what the release compiled there, how strongly), as ``reduce``
records them. With a bundle (``bundle=``) the signature and identity are the bundle's instead, its identity placed
in the model (the tensors at or after its region are the model's), and the oracle still runs on the model.

The reference is held as a :class:`~graphbisect.artifacts.bundle.LoadedBundle` of the whole model in the compare
work folder (``model.onnx``, ``inputs.npz``), never written as a bundle: each release is then judged by
:func:`~graphbisect.workflows.verify.verify_bundle`, the same code that judges a bundle's releases.

The baseline is the newest release that can be installed with ``find="bad"`` (the newest failing release, when
there is anything to find), and the oldest with ``find="fixed"`` (the newest release of a fixed failure passes;
the oldest is the end known to fail when there is anything to find).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from graphbisect.artifacts.bundle import LoadedBundle
from graphbisect.backends import BackendSpec
from graphbisect.compare import Tolerance
from graphbisect.data import load_inputs
from graphbisect.model import Model
from graphbisect.oracle.identity import Identity, IdentityCheck
from graphbisect.oracle.signature import ModelNames, Signature, signature_of
from graphbisect.workflows.compare import CompareResult, compare_models

__all__ = ["ModelReference", "model_reference"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelReference:
    """The reference (``bundle``: the model, its inputs, the oracle's outputs, the failure) and the comparison
    on the baseline release that made it (``baseline``). ``failed``: the baseline's target failed (else there is
    no failure of the model's own to search for, and with no ``bundle=`` the reference's signature is "no
    failure")."""

    bundle: LoadedBundle
    baseline: CompareResult

    @property
    def failed(self) -> bool:
        return not self.baseline.passed

    @property
    def oracle_runs(self) -> int:
        """The oracle's runs (one: its outputs are every release's expectation)."""
        return int(self.baseline.invocations.get("oracle", 0))

    @property
    def target_runs(self) -> int:
        """The baseline release's target runs in the comparison (its plain run, its probe, its noise floor)."""
        return int(self.baseline.invocations.get("target", 0))


def model_reference(model: Model, *, oracle: BackendSpec, target: BackendSpec, workdir: Path,
                    inputs: Mapping[str, np.ndarray] | None = None, seed: int = 0,
                    tolerance: Tolerance | None = None, bundle: LoadedBundle | None = None) -> ModelReference:
    """Compare ``target`` (one release's spec, ``python=`` its environment) with ``oracle`` on ``model`` in
    ``workdir`` and hold the result as the reference every release is judged against (module docstring).
    ``bundle``: take the failure's signature and identity from it instead of the baseline's run.
    Raises :class:`~graphbisect.workflows.compare.OracleFailed` when the oracle cannot run the model."""
    result = compare_models(model, oracle=oracle, target=target, inputs=inputs, seed=seed, tolerance=tolerance,
                            workdir=workdir)
    proto = onnx.load(str(workdir / "model.onnx"), load_external_data=False)
    names = ModelNames(proto)
    floor = result.noise_floor
    if bundle is not None:
        signature, identity, message = bundle.signature, Identity.from_json(bundle.report.get("identity")), \
            bundle.target_message
        versions = bundle.report.get("versions") or {}
    else:
        signature = signature_of(result.target_run, result.comparison, floor=floor, names=names)
        identity, message = _identity(result), result.target_run.message if signature.kind.raised else None
        versions = {"oracle": dict(result.versions.get("oracle", {})),
                    "target": dict(result.versions.get("target", {}))}
    record: dict[str, Any] | None = None
    if identity is not None and signature.failed:
        after = IdentityCheck(identity, model.nodes).after  # the model's tensors at or after the region
        record = {**identity.to_json(), "matched_by": "identity", "describe": identity.describe(),
                  "after": sorted(after)}
    outputs = list(model.output_names)
    report = {"signature": signature.to_json(), "identity": record, "versions": versions,
              "noise_floor": None if floor is None else floor.to_json(),
              "target_message": _as_recorded(result, message) if bundle is None else message,
              "original_nodes": len(model.nodes), "final_nodes": len(model.nodes),
              # each output's verdict and score on the baseline, as a bundle records them (the checker reads them)
              "outputs": [s.to_json() for s in result.comparison.outputs]
              if bundle is None and result.comparison is not None else []}
    oracle_outputs = {name: np.array(result.oracle_run.outputs[name]) for name in outputs}
    reference = LoadedBundle(
        path=workdir, source=Path(model.origin or model.path or workdir), report=report,
        oracle=result.oracle, target=result.target, tolerance=result.tolerance or tolerance or Tolerance(),
        signature=signature, target_message=message, inputs=load_inputs(result.inputs_path, model),
        oracle_outputs=oracle_outputs, target_outputs={}, environment={})
    return ModelReference(reference, result)


def _as_recorded(result: CompareResult, message: str | None) -> str | None:
    """The baseline's crash message as ``reduce`` writes a bundle's ``target_message`` (``ErrorType: message``),
    which the checker reads (the search's own matching keeps ``message``)."""
    run = result.target_run
    return None if message is None else f"{run.error_type or ''}: {run.message or ''}".strip(": ")


def _identity(result: CompareResult) -> Identity | None:
    """The identity of the baseline's wrong result, as ``reduce`` records it: where it first goes wrong above
    the noise floor and what the target compiled there (None: no layerwise evidence, or no wrong result)."""
    first = result.first_divergence
    if first is None or result.comparison is None or result.comparison.passed:
        return None
    source = result.compiled.source if result.compiled is not None else None
    return Identity.of_row(first.node, first.tensor, first.stats.score, first.compiled_as, source)


def describe_reference(reference: ModelReference) -> str:
    """The baseline's failure in one line, its identity where it has one."""
    signature: Signature = reference.bundle.signature
    identity = (reference.bundle.report.get("identity") or {}).get("describe")
    return signature.describe() + (f"; {identity}" if identity else "")
