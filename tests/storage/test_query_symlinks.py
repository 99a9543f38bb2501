"""A symbolic link under a workdir's runs/ is refused by `sparrow query`'s sandbox (DuckDB 2.x
resolves it and the fence is on the resolved path), whether it names a file or a folder
outside; docs/storage.md says so.

Run: `python -m pytest tests/storage/test_query_symlinks.py -q`.
"""

from __future__ import annotations

import duckdb
import pytest

from sparrow.storage import Store
from sparrow.storage.errors import StorageError
from sparrow.storage.query import query


def _parquet(path, value: int) -> None:
    duckdb.sql(f"COPY (SELECT {value} AS x) TO '{path}' (FORMAT parquet)")


def test_links_under_runs_are_refused_and_plain_files_read(tmp_path):
    workdir = tmp_path / "w"
    Store.open_writer(workdir).close()
    (workdir / "runs" / "r1").mkdir(parents=True)
    _parquet(workdir / "runs" / "r1" / "inside.parquet", 2)
    _parquet(tmp_path / "outside.parquet", 1)
    (workdir / "runs" / "r1" / "link.parquet").symlink_to(tmp_path / "outside.parquet")
    (workdir / "runs" / "folder").symlink_to(tmp_path)
    inside = f"SELECT x FROM read_parquet('{workdir}/runs/r1/inside.parquet')"
    assert query(workdir, inside).rows == [(2,)]
    for path in ("runs/r1/link.parquet", "runs/folder/outside.parquet"):
        with pytest.raises(StorageError, match="disabled by configuration"):
            query(workdir, f"SELECT x FROM read_parquet('{workdir}/{path}')")
