"""The local executor: worker processes, exceptions passed through, lost workers retried once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from graphbisect.errors import SpecError
from graphbisect.executors import ExecutorSpec, WorkerLostError, make_executor
from graphbisect.executors.local import LocalExecutor


def square(x: int) -> int:
    return x * x


def fail(message: str) -> None:
    raise ValueError(message)


def die_once(marker: str) -> int:
    """Kill this worker process the first time (the marker file remembers), succeed the second."""
    if not Path(marker).exists():
        Path(marker).touch()
        os._exit(9)
    return os.getpid()


def die_always() -> None:
    os._exit(9)


def test_spec_parsing() -> None:
    assert ExecutorSpec.parse("local") == ExecutorSpec("local")
    assert ExecutorSpec.parse("ray") == ExecutorSpec("ray")
    assert ExecutorSpec.parse("ray:auto") == ExecutorSpec("ray", "auto")
    with pytest.raises(SpecError) as err:
        ExecutorSpec.parse("dask")
    assert err.value.hint


def test_results_and_exceptions() -> None:
    with make_executor("local", jobs=2) as ex:
        assert ex.workers == 2 and ex.name == "local"
        assert [ex.submit(square, i).result() for i in range(4)] == [0, 1, 4, 9]
        with pytest.raises(ValueError, match="boom"):  # the task's own error: not retried
            ex.submit(fail, "boom").result()


def test_lost_worker_is_retried_once(tmp_path: Path) -> None:
    with LocalExecutor(jobs=1) as ex:
        pid = ex.submit(die_once, str(tmp_path / "marker")).result(timeout=60)
        assert pid != os.getpid() and ex.lost == 1
        with pytest.raises(WorkerLostError) as err:
            ex.submit(die_always).result(timeout=60)
        assert err.value.hint and "died 2 times" in err.value.message
        assert ex.submit(square, 3).result(timeout=60) == 9  # the executor still works
