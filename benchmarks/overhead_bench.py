"""graphbisect's own cost per reduce candidate (materialize + serialize + check, backend excluded), 2,000–50,000 nodes.

For each model, one oracle run fills the activation store, then random node subsets of several sizes (10
nodes, 1 %, 50 % and 100 % of the model) and contiguous topological slices of the same sizes (what prefix and
suffix bisection try) are turned into candidates exactly as :class:`graphbisect.oracle.tester.CandidateTester`
does before it hands one to a backend:

* ``materialize``: :meth:`graphbisect.strategies.subgraph.SubgraphSpace.materialize` (cut tensors fed from the
  store, outputs at the frontier, initializers referenced into the shared ``weights.bin``);
* ``save``: ``Candidate.save`` (atomic write of the candidate file, no fsync, as the tester);
* ``check``: ``SubgraphSpace.check(candidate, path)``, the tester's last gate before a run (on a model that
  passes ``onnx.checker`` itself: the checker's verdict on the pieces the candidate adds);
* ``hash``: the tester's hashes: of the model's bytes (``Candidate.digest``, what a re-verification
  compares) and, on older code, of the node set (the candidate file's name; now a counter);
* ``feeds``: handing the candidate's feeds (original inputs and cut tensors) to the backend worker, both
  halves: ``write`` what ``BackendProcess.run`` does with them in the host (``InputsWriter.write`` and the
  JSON of the request's inputs entry; before it, ``save_npz``), ``read`` what the worker does before it
  calls the runtime (``InputsReader.read``; before it, ``load_npz``), as for one target worker that runs
  every candidate of the table in turn. Measured in this process: the worker runs the same code. The space
  is given the activation store where ``SubgraphSpace`` takes one (as ``reduce`` does): its cut points are
  then declared when it is made (the setup table's ``declarations`` column) and a candidate's stored feeds
  go to the worker by name, read there from the store (``worker store open``: its index read and checked,
  once per worker, timed apart from the rows).

Run against older code (``PYTHONPATH`` pointing at another checkout), ``save`` is ``save_proto(candidate.proto)``
and ``check`` is ``onnx.checker.check_model(path)``, and the feeds go through an ``.npz``, as the tester did then.

Reported: mean and p95 milliseconds per candidate, microseconds per kept node (flat across model sizes when
the cost is proportional to the candidate, not to the model), the candidate file's size, the bytes of
weights it *references* in ``weights.bin`` and the weight bytes it *copies* (must be 0: weights are never
copied per candidate). A third model, a 72 MiB transformer (hidden 256), makes that last point visible: the
hosts' weights are tiny (a shared pool of 16).

The activation store comes from ``compare_models(..., layerwise=True, workdir=...)``. The setup table also
times ``Model.with_outputs`` (the probe ``compare`` and ``reduce`` build), which was quadratic before commit
bd8b8b3 (928 s at 50,000 nodes).

Run: ``python benchmarks/overhead_bench.py [--quick | --full] [--profile] [--json PATH]``
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import io
import json
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from _common import add_size_args, describe_machine, dir_size, print_table, write_json

from graphbisect.backends import worker
from graphbisect.data import ActivationStore
from graphbisect.examples import host_network, transformer, transformer_inputs
from graphbisect.model import Model, load_model, save_proto
from graphbisect.oracle import tester
from graphbisect.strategies.subgraph import Candidate, SubgraphSpace
from graphbisect.workflows.compare import compare_models

try:  # feeds that name the store's tensors (the worker reads them); absent in older code
    from graphbisect.data.store import StoredFeeds
except ImportError:  # pragma: no cover - older checkouts
    StoredFeeds = None  # type: ignore[assignment,misc]

KINDS = ("random", "slice")


@dataclass(frozen=True)
class Subject:
    """A model under test with its inputs and how long it took to build, load and capture."""

    name: str
    model: Model
    inputs: dict[str, np.ndarray]
    build_s: float


def build_subject(name: str) -> Subject:
    """``host-N`` (``host_network(N)``) or ``transformer-h256`` (24 layers, hidden 256, 72 MiB of weights)."""
    started = time.perf_counter()
    if name.startswith("host-"):
        host = host_network(int(name.split("-")[1]))
        proto, inputs = host.model, dict(host.inputs)
    else:
        proto, inputs = transformer(hidden=256, heads=4), transformer_inputs()
    return Subject(name, load_model(proto), inputs, time.perf_counter() - started)


# ------------------------------------------------------------------------------------------- the store


def capture(subject: Subject, folder: Path) -> tuple[Path, float]:
    """The oracle activation store of ``subject`` from ``compare_models(layerwise=True)``: (folder, seconds)."""
    started = time.perf_counter()
    compare_models(subject.model, inputs=subject.inputs, layerwise=True, workdir=folder)
    return folder / "activations", time.perf_counter() - started


def probe_seconds(model: Model) -> float:
    """Seconds to build the probe exposing every tensor (``compare`` and ``reduce`` build it; once O(n²))."""
    started = time.perf_counter()
    model.with_outputs(model.intermediate_names())
    return time.perf_counter() - started


@dataclass
class StoreReads:
    """Reads of the activation store (``ActivationStore.get``) made while materializing: how many, how long."""

    count: int = 0
    seconds: float = 0.0


def make_space(subject: Subject, store_dir: Path, folder: Path) -> tuple[SubgraphSpace, float]:
    store = ActivationStore.open(store_dir)
    reads = StoreReads()

    def value(name: str) -> np.ndarray:
        if name in subject.inputs:
            return subject.inputs[name]
        started = time.perf_counter()
        try:
            return store.get(name)
        finally:
            reads.count += 1
            reads.seconds += time.perf_counter() - started

    started = time.perf_counter()
    if "store" in inspect.signature(SubgraphSpace).parameters:  # cut points declared from the store's index
        space = SubgraphSpace(subject.model, value, folder / "candidates", store=store)
    else:
        space = SubgraphSpace(subject.model, value, folder / "candidates")
    elapsed = time.perf_counter() - started
    space.store_reads = reads  # type: ignore[attr-defined]  # the benchmark's own counter
    space.handoff = Handoff(space.workdir)  # type: ignore[attr-defined]  # as one target worker
    space.worker_open_s = open_store(space.handoff, store)  # type: ignore[attr-defined]
    return space, elapsed


def open_store(handoff: Handoff, store: ActivationStore) -> float:
    """Seconds the worker takes to open the activation store the first time a request names one of its
    tensors (its index read and checked; once per worker), or 0.0 where feeds never name the store."""
    if StoredFeeds is None or handoff.writer is None:
        return 0.0
    name = next(name for name in store.names() if store.describe(name) is not None)
    started = time.perf_counter()
    handoff.receive(handoff.send(StoredFeeds([name], {}, store, store.get)))
    return time.perf_counter() - started


# ------------------------------------------------------------------------------------------ candidates


def subset(kind: str, size: int, total: int, rng: random.Random) -> frozenset[int]:
    """``size`` random node indices, or a contiguous slice of ``size`` nodes at a random offset."""
    if kind == "random":
        return frozenset(rng.sample(range(total), size))
    start = rng.randrange(total - size + 1)
    return frozenset(range(start, start + size))


@dataclass(frozen=True)
class Sample:
    """The cost of one candidate, in seconds, and what it contains."""

    materialize: float
    save: float
    check: float
    hash: float
    feeds_write: float
    feeds_read: float
    file_bytes: int
    referenced_bytes: int  # weights the candidate points to in weights.bin
    copied_bytes: int  # weights of weights.bin copied into the candidate (must be 0)
    feeds: int
    store_reads: int  # values read from the store during materialize (the space keeps small ones after)
    store_seconds: float


def weight_bytes(space: SubgraphSpace, candidate: Candidate) -> tuple[int, int]:
    """(bytes referenced in weights.bin, bytes of those weights copied inline) for one candidate."""
    referenced = copied = 0
    for tensor in candidate.proto.graph.initializer:
        ref = space.refs.get(tensor.name)
        if ref is None:
            continue
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            referenced += ref.length
        else:
            copied += ref.length
    return referenced, copied


def save(candidate: Candidate, path: Path) -> None:
    """Write the candidate as :class:`CandidateTester` does: a scratch file, no fsync. (Before commit
    "strategies: candidates assembled from serialized pieces" a candidate was a ModelProto to serialize;
    the fallback lets this script measure that code too, for before/after rows.)"""
    if hasattr(candidate, "save"):
        candidate.save(path, durable=False)
    else:
        save_proto(candidate.proto, path, durable=False)


def check(space: SubgraphSpace, candidate: Candidate, path: Path) -> None:
    """The tester's checker gate on a model that passes ``onnx.checker`` itself (the hosts and the
    transformer do): ``SubgraphSpace.check``, which checks the candidate's new pieces; before it,
    ``onnx.checker.check_model`` on the file."""
    if hasattr(space, "check"):
        invalid = space.check(candidate, path)
        if invalid:
            raise AssertionError(f"the checker refuses a candidate: {invalid}")
    else:
        onnx.checker.check_model(str(path))


def hashes(keep: frozenset[int], candidate: Candidate) -> str:
    """The tester's hashes of a candidate: of its bytes (the digest ``CandidateTester.tested`` keeps) and,
    before the tester named candidate files by a counter, of its node set."""
    named = getattr(tester, "_digest", None)
    return (named(keep) if named is not None else "") + candidate.digest


class Handoff:
    """A candidate's feeds handed to a backend worker as ``BackendProcess.run`` and the worker do it: one
    ``InputsWriter`` and one ``InputsReader`` per worker, kept across its runs (before them: an ``.npz``,
    written by the host and read by the worker each run)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.writer = worker.InputsWriter(folder) if hasattr(worker, "InputsWriter") else None
        self.reader = worker.InputsReader() if hasattr(worker, "InputsReader") else None

    def send(self, feeds: Mapping[str, Any]) -> Any:
        """The host's half, up to the request's JSON (``_Worker.send`` encodes it)."""
        if self.writer is None:
            return str(worker.save_npz(self.folder / "inputs.npz", feeds))
        return json.dumps(self.writer.write(feeds, pid=1))

    def receive(self, sent: Any) -> dict[str, Any]:
        """The worker's half, from the request's JSON to the arrays the runtime gets."""
        if self.reader is None:
            return worker.load_npz(sent)
        return self.reader.read(json.loads(sent))


def one_candidate(space: SubgraphSpace, keep: frozenset[int], path: Path) -> Sample:
    """Materialize, save, check, hash one candidate and hand its feeds over as the tester does; time each."""
    reads: StoreReads = space.store_reads  # type: ignore[attr-defined]
    before = reads.count, reads.seconds
    t0 = time.perf_counter()
    candidate = space.materialize(keep)
    t1 = time.perf_counter()
    save(candidate, path)
    t2 = time.perf_counter()
    check(space, candidate, path)
    t3 = time.perf_counter()
    hashes(keep, candidate)
    t4 = time.perf_counter()
    handoff: Handoff = space.handoff  # type: ignore[attr-defined]
    sent = handoff.send(candidate.feeds)  # as the tester passes them
    t5 = time.perf_counter()
    received = handoff.receive(sent)
    t6 = time.perf_counter()
    if list(received) != list(candidate.feeds):
        raise AssertionError("the worker would not get the candidate's feeds")
    referenced, copied = weight_bytes(space, candidate)
    size = path.stat().st_size
    path.unlink()
    return Sample(t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, size, referenced, copied,
                  len(candidate.feeds), reads.count - before[0], reads.seconds - before[1])


#: The steps of a candidate, as Sample fields; "total" is their sum.
STEPS = ("materialize", "save", "check", "hash", "feeds_write", "feeds_read")


def total_ms(sample: Sample) -> float:
    return sum(getattr(sample, step) for step in STEPS) * 1e3


def sizes_for(total: int) -> list[int]:
    return sorted({min(10, total), max(1, total // 100), total // 2, total})


def repeats_for(size: int, quick: bool) -> int:
    if size <= 1000:
        return 10 if quick else 30
    return 3 if size > 20000 or quick else 5


def p95(values: Sequence[float]) -> float:
    return float(np.percentile(values, 95))


def measure(space: SubgraphSpace, kind: str, size: int, repeats: int, seed: int) -> dict[str, Any]:
    """Mean/p95 of each step over ``repeats`` fresh subsets of ``size`` nodes."""
    rng = random.Random(f"{seed}-{kind}-{size}")
    keeps = [subset(kind, size, space.size, rng) for _ in range(repeats)]
    samples = [one_candidate(space, keep, space.workdir / "candidate.onnx") for keep in keeps]
    # The same subsets again: every boundary tensor has been seen (its value read, its declaration made),
    # as for most candidates of a reduction, whose subsets share their boundaries.
    again = [one_candidate(space, keep, space.workdir / "candidate.onnx") for keep in keeps]
    out: dict[str, Any] = {"kind": kind, "nodes": size, "repeats": repeats}
    for step in STEPS:
        values = [getattr(s, step) * 1e3 for s in samples]
        out[f"{step}_ms"] = {"mean": statistics.fmean(values), "p95": p95(values)}
    totals = [total_ms(s) for s in samples]
    out["total_ms"] = {"mean": statistics.fmean(totals), "p95": p95(totals)}
    out["us_per_node"] = 1e3 * out["total_ms"]["mean"] / size
    totals = [total_ms(s) for s in again]
    out["again_ms"] = {"mean": statistics.fmean(totals), "p95": p95(totals)}
    for key in ("file_bytes", "referenced_bytes", "copied_bytes", "feeds"):
        out[key] = max(getattr(s, key) for s in samples)
    out["store_reads"] = statistics.fmean(s.store_reads for s in samples)
    out["store_ms"] = statistics.fmean(s.store_seconds * 1e3 for s in samples)
    return out


def profile(space: SubgraphSpace, kind: str, size: int, repeats: int = 20, top: int = 14) -> str:
    """cProfile's top entries (cumulative time) over ``repeats`` candidates of ``size`` nodes."""
    rng = random.Random(f"profile-{kind}-{size}")
    keeps = [subset(kind, size, space.size, rng) for _ in range(repeats)]
    profiler = cProfile.Profile()
    profiler.enable()
    for keep in keeps:
        one_candidate(space, keep, space.workdir / "candidate.onnx")
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(top)
    return text.getvalue()


# ------------------------------------------------------------------------------------------------ main


def run_subject(name: str, args: argparse.Namespace, root: Path, log: Callable[[str], None]) -> dict[str, Any]:
    subject = build_subject(name)
    folder = root / name
    folder.mkdir(parents=True)
    probe_s = probe_seconds(subject.model)
    store_dir, capture_s = capture(subject, folder)
    space, space_s = make_space(subject, store_dir, folder)
    log(f"{name}: built {subject.build_s:.1f} s, compare {capture_s:.1f} s, space {space_s:.2f} s")
    rows = [measure(space, kind, size, repeats_for(size, args.quick), args.seed)
            for size in sizes_for(space.size) for kind in KINDS]
    weights = (space.workdir / "weights.bin").stat().st_size
    result = {"model": name, "nodes": space.size, "build_s": subject.build_s, "with_outputs_s": probe_s,
              "capture_s": capture_s, "space_init_s": space_s,
              "declare_s": getattr(space, "declare_seconds", 0.0), "worker_open_s": space.worker_open_s,
              "weights_bin_bytes": weights,
              "store": dir_size(store_dir).to_json(), "rows": rows}
    if args.profile:
        result["profile"] = {f"{kind}-{size}": profile(space, kind, size, repeats=20 if size <= 1000 else 3)
                             for kind in KINDS
                             for size in (min(10, space.size), max(1, space.size // 100), space.size // 2)}
    return result


def table_rows(results: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for entry in results:
        for r in entry["rows"]:
            rows.append([entry["model"], str(entry["nodes"]), r["kind"], str(r["nodes"]), str(r["repeats"]),
                         *(f"{r[f'{s}_ms']['mean']:.2f}/{r[f'{s}_ms']['p95']:.2f}" for s in (*STEPS, "total")),
                         str(r["feeds"]), f"{r['store_reads']:.0f}", f"{r['store_ms']:.2f}",
                         f"{r['again_ms']['mean']:.2f}/{r['again_ms']['p95']:.2f}",
                         f"{r['us_per_node']:.1f}", f"{r['file_bytes'] / 1024:.1f}",
                         f"{r['referenced_bytes'] / 1024:.1f}", str(r["copied_bytes"]),
                         f"{entry['weights_bin_bytes'] / 1024:.0f}"])
    return rows


def setup_rows(results: Sequence[dict[str, Any]]) -> list[list[str]]:
    return [[e["model"], str(e["nodes"]), f"{e['build_s']:.1f}", f"{e['with_outputs_s']:.2f}", f"{e['capture_s']:.1f}",
             f"{e['space_init_s']:.2f}", f"{e['declare_s']:.2f}", f"{e['worker_open_s']:.2f}",
             f"{e['store']['files']}", f"{e['store']['apparent_bytes'] / 2**20:.1f}",
             f"{e['store']['disk_bytes'] / 2**20:.0f}"] for e in results]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_args(parser)
    parser.add_argument("--models", nargs="+", help="host-N and/or transformer-h256 "
                        "(default host-2000 host-50000 transformer-h256; --quick: host-2000; --full adds host-100000)")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top entries per model")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.models or (["host-2000"] if args.quick else
                            ["host-2000", "host-50000", "host-100000", "transformer-h256"] if args.full else
                            ["host-2000", "host-50000", "transformer-h256"])
    with tempfile.TemporaryDirectory(prefix="overhead-bench-") as root:
        results = [run_subject(name, args, Path(root), lambda m: print(m, file=sys.stderr, flush=True))
                   for name in names]
    print(f"Per-candidate overhead, backend excluded ({describe_machine()})")
    print_table("Setup (once per model)", ["model", "nodes", "build+load s", "probe s", "compare s",
                "SubgraphSpace s", "of it declarations s", "worker store open s", "store files", "store MiB",
                "on disk MiB"], setup_rows(results), left=1,
                notes=["probe: Model.with_outputs(every tensor), the probe compare and reduce build; compare: "
                       "compare_models(layerwise=True), which fills the store.",
                       "declarations: of SubgraphSpace, every stored cut point and output declared (and checked) "
                       "from the store's index, once per search (0: older code, which declares on first touch); "
                       "worker store open: the worker reading and checking the store's index, the first time a "
                       "request names its tensors (once per worker; 0: older code, which sends every value)."])
    print_table("Per candidate: mean/p95 ms", ["model", "nodes", "subset", "kept", "reps", "materialize", "save",
                "check", "hash", "feeds write", "feeds read", "total", "feeds", "reads", "reads ms", "again",
                "us/node", "file KiB", "refs KiB", "copied B", "weights.bin KiB"],
                table_rows(results), left=3,
                notes=["hash: the tester's hashes (node set, model bytes); feeds write/read: the feeds handed to the "
                       "backend worker, host side and worker side (an .npz before InputsWriter); feeds: the most "
                       "feeds of a candidate in the row.",
                       "reads / reads ms: values read from the activation store during materialize (mean per "
                       "candidate; part of materialize): a tensor's first time at the boundary (the space keeps "
                       "values up to 64 KiB), every time for larger ones.",
                       "again: total of the same subsets a second time (every boundary tensor seen before, as for "
                       "most candidates of a reduction).",
                       "refs KiB: weights the candidate references in weights.bin; copied B: weight bytes copied into "
                       "the candidate (0 = never copied)."])
    for entry in results:
        for label, text in entry.get("profile", {}).items():
            print(f"\ncProfile, {entry['model']}, {label}-node candidates:\n{text}")
    write_json(args.json, {"benchmark": "overhead", "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
