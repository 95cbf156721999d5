"""Handler mistakes: what ``@pgpool.handler`` refuses at registration, and what happens to a
value a handler returns.

Registration is checked in this process (the functions below are module-level, so only the
mistake under test is wrong with them); the returned-value rule also through a real
``pgpool run``, whose workers import the handlers as any deployment does.
"""

from __future__ import annotations

import asyncio
import functools
import textwrap
from pathlib import Path

import psycopg
import pytest
from commands import MARKER, assert_user_error, run_pgpool

import pgpool
from pgpool import HandlerError, registry


def generator(payload):
    yield payload


async def async_generator(payload):
    yield payload


class Jobs:
    def method(self, payload):
        pass


def plain(payload):
    pass


def returns_a_value(payload):
    return {"echo": payload}


async def returns_a_value_async(payload):
    return [payload]


def nested():
    def inner(payload):
        pass

    return inner


REFUSED = {
    "generator": (generator, ["generator function", "test_handlers.generator", "return"]),
    "async-generator": (async_generator, ["generator function", "async_generator"]),
    "bound-method": (Jobs().method, ["is a method", "top level of a module"]),
    "method": (Jobs.method, ["Jobs.method", "cannot be imported by its module and name"]),
    "nested": (nested(), ["nested.<locals>.inner", "cannot be imported"]),
    "lambda": (lambda payload: None, ["<lambda>", "cannot be imported"]),
    "non-callable": (5, ["is not callable (a int)", "plain `def`"]),
    "string": ("plain", ["is not callable (a str)"]),
    "class": (Jobs, ["is a class", "plain `def`"]),
    "partial": (functools.partial(plain), ["is a partial", "plain `def`"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_registration_refuses_what_a_worker_cannot_run(case: str) -> None:
    fn, needles = REFUSED[case]
    kind = f"refused-{case}"
    with pytest.raises(HandlerError) as caught:
        pgpool.handler(kind)(fn)
    message = str(caught.value)
    assert "\n" not in message
    assert f"handler {kind!r}" in message
    for needle in needles:
        assert needle in message
    assert kind not in registry.registered()


def test_what_a_handler_returns_comes_back_from_run() -> None:
    # The worker sends it to its dispatcher, which keeps it or drops it (with a warning:
    # tests/api/test_outcomes.py).
    pgpool.handler("test-returns")(returns_a_value)
    pgpool.handler("test-returns-async")(returns_a_value_async)
    handlers = registry.registered()
    assert handlers["test-returns"].run({"n": 1}) == {"echo": {"n": 1}}
    assert asyncio.run(handlers["test-returns-async"].run({"n": 1})) == [{"n": 1}]
    # Registration hands back a Handler, which calls the function as written: callers and
    # tests see its value.
    returning = pgpool.handler("test-returns")(returns_a_value)
    assert isinstance(returning, pgpool.Handler) and returning.fn is returns_a_value
    assert returning({"n": 1}) == {"echo": {"n": 1}}
    assert returning.__name__ == "returns_a_value" and returning.__wrapped__ is returns_a_value
    assert handlers["test-returns"].qualname == "test_handlers.returns_a_value"


def test_a_handler_that_returns_a_value_succeeds_in_a_real_run(
    dsn: str, db: psycopg.Connection, tmp_path: Path
) -> None:
    (tmp_path / "returning.py").write_text(textwrap.dedent('''
        import pgpool

        @pgpool.handler("returning")
        def returning(payload):
            return payload
    '''))
    jobs = [pgpool.enqueue(db, "returning", {"secret": MARKER, "n": n}) for n in range(3)]
    assert len(set(jobs)) == 3
    done = run_pgpool(dsn, "run", "--handlers", "returning", "--burst", "--procs", "1",
                      PYTHONPATH=str(tmp_path))
    assert done.returncode == 0, done.stderr
    # Succeeded: gone from the table, not retried or dead-lettered.
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM pgpool_dead").fetchone()[0] == 0
    assert done.stderr.count("handler 'returning' returned a value, which is dropped") == 1, \
        done.stderr
    assert MARKER not in done.stderr


MISTAKEN_MODULES = {
    "generator": ("@pgpool.handler('gen')\ndef gen(payload):\n    yield 1\n",
                  ["generator function", "mistaken_generator.gen"]),
    "method": ("class Jobs:\n    @pgpool.handler('method')\n    def method(self, payload):\n"
               "        pass\n",
               ["mistaken_method.Jobs.method", "cannot be imported by its module and name"]),
    "renamed": ("@pgpool.handler('renamed')\ndef first(payload):\n    pass\n\n"
                "second = first\ndel first\n",
                ["mistaken_renamed.first", "keep the decorated function under its own name"]),
    "rebound": ("@pgpool.handler('rebound')\ndef first(payload):\n    pass\n\n"
                "def first(payload):\n    pass\n",
                ["mistaken_rebound.first", "keep the decorated function under its own name"]),
}


@pytest.mark.parametrize("case", sorted(MISTAKEN_MODULES))
def test_cli_run_refuses_a_handler_module_with_a_mistake(dsn: str, tmp_path: Path,
                                                         case: str) -> None:
    source, needles = MISTAKEN_MODULES[case]
    module = f"mistaken_{case}"
    (tmp_path / f"{module}.py").write_text("import pgpool\n\n" + source)
    assert_user_error(run_pgpool(dsn, "run", "--handlers", module, "--burst",
                                 PYTHONPATH=str(tmp_path)), *needles)


@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_an_installed_packages_entry_point_handlers_run_without_handlers_given(
    dsn: str, db: psycopg.Connection, tmp_path: Path
) -> None:
    """A package that declares a ``pgpool.handlers`` entry point needs no ``--handlers``: the
    dispatcher finds it, and its workers import what it found (they read no package
    metadata themselves), so its jobs run, beside those of a module given by name."""
    (tmp_path / "installedjobs.py").write_text(textwrap.dedent('''
        import pgpool

        @pgpool.handler("installed")
        def installed(payload):
            pass
    '''))
    (tmp_path / "named.py").write_text(textwrap.dedent('''
        import pgpool

        @pgpool.handler("named")
        def named(payload):
            pass
    '''))
    # An installed distribution, as pip leaves it: what importlib.metadata reads.
    info = tmp_path / "installedjobs-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: installedjobs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pgpool.handlers]\njobs = installedjobs\n")
    pgpool.enqueue(db, "installed", {})
    done = run_pgpool(dsn, "run", "--burst", "--procs", "1", PYTHONPATH=str(tmp_path))
    assert done.returncode == 0, done.stderr
    pgpool.enqueue(db, "installed", {})
    pgpool.enqueue(db, "named", {})
    done = run_pgpool(dsn, "run", "--handlers", "named", "--burst", "--procs", "1",
                      PYTHONPATH=str(tmp_path))
    assert done.returncode == 0, done.stderr
    # Each ran in a worker: a worker without its kind's handler fails the job instead.
    assert db.execute("SELECT (SELECT count(*) FROM pgpool_jobs), "
                      "(SELECT count(*) FROM pgpool_dead)").fetchone() == (0, 0)
