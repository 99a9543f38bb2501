"""Shared test fixtures: tiny random Hugging Face checkpoints, built once per test session.

    def test_something(qwen3_checkpoint):            # a Path to a model directory
        model = load_model(qwen3_checkpoint)

    def test_custom(tiny_checkpoint):                # build (and cache) any other shape
        path = tiny_checkpoint("deep", "qwen3", num_layers=4, seed=3)

Every checkpoint holds config.json, safetensors weights and the byte-level tokenizer of
sparrow.model.random_checkpoint (ids 0..255 are bytes, 256 <|endoftext|> = eos,
257 <|bos|>, 258 <|im_start|>, 259 <|im_end|>; vocab 384). CHECKPOINT_FIXTURES names the
ones that cover every supported family and shape corner, for parametrised tests.

    def test_flow(flow_environment):                 # one Prefect test API and one Ray
        flow_environment.start()
        env, ray_address = flow_environment.subprocess_env(tmp_path / "prefect-home")

Flows run in this process report to the Prefect test API; a `sparrow train` subprocess joins
both with that environment and `ray.address=<ray_address>`, so it starts neither.

    def test_run(base_run):                          # one finished `sparrow train`, shared
        assert base_run.done.returncode == 0

base_run is BASE_RUN_ARGS run once per session as a user on a fresh machine runs it; the
tests that check what it printed and the ones that compare a resumed run with an
uninterrupted one all read this one run.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

# The tests run a tiny model: many small ops, which torch's intra-op threads only slow down on
# a busy 2-core machine (the tiny model's decode took 6x longer with 2 threads than with 1
# while another test run shared the machine). One thread in this process and, through
# OMP_NUM_THREADS, in every process it starts: Ray's workers (a CPU rollout engine caps its
# threads by it) and `sparrow` subprocesses.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# fixture name -> (family, make_random_checkpoint keyword arguments)
CHECKPOINT_SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    # Qwen3-like: q/k norm, tied embeddings, GQA 2, head_dim 16
    "qwen3_checkpoint": ("qwen3", {}),
    # odd GQA ratio (6 / 2 = 3) and q width (6 x 24 = 144) different from hidden (64)
    "qwen3_gqa3_checkpoint": (
        "qwen3",
        dict(num_q_heads=6, num_kv_heads=2, head_dim=24, seed=1),
    ),
    # Qwen2: q/k/v bias, untied, GQA 3, head_dim 16 = hidden / heads
    "qwen2_checkpoint": (
        "qwen2",
        dict(
            hidden_size=96,
            num_q_heads=6,
            num_kv_heads=2,
            head_dim=16,
            tie_word_embeddings=False,
            seed=2,
        ),
    ),
    # Llama 3.1 style: llama3 RoPE scaling, untied, one KV head for 3 query heads, head_dim 24
    "llama_checkpoint": (
        "llama",
        dict(
            hidden_size=72,
            num_q_heads=3,
            num_kv_heads=1,
            head_dim=24,
            tie_word_embeddings=False,
            rope_theta=500000.0,
            rope_scaling="llama3-test",
            seed=3,
        ),
    ),
    # same shape as qwen3_checkpoint, other weights, written as several shards
    "qwen3_sharded_checkpoint": ("qwen3", dict(seed=4, shards=3)),
}
CHECKPOINT_FIXTURES = (
    "qwen3_checkpoint",
    "qwen3_gqa3_checkpoint",
    "qwen2_checkpoint",
    "llama_checkpoint",
)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Callable[..., Path]:
    """build(name, family="qwen3", **kwargs) -> Path, cached by name for the session."""
    built: dict[str, Path] = {}

    def build(name: str, family: str = "qwen3", **kwargs: Any) -> Path:
        if name not in built:
            from transformers.utils import logging as hf_logging

            from sparrow.model.random_checkpoint import LLAMA3_TEST_SCALING, make_random_checkpoint

            hf_logging.disable_progress_bar()
            if kwargs.get("rope_scaling") == "llama3-test":
                kwargs["rope_scaling"] = LLAMA3_TEST_SCALING
            out = tmp_path_factory.mktemp("checkpoints") / name
            built[name] = make_random_checkpoint(out, family, **kwargs)
        return built[name]

    return build


def _checkpoint_fixture(name: str):
    family, kwargs = CHECKPOINT_SPECS[name]

    @pytest.fixture(scope="session", name=name)
    def fixture(tiny_checkpoint) -> Path:
        return tiny_checkpoint(name, family, **kwargs)

    return fixture


qwen3_checkpoint = _checkpoint_fixture("qwen3_checkpoint")
qwen3_gqa3_checkpoint = _checkpoint_fixture("qwen3_gqa3_checkpoint")
qwen2_checkpoint = _checkpoint_fixture("qwen2_checkpoint")
llama_checkpoint = _checkpoint_fixture("llama_checkpoint")
qwen3_sharded_checkpoint = _checkpoint_fixture("qwen3_sharded_checkpoint")


@pytest.fixture(params=CHECKPOINT_FIXTURES)
def any_checkpoint(request) -> Path:
    """Each family / shape corner in turn (parametrised over CHECKPOINT_FIXTURES)."""
    return request.getfixturevalue(request.param)


def pytest_collection_modifyitems(config, items):
    """GPU tests run on the device machine; on a CPU-only machine they are deselected, not
    skipped. Tests of several GPUs (marked multigpu) run only when asked for (`-m multigpu`),
    and then fail on a machine with fewer GPUs than they need."""
    if "multigpu" not in (config.getoption("markexpr", "") or ""):
        several = [item for item in items if item.get_closest_marker("multigpu")]
        if several:
            config.hook.pytest_deselected(items=several)
            items[:] = [item for item in items if not item.get_closest_marker("multigpu")]
    if torch.cuda.is_available():
        return
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]


class FlowEnvironment:
    """A Prefect test API and a local Ray, started on first use and stopped right after the last
    test that asks for them (not at the session's end: later tests count their own child
    processes, and Ray's and Prefect's would be among them). Starting them costs ~30 s on a
    2-core machine, and so does each `sparrow train` subprocess that starts its own. Tests of
    Ray actors alone call .start_ray(), which starts the local Ray only."""

    def __init__(self):
        self.stack: contextlib.ExitStack | None = None
        self.prefect_started = False
        self.api_url = ""
        self.ray_address = ""

    def start_ray(self) -> None:
        if self.stack is not None:
            return
        import ray

        from sparrow.runtime.rollout.actors import start_ray

        stack = contextlib.ExitStack()
        if start_ray(""):
            stack.callback(ray.shutdown)
        self.ray_address = ray.get_runtime_context().gcs_address
        self.stack = stack

    def start(self, ray: bool = True) -> None:
        """ray=False: the Prefect test API alone, for a flow that joins a cluster of its own
        (tests/flows/test_two_nodes.py); it stops what an earlier test started first."""
        if self.prefect_started and bool(self.ray_address) == ray:
            return
        if self.stack is not None and bool(self.ray_address) != ray:
            self.stop()
        from sparrow.flows.prefect_env import quiet_prefect

        quiet_prefect()
        import prefect.settings
        from prefect.testing.utilities import prefect_test_harness

        if ray:
            self.start_ray()
        elif self.stack is None:
            self.stack = contextlib.ExitStack()
        self.stack.enter_context(prefect_test_harness(server_startup_timeout=180))
        # a flow run's heartbeat thread sleeps in 1 s steps and each flow and subflow joins it
        # on exit (~0.5 s a flow run); no test here watches for crashed runs
        self.stack.enter_context(
            prefect.settings.temporary_settings(updates={"flows.heartbeat_frequency": None})
        )
        self.api_url = prefect.settings.PREFECT_API_URL.value()
        self.prefect_started = True

    def subprocess_env(self, prefect_home: Path) -> tuple[dict[str, str], str]:
        """(environment, ray address) of a subprocess that reports to this Prefect API and
        joins this Ray (with `ray.address=<address>`): none of this process's PREFECT_ and RAY_
        settings but the Ray auth mode (a local Ray asks for its token)."""
        self.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_"))}
        env.update(PREFECT_HOME=str(prefect_home), PREFECT_API_URL=self.api_url)
        if "RAY_AUTH_MODE" in os.environ:
            env["RAY_AUTH_MODE"] = os.environ["RAY_AUTH_MODE"]
        return env, self.ray_address

    def stop(self) -> None:
        if self.stack is not None:
            stack, self.stack, self.prefect_started = self.stack, None, False
            self.ray_address = ""
            stack.close()


FLOW_ENVIRONMENT = FlowEnvironment()


@pytest.fixture(scope="session")
def flow_environment() -> FlowEnvironment:
    """The session's FlowEnvironment; call .start() (or .subprocess_env, or .start_ray for Ray
    alone) before using it."""
    return FLOW_ENVIRONMENT


def _last_flow_test(session) -> object | None:
    if not hasattr(session, "_last_flow_test"):
        users = [item for item in session.items if "flow_environment" in item.fixturenames]
        session._last_flow_test = users[-1] if users else None
    return session._last_flow_test


def pytest_runtest_teardown(item, nextitem):
    if nextitem is None or item is _last_flow_test(item.session):
        FLOW_ENVIRONMENT.stop()


# `sparrow train` of the session's base run: 2 test-size steps; hot sampling (temperature 2)
# so that the samples of a prompt differ and the update changes the weights
BASE_RUN_ARGS = (
    "pipeline.steps=2",
    "data.prompts_per_step=2",
    "rollout.samples_per_prompt=2",
    "rollout.max_new_tokens=16",
    "rollout.temperature=2.0",
    "pipeline.keep_checkpoints=0",
)


@dataclass(frozen=True)
class BaseRun:
    workdir: Path
    run_id: str
    args: tuple[str, ...]  # BASE_RUN_ARGS: a run of the same configuration passes them too
    env: dict[str, str]  # a fresh machine's: its own PREFECT_HOME, no server, no Ray address
    done: subprocess.CompletedProcess


@pytest.fixture(scope="session")
def base_run(tmp_path_factory) -> BaseRun:
    """BASE_RUN_ARGS run to the end by `sparrow train` in a fresh Prefect home (Prefect's
    temporary server and a local Ray of its own); the caller checks its exit status. Run once
    for all pytest-xdist workers: the first to ask runs it under a lock in their common temp
    folder and records its outcome there; the others read it (its users only read the run)."""
    import fcntl
    import json

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # every worker's temp folder is a child of this one
    root = shared / "base-run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_"))}
    # a home whose parent does not exist yet either (Prefect makes only the last folder)
    env["PREFECT_HOME"] = str(root / "home" / "prefect")
    workdir, record = root / "work", root / "outcome.json"
    with open(shared / "base-run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.exists():
            root.mkdir(exist_ok=True)
            command = [
                sys.executable,
                "-m",
                "sparrow.cli.main",
                "train",
                f"pipeline.workdir={workdir}",
                "pipeline.run_id=base",
                *BASE_RUN_ARGS,
            ]
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
            outcome = [command, done.returncode, done.stdout, done.stderr]
            record.write_text(json.dumps(outcome))
    done = subprocess.CompletedProcess(*json.loads(record.read_text()))
    return BaseRun(workdir, "base", BASE_RUN_ARGS, env, done)
