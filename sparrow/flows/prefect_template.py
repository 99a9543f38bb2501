"""A new Prefect database as a copy of an empty one that this Prefect version made before.

Prefect's temporary API server makes its SQLite database under PREFECT_HOME when it first
starts there: every migration of its schema, then the block types it registers. On 2 cores
that is about 8 s (12 s to the first answer against 4 s on a database already made), paid
again by every new PREFECT_HOME: each arm of a study run at once has its own, and so does
every test command that starts its own server. The first server that makes a database leaves
a copy in Sparrow's cache folder ($SPARROW_CACHE_DIR, else ~/.cache/sparrow), named by the
Prefect version (each version's migrations end at its own schema); a later new home starts
from the copy, and the server finds its schema current and only checks it.

    from sparrow.flows import prefect_template
    made = prefect_template.seed_database()   # before the server starts: "copied", "new", "kept"
    ...                                       # the server answers its health check
    if made == "new":
        prefect_template.keep_template()      # this home's database becomes the template

A database named by PREFECT_SERVER_DATABASE_CONNECTION_URL (or its older name
PREFECT_API_DATABASE_CONNECTION_URL) is the user's and is left alone, as is any database
already in the home. A template that cannot be read or written is skipped: the server then
makes its database as it would without one.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from importlib.metadata import version
from pathlib import Path

from sparrow.cache import cache_dir
from sparrow.storage.prefect_store import copy_empty_database, remove_database

DATABASE_URL_KEYS = (
    "PREFECT_SERVER_DATABASE_CONNECTION_URL",
    "PREFECT_API_DATABASE_CONNECTION_URL",
)


def database_path() -> Path | None:
    """The SQLite file Prefect's server uses under PREFECT_HOME (~/.prefect by default), or None
    when the environment names a database of its own."""
    if any(os.environ.get(key) for key in DATABASE_URL_KEYS):
        return None
    home = Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()
    return home / "prefect.db"


def template_path() -> Path:
    """Where the empty database of the installed Prefect version is kept."""
    return cache_dir() / f"prefect-{version('prefect')}-empty.db"


def seed_database() -> str:
    """Copy the template into a home that has no database yet: "copied"; "new" when there is
    no template to copy (the server will make the database); "kept" when the home already has
    one or the environment names another."""
    database = database_path()
    if database is None or database.exists():
        return "kept"
    template = template_path()
    if not template.is_file():
        return "new"
    scratch = database.with_name(f".{database.name}.tmp-{os.getpid()}")
    try:
        database.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, scratch)
        os.replace(scratch, database)  # whole or not at all: a killed copy leaves no database
    except OSError:
        scratch.unlink(missing_ok=True)
        return "new"
    return "copied"


def keep_template() -> bool:
    """Keep a copy of the home's database, which a server has just made, as the template of
    this Prefect version; False (nothing kept) when one is kept already, the database holds a
    flow run or is not at a migration, or the cache cannot be written. The copy is SQLite's
    own backup of a consistent state (the server may be writing; sparrow.storage.prefect_store),
    renamed into place whole."""
    database, template = database_path(), template_path()
    if database is None or not database.is_file() or template.is_file():
        return False
    part = template.with_name(f".{template.name}.tmp-{os.getpid()}")
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        if not copy_empty_database(database, part):
            return False
        os.replace(part, template)
    except (OSError, sqlite3.Error):
        remove_database(part)
        return False
    return True
