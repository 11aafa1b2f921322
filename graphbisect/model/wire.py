"""Serialized models assembled from serialized pieces: a model's bytes without building its ``ModelProto``.

Why: the reduce engine turns hundreds of node subsets of one model into candidate files. Building each as
a ``ModelProto`` copies every kept node, declaration and initializer stub into a new message and serializes
it again, although those pieces are the same for every candidate. Protobuf's wire format makes a message
the concatenation of its fields, and a repeated field the concatenation of its entries, so a candidate's
file is its pieces' bytes joined in field-number order — the order protobuf itself writes known fields in
(unknown fields last). :class:`GraphLayout` keeps the fixed part of a model (everything but the graph's
nodes, initializers, inputs, outputs and ``value_info``) as bytes between those open fields;
:meth:`GraphLayout.assemble` joins entries made once by :func:`entry` with it. The result is byte for byte
what ``SerializeToString()`` writes for the same ``ModelProto`` (tests/model/test_model_wire.py checks it on
real models), and any protobuf parser reads it whatever the order.

Example:
    >>> import onnx
    >>> from onnx import helper
    >>> node = helper.make_node("Relu", ["x"], ["y"])
    >>> x, y = (helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2]) for n in "xy")
    >>> whole = helper.make_model(helper.make_graph([node], "g", [x], [y]))
    >>> layout = GraphLayout(whole)
    >>> data = layout.assemble(node=[entry(GRAPH_FIELDS["node"], node.SerializeToString())],
    ...                        input=[entry(GRAPH_FIELDS["input"], x.SerializeToString())],
    ...                        output=[entry(GRAPH_FIELDS["output"], y.SerializeToString())])
    >>> data == whole.SerializeToString()
    True
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Mapping

import onnx
from google.protobuf.message import Message

__all__ = ["GRAPH_FIELDS", "OPEN_FIELDS", "GraphLayout", "entry", "entry_payload"]

#: The graph's repeated fields a candidate fills; the rest of the model is fixed per layout.
OPEN_FIELDS = ("node", "initializer", "input", "output", "value_info")

#: Field numbers of the open fields in ``GraphProto`` (node 1, initializer 5, input 11, ...).
GRAPH_FIELDS: Mapping[str, int] = {name: onnx.GraphProto.DESCRIPTOR.fields_by_name[name].number
                                   for name in OPEN_FIELDS}

_MODEL_GRAPH = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_LENGTH_DELIMITED = 2


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _BYTES[value]
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_BYTES = [bytes((value,)) for value in range(0x80)]


@functools.lru_cache(maxsize=64)
def _key(number: int) -> bytes:
    return _varint(number << 3 | _LENGTH_DELIMITED)


def entry(number: int, payload: bytes) -> bytes:
    """One length-delimited field entry: a message ``payload`` (its serialized bytes) as field ``number``.

    >>> entry(1, b"ab")
    b'\\n\\x02ab'
    """
    return _key(number) + _varint(len(payload)) + payload


def entry_payload(data: bytes) -> bytes:
    """The message bytes of one field entry (what :func:`entry` was given): ``data`` after its key and
    length. A piece kept as its entry needs no second copy of its message bytes.

    >>> entry_payload(entry(13, b"ab"))
    b'ab'
    """
    start = 0
    for _ in range(2):  # the key, then the length: varints end at the first byte below 0x80
        while data[start] & 0x80:
            start += 1
        start += 1
    return data[start:]


def _fields(message: Message, low: int, high: float, *, unknown: bool) -> bytes:
    """The serialized fields of ``message`` numbered ``low <= n < high`` (in field-number order, as
    protobuf writes them); the message's unknown fields too when ``unknown`` (protobuf writes them last)."""
    part = type(message)()
    part.CopyFrom(message)
    for field, _ in message.ListFields():
        if not low <= field.number < high:
            part.ClearField(field.name)
    if not unknown:
        part.DiscardUnknownFields()
    return part.SerializeToString()


class GraphLayout:
    """The fixed bytes of ``shell`` (a ``ModelProto``) around its graph's open fields (:data:`OPEN_FIELDS`).

    Whatever ``shell``'s graph holds in the open fields is ignored: :meth:`assemble` supplies them.
    """

    def __init__(self, shell: onnx.ModelProto) -> None:
        self._model_head = _fields(shell, 0, _MODEL_GRAPH, unknown=False)
        self._model_tail = _fields(shell, _MODEL_GRAPH + 1, float("inf"), unknown=True)
        graph = onnx.GraphProto()
        graph.CopyFrom(shell.graph)
        for name in OPEN_FIELDS:
            graph.ClearField(name)
        self._order = sorted(OPEN_FIELDS, key=GRAPH_FIELDS.__getitem__)
        bounds = [0, *(GRAPH_FIELDS[name] for name in self._order)]
        # _gaps[i]: the graph's fixed fields numbered between open field i-1 and open field i; the last one
        # holds everything after the last open field, unknown fields included.
        self._gaps = [_fields(graph, low, high, unknown=False) for low, high in itertools.pairwise(bounds)]
        self._gaps.append(_fields(graph, bounds[-1], float("inf"), unknown=True))

    def assemble(self, **entries: Iterable[bytes]) -> bytes:
        """The serialized model whose graph's open fields are ``entries`` (name → field entries made by
        :func:`entry` with that field's number, in order); an open field not given stays empty."""
        unknown = set(entries) - set(OPEN_FIELDS)
        if unknown:
            raise TypeError(f"not an open graph field: {sorted(unknown)}")
        pieces: list[bytes] = []
        for gap, name in zip(self._gaps, self._order, strict=False):
            pieces.append(gap)
            pieces.extend(entries.get(name, ()))
        pieces.append(self._gaps[-1])
        graph = b"".join(pieces)
        return b"".join((self._model_head, _key(_MODEL_GRAPH), _varint(len(graph)), graph, self._model_tail))
