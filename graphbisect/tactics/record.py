"""The backend-neutral tactic record: which implementation (kernel, tactic) each node got in one build.

A :class:`TacticRecord` names the backend, its version and the device, and lists one
:class:`TacticChoice` per node: the ONNX node name (where the backend can map its layers back), the
backend's name for the chosen implementation (``choice``: the string a replay forces, e.g. OpenVINO's
``brgconv_avx512`` or a TensorRT tactic hash), and what the backend said about it (its layer name and type,
runtime precision, the ONNX nodes fused into it, a backend-specific ``key`` such as a timing-cache key).

Records are JSON files (``{"format": "graphbisect-tactics", "version": 1, ...}``). This module imports only
the standard library: backend runtimes read records inside their worker processes.

Example:
    >>> rec = TacticRecord("openvino", "2026.4", "CPU", (TacticChoice("conv0", "brgconv_avx512"),))
    >>> TacticRecord.from_json(rec.to_json()) == rec
    True
    >>> rec.choice_of("conv0")
    'brgconv_avx512'
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from graphbisect.errors import InputError

__all__ = ["FORMAT", "TacticChoice", "TacticRecord", "load_record", "save_record"]

logger = logging.getLogger(__name__)

FORMAT = "graphbisect-tactics"
_VERSION = 1


@dataclass(frozen=True)
class TacticChoice:
    """One node's implementation in one build.

    ``node`` is the ONNX node name (or the backend's layer name when it cannot be mapped back);
    ``choice`` is what a replay forces. The other fields are facts for humans and for matching layers.
    """

    node: str
    choice: str
    layer: str | None = None
    layer_type: str | None = None
    precision: str | None = None
    fused: tuple[str, ...] = ()
    key: str | None = None  # backend-specific handle, e.g. a TensorRT timing-cache key

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"node": self.node, "choice": self.choice}
        for name in ("layer", "layer_type", "precision", "key"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        if self.fused:
            data["fused"] = list(self.fused)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TacticChoice:
        return cls(
            node=str(data["node"]), choice=str(data["choice"]), layer=_opt(data.get("layer")),
            layer_type=_opt(data.get("layer_type")), precision=_opt(data.get("precision")),
            fused=tuple(str(x) for x in data.get("fused", ())), key=_opt(data.get("key")),
        )


def _opt(value: object) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class TacticRecord:
    """The kernel choices of one build, in the backend's execution order (see the module docstring)."""

    backend: str
    version: str | None
    device: str | None
    choices: tuple[TacticChoice, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def nodes(self) -> tuple[str, ...]:
        """Node names in record order."""
        return tuple(c.node for c in self.choices)

    def as_dict(self) -> dict[str, TacticChoice]:
        """``node -> TacticChoice`` (the first entry wins if a backend reported a node twice)."""
        out: dict[str, TacticChoice] = {}
        for c in self.choices:
            out.setdefault(c.node, c)
        return out

    def choice_of(self, node: str) -> str | None:
        """The implementation recorded for ``node``, or None."""
        found = self.as_dict().get(node)
        return None if found is None else found.choice

    def with_choices(self, changes: Mapping[str, str]) -> TacticRecord:
        """A copy where the nodes in ``changes`` get another implementation (unknown nodes are appended).

        Example:
            >>> rec = TacticRecord("openvino", None, None, (TacticChoice("a", "x"),))
            >>> rec.with_choices({"a": "ref_any"}).choice_of("a")
            'ref_any'
        """
        seen: set[str] = set()
        choices: list[TacticChoice] = []
        for c in self.choices:
            seen.add(c.node)
            choices.append(replace(c, choice=changes[c.node]) if c.node in changes else c)
        choices.extend(TacticChoice(node, choice) for node, choice in changes.items() if node not in seen)
        return replace(self, choices=tuple(choices))

    def restricted(self, nodes: Iterable[str]) -> TacticRecord:
        """Only the choices of ``nodes`` (e.g. the nodes a reduced model still has)."""
        keep = set(nodes)
        return replace(self, choices=tuple(c for c in self.choices if c.node in keep))

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": _VERSION, "backend": self.backend, "backend_version": self.version,
            "device": self.device, "meta": dict(self.meta), "choices": [c.to_json() for c in self.choices],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TacticRecord:
        if data.get("format") != FORMAT:
            raise InputError(
                f"not a tactic record (format {data.get('format')!r})",
                hint="write one with `graphbisect tactics record MODEL --target SPEC -o record.json`",
            )
        if int(data.get("version", 0)) > _VERSION:
            raise InputError(f"tactic record version {data.get('version')} is newer than this graphbisect reads",
                             hint="upgrade graphbisect")
        return cls(
            backend=str(data["backend"]), version=_opt(data.get("backend_version")), device=_opt(data.get("device")),
            choices=tuple(TacticChoice.from_json(c) for c in data.get("choices", ())),
            meta=dict(data.get("meta", {})),
        )


def save_record(record: TacticRecord, path: str | Path) -> Path:
    """Write ``record`` as JSON, atomically (a temporary sibling renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(record.to_json(), handle, indent=1)
        handle.write("\n")
    os.replace(tmp, path)
    logger.debug("wrote tactic record %s (%d choices)", path, len(record.choices))
    return path


def load_record(path: str | Path) -> TacticRecord:
    """Read a record written by :func:`save_record`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputError(f"tactic record {path} does not exist",
                         hint="record one with `graphbisect tactics record`") from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"tactic record {path} is not valid JSON: {exc}",
                         hint="give a file written by `graphbisect tactics record`") from exc
    if not isinstance(data, dict):
        raise InputError(f"tactic record {path} is not a JSON object", hint="give a file written by graphbisect")
    return TacticRecord.from_json(data)
