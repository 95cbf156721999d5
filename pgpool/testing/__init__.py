"""What a project's tests use: the kit (`pgpool.testing.kit`: assertions on enqueued jobs,
`drain`, `run_handler`), imported as ``pgpool.testing``, and the pytest plugin
(`pgpool.testing.plugin`, loaded by pytest through the ``pytest11`` entry point).

The kit's names are read from it when first asked for: loading the plugin imports this
package, and must not import psycopg for a test that asks for no fixture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .kit import (
        Counts,
        EnqueuedJob,
        FollowUp,
        FollowUpGroup,
        HandlerRun,
        assert_enqueued,
        drain,
        enqueued,
        refute_enqueued,
        run_handler,
    )

__all__ = [
    "Counts",
    "EnqueuedJob",
    "FollowUp",
    "FollowUpGroup",
    "HandlerRun",
    "assert_enqueued",
    "drain",
    "enqueued",
    "refute_enqueued",
    "run_handler",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import kit

        return getattr(kit, name)
    raise AttributeError(f"module 'pgpool.testing' has no attribute {name!r}")
