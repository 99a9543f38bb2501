"""The per-token Parquet files of a workdir, sorted into readable and damaged ones.

    files = find_token_files(workdir)      # files.readable: [Path], files.damaged: [Damaged]

A file counts as readable when its Parquet footer parses (pyarrow reads the footer only, so
this costs a few milliseconds a file). A damaged file (cut short by a full disk, overwritten
by hand) is left out of the token_mismatch view with a warning naming it, so one bad step
does not break every query, `sparrow runs` and `sparrow report` for the whole workdir.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from sparrow.errors import SparrowWarning
from sparrow.storage.schema import OLD_TOKEN_COLUMNS, TOKEN_FILE_GLOB

_STEP_DIR = re.compile(r"step-(\d+)$")


class DamagedFileWarning(SparrowWarning):
    """A workdir file that could not be read and was left out."""


@dataclass(frozen=True)
class Damaged:
    path: Path
    reason: str

    @property
    def run_id(self) -> str:
        return self.path.parents[2].name

    @property
    def step(self) -> int | None:
        match = _STEP_DIR.search(self.path.parents[1].name)
        return int(match.group(1)) if match else None


@dataclass(frozen=True)
class TokenFiles:
    readable: list[Path] = field(default_factory=list)
    damaged: list[Damaged] = field(default_factory=list)
    # readable files written before a column was renamed (OLD_TOKEN_COLUMNS)
    old_columns: list[Path] = field(default_factory=list)
    # every column some readable file holds (a column added later is missing from older files)
    columns: set[str] = field(default_factory=set)


def find_token_files(workdir: str | Path, warn: bool = True) -> TokenFiles:
    """Every tokens.parquet under the workdir's runs, checked; warns once per damaged file."""
    files = TokenFiles()
    for path in sorted(Path(workdir).resolve().glob(TOKEN_FILE_GLOB)):
        try:
            names = pq.read_metadata(path).schema.names
        except Exception as err:  # pyarrow raises ArrowInvalid, OSError, ... for a bad file
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            files.damaged.append(Damaged(path, reason))
            if warn:
                warnings.warn(
                    DamagedFileWarning(
                        f"skipped damaged Parquet file {path} ({reason}); its step's tokens are "
                        f"missing from token_mismatch"
                    ),
                    stacklevel=2,
                )
        else:
            files.readable.append(path)
            files.columns.update(names)
            if any(old in names for old in OLD_TOKEN_COLUMNS):
                files.old_columns.append(path)
    return files
