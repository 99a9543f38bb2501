"""scripts/device_tree.sh: `light` leaves the kept results out of what a device call carries
(index only, every file stays on disk, commits refused meanwhile); `restore` puts the index
back as HEAD has it, with nothing else changed.

Run: `python -m pytest tests/scripts/test_device_tree.py -q`.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=check)  # fmt: skip


def _tool(repo: Path, verb: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(repo / "scripts" / "device_tree.sh"), verb], cwd=repo,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.fixture
def repo(tmp_path) -> Path:
    repo = tmp_path / "repo"
    for name, size in [("benchmarks/results/day/a.csv", 5000), ("docs/img/f.png", 3000),
                       ("docs/page.md", 10), ("sparrow/x.py", 20)]:  # fmt: skip
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(b"x" * size)
    (repo / "scripts").mkdir()
    for script in ("device_tree.sh", "split_device_parts.py"):  # the second counts the bytes
        shutil.copy(ROOT / "scripts" / script, repo / "scripts" / script)
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return repo


def test_light_then_restore(repo):
    head = _git(repo, "rev-parse", "HEAD").stdout
    done = _tool(repo, "light")
    assert done.returncode == 0, done.stderr
    assert "stay here" in done.stdout
    listed = _git(repo, "ls-files", "-co", "--exclude-standard").stdout.split()
    assert "benchmarks/results/day/a.csv" not in listed and "docs/img/f.png" not in listed
    assert "docs/page.md" in listed and "sparrow/x.py" in listed
    assert (repo / "benchmarks/results/day/a.csv").stat().st_size == 5000  # still on disk
    assert "light" in _tool(repo, "status").stdout
    refused = _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "no",
                   check=False)  # fmt: skip
    assert refused.returncode != 0 and "restore first" in refused.stderr
    assert _tool(repo, "light").returncode == 0  # again: says so, changes nothing
    done = _tool(repo, "restore")
    assert done.returncode == 0, done.stderr
    assert _git(repo, "status", "--porcelain").stdout == ""
    assert _git(repo, "rev-parse", "HEAD").stdout == head
    assert "benchmarks/results/day/a.csv" in _git(repo, "ls-files").stdout
    assert not (repo / ".git/hooks/pre-commit").exists()
    assert "device_tree" not in (repo / ".git/info/exclude").read_text()


def test_light_refuses_while_something_is_staged(repo):
    (repo / "sparrow/x.py").write_text("changed")
    _git(repo, "add", "sparrow/x.py")
    done = _tool(repo, "light")
    assert done.returncode == 2 and "staged" in done.stderr
    assert "benchmarks/results/day/a.csv" in _git(repo, "ls-files").stdout


def test_light_in_a_linked_worktree_uses_the_repositorys_hooks_and_excludes(repo, tmp_path):
    tree = tmp_path / "tree"
    _git(repo, "worktree", "add", "-q", str(tree), "HEAD")
    done = _tool(tree, "light")
    assert done.returncode == 0, done.stderr
    listed = _git(tree, "ls-files", "-co", "--exclude-standard").stdout.split()
    assert "benchmarks/results/day/a.csv" not in listed  # excluded, not untracked
    refused = _git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "no",
                   "--allow-empty", check=False)  # fmt: skip
    assert refused.returncode != 0 and "restore first" in refused.stderr
    assert _tool(tree, "restore").returncode == 0
    assert _git(tree, "status", "--porcelain").stdout == ""
