"""The kernel runtime's options: KernelOptions and their scopes (kernel_options,
programmatic_launch), the programmatic-launch settings, and no switch read from the
environment."""

import os
import subprocess
import sys

import pytest
import torch

from sparrow.errors import SparrowError
from sparrow.kernels import runtime
from sparrow.kernels.runtime import (
    PDL_FAMILIES,
    KernelOptions,
    current_options,
    kernel_options,
    pdl_families,
    programmatic_launch,
)


@pytest.mark.parametrize(
    "setting, families",
    [
        ("", set()),
        ("0", set()),
        ("none", set()),
        ("1", set(PDL_FAMILIES)),
        ("all", set(PDL_FAMILIES)),
        ("linear", {"linear"}),
        (" Attention , linear ", {"attention", "linear"}),
    ],
)
def test_pdl_setting_names_kernel_families(setting, families):
    assert pdl_families(setting) == families


def test_an_unknown_pdl_family_is_named():
    with pytest.raises(SparrowError, match=r"programmatic_launch='linear,norms'.*\['norms'\]"):
        pdl_families("linear,norms")
    with pytest.raises(SparrowError, match=r"\['norms'\]"):
        KernelOptions(programmatic_launch=frozenset({"norms"}))


def test_the_defaults_are_every_family_the_skinny_kernel_and_folded_norms():
    assert current_options() == KernelOptions()
    assert KernelOptions().programmatic_launch == set(PDL_FAMILIES)
    assert KernelOptions().skinny_linear and KernelOptions().fold_norms


def test_kernel_options_and_programmatic_launch_scope_the_options():
    chosen = KernelOptions(
        programmatic_launch=frozenset({"attention"}), skinny_linear=False, fold_norms=False
    )
    with kernel_options(chosen):
        assert current_options() is chosen
        with programmatic_launch("linear"):
            # only the families change
            assert current_options() == KernelOptions(frozenset({"linear"}), False, False)
            with programmatic_launch(False):
                assert current_options().programmatic_launch == set()
            with programmatic_launch(True):
                assert current_options().programmatic_launch == set(PDL_FAMILIES)
        assert current_options() is chosen
    assert current_options() == KernelOptions()
    with pytest.raises(RuntimeError):
        with kernel_options(chosen):
            raise RuntimeError("a failed forward")
    assert current_options() == KernelOptions()  # restored on the way out of an error


def test_cpu_tensors_never_launch_programmatically():
    with programmatic_launch(True):
        assert not runtime.pdl_launch(torch.device("cpu"), "linear")
        assert not runtime.pdl_launch(torch.device("cpu"), "attention")


def test_the_environment_switches_nothing():
    """The switches once read from SPARROW_PDL, SPARROW_SKINNY_LINEAR and SPARROW_FOLD_NORMS
    at import time are options now (EngineConfig): those variables change no default."""
    env = dict(os.environ, SPARROW_PDL="0", SPARROW_SKINNY_LINEAR="0", SPARROW_FOLD_NORMS="0")
    code = (
        "from sparrow.kernels import runtime; o = runtime.current_options(); "
        "print(','.join(sorted(o.programmatic_launch)), o.skinny_linear, o.fold_norms)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == f"{','.join(sorted(PDL_FAMILIES))} True True"
