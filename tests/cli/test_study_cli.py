"""`sparrow study run`'s arguments: --gpus and overrides after options, refused before anything
runs (no workdir is touched)."""

from __future__ import annotations

import argparse

import pytest

from sparrow.cli.commands.study import _gpu_list
from sparrow.cli.main import build_parser, main, parse_args


def test_gpu_lists():
    assert _gpu_list("0,1,2,3") == ["0", "1", "2", "3"]
    assert _gpu_list("0, 1,0") == ["0", "1", "0"]  # an index twice: two arms on that GPU
    for bad in ("", "0,a", "-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="GPU indices"):
            _gpu_list(bad)


def test_gpus_all_needs_a_gpu(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(SystemExit):
        main(["study", "run", "s1", "--gpus", "all"])
    assert "no GPU that torch sees" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert _gpu_list("all") == ["3", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _gpu_list("all") == ["0", "1"]


def test_overrides_may_follow_options_in_order():
    args = parse_args(
        build_parser(), ["study", "run", "s1", "a=1", "--gpus", "0,1", "b=2", "study.c=3"]
    )
    assert args.overrides == ["a=1", "b=2", "study.c=3"] and args.gpus == ["0", "1"]
    with pytest.raises(SystemExit):  # an unknown option is still one error
        parse_args(build_parser(), ["study", "run", "s1", "--nope", "a=1"])
    with pytest.raises(SystemExit):  # and so is a stray word where no override is taken
        parse_args(build_parser(), ["runs", "r1", "b=2"])
