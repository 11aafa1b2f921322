"""Make the executor a spec names: the one module that knows every implementation (base.py knows none)."""

from __future__ import annotations

from graphbisect.executors.base import DEFAULT_RETRIES, Executor, ExecutorSpec
from graphbisect.settings.options import JOBS, check_value

__all__ = ["make_executor"]


def make_executor(spec: str | ExecutorSpec, *, jobs: int | None = None, gpus_per_task: float = 0.0,
                  max_retries: int = DEFAULT_RETRIES) -> Executor:
    """The executor named by ``spec``, running up to ``jobs`` tasks at once (default: one per CPU).

    ``gpus_per_task`` is requested from Ray for each task (a backend with ``Capability.NEEDS_GPU``);
    the local executor runs on this machine's GPU and ignores it.
    """
    check_value("make_executor", "jobs", jobs, JOBS.or_none("one per CPU"))
    parsed = spec if isinstance(spec, ExecutorSpec) else ExecutorSpec.parse(spec)
    if parsed.kind == "ray":
        from graphbisect.executors.ray import RayExecutor

        return RayExecutor(parsed.address, jobs=jobs, gpus_per_task=gpus_per_task, max_retries=max_retries)
    from graphbisect.executors.local import LocalExecutor

    return LocalExecutor(jobs=jobs, max_retries=max_retries)
