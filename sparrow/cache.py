"""Sparrow's cache folder, for what can be made again but takes time to make: the random tiny
model's weights, and empty MLflow and Prefect databases of the installed versions. Deleting it
costs time only.

    from sparrow.cache import cache_dir
    cache_dir()          # $SPARROW_CACHE_DIR, else ~/.cache/sparrow (not made here)

Below every other module, and imports nothing heavy (the server guard reads it before torch).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$SPARROW_CACHE_DIR, else ~/.cache/sparrow."""
    override = os.environ.get("SPARROW_CACHE_DIR")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "sparrow"
