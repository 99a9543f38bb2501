"""The kernel runtime's switches: SPARROW_PDL's kernel families and programmatic_launch."""

import pytest
import torch

from sparrow_core.errors import SparrowError
from sparrow_core.kernels import runtime
from sparrow_core.kernels.runtime import PDL_FAMILIES, _pdl_families, programmatic_launch


@pytest.mark.parametrize("setting, families", [
    ("", set()), ("0", set()), ("1", set(PDL_FAMILIES)), ("all", set(PDL_FAMILIES)),
    ("linear", {"linear"}), (" Attention , linear ", {"attention", "linear"})])
def test_pdl_setting_names_kernel_families(setting, families):
    assert _pdl_families(setting) == families


def test_an_unknown_pdl_family_is_named():
    with pytest.raises(SparrowError, match=r"SPARROW_PDL='linear,norms'.*\['norms'\]"):
        _pdl_families("linear,norms")


def test_programmatic_launch_scopes_the_families():
    before = runtime._PDL_SETTING[0]
    with programmatic_launch("linear"):
        assert runtime._PDL_SETTING[0] == {"linear"}
        with programmatic_launch(False):
            assert runtime._PDL_SETTING[0] == set()
        with programmatic_launch(True):
            assert runtime._PDL_SETTING[0] == set(PDL_FAMILIES)
    assert runtime._PDL_SETTING[0] == before


def test_cpu_tensors_never_launch_programmatically():
    with programmatic_launch(True):
        assert not runtime.pdl_launch(torch.device("cpu"), "linear")
        assert not runtime.pdl_launch(torch.device("cpu"), "attention")


def test_pdl_is_on_for_every_family_by_default():
    """With SPARROW_PDL unset, both families launch with programmatic dependent launch
    (round 10's measured default)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "SPARROW_PDL"}
    code = ("from sparrow_core.kernels import runtime; "
            "print(','.join(sorted(runtime._PDL_SETTING[0])))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == ",".join(sorted(PDL_FAMILIES))
