"""What a bundle's ``report.json`` must look like for its readers: one check at load, naming the field.

``report.json`` is not hashed (it is the index of the bundle's files), and anyone may edit it. Its readers —
:func:`graphbisect.verify`, the checker (``graphbisect audit``), the reports — take each field as the writer
wrote it: ``signature`` an object, ``target`` a spec string, ``noise_floor`` an object of numbers. A field of
another shape (``"target": {...}``, ``"signature": "crash"``) used to surface as an ``AttributeError`` deep in
a reader, reported as "a graphbisect bug" (exit 3, issue 36 item 7). :func:`report_problem` checks every field
a reader relies on against :data:`REPORT_SCHEMA` once, when the bundle is loaded, and says which field is wrong
and what it should be, so a malformed bundle is a damaged bundle (exit 2).

A field may be absent (older bundles lack some) unless :data:`REQUIRED`; where present it must have its shape.
Fields no reader looks into (``environment``, ``journey``, ``command_line``...) are not checked. Numbers a
verdict is computed from (tolerances, noise floor margins) must be finite: JSON's ``NaN``/``Infinity`` are not.

Example:
    >>> report_problem({"format": "graphbisect-bundle", "oracle": "onnxruntime", "target": {"a": 1},
    ...                 "signature": {"kind": "mismatch"}})
    'target: expected a string (a backend spec), found an object'
    >>> report_problem({"oracle": "ort", "target": "ort", "signature": {"kind": "mismatch", "band": "x"}})
    'signature.band: expected an integer or null, found a string'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["REPORT_SCHEMA", "REQUIRED", "report_problem"]


@dataclass(frozen=True)
class Shape:
    """A JSON shape. ``kind``: ``string``, ``integer``, ``number`` (finite), ``any-number`` (a recorded score:
    also ``"inf"``/``"nan"``, as :func:`~graphbisect.artifacts.report.jsonable` writes them), ``boolean``,
    ``list``, ``map`` (string keys, ``item`` values), ``pair`` (two finite numbers) or ``object`` (the listed
    ``fields``, each optional, others allowed)."""

    kind: str
    item: Shape | None = None
    fields: tuple[tuple[str, Shape], ...] = ()
    nullable: bool = False
    what: str = ""  # what the value means, in the message

    def describe(self) -> str:
        base = {"string": "a string", "integer": "an integer", "number": "a finite number",
                "any-number": "a number", "boolean": "true or false", "list": "a list", "map": "an object",
                "pair": "a list of two finite numbers", "object": "an object"}[self.kind]
        return base + (" or null" if self.nullable else "") + (f" ({self.what})" if self.what else "")


def _opt(shape: Shape) -> Shape:
    return Shape(shape.kind, shape.item, shape.fields, True, shape.what)


STR, INT, NUM, BOOL = Shape("string"), Shape("integer"), Shape("number"), Shape("boolean")
ANY_NUM = Shape("any-number")
STRS = Shape("list", STR)


def _obj(**fields: Shape) -> Shape:
    return Shape("object", fields=tuple(fields.items()))


def _list(item: Shape) -> Shape:
    return Shape("list", item)


def _map(item: Shape) -> Shape:
    return Shape("map", item)


#: Every field of report.json a reader of a loaded bundle relies on, with its shape.
REPORT_SCHEMA: dict[str, Shape] = {
    "format": STR,
    "format_version": INT,
    "oracle": Shape("string", what="a backend spec"),
    "target": Shape("string", what="a backend spec"),
    "signature": _obj(kind=STR, detail=_opt(STR), band=_opt(INT), description=_opt(STR)),
    "target_message": _opt(STR),
    "headline": _opt(STR),
    "tolerance": _opt(_obj(atol=NUM, rtol=NUM, min_cosine=_opt(NUM), per_output=_map(Shape("pair")),
                           check_dtype=BOOL, int_atol=NUM, quantized=_map(NUM))),
    "noise_floor": _opt(_obj(spec=_opt(STR), measured=BOOL, note=_opt(STR), margin=NUM,
                             scores=_map(_opt(ANY_NUM)))),
    "identity": _opt(_obj(matched_by=STR, node=STR, tensor=STR, band=_opt(INT), region=STRS,
                          compiled_kind=_opt(STR), compiled_name=_opt(STR), made_by=_opt(STR), source=_opt(STR),
                          ran_in=_opt(STR), after=STRS, describe=_opt(STR), disable=_opt(STRS))),
    "files": _list(_obj(name=STR, bytes=INT, sha256=STR)),
    "outputs": _list(_obj(name=STR, passed=BOOL, kind=STR, score=_opt(ANY_NUM))),
    "model": _opt(_obj(inputs=STRS, outputs=STRS)),
    "original_model": _opt(_obj(path=_opt(STR), fingerprint=_opt(STR), nodes=_opt(INT))),
    "original_fingerprint": _opt(STR),
    "original_nodes": _opt(INT),
    "final_nodes": _opt(INT),
    "kept_nodes": _list(_obj(name=STR, op_type=STR)),
    "one_minimal": _opt(BOOL),
    "verified": _opt(BOOL),
    "flaky": _opt(BOOL),
    "notes": STRS,
    "versions": _opt(_map(_opt(Shape("object")))),
    "audit": _opt(_obj(holds=_opt(BOOL), claims=_list(_obj(id=STR, claim=_opt(STR), holds=_opt(BOOL),
                                                           evidence=_opt(STR), fail_otherwise=_opt(STRS))))),
    "optimization_levels": _opt(_obj(lowest_failing=_opt(STR))),
    "spec_check": _opt(_obj(verdict=_opt(STR), agrees_with_oracle=_opt(BOOL), agrees_with_target=_opt(BOOL),
                            text=_opt(STR))),
    "report_runs": _opt(_map(INT)),
    "report_calls": _opt(_map(Shape("object"))),
    # what `graphbisect releases` found on the bundle, by --find (graphbisect.artifacts.releases_section)
    "releases": _opt(_map(Shape("object"))),
}

#: The fields no bundle can lack: what runs (``oracle``, ``target``) and what it is checked against.
REQUIRED = ("oracle", "target", "signature")


def report_problem(report: object) -> str | None:
    """The first field of ``report`` (parsed report.json) that a reader could not use, as ``"FIELD: expected
    ..., found ..."``; None when every field has its shape."""
    if not isinstance(report, Mapping):
        return f"expected an object at the top, found {_found(report)}"
    for name in REQUIRED:
        if name not in report:
            return f"{name}: missing ({REPORT_SCHEMA[name].describe()})"
    for name, shape in REPORT_SCHEMA.items():
        if name in report:
            problem = _problem(report[name], shape, name)
            if problem is not None:
                return problem
    return None


def _problem(value: Any, shape: Shape, where: str) -> str | None:
    if value is None:
        return None if shape.nullable else f"{where}: expected {shape.describe()}, found null"
    if not _is(value, shape.kind):
        return f"{where}: expected {shape.describe()}, found {_found(value)}"
    if shape.kind == "list" and shape.item is not None:
        for i, item in enumerate(value):
            problem = _problem(item, shape.item, f"{where}[{i}]")
            if problem is not None:
                return problem
    elif shape.kind == "map" and shape.item is not None:
        for key, item in value.items():
            problem = _problem(item, shape.item, f"{where}[{key!r}]")
            if problem is not None:
                return problem
    elif shape.kind == "object":
        for name, field_shape in shape.fields:
            if name in value:
                problem = _problem(value[name], field_shape, f"{where}.{name}")
                if problem is not None:
                    return problem
    return None


#: The integers a report holds (sizes, counts, bands): 64-bit, as graphbisect writes them. JSON has no bound, and
#: Python reads 400 digits as an int no float holds (``math.isfinite`` raised OverflowError on one).
_INT64 = range(-(2**63), 2**63)


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number", "any-number"):
        number = isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)
                                              and value in _INT64)
        if kind == "integer":
            return number and isinstance(value, int)
        if kind == "number":
            return number and math.isfinite(value)
        return number or value in ("inf", "-inf", "nan")  # how jsonable writes them
    return {
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "list": isinstance(value, list),
        "map": isinstance(value, dict),
        "object": isinstance(value, dict),
        "pair": isinstance(value, list) and len(value) == 2 and all(_is(v, "number") for v in value),
    }[kind]


def _found(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int) and value not in _INT64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (int, float)):
        return f"the number {value!r}" if isinstance(value, float) and not math.isfinite(value) else "a number"
    names: dict[type, str] = {str: "a string", list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)
