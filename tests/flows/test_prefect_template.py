"""sparrow.flows.prefect_template: a new PREFECT_HOME starts from a copy of a database a server
of this Prefect version made before; a database already there, or one the environment names,
is left alone; only an empty, migrated database becomes the template; and a real server
started on a copied database answers and runs a flow.

Run: `python -m pytest tests/flows/test_prefect_template.py -q`.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from sparrow.flows import prefect_template


@pytest.fixture
def homes(tmp_path, monkeypatch):
    """A cache folder of its own and a function that points PREFECT_HOME at a new home."""
    monkeypatch.setenv("SPARROW_CACHE_DIR", str(tmp_path / "cache"))
    for key in prefect_template.DATABASE_URL_KEYS:
        monkeypatch.delenv(key, raising=False)

    def home(name: str):
        monkeypatch.setenv("PREFECT_HOME", str(tmp_path / name))
        return tmp_path / name / "prefect.db"

    return home


def _made_database(path, flow_runs: int = 0, migrated: bool = True) -> None:
    """What a server leaves: a schema at one migration, block types, `flow_runs` flow runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE flow_run (id TEXT)")
        conn.execute("CREATE TABLE block_type (name TEXT)")
        conn.execute("INSERT INTO block_type VALUES ('secret')")
        if migrated:
            conn.execute("CREATE TABLE alembic_version (version_num TEXT)")
            conn.execute("INSERT INTO alembic_version VALUES ('27d8f4e1a6c9')")
        conn.executemany("INSERT INTO flow_run VALUES (?)", [(str(i),) for i in range(flow_runs)])


def _rows(path, sql: str) -> list[tuple]:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchall()


def test_a_new_home_copies_the_template_a_made_database_left(homes):
    first = homes("first")
    assert prefect_template.seed_database() == "new"  # no template yet: the server makes it
    _made_database(first)
    assert prefect_template.keep_template()
    template = prefect_template.template_path()
    assert template.name.startswith("prefect-") and template.name.endswith("-empty.db")
    assert sorted(p.name for p in template.parent.iterdir()) == [template.name]  # one file
    assert _rows(template, "SELECT name FROM block_type") == [("secret",)]

    second = homes("second")
    assert prefect_template.seed_database() == "copied"
    assert _rows(second, "SELECT version_num FROM alembic_version") == [("27d8f4e1a6c9",)]
    assert not list(second.parent.glob(".prefect.db.tmp-*"))  # renamed into place whole
    assert not prefect_template.keep_template()  # one template is kept, not replaced


def test_a_database_already_there_or_named_elsewhere_is_left_alone(homes, monkeypatch):
    _made_database(homes("made"))
    assert prefect_template.keep_template()
    mine = homes("mine")
    _made_database(mine, flow_runs=3)
    assert prefect_template.seed_database() == "kept"
    assert len(_rows(mine, "SELECT id FROM flow_run")) == 3  # the user's runs stay

    other = homes("other")
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", "sqlite+aiosqlite:////tmp/x.db")
    assert prefect_template.database_path() is None
    assert prefect_template.seed_database() == "kept"
    assert not other.exists()


@pytest.mark.parametrize("flow_runs,migrated", [(1, True), (0, False)])
def test_only_an_empty_migrated_database_becomes_the_template(homes, flow_runs, migrated):
    _made_database(homes("h"), flow_runs=flow_runs, migrated=migrated)
    assert not prefect_template.keep_template()
    assert not prefect_template.template_path().exists()
    assert not list(prefect_template.template_path().parent.glob(".*tmp-*"))


_TWO_SERVERS = textwrap.dedent(
    """
    import json, os, sys, urllib.request
    from sparrow.flows.prefect_env import quiet_prefect
    from sparrow.flows.server_guard import start_local_server
    seen = {}
    for name in ("first", "second"):  # two new homes, one after the other
        os.environ["PREFECT_HOME"] = os.path.join(sys.argv[1], name)
        os.environ.pop("PREFECT_API_URL", None)
        quiet_prefect()
        server = start_local_server()
        if name == "second":  # Prefect is imported once its last server is up
            from prefect import flow

            @flow
            def hello():
                return 7

            seen["flow"] = hello()
        with urllib.request.urlopen(server.api_url + "/health") as answer:
            seen[name] = answer.status
        server.stop()
    print(json.dumps(seen))
    """
)


def test_a_server_starts_on_a_copied_database_and_runs_a_flow(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["SPARROW_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run(
        [sys.executable, "-c", _TWO_SERVERS, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"first": 200, "second": 200, "flow": 7}, seen
    (template,) = (tmp_path / "cache").glob("prefect-*-empty.db")  # the first server's, kept
    first, second = (tmp_path / name / "prefect.db" for name in ("first", "second"))
    assert _rows(template, "SELECT count(*) FROM flow_run") == [(0,)]  # kept before any run
    assert _rows(second, "SELECT count(*) FROM flow_run") == [(1,)]  # the copy took the run
    # block types get new random ids in a database a server makes: the second home's are the
    # template's, so it is the copy, not made again
    ids = "SELECT name, id FROM block_type ORDER BY name"
    assert _rows(second, ids) == _rows(template, ids) == _rows(first, ids)
