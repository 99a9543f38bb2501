"""quiet_prefect's PREFECT_HOME: made with its parents, or one error naming it."""

from __future__ import annotations

import pytest

from sparrow.errors import SparrowError
from sparrow.flows.prefect_env import make_prefect_home


def test_a_home_whose_parents_do_not_exist_is_made(tmp_path, monkeypatch):
    home = tmp_path / "a" / "b" / "prefect"
    monkeypatch.setenv("PREFECT_HOME", str(home))
    make_prefect_home()
    assert home.is_dir() and (home.stat().st_mode & 0o777) == 0o700
    make_prefect_home()  # made already: nothing to do


def test_a_home_under_a_file_is_one_error_naming_it(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "file" / "prefect"))
    with pytest.raises(SparrowError, match=r"PREFECT_HOME=.*file/prefect cannot be made"):
        make_prefect_home()
