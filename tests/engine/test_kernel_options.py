"""EngineConfig's kernel choices (programmatic_launch, skinny_linear, fold_norms): checked by
the config, defaulting to the measured best (kernels/runtime.py KernelOptions), passed on
from the rollout config, and in force during every forward pass the engine runs and only
then."""

import pytest

from sparrow.config.schema import CHOICES, RolloutConfig
from sparrow.engine.config import PROGRAMMATIC_LAUNCH, EngineConfig, EngineError
from sparrow.engine.engine import Engine
from sparrow.engine.sampler import SamplingParams
from sparrow.kernels.runtime import PDL_FAMILIES, KernelOptions, current_options

pytestmark = pytest.mark.usefixtures("single_thread")


def test_defaults_are_the_kernel_defaults():
    assert EngineConfig().kernel_options() == KernelOptions()
    assert EngineConfig().kernel_options().programmatic_launch == set(PDL_FAMILIES)
    assert EngineConfig.from_rollout(RolloutConfig()).kernel_options() == KernelOptions()


@pytest.mark.parametrize(
    "setting, families",
    [
        ("all", {"linear", "attention"}),
        ("none", set()),
        ("linear", {"linear"}),
        ("attention", {"attention"}),
    ],
)
def test_each_programmatic_launch_setting_names_its_families(setting, families):
    options = EngineConfig(programmatic_launch=setting).kernel_options()
    assert options.programmatic_launch == families


def test_bad_kernel_choices_are_refused():
    with pytest.raises(
        EngineError,
        match=r"programmatic_launch must be one of all, none, "
        r"linear, attention, got 'yes'",
    ):
        EngineConfig(programmatic_launch="yes")
    for key in ("skinny_linear", "fold_norms"):
        with pytest.raises(EngineError, match=f"EngineConfig.{key} must be true or false"):
            EngineConfig(**{key: 1})


def test_the_rollout_config_passes_them_on():
    # the configuration schema offers the same values
    assert CHOICES["rollout.programmatic_launch"] == PROGRAMMATIC_LAUNCH
    rollout = RolloutConfig(programmatic_launch="attention", skinny_linear=False, fold_norms=False)
    config = EngineConfig.from_rollout(rollout)
    assert (config.programmatic_launch, config.skinny_linear, config.fold_norms) == (
        "attention",
        False,
        False,
    )


def test_every_forward_runs_under_the_engines_options(qwen3_model):
    """Prefill and decode (eager and overlapped) see the engine's options; outside the
    engine's calls the defaults hold again."""
    config = EngineConfig(
        num_pages=40,
        page_size=4,
        programmatic_launch="linear",
        skinny_linear=False,
        fold_norms=False,
    )
    seen = []
    hook = qwen3_model.register_forward_pre_hook(lambda *_: seen.append(current_options()))
    try:
        engine = Engine(qwen3_model, None, config)
        engine.generate([[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=6, temperature=0.0))
    finally:
        hook.remove()
    assert engine.stats["prefill_steps"] == 1 and engine.stats["decode_steps"] >= 5
    assert len(seen) == 1 + engine.stats["decode_steps"]
    assert set(seen) == {config.kernel_options()}
    assert current_options() == KernelOptions()
