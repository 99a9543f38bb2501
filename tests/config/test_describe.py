"""One description per config key (sparrow/config/describe.py): the schema's field docstrings
are the source; every YAML comment above a key and every row of docs/configuration.md's key
tables must be what they give, and a drifted comment or row is caught."""

from __future__ import annotations

import dataclasses

from sparrow.config import describe, schema


def test_every_key_has_one_description():
    keys = describe.keys()
    assert describe.undescribed() == []
    assert len({k.dotted for k in keys}) == len(keys)
    described = {k.dotted: k.description for k in keys}
    # the drift the issue found: 0 lets engines pull prompts, it does not mean one item each
    assert described["rollout.work_item_prompts"].startswith("0: each engine takes prompts")
    assert described["control.patience"] and "calibrate.patience" not in described


def test_the_yaml_comments_and_the_doc_follow_the_schema():
    assert describe.drift() == [], "run: python -m sparrow.config.describe --write"


def test_every_group_has_a_file_and_every_group_file_sets_every_key():
    from omegaconf import OmegaConf

    for group in schema.GROUPS:
        data = OmegaConf.to_container(OmegaConf.load(describe.CONF / group / "default.yaml"))
        cls = type(getattr(schema.SparrowConfig(), group))
        assert set(data) == {f.name for f in dataclasses.fields(cls)}, group


def test_a_drifted_comment_is_caught_and_a_note_is_kept():
    described = {k.dotted: k.description for k in describe.keys()}
    wrong = "# 0 gives each actor one item\nwork_item_prompts: 0\n"
    fixed = describe.render_yaml(wrong, "rollout", described)
    assert "one item" not in fixed.splitlines()[0]
    assert fixed.splitlines()[0].startswith("# 0: each engine takes prompts while it runs")
    noted = "# generation cutoff in new tokens\n# here: long chains\nmax_new_tokens: 6144\n"
    assert describe.render_yaml(noted, "rollout", described) == noted
    header = "# a header\n\n# stale\nnum_workers: 0\n"
    assert describe.render_yaml(header, "trainer", described).startswith("# a header\n\n# trainer")


def test_a_drifted_doc_row_is_caught():
    text = describe.DOC.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `rollout.top_k`"))
    drifted = text.replace(row, row.replace("keep only", "keep"))
    assert describe.render_doc(drifted) == text
