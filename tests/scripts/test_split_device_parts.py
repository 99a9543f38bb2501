"""scripts/split_device_parts.py: packed device wheels cut into chunks that fit beside the
working tree; the chunks join to the same bytes, and the last chunk's install.sh installs the
wheels only when every piece arrived; bad input is one error and the parts stay."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "split_device_parts.py"


def _wheel() -> bytes:
    """A minimal pure-Python wheel of a package `tinypkg` that pip installs."""
    info = "tinypkg-0.1.dist-info"
    files = {
        "tinypkg/__init__.py": "VALUE = 7\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buffer.getvalue()


def _pack(folder: Path, part_bytes: int) -> bytes:
    """device-wheels' layout: a tar of wheels/ cut into part-NN/part.MM folders."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in [
            ("wheels/tinypkg-0.1-py3-none-any.whl", _wheel()),
            ("wheels/padding.bin", os.urandom(300_000)),
        ]:
            member = tarfile.TarInfo(name)
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    data = buffer.getvalue()
    for k in range(0, len(data), part_bytes):
        part = folder / f"part-{k // part_bytes + 1:02d}"
        part.mkdir(parents=True)
        (part / f"part.{k // part_bytes:02d}").write_bytes(data[k : k + part_bytes])
        (part / "unpack.sh").write_text("# device-wheels' own\n")
    return data


def _split(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False
    )


def test_chunks_join_to_the_packed_bytes_and_install(tmp_path):
    packed = _pack(tmp_path / "wheels", 200_000)
    result = _split(str(tmp_path / "wheels"), "--mib", "0.1")
    assert result.returncode == 0, result.stderr
    chunks = sorted((tmp_path / "wheels").iterdir())
    assert [c.name for c in chunks] == [f"chunk-{k:02d}" for k in range(1, len(chunks) + 1)]
    assert len(chunks) == -(-len(packed) // int(0.1 * (1 << 20)))
    pieces = sorted(p for c in chunks for p in c.glob("piece.*"))
    assert all(p.stat().st_size <= int(0.1 * (1 << 20)) for p in pieces)
    assert b"".join(p.read_bytes() for p in pieces) == packed

    dw, site = tmp_path / "dw", tmp_path / "site"
    env = {**os.environ, "DW": str(dw), "SITE": str(site)}
    install = chunks[-1] / "install.sh"
    missing = subprocess.run(["bash", str(install)], env=env, capture_output=True, text=True)
    assert missing.returncode == 3
    assert f"1 of {len(chunks)} pieces" in missing.stdout
    for chunk in chunks[:-1]:  # the copy calls
        for piece in chunk.glob("piece.*"):
            (dw / piece.name).write_bytes(piece.read_bytes())
    done = subprocess.run(["bash", str(install)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (site / "tinypkg" / "__init__.py").read_text() == "VALUE = 7\n"


def test_pieces_of_another_pack_are_refused(tmp_path):
    _pack(tmp_path / "a", 200_000)
    assert _split(str(tmp_path / "a"), "--mib", "0.2").returncode == 0
    dw = tmp_path / "dw"
    dw.mkdir()
    for piece in (tmp_path / "a").glob("chunk-*/piece.*"):
        (dw / piece.name).write_bytes(b"x" + piece.read_bytes()[1:])  # same names, other bytes
    env = {**os.environ, "DW": str(dw), "SITE": str(tmp_path / "site")}
    last = sorted((tmp_path / "a").glob("chunk-*"))[-1] / "install.sh"
    result = subprocess.run(["bash", str(last)], env=env, capture_output=True, text=True)
    assert result.returncode == 3 and "not the packed bytes" in result.stdout
    assert not (tmp_path / "site").exists()


def test_a_folder_without_parts_is_one_error(tmp_path):
    (tmp_path / "empty").mkdir()
    result = _split(str(tmp_path / "empty"))
    assert result.returncode == 2
    assert "no part-*/part.* or chunk-*/piece.* files" in result.stderr
    assert result.stderr.count("\n") == 1


def test_chunks_are_cut_again_to_a_new_size_with_the_same_bytes(tmp_path):
    packed = _pack(tmp_path / "wheels", 200_000)
    assert _split(str(tmp_path / "wheels"), "--mib", "0.2").returncode == 0
    result = _split(str(tmp_path / "wheels"), "--mib", "0.07")  # the tree grew: smaller chunks
    assert result.returncode == 0, result.stderr
    chunks = sorted((tmp_path / "wheels").iterdir())
    assert len(chunks) == -(-len(packed) // int(0.07 * (1 << 20)))
    pieces = sorted(p for c in chunks for p in c.glob("piece.*"))
    assert b"".join(p.read_bytes() for p in pieces) == packed
    assert [p.parent for p in (tmp_path / "wheels").glob("chunk-*/install.sh")] == [chunks[-1]]
    assert f"-eq {len(chunks)} ]" in (chunks[-1] / "install.sh").read_text()
