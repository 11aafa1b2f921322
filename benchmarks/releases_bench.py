"""`graphbisect releases`: how many releases it runs to decide N, and what a second run of the same range installs.

Two parts:

* **the search alone** (``graphbisect.releases.search.find_change``) on every change position of N releases, N up
  to 256: the most releases asked, against the bound ceil(log2 N) + 2;
* **real ONNX Runtime releases**, each in its cached environment (``--cache``, default the test suite's folder,
  ``$GRAPHBISECT_TEST_VENVS`` or ``~/.cache/graphbisect/test-venvs``: the releases found there, and this
  interpreter's): a bundle of a model stamped opset 22 (reduced on 1.20.1, which refuses it) searched with
  ``find="fixed"``, the same range again, the LayerNorm mis-fusion bundle with ``find="bad"`` (in every release),
  and the LayerNorm *model* (the oracle run once). Installs, releases run of N, the target's runs, seconds.

* with ``--installers P==V,...``, **pip against uv**: each release's environment made by
  :func:`~graphbisect.releases.environments.prepare_environments` with each installer, from an empty wheel cache
  (cold: everything downloaded) and again from the cache it filled (warm), in temporary folders.

    python benchmarks/releases_bench.py [--quick | --full] [--cache DIR] [--json PATH]
                                        [--installers onnxruntime==1.20.1,openvino==2024.6.0]

``--quick``: the search alone, and the opset-22 bundle. Nothing is installed: a release missing from the cache is
not searched (make them with tests/ort_releases.py, or ``graphbisect releases`` once).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnx

import graphbisect as gb
from benchmarks._common import add_size_args, print_table, write_json
from graphbisect.examples.patterns import pattern_model
from graphbisect.releases.index import release_key
from graphbisect.releases.search import Answer, find_change


def search_alone(sizes: list[int]) -> list[dict[str, Any]]:
    """The most releases ``find_change`` asks over every change position of N releases."""
    rows = []
    for n in sizes:
        worst = 0
        for change in range(n + 1):
            asked = find_change(n, lambda i, c=change: Answer.YES if i >= c else Answer.NO).asked
            worst = max(worst, len(asked))
        rows.append({"releases": n, "most_run": worst, "bound": math.ceil(math.log2(n)) + 2})
    return rows


def cached_releases(cache: Path) -> list[str]:
    """The ONNX Runtime releases with a ready environment in ``cache`` for this Python, and this interpreter's."""
    suffix = f"-py{sys.version_info.major}.{sys.version_info.minor}"
    found = {folder.name[len("onnxruntime-"):-len(suffix)] for folder in cache.glob(f"onnxruntime-*{suffix}")
             if (folder / "ready").exists() and "+" not in folder.name}
    found.add(metadata.version("onnxruntime"))
    return sorted(found, key=release_key)


def _row(case: str, found: Any, seconds: float) -> dict[str, Any]:
    answer = (f"{found.last_good or found.last_bad} -> {found.first_bad or found.first_fixed}" if found.found
              else found.status)
    skips = sum(run.verdict == "skip" for run in found.tested.values())
    return {"case": case, "releases": len(found.versions), "answer": answer, "installs": found.installs,
            "releases_run": found.releases_run, "bound": found.bound, "skips": skips, "runs": found.runs,
            "oracle_runs": found.oracle_runs, "seconds": round(seconds, 1)}


def real_releases(cache: Path, *, quick: bool) -> list[dict[str, Any]]:
    versions = cached_releases(cache)
    if "1.20.1" not in versions or len(versions) < 3:
        print(f"not enough cached releases in {cache} ({', '.join(versions)}): skipping the real releases",
              file=sys.stderr)
        return []
    python = cache / f"onnxruntime-1.20.1-py{sys.version_info.major}.{sys.version_info.minor}" / "bin" / "python"
    rows = []
    with tempfile.TemporaryDirectory(prefix="releases-bench-") as tmp:
        work = Path(tmp)
        stamped = pattern_model("relu_clip_f32")
        opset22 = onnx.helper.make_model(stamped.graph, opset_imports=[onnx.helper.make_opsetid("", 22)],
                                         ir_version=10)
        gb.reduce(opset22, work / "opset22", target=f"onnxruntime:opt_level=all,python={python}")
        fixed = [v for v in versions if release_key(v) >= release_key("1.20.1")]
        for case in ("opset-22 bundle, fixed", "same range again"):
            start = time.monotonic()
            found = gb.releases(work / "opset22", package="onnxruntime", versions=fixed, find="fixed", cache=cache,
                                section=False)
            rows.append(_row(case, found, time.monotonic() - start))
        if quick:
            return rows
        gb.reduce(pattern_model("layernorm_keepdims0"), work / "layernorm", target="onnxruntime:opt_level=all")
        start = time.monotonic()
        found = gb.releases(work / "layernorm", package="onnxruntime", versions=versions, cache=cache, section=False)
        rows.append(_row("LayerNorm bundle, bad", found, time.monotonic() - start))
        onnx.save(pattern_model("layernorm_keepdims0"), work / "layernorm.onnx")
        start = time.monotonic()
        found = gb.releases(work / "layernorm.onnx", package="onnxruntime", versions=versions, cache=cache)
        rows.append(_row("LayerNorm model, bad", found, time.monotonic() - start))
    return rows


def installers(releases: list[str]) -> list[dict[str, Any]]:
    """Seconds to make each release's environment with pip and with uv (where it is there: skipped otherwise),
    from an empty wheel cache and from the cache that filled."""
    from graphbisect.releases.environments import find_uv, prepare_environments

    rows = []
    for release in releases:
        package, _, version = release.partition("==")
        for installer in ("pip", "uv") if find_uv() else ("pip",):
            row: dict[str, Any] = {"release": release, "installer": installer}
            with tempfile.TemporaryDirectory(prefix="graphbisect-installers-") as folder:
                os.environ["PIP_CACHE_DIR" if installer == "pip" else "UV_CACHE_DIR"] = str(Path(folder) / "wheels")
                try:
                    for run in ("cold", "warm"):
                        env = prepare_environments(package, [version], cache=Path(folder) / run, use_host=False,
                                                   installer=installer)[version]
                        row[run] = round(env.seconds, 1) if env.error is None else f"failed: {env.error[:60]}"
                finally:
                    os.environ.pop("PIP_CACHE_DIR" if installer == "pip" else "UV_CACHE_DIR", None)
            rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_size_args(parser)
    base = os.environ.get("GRAPHBISECT_TEST_VENVS")
    parser.add_argument("--cache", type=Path, default=Path(base) if base else
                        Path.home() / ".cache" / "graphbisect" / "test-venvs",
                        help="the release environments (default: the test suite's)")
    parser.add_argument("--installers", metavar="P==V,...",
                        help="time pip against uv making these releases' environments (downloads them twice)")
    args = parser.parse_args()
    sizes = [4, 8, 16, 32] if args.quick else [4, 8, 16, 32, 64, 128, 256] if not args.full else \
        [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    alone = search_alone(sizes)
    print_table("The search alone: the most releases run over every change position",
                ["releases", "most run", "ceil(log2 N)+2"], [[r["releases"], r["most_run"], r["bound"]] for r in alone])
    real = real_releases(args.cache, quick=args.quick)
    if real:
        print_table("Real ONNX Runtime releases (cached environments; runs: the target's, skips' included)",
                    ["case", "N", "answer", "installs", "releases run", "bound", "skips", "runs", "oracle runs", "s"],
                    [[r["case"], r["releases"], r["answer"], r["installs"], r["releases_run"], r["bound"], r["skips"],
                      r["runs"], r["oracle_runs"], r["seconds"]] for r in real])
    timed = installers(args.installers.split(",")) if args.installers else []
    if timed:
        print_table("One environment per release: pip against uv (seconds; cold: an empty wheel cache)",
                    ["release", "installer", "cold s", "warm s"],
                    [[r["release"], r["installer"], r["cold"], r["warm"]] for r in timed])
    write_json(args.json, {"search_alone": alone, "real_releases": real, "installers": timed})
    return 0 if all(r["most_run"] <= r["bound"] for r in alone) else 1


if __name__ == "__main__":
    sys.exit(main())
