"""Which original tensor each node of a saved optimized ONNX model computes (ONNX Runtime, onnxoptimizer).

A node of the optimized model says what it computes when one of its outputs keeps an original tensor's
name (fusions keep the name of the last node they replaced). ONNX Runtime's NCHWc transformer (CPUs with
blocked-layout kernels) does not: it keeps tensors in a blocked channel layout and names them
``reorder_token_N``. What such a node computes is read from the node itself, never from a name alone:

* A **layout node** (``ReorderInput``, ``ReorderOutput`` without ``channels_last``) holds the tensor it
  reads in another layout. It computes nothing and stands for no original node; a ``ReorderOutput`` that
  writes an original name says which tensor its blocked input is. With ``channels_last`` it is the original
  ``Transpose`` to or from NHWC that ONNX Runtime folded into it (:meth:`_Mapper._transposed`).
* A node the transformer **kept** (``Concat``, ``Add``/``Sum``/``Mul``, ``Relu``/``Sigmoid``/``Tanh`` on
  blocked inputs keep their op and attributes and read the blocked form of the original inputs) is the
  original node with the same op, attributes and inputs.
* A node the transformer **created** (``Conv``, ``MaxPool``, ``AveragePool``, ``Upsample`` in the
  ``com.microsoft.nchwc`` domain) is named after the tensor it computed when it was created: ``r2_nchwc``,
  ``r8_bn_nchwc`` (a BatchNormalization rewritten as a depthwise Conv), ``r10_mul_nchwc``, with
  ``_token_N`` appended when the name was taken. That name is only a proposal: it is accepted when the
  original graph computes that tensor from the node's input and constants alone, through tensors no other
  optimized node holds (:func:`_computed_from`). The ops the node absorbed afterwards then extend it: a
  ``Conv``'s fourth (``Sum``) input adds the ``Add``/``Sum`` that read it, its ``activation`` attribute the
  activation after that (:func:`_fused_after`).

Common-subexpression elimination merges identical computations (two branches with equal weights), so one
optimized tensor may hold several original tensors: tensors are compared by :func:`value_numbers` (same
op, attributes and inputs; small constants by content). A node keeps one original name as its output
(the one ONNX Runtime kept, so that exposing it does not undo the merge); the others are *held*.

A node whose computation cannot be shown is left unmapped (a wrong tensor would report a false
divergence).

Example:
    >>> from onnx import helper
    >>> nodes = [helper.make_node("Relu", ["x"], ["a"], name="r1"), helper.make_node("Relu", ["x"], ["b"], name="r2")]
    >>> numbers = value_numbers(nodes, {})
    >>> numbers["a"] == numbers["b"] != numbers["x"]
    True
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx

__all__ = ["OptimizedTensors", "OriginalGraph", "optimized_tensors", "value_numbers"]

log = logging.getLogger(__name__)

_LAYOUT = frozenset({"ReorderInput", "ReorderOutput"})
_LAYOUT_DOMAINS = frozenset({"com.microsoft.nchwc", "com.microsoft"})
_NCHWC_DOMAIN = "com.microsoft.nchwc"
_NCHWC_NAME = re.compile(r"^(?P<base>.+?)_nchwc(?:_token_\d+)?$")
#: ONNX Runtime's name for a node a fusion pass made: ``<the original node's name>/<Pass>/``, ``_token_N`` appended
#: when taken (``/model.2/act/Mul/QuickGeluFusion/``).
_FUSION_NAME = re.compile(r"^(?P<node>.+)/[A-Za-z_][\w.]*/(?:_token_\d+)?$")
#: Constants up to this many serialized bytes are compared by content (equal weights merged by CSE).
_SMALL_CONSTANT = 4096
#: Ops whose equal-looking nodes compute different values: never merged.
_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                               "Multinomial", "Bernoulli"})


@dataclass(frozen=True)
class OptimizedTensors:
    """Per optimized node ``(name, op, original tensors it exposes)``, and every original tensor the optimized
    graph still holds in some form (another layout, merged by CSE)."""

    named: tuple[tuple[str, str, tuple[str, ...]], ...]
    held: frozenset[str]


def value_numbers(nodes: Sequence[onnx.NodeProto], constants: Mapping[str, onnx.TensorProto]) -> dict[str, int]:
    """Tensor name → a number shared by tensors that certainly hold the same values: the same op, domain,
    attributes and (numbered) inputs, or equal small ``constants`` (initializers; large or external ones
    only equal themselves). Tensors nothing computes (graph inputs) are their own number."""
    table: dict[object, int] = {}
    numbers: dict[str, int] = {}

    def number(name: str) -> int:
        if not name:
            return -1
        if name not in numbers:
            tensor = constants.get(name)
            key: object = ("tensor", name)
            if tensor is not None and tensor.data_location != onnx.TensorProto.EXTERNAL \
                    and tensor.ByteSize() <= _SMALL_CONSTANT:
                content = onnx.TensorProto()
                content.CopyFrom(tensor)
                content.ClearField("name")
                key = ("constant", content.SerializeToString(deterministic=True))
            numbers[name] = table.setdefault(key, len(table))
        return numbers[name]

    for node in nodes:
        inputs = tuple(number(name) for name in node.input)
        attributes = tuple(sorted(a.SerializeToString(deterministic=True) for a in node.attribute))
        own = node.name if node.op_type in _NONDETERMINISTIC else ""
        for k, name in enumerate(node.output):
            if name:
                numbers[name] = table.setdefault((node.domain, node.op_type, attributes, inputs, k, own), len(table))
    return numbers


def optimized_tensors(nodes: Sequence[onnx.NodeProto], optimized: onnx.GraphProto,
                      constants: Mapping[str, onnx.TensorProto] | None = None, *,
                      original: OriginalGraph | None = None) -> OptimizedTensors:
    """What each node of ``optimized`` computes, as original tensors of ``nodes`` (see the module docstring).

    ``constants``: the original model's initializers, so that weights merged by CSE compare equal. Without
    them every tensor that no node computes and the optimized graph does not take as an input counts as one.
    ``original``: ``OriginalGraph(nodes, constants)`` made beforehand (it depends on the model alone).
    """
    if original is None or original.nodes is not nodes:
        original = OriginalGraph(nodes, constants)
    return _Mapper(original, optimized).run()


class OriginalGraph:
    """What mapping an optimized graph needs to know of the original one: producers, readers, value numbers
    and constant tensors. It depends on the model alone, so a caller that expects an optimized model can make
    it while the backend is still building (`compare` does, during the target's plain run).

    ``nodes`` and ``constants`` as for :func:`optimized_tensors`.
    """

    def __init__(self, nodes: Sequence[onnx.NodeProto], constants: Mapping[str, onnx.TensorProto] | None) -> None:
        self.nodes = nodes
        self.producer = {name: node for node in nodes for name in node.output if name}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in nodes:
            for name in dict.fromkeys(node.input):
                if name:
                    self.readers.setdefault(name, []).append(node)
        self.known = set(self.producer) | set(self.readers) | set(constants or {})
        self.numbers = value_numbers(nodes, constants or {})
        members: dict[int, list[str]] = {}
        for name, value in self.numbers.items():
            members.setdefault(value, []).append(name)
        # one frozenset per class, shared by every member: a class of n equal constants (a model's thousand
        # identical biases) costs n, not n² (each member its own copy of the class)
        self.classes: dict[int, frozenset[str]] = {value: frozenset(names) for value, names in members.items()}
        # Initializers and what nodes compute from them alone; without the initializers this depends on the
        # optimized graph's inputs (:class:`_Mapper`).
        self.constant = _constant_tensors(nodes, constants) if constants is not None else None


class _Mapper:
    """One walk over the optimized graph in its (topological) order; ``held`` maps each optimized tensor to
    the original tensors with its values."""

    def __init__(self, original: OriginalGraph, optimized: onnx.GraphProto) -> None:
        self.optimized = optimized
        self.producer, self.readers, self.known = original.producer, original.readers, original.known
        self.by_name = {node.name: node for node in original.nodes if node.name}
        self.numbers, self.classes = original.numbers, original.classes
        if original.constant is not None:
            self.constant = original.constant
        else:  # without the initializers: what is neither computed nor fed
            fed = {v.name for v in optimized.input} - {t.name for t in optimized.initializer}
            leaves = {name: onnx.TensorProto() for node in original.nodes for name in node.input
                      if name and name not in self.producer and name not in fed}
            self.constant = _constant_tensors(original.nodes, leaves)
        self.initializers = {t.name for t in optimized.initializer} | \
            {t.values.name for t in optimized.sparse_initializer}
        present = {v.name for v in optimized.input} | self.initializers | \
            {name for node in optimized.node for name in node.output if name}
        self.held: dict[str, frozenset[str]] = {name: self.alike(name) for name in present if name in self.known}
        self._everything_held: set[str] | None = None  # every original tensor in held's values, made when needed
        self.chosen: dict[str, str] = {}  # blocked tensor → the original name a ReorderOutput gives it

    def alike(self, name: str) -> frozenset[str]:
        """The original tensors certainly equal to ``name`` (itself included)."""
        value = self.numbers.get(name)
        return self.classes[value] if value is not None else frozenset({name})

    def run(self) -> OptimizedTensors:
        for node in self.optimized.node:  # a ReorderOutput names its blocked input before that input's producer
            if _is_layout(node) and node.op_type == "ReorderOutput" and node.output[0] in self.known:
                self.held[node.input[0]] = self.alike(node.output[0])
                self._everything_held = None
                self.chosen[node.input[0]] = node.output[0]
        named: list[tuple[str, str, tuple[str, ...]]] = []
        for node in self.optimized.node:
            outputs = self._outputs(node)
            named.append((node.name or node.op_type, node.op_type, tuple(outputs)))
        distinct = {id(names): names for names in self.held.values()}.values()  # classes are shared sets
        held = frozenset(name for names in distinct for name in names if name in self.producer)
        return OptimizedTensors(tuple(named), held)

    def _outputs(self, node: onnx.NodeProto) -> list[str]:
        """The original tensors ``node`` computes and exposes (none for a layout node)."""
        if _is_layout(node):
            source = self.held.get(node.input[0]) if node.input else None
            if source is not None and node.output and node.output[0] not in self.held:
                self._hold(node.output[0], source)
            return []
        named = [name for name in node.output if name in self.known]
        if named or not node.output or not node.output[0]:
            return named
        out = node.output[0]
        computed = self.chosen.get(out) or self._computed(node)
        if computed is None:
            return []
        if out not in self.held:
            self._hold(out, self.alike(computed))
        return [computed]

    def _hold(self, name: str, originals: frozenset[str]) -> None:
        """``held[name] = originals`` for a new ``name`` (the walk adds entries, never replaces one)."""
        self.held[name] = originals
        if self._everything_held is not None:
            self._everything_held |= originals

    def _computed(self, node: onnx.NodeProto) -> str | None:
        """The original tensor ``node`` (no output of which keeps an original name) computes, or None."""
        sources = [None if not name or name in self.initializers else self.held.get(name, frozenset())
                   for name in node.input]
        if any(s is not None and not s for s in sources):
            log.debug("optimized node %s reads a tensor that stands for no original one", node.name)
            return None
        if node.domain in ("", "ai.onnx"):
            return self._kept(node, sources)
        if node.op_type in _LAYOUT and node.domain in _LAYOUT_DOMAINS:  # channels_last (a plain one computes nothing)
            return self._transposed(node, sources[0] if sources else None)
        match = _NCHWC_NAME.match(node.name)
        if node.domain != _NCHWC_DOMAIN or match is None:
            return self._fused_by(node, sources)
        if not node.input or sources[0] is None:
            return None
        base = self._named_tensor(match["base"])
        if base is None or not self._computed_from(base, sources[0]):
            log.warning("cannot tell which original tensor ONNX Runtime's %s %r computes: its name does not "
                        "name a tensor the original graph computes from its input; it is not mapped",
                        node.op_type, node.name)
            return None
        return self._fused_after(node, base, sources)

    def _transposed(self, node: onnx.NodeProto, source: frozenset[str] | None) -> str | None:
        """The output of the original ``Transpose`` a ``channels_last`` layout node folded in, or None.

        ONNX Runtime folds a Transpose from NHWC to NCHW (``perm`` 0, r-1, 1, ..., r-2) into the
        ``ReorderInput`` after it, and one from NCHW to NHWC into the ``ReorderOutput`` before it: the node then
        computes that Transpose's output (blocked, for a ReorderInput). It is the one original Transpose that
        reads what the node reads with that permutation; none or several: not mapped."""
        found: set[str] = set()
        for name in source or ():
            for reader in self.readers.get(name, ()):
                if reader.op_type != "Transpose" or reader.domain not in ("", "ai.onnx") or not reader.output \
                        or not reader.output[0]:
                    continue
                perm = next((list(a.ints) for a in reader.attribute if a.name == "perm"), [])
                rank = len(perm)
                expected = [0, rank - 1, *range(1, rank - 1)] if node.op_type == "ReorderInput" \
                    else [0, *range(2, rank), 1]
                if rank > 2 and perm == expected:
                    found.add(reader.output[0])
        if len({self.alike(name) for name in found}) != 1:  # (CSE-equal ones are one)
            log.warning("cannot tell which original tensor ONNX Runtime's %s %r (channels_last) computes: %s "
                        "original Transpose reads its input with that permutation; it is not mapped",
                        node.op_type, node.name, "no" if not found else "more than one")
            return None
        return min(found)

    def _fused_by(self, node: onnx.NodeProto, sources: Sequence[frozenset[str] | None]) -> str | None:
        """The original tensor a fusion's node computes on blocked tensors (a ``QuickGelu`` that a YOLO SiLU,
        ``Mul(c, Sigmoid(c))``, became before the NCHWc transformer renamed its output), or None.

        ONNX Runtime names it after the original node whose output it computes (``/m0/act/Mul/QuickGeluFusion/``);
        that is a proposal, accepted as for a created NCHWc node when the original graph computes that node's
        output from the fused node's inputs and constants alone (:meth:`_computed_from`)."""
        match = _FUSION_NAME.match(node.name)
        named = self.by_name.get(match["node"]) if match else None
        if named is None or not named.output or not named.output[0]:
            log.warning("cannot tell which original tensor %s's %s %r computes: its output has no original name and "
                        "its name names no original node; it is not mapped", node.domain or "ai.onnx", node.op_type,
                        node.name)
            return None
        reads = frozenset().union(*(s for s in sources if s))
        if not reads or not self._computed_from(named.output[0], reads):
            log.warning("cannot tell which original tensor ONNX Runtime's %s %r computes: the original graph does "
                        "not compute %r from its inputs; it is not mapped", node.op_type, node.name, named.output[0])
            return None
        return named.output[0]

    def _kept(self, node: onnx.NodeProto, sources: Sequence[frozenset[str] | None]) -> str | None:
        """The original node ``node`` is (same op, attributes and inputs): its output, or None."""
        first = next((s for s in sources if s), None)
        if first is None:
            return None
        attributes = sorted(a.SerializeToString(deterministic=True) for a in node.attribute)
        found = {id(c): c for name in first for c in self.readers.get(name, ())
                 if c.op_type == node.op_type and len(c.input) == len(node.input) and c.output
                 and all(self._same_input(node.input[k], c.input[k], s) for k, s in enumerate(sources))
                 and sorted(a.SerializeToString(deterministic=True) for a in c.attribute) == attributes}
        candidates = list(found.values())
        same_name = [c for c in candidates if c.name == node.name]
        chosen = same_name[0] if same_name else candidates[0] if len(candidates) == 1 else None
        return chosen.output[0] if chosen is not None and chosen.output[0] else None

    def _same_input(self, mine: str, theirs: str, held: frozenset[str] | None) -> bool:
        """Whether the optimized input ``mine`` (holding the original tensors ``held``; None for an optimized
        initializer) is the original input ``theirs``. An initializer is the same one when it keeps an original
        name; one the optimizer made (a folded constant) can only stand for a constant."""
        if held is not None:
            return theirs in held
        if not mine:
            return not theirs
        return theirs in self.alike(mine) if mine in self.known else theirs in self.constant

    def _named_tensor(self, base: str) -> str | None:
        """The original tensor a created node's name base names: ``r2`` or ``r8_bn`` (an op tag appended)."""
        if base in self.producer:
            return base
        stem, _, tag = base.rpartition("_")
        return stem if stem in self.producer and tag.isalpha() else None

    def _computed_from(self, tensor: str, sources: frozenset[str]) -> bool:
        """Whether the original graph computes ``tensor`` from ``sources`` and constants alone, through
        tensors the optimized graph does not hold elsewhere (else the node would read them, not compute
        them)."""
        if self._everything_held is None:  # kept up to date from here on (_hold): made once, not per call
            self._everything_held = {name for names in self.held.values() for name in names}
        held = self._everything_held
        seen: set[str] = set()
        pending = [tensor]
        reached = False
        while pending:
            node = self.producer[pending.pop()]
            for name in node.input:
                if not name or name in seen:
                    continue
                seen.add(name)
                if name in sources:
                    reached = True
                elif name in self.constant:
                    continue
                elif name in self.producer and name not in held:  # (not among ``sources``: checked above)
                    pending.append(name)
                else:
                    return False
        return reached

    def _fused_after(self, node: onnx.NodeProto, base: str, sources: Sequence[frozenset[str] | None]) -> str | None:
        """The tensor ``node`` computes: ``base``, extended by the ``Add``/``Sum`` fused as its fourth input and
        then the activation named by its ``activation`` attribute (each the only reader of the tensor before
        it). An activation fused before the transformer ran (a ``FusedConv``) wrote ``base`` itself."""
        steps: list[tuple[frozenset[str], frozenset[str] | None]] = []
        if node.op_type == "Conv":
            if len(node.input) > 3 and node.input[3]:
                steps.append((frozenset({"Add", "Sum"}), sources[3] or frozenset()))
            activation = next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "activation"),
                              None)
            if isinstance(activation, bytes):
                kind = activation.decode()
                if steps or self.producer[base].op_type != kind:
                    steps.append((frozenset({kind}), None))
        tensor = base
        for kinds, other in steps:
            mine = self.alike(tensor)
            read = list({id(r): r for name in mine for r in self.readers.get(name, ())}.values())
            ok = len(read) == 1 and read[0].op_type in kinds and bool(read[0].output) \
                and read[0].output[0] in self.producer
            if ok and other is not None:
                rest = [name for name in read[0].input if name not in mine]
                ok = len(rest) == 1 and rest[0] in other
            if not ok:
                log.warning("ONNX Runtime's %s fused a %s after %r that the original graph does not show: its "
                            "output is not mapped", node.name, "/".join(sorted(kinds)), tensor)
                return None
            tensor = read[0].output[0]
        return tensor


def _constant_tensors(nodes: Sequence[onnx.NodeProto], constants: Mapping[str, onnx.TensorProto]) -> set[str]:
    """Initializers and what nodes compute from them alone (a converted model's ConstantOfShape weights)."""
    constant = set(constants)
    for node in nodes:
        if node.op_type not in _NONDETERMINISTIC and all(not name or name in constant for name in node.input):
            constant.update(name for name in node.output if name)
    return constant


def _is_layout(node: onnx.NodeProto) -> bool:
    """A blocked-layout conversion that keeps values (not a ``channels_last`` transpose)."""
    if node.op_type not in _LAYOUT or node.domain not in _LAYOUT_DOMAINS:
        return False
    return not any(a.name == "channels_last" and a.i for a in node.attribute)
