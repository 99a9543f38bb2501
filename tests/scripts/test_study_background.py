"""scripts/study_background.sh: holds started in their own process sessions with their
settings, collected into one archive (partial while a hold runs), bad holds refused before any
starts. A stand-in for scripts/study_seed.sh records what it was given.

Run: `python -m pytest tests/scripts/test_study_background.py -q`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# what study_seed.sh leaves in $OUT/<variant>-s<seed>/, in miniature; SLEEP keeps it running
STAND_IN = """
set -e
mkdir -p "$OUT/$1-s$2"
echo "gpus=${GPU_IDS:-} arms=${ARMS:-} minutes=${STUDY_MINUTES:-}" > "$OUT/$1-s$2/settings.txt"
echo "[0s] calibrating" > "$OUT/$1-s$2/timeline.txt"
sleep "${SLEEP:-0}"
echo "[1s] all done" >> "$OUT/$1-s$2/timeline.txt"
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    seed_script = tmp_path / "study_seed.sh"
    seed_script.write_text(STAND_IN)
    env = {"PATH": "/usr/bin:/bin", "STUDY_BG": str(tmp_path / "bg"),
           "STUDY_SEED_SCRIPT": str(seed_script)}  # fmt: skip
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "study_background.sh"), *args],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=60,
    )  # fmt: skip


def test_two_holds_run_with_their_settings_and_come_back_in_one_archive(tmp_path):
    started = _run(tmp_path, "start", "v2 2 GPU_IDS=0 ARMS=dense,fixed",
                   "v3 0 GPU_IDS=1 STUDY_MINUTES=22")  # fmt: skip
    assert started.returncode == 0, started.stderr
    assert "hold 1: v2 seed 2 GPU_IDS=0 ARMS=dense,fixed" in started.stdout
    done = _run(tmp_path, "collect", "30", str(tmp_path / "back"))
    assert done.returncode == 0, done.stderr
    assert "2 of 2 holds ended" in done.stdout and "ALL DONE" in done.stdout
    assert "== v2-s2/timeline.txt\n[0s] calibrating\n[1s] all done" in done.stdout
    with tarfile.open(tmp_path / "back" / "seed.tgz") as archive:
        names = set(archive.getnames())
        assert {"./v2-s2/settings.txt", "./v3-s0/timeline.txt", "./1.done", "./2.done"} <= names
        settings = archive.extractfile("./v2-s2/settings.txt").read().decode()
        assert settings == "gpus=0 arms=dense,fixed minutes=\n"
        assert archive.extractfile("./2.done").read().decode().strip() == "0"
    assert list((tmp_path / "back").glob("load-*.txt"))


def test_two_holds_of_one_seed_run_at_once_in_their_own_folders(tmp_path):
    bg = tmp_path / "bg"
    started = _run(tmp_path, "start", f"v3 0 ARMS=a WORK=/tmp/w-h2 OUT={bg}/h2",
                   f"v3 0 ARMS=b WORK=/tmp/w-h3 OUT={bg}/h3")  # fmt: skip
    assert started.returncode == 0, started.stderr
    done = _run(tmp_path, "collect", "30", str(tmp_path / "back"))
    assert "ALL DONE" in done.stdout and "== h3/v3-s0/timeline.txt" in done.stdout
    with tarfile.open(tmp_path / "back" / "seed.tgz") as archive:
        hold3 = archive.extractfile("./h3/v3-s0/settings.txt").read().decode()
    assert hold3 == "gpus= arms=b minutes=\n"


def test_a_hold_still_running_comes_back_partial(tmp_path):
    assert _run(tmp_path, "start", "v2 0 SLEEP=20").returncode == 0
    done = _run(tmp_path, "collect", "1", str(tmp_path / "back"))
    assert done.returncode == 0, done.stderr
    assert "0 of 1 holds ended" in done.stdout and "ALL DONE" not in done.stdout
    with tarfile.open(tmp_path / "back" / "seed.tgz") as archive:
        assert "./v2-s0/timeline.txt" in archive.getnames()
        assert "./1.done" not in archive.getnames()
    os.killpg(int((tmp_path / "bg" / "1.pid").read_text()), signal.SIGTERM)


def test_bad_holds_are_refused_before_any_starts(tmp_path):
    for holds, says in (
        (["v2 0", "v2 0 GPU_IDS=1"], "would share one work (/tmp/sw-v2-s0)"),
        (["v2 0", "v2 0 WORK=/tmp/w2"], "would share one folder"),
        (["v2 1", "v2 x"], 'is "VARIANT SEED'),
        (["v2 1", "v2 2 gpu=1"], "'gpu=1' in hold 'v2 2 gpu=1' is not NAME=VALUE"),
    ):
        refused = _run(tmp_path, "start", *holds)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr
        assert not (tmp_path / "bg").exists()  # the good hold before it did not start either
    missing = _run(tmp_path, "collect", "1", str(tmp_path / "back"))
    assert missing.returncode == 2 and "nothing started here" in missing.stderr
