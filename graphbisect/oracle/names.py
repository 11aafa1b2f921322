"""Names out of a crash message: the part of a failure's identity that the backend, not the bug, chose.

A crash is the same failure when the op, the stage and the reason are the same, whatever the nodes and tensors
are called. Backends put names in their messages that change while the bug does not:

* OpenVINO numbers the nodes it creates per process (``If_5381`` in one worker, ``If_5515`` in the next), and
  renames a node whose output becomes a graph output after that output (``'opset1::MatMul m (...)' with
  friendly_name 'm'`` where the node was ``/blk5/pool/MatMul``); it describes a node's inputs by their
  producers (``opset1::Greater /gt[0]:boolean[1,1]``), which a reduction cuts and feeds as a ``Parameter``
  or a ``Constant``;
* every backend names the model's own nodes and tensors, which differ between a model and its reductions.

:func:`erase_names` replaces each such name by :data:`NAME`, in three ways, so two processes and two
candidates that fail the same way normalize to the same text:

1. **positions** (:data:`POSITIONS`): the places a message's format says "a node or tensor named ...", whatever
   the name is (OpenVINO's node descriptions, ONNX Runtime's ``Name:'...'`` and ``Node (...) Op (...)``);
2. **generated names** (:data:`GENERATED`): ``<OpType>_<number>`` tokens, how OpenVINO (and exporters) number
   nodes;
3. **the model's names**: a token equal to one of ``names``, the model's node and tensor names, as the caller
   normalized them (:func:`graphbisect.oracle.signature.crash_names`). Only names that are not plain words
   count: a name of letters alone (``x``, ``input``, ``MatMul``) can be a word of the reason ("First input
   dimension", "Incompatible MatMul matrix dimension") and is replaced only in a position.

What stays is the op type of the failing node, the element types and shapes, the check that failed and the
reason, so two genuinely different errors stay different.

This module uses only the standard library: ``repro.py`` embeds its text verbatim (``embedded_source``), so a
bundle's script and ``graphbisect verify`` normalize alike.

Example:
    >>> erase_names("node 'opset8::If If_5381 (opset1::Greater gt[0]:boolean[1,1])' with friendly_name 'If_5381'")
    "node 'opset8::If <name> (<name>[0]:boolean[1,1])' with friendly_name '<name>'"
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator

NAME = "<name>"

# What follows a name inside a node description: not part of it (names with these characters are rare, and a
# position that stops early only leaves a name in, never takes a word out).
_NAME_CHARS = r"[^\s\[\]()',]+"

#: Where a message's format names a node or a tensor: (pattern, replacement), applied in order.
POSITIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    # OpenVINO, an input described by its producer's output port: "opset1::Greater gt[0]" -> "<name>[0]". The
    # producer's op type goes too: a reduction cuts the producer, and the input becomes a Parameter or Constant.
    (re.compile(rf"\b\w*opset\d+::\w+ {_NAME_CHARS}\[(\d+)\]"), NAME + r"[\1]"),
    # OpenVINO, the node itself: "opset8::If If_5381 (" -> "opset8::If <name> (" (its op type stays).
    (re.compile(rf"\b(\w*opset\d+::\w+) {_NAME_CHARS}(?= \()"), r"\1 " + NAME),
    # OpenVINO: "with friendly_name 'm'".
    (re.compile(r"\b(friendly_name )'[^'\n]*'"), r"\1'" + NAME + "'"),
    # OpenVINO's ONNX frontend: "ONNX node '<Node(If): y>'" (the node's output).
    (re.compile(r"(<Node\(\w+\): )(?:<name>|[^>\n]*)(?=>)"), r"\1" + NAME),
    # ONNX Runtime at run time: "while running Reshape node. Name:'/blk/Reshape' Status Message: ...".
    (re.compile(r"\b(Name:)'[^'\n]*'"), r"\1'" + NAME + "'"),
    # ONNX Runtime's shape inference: "Node (/blk/MatMul) Op (MatMul) [ShapeInferenceError] ...".
    (re.compile(r"\b(Node \()[^)\n]*(\) Op \()"), r"\1" + NAME + r"\2"),
)

#: A name a backend (or an exporter) numbered: an op type, an underscore and a number (OpenVINO: ``If_5381``,
#: ``Constant_1234``). Upper-case first, digits alone after the last underscore: ``COL_INDEX_DIM=1``,
#: ``if_condition_rank`` and ``AVX512_BF16`` stay.
GENERATED = re.compile(r"[A-Z][A-Za-z0-9]*_\d+")

# A token: what lies between spaces, quotes, brackets, commas and semicolons ("onnx::Add_3", "x.1", "If_18").
_TOKEN = re.compile(r"[^\s'\"()\[\]{}<>,;]+")
_TRAILING = ".:"  # sentence punctuation after a name ("... for input: x.1.")


def erase_names(text: str, names: Collection[str] = ()) -> str:
    """``text`` (a message already without volatile details) with every name a backend chose replaced by
    :data:`NAME`: names in :data:`POSITIONS`, :data:`GENERATED` names, and tokens in ``names`` (see the module
    docstring). Idempotent: erasing a text twice gives the same text.

    Example:
        >>> erase_names("Got invalid dimensions for input: x.1 for the following indices", {"x.1"})
        'Got invalid dimensions for input: <name> for the following indices'
    """
    for pattern, replacement in POSITIONS:
        text = pattern.sub(replacement, text)
    return _TOKEN.sub(lambda found: _erased(found.group(0), names), text)


def found_names(text: str, names: Collection[str]) -> set[str]:
    """The members of ``names`` that :func:`erase_names` would replace in ``text`` as tokens."""
    return {core for core in _cores(text) if core in names}


def _cores(text: str) -> Iterator[str]:
    for found in _TOKEN.finditer(text):
        yield found.group(0).rstrip(_TRAILING)


def _erased(token: str, names: Collection[str]) -> str:
    core = token.rstrip(_TRAILING)
    if core and (core in names or GENERATED.fullmatch(core)):
        return NAME + token[len(core):]
    return token
