"""prefect.yaml: every deployment's entrypoint imports to a Prefect flow that takes its
parameters, and names a file of this repository.

Run: `python -m pytest tests/flows/test_prefect_yaml.py -q`.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def deployments() -> list[dict]:
    config = yaml.safe_load((REPO / "prefect.yaml").read_text())
    return config["deployments"]


def test_every_entrypoint_imports_to_a_flow_taking_its_parameters():
    from prefect import Flow

    found = deployments()
    assert [d["name"] for d in found] == ["sparrow-train", "sparrow-calibrate"]
    for deployment in found:
        path, _, name = deployment["entrypoint"].partition(":")
        assert (REPO / path).is_file(), path
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        flow = getattr(module, name)
        assert isinstance(flow, Flow), deployment["entrypoint"]
        accepted = set(inspect.signature(flow.fn).parameters)
        assert set(deployment.get("parameters", {})) <= accepted, deployment["name"]
        assert deployment["work_pool"]["name"]
