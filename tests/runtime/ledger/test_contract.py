"""The stage contract (sparrow/runtime/ledger/contract.py): one owner for every stage's files.

No module in sparrow/stages imports a sibling stage, no stage module defines a file name of
its own, every file of the contract belongs to a known stage under a name no other file
takes, and the readers give back what the writers wrote.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from sparrow.runtime.ledger import calibration_files, contract
from sparrow.runtime.ledger.stage import STAGES, StageInputError
from sparrow.sparse.presets import get_preset
from sparrow.storage import RunLayout
from tests.test_layers import MODULES, imports_of

ROOT = Path(__file__).resolve().parents[3]
STAGE_MODULES = {name: path for name, path in MODULES.items() if name.startswith("sparrow.stages.")}
FILE_NAME = re.compile(r"^[\w.-]+\.(json|parquet|yaml|png|pt|safetensors)$")


def test_no_stage_module_imports_a_sibling_stage():
    assert len(STAGE_MODULES) >= 12, "sparrow/stages/ is not read"
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {imported}"
        for name, path in STAGE_MODULES.items()
        for line, imported in imports_of(path)
        if imported.startswith("sparrow.stages.") and imported != name
    ]
    assert not bad, "a stage learns from the contract, not from another stage:\n" + "\n".join(bad)


def test_the_probe_sees_a_sibling_import():
    from tests.test_layers import imports_in

    found = imports_in("from sparrow.stages.rollout import x\n", "sparrow.stages.reward")
    assert found == [(1, "sparrow.stages.rollout")]


def test_no_stage_module_names_a_file_of_its_own():
    """A string constant that is a file name, at module level, belongs in the contract."""
    bad = []
    for path in STAGE_MODULES.values():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                value = node.value.value
                if isinstance(value, str) and FILE_NAME.match(value):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {value!r}")
    assert not bad, "\n".join(bad)


def test_every_file_belongs_to_a_stage_under_its_own_name():
    assert {f.stage for f in contract.FILES} <= set(STAGES)
    pairs = [(f.stage, f.name) for f in contract.FILES]
    assert len(pairs) == len(set(pairs))
    # the two schedule files are two names: the one used (json) and the one chosen (yaml)
    assert contract.ROLLOUT_SCHEDULE.name != contract.NEW_SCHEDULE.name
    layout = RunLayout(Path("/w"), "r")
    assert contract.TOKENS.at(layout, 3) == layout.token_file(3)
    assert contract.ROLLOUTS.at(layout, 2) == Path("/w/runs/r/step-2/rollout/rollouts.parquet")
    assert contract.policy_state_dir(layout, 2) == Path("/w/runs/r/step-2/policy_state")


def test_the_readers_give_back_what_was_written(tmp_path):
    schedule = get_preset("tiny-0.86")
    contract.write_rollout_schedule(tmp_path, schedule, 4, sparse=False)
    used = contract.read_rollout_schedule(tmp_path)
    assert (used.schedule.topk_pages, used.version, used.sparse) == (schedule.topk_pages, 4, False)

    contract.write_rewards(contract.REWARDS.under(tmp_path), [0, 0], [0, 1], [1.0, 0.25])
    assert contract.read_rewards(contract.REWARDS.under(tmp_path)) == [1.0, 0.25]
    with pytest.raises(StageInputError, match="2 rewards for 3 rollouts"):
        contract.read_rewards(contract.REWARDS.under(tmp_path), [object()] * 3)

    assert contract.pointed_policy(tmp_path) is None
    contract.write_policy_pointer(tmp_path, tmp_path / "state")
    assert contract.pointed_policy(tmp_path) == tmp_path / "state"

    assert contract.read_cheaper(tmp_path) is None
    contract.write_cheaper(tmp_path, 2, "p5", (4, 8), (2, 4), {"0": 0.9})
    assert contract.read_cheaper(tmp_path)["cheaper_topk"] == [2, 4]


def test_a_calibration_table_survives_its_file():
    import numpy as np

    from sparrow.control.calibration import AcceptanceTable

    grid = np.array([[0.5, np.nan], [0.9, np.nan]])
    table = AcceptanceTable((2, 4), 64, np.array([10, 0]), grid, grid, grid, grid)
    back = calibration_files.table_from_dict(calibration_files.table_to_dict(table))
    assert back.topk_pages == (2, 4) and back.tokens.tolist() == [10, 0]
    assert back.p5[1, 0] == 0.9 and np.isnan(back.p5[0, 1])
