"""Cut packed device wheels into chunks small enough to travel beside the working tree.

A device call carries the working tree (tracked and untracked-not-ignored files) and the paths
it names in `carry`, 64 MiB in all. The tree holds the kept testbed models (about 37 MB with
them), so the 50 MiB parts that `device-wheels` and scripts/pack_vllm.sh write no longer fit
in one call (and `bash scripts/device_tree.sh light` first leaves the kept results out of the
tree, for larger chunks). This joins DIR's parts and cuts them again into DIR/chunk-01 ...
chunk-NN:

    python3 scripts/split_device_parts.py .vllmwheels           # chunks sized to fit this tree
    python3 scripts/split_device_parts.py .devwheels --mib 20   # or a size of your own

Device calls, back to back (files under /tmp there live only while the machine stays warm):
    chunk k < N:  mkdir -p /tmp/dw && cp DIR/chunk-k/piece.* /tmp/dw/     carry ["DIR/chunk-k"]
    chunk N:      bash DIR/chunk-N/install.sh && export PYTHONPATH=/tmp/site ...
                                                                        carry ["DIR/chunk-N"]
install.sh checks that all N pieces arrived (else: the machine went cold, copy them again),
joins them and installs the wheels into /tmp/site. The part-* folders are removed only once
the chunks hold the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

MIB = 1 << 20
CALL_LIMIT = 64 * MIB  # what one device call carries, tree included
MARGIN = 2 * MIB  # for files the tree gains between packing and the calls

INSTALL = """#!/usr/bin/env bash
# Joins the {count} pieces copied to /tmp/dw (this chunk's too), installs the wheels into /tmp/site.
set -e
DW=${{DW:-/tmp/dw}}
SITE=${{SITE:-/tmp/site}}
mkdir -p "$DW" && cp "$(dirname "$0")"/piece.* "$DW"/
have=$(ls "$DW"/piece.* | wc -l)
[ "$have" -eq {count} ] || {{ echo "install: $have of {count} pieces in $DW (the machine went cold \
between calls? copy them again)"; exit 3; }}
[ "$(cat "$DW"/piece.* | sha256sum | cut -c1-64)" = {sha256} ] || {{ echo "install: the pieces \
in $DW are not the packed bytes (pieces of another pack there?)"; exit 3; }}
rm -rf "$DW/wheels" && cat "$DW"/piece.* | tar -C "$DW" -xf -
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$DW"/wheels/*.whl
echo "install: $(ls "$DW"/wheels/*.whl | wc -l) wheels in $SITE; export PYTHONPATH=$SITE"
"""


class SplitError(Exception):
    """A folder this script cannot cut; the message names it."""


def tree_bytes(repo: Path) -> int:
    """Bytes a device call carries for the working tree: tracked and untracked-not-ignored."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "-co", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    files = [repo / name.decode() for name in listed if name]
    return sum(f.stat().st_size for f in files if f.is_file())


def packed_parts(folder: Path) -> list[Path]:
    """The data files of device-wheels' part-NN folders (or of an earlier cut's chunk-NN
    folders, to cut them again once the tree has grown), in joining order."""
    parts = sorted(folder.glob("part-*/part.*")) or sorted(folder.glob("chunk-*/piece.*"))
    if not parts:
        raise SplitError(
            f"{folder}: no part-*/part.* or chunk-*/piece.* files (pack with device-wheels first)"
        )
    return parts


def _blocks(parts: list[Path]):
    """The parts' bytes in joining order, a MiB at a time."""
    for part in parts:
        with part.open("rb") as source:
            while block := source.read(MIB):
                yield block


def split(folder: Path, chunk_bytes: int) -> list[Path]:
    """Cut folder's parts into chunk-NN/piece.MMM of at most chunk_bytes; returns the chunks."""
    parts = packed_parts(folder)
    total = sum(p.stat().st_size for p in parts)
    count = -(-total // chunk_bytes)
    staging = folder / ".chunks"
    shutil.rmtree(staging, ignore_errors=True)
    digest = hashlib.sha256()
    width = max(3, len(str(count)))
    blocks, pending = _blocks(parts), b""
    for index in range(1, count + 1):
        chunk = staging / f"chunk-{index:02d}"
        chunk.mkdir(parents=True)
        with (chunk / f"piece.{index:0{width}d}").open("wb") as out:
            need = chunk_bytes
            while need and (pending := pending or next(blocks, b"")):
                take, pending = pending[:need], pending[need:]
                out.write(take)
                digest.update(take)
                need -= len(take)
    last = staging / f"chunk-{count:02d}" / "install.sh"
    last.write_text(INSTALL.format(count=count, sha256=digest.hexdigest()))
    last.chmod(0o755)
    again = sum(p.stat().st_size for p in staging.glob("chunk-*/piece.*"))
    if again != total:
        raise SplitError(f"{folder}: chunks hold {again} bytes, the parts {total}; parts kept")
    for old in [*folder.glob("part-*"), *folder.glob("chunk-*")]:
        shutil.rmtree(old)
    chunks = []
    for chunk in sorted(staging.iterdir()):
        chunks.append(folder / chunk.name)
        chunk.rename(chunks[-1])
    staging.rmdir()
    return chunks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="what device-wheels or pack_vllm.sh wrote")
    parser.add_argument("--mib", type=float, help="chunk size (default: what fits beside the tree)")
    args = parser.parse_args(argv)
    try:
        if args.mib is not None:
            chunk_bytes = int(args.mib * MIB)
        else:
            repo = Path(__file__).resolve().parent.parent
            tree = tree_bytes(repo)
            chunk_bytes = (CALL_LIMIT - tree - MARGIN) // MIB * MIB
            if chunk_bytes < 4 * MIB:
                raise SplitError(
                    f"the working tree carries {tree / MIB:.1f} MiB: too little of a call's "
                    f"64 MiB is left for chunks (name --mib, or make the tree smaller)"
                )
        if chunk_bytes < 1:
            raise SplitError(f"--mib must be positive, got {args.mib}")
        chunks = split(args.folder, chunk_bytes)
    except SplitError as err:
        print(f"split_device_parts: {err}", file=sys.stderr)
        return 2
    print(
        f"split_device_parts: {len(chunks)} chunks of at most {chunk_bytes / MIB:.1f} MiB under "
        f"{args.folder}; the last runs install.sh"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
