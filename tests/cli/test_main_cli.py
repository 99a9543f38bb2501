"""The `sparrow` command's own options: --version, and `config show` in both forms.
Run: `python -m pytest tests/cli/test_main_cli.py -q`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from sparrow.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_the_package_version(capsys):
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    done = subprocess.run(
        [sys.executable, "-m", "sparrow.cli.main", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0
    assert done.stdout.strip() == f"sparrow {declared.group(1)}"


def test_config_show_json_equals_the_yaml(capsys):
    assert main(["config", "show", "algo.lr=2e-6", "rollout.samples_per_prompt=4"]) == 0
    from_yaml = yaml.safe_load(capsys.readouterr().out)
    assert main(["config", "show", "--json", "algo.lr=2e-6", "rollout.samples_per_prompt=4"]) == 0
    from_json = json.loads(capsys.readouterr().out)
    assert from_json == from_yaml
    assert from_json["algo"]["lr"] == 2e-6 and from_json["rollout"]["samples_per_prompt"] == 4


def test_config_show_json_refuses_a_bad_key(capsys):
    assert main(["config", "show", "--json", "algo.no_such_key=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "no_such_key" in err


def test_ctrl_c_is_one_line_and_status_130(monkeypatch, capsys):
    from sparrow.cli.commands import train

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "run", interrupted)
    assert main(["train", "pipeline.steps=1"]) == 130
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert line.startswith("interrupted") and "pipeline.run_id=ID" in line
    assert "Traceback" not in captured.err and captured.out == ""


def test_the_parser_imports_none_of_the_heavy_libraries():
    """`sparrow --help`, `sparrow query`, `sparrow runs`: building the parser imports every
    command's module, and none of them may pull torch, Prefect, Ray, MLflow or transformers
    (about 1.5 s of torch alone on 2 cores); a command imports what it needs when it runs."""
    heavy = ("torch", "prefect", "ray", "mlflow", "transformers")
    probe = (
        "import sys; from sparrow.cli.main import build_parser; build_parser(); "
        f"print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ""
