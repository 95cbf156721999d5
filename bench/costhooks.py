"""A handler module for bench/hooks_cost.py: worker hooks that do nothing, so a drain
measures what calling them costs."""

from pgpool import JobInfo, hooks


@hooks.on_start
def started(job: JobInfo) -> None:
    pass


@hooks.on_end
def ended(job: JobInfo, outcome: hooks.Outcome, exc: BaseException | None) -> None:
    pass
