"""The README's opening: exactly two commands, installing from the package index alone (they
must work where only it is reachable), and the light CPU install and what the plain one
downloads, named beside them.

Run: `python -m pytest tests/test_readme.py -q`.
"""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_the_opening_block_is_two_commands_from_the_package_index():
    first = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    commands = [line for line in first.splitlines() if line.strip()]
    assert len(commands) == 2
    assert all("pip install torch==2.13.0 && pip install -e" in c for c in commands)
    assert not any("--index-url" in c or "--extra-index-url" in c for c in commands)


def test_the_cpu_index_and_the_plain_download_are_stated():
    light = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    assert light in README
    assert "29 wheels, about 2.7 GB" in README
