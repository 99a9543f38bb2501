"""Rollout actors: Ray actors that each hold one rollout engine, and the pool that drives them.

    start_ray("")                                   # a local Ray unless an address is given
    pool = ActorPool.start(WorkerSpec(model_path, weights_path, schedule, engine), num_actors=1)
    results = pool.generate(prompt_ids, sampling_params)    # [prompt][sample] SampleResult
    pool.load_weights("/runs/q17/runs/r1/step-3/policy_update")  # every actor reads the folder
    pool.set_schedule(schedule_or_none); pool.shutdown()

One actor per GPU (the engine on that GPU), or `rollout.num_actors` CPU actors (1 when it
is 0) on a machine without GPU; each actor's body is a RolloutWorker (sparrow/runtime/rollout/worker.py),
native or vLLM engine alike, so the pool and the weight sync do not tell them apart (the
dispatch does: only the native engine takes requests while it runs, `ActorPool.pulls`).
Prompts are taken by the engines while they run (sparrow/runtime/rollout/dispatch.py: a PromptSource
actor, the native engine's feed), or go out in work items (`rollout.work_item_prompts`
prompts each to whichever actor is free; one per actor with vLLM); each request carries
its own seed, so what a prompt gets does not depend on which actor ran it. An actor that dies (RayActorError) is
replaced by a fresh one built from the current weights folder and schedule, and its prompts
are run again once; a second death is RolloutActorLost, an infrastructure fault that the
rollout task may retry. With a trainer group (sparrow/runtime/trainer_group/group.py) the actors also join
its weight-sync group (join_sync, receive_weights; sparrow/runtime/rollout/actor_sync.py, driven by
sparrow/runtime/rollout/weight_sync.py). pool.rollout_stats() gives each actor's time inside its engine and
its step counts since the last call; pool.last_dispatch the last rollout's busy time per actor.
Weights travel by path: an actor loads the safetensors of a folder, never tensors through
the flow. With DistillSparse an adapter folder travels beside it and the engine loads
merge(policy, LoRA) (sparrow/trainer/lora.py), read one tensor at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sparrow.errors import SparrowError
from sparrow.runtime.rollout.worker import RolloutWorker, WorkerSpec, engine_process_env
from sparrow.sparse import Schedule


class RolloutActorLost(RuntimeError):
    """A rollout actor died twice on one shard (infrastructure, not a bad input)."""


class RayStartError(SparrowError):
    """Ray could not be started or reached (the message names ray.address)."""


def start_ray(address: str) -> bool:
    """Connect to `address` ("auto": a cluster already running here), or start a new quiet
    local Ray (never joining one by accident); True when this call started or joined it."""
    import ray

    if ray.is_initialized():
        joined = ray.get_runtime_context().gcs_address
        if ":" in address and "://" not in address and _port(address) != _port(joined):
            raise RayStartError(
                f"ray.address={address} names another cluster than the one this process is "
                f"already connected to ({joined}); a process joins one Ray cluster"
            )
        return False
    kwargs: dict[str, Any] = dict(
        include_dashboard=False, log_to_driver=False, logging_level="ERROR", configure_logging=True
    )
    try:
        ray.init(address=address or "local", **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as err:
        where = f"ray.address={address}" if address else "a local Ray"
        raise RayStartError(f"cannot start {where}: {err}") from None
    return True


def _port(address: str) -> str:
    return address.rsplit(":", 1)[-1]


def actor_resources(num_actors: int, use_gpu: bool = True) -> tuple[int, dict[str, float], str]:
    """(actors, resources per actor, device): one per GPU, else num_actors (0: 1) CPU actors."""
    import ray

    gpus = int(ray.cluster_resources().get("GPU", 0)) if use_gpu else 0
    if gpus > 0:
        return (num_actors or gpus), {"num_gpus": 1, "num_cpus": 1}, "cuda"
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    count = num_actors or 1
    return count, {"num_cpus": max(1, cpus // count)}, "cpu"


class ActorPool:
    """Rollout actors plus what a replacement actor needs (current weights and schedule)."""

    def __init__(
        self,
        spec: WorkerSpec,
        resources: dict[str, float],
        actors: list[Any],
        placement: Sequence[dict] | None = None,
        work_item_prompts: int = 0,
    ):
        self.spec, self.resources, self.actors = spec, resources, actors
        # per actor: Ray options that replace `resources` (sparrow/runtime/placement.py's GPU bundles)
        self.placement = list(placement) if placement else None
        self.work_item_prompts = work_item_prompts
        self.replaced = 0
        self.last_dispatch = None  # the last generate()'s DispatchTimes
        self._source = None  # the PromptSource actor the engines take prompts from

    @property
    def pulls(self) -> bool:
        """Whether the engines take prompts while they run (an engine that takes a feed; with
        one actor its one work item is the same batch without a call per prompt)."""
        return self.spec.engine_class.takes_feed and len(self.actors) > 1

    def prompt_source(self):
        """The pool's PromptSource actor (sparrow/runtime/rollout/dispatch.py), started once: an
        actor is a process, too slow to start at every rollout."""
        import ray

        from sparrow.runtime.rollout.dispatch import PromptSource

        if self._source is None:
            self._source = ray.remote(num_cpus=0)(PromptSource).remote()
        return self._source

    @classmethod
    def start(
        cls,
        spec: WorkerSpec,
        num_actors: int,
        resources: dict[str, float],
        placement: Sequence[dict] | None = None,
        work_item_prompts: int = 0,
        wait: bool = True,
    ) -> ActorPool:
        """The actors, each building its engine in its own process; wait=False returns at
        once (the caller does other work, then calls wait_ready)."""
        pool = cls(spec, resources, [], placement, work_item_prompts)
        pool.actors = [pool._new_actor(index) for index in range(num_actors)]
        if wait:
            pool.wait_ready()
        return pool

    def wait_ready(self) -> None:
        """Until every actor has built its engine; an actor that died meanwhile is replaced
        once (the chaos soak killed one here), and one that could not build raises here."""
        self._call_each("info")

    def _new_actor(self, index: int):
        import ray

        options = dict(self.placement[index] if self.placement else self.resources)
        env = engine_process_env(self.spec)
        if env:
            options["runtime_env"] = {"env_vars": env}
        remote = ray.remote(max_restarts=0, max_task_retries=0)(RolloutWorker)
        return remote.options(**options).remote(self.spec)

    def _replace(self, index: int) -> None:
        import ray

        try:
            ray.kill(self.actors[index], no_restart=True)
        except Exception:  # noqa: BLE001 - the actor is already gone
            pass
        self.actors[index] = self._new_actor(index)
        self.replaced += 1

    def _wait(self, futures: list[Any]) -> list[Any]:
        """ray.get; an actor's own SparrowError (a request it refuses) comes back as itself,
        not wrapped in Ray's multi-line RayTaskError."""
        import ray
        import ray.exceptions

        try:
            return ray.get(futures)
        except ray.exceptions.RayTaskError as err:
            if isinstance(err.cause, SparrowError):
                raise err.cause from None
            raise

    def _call_each(self, method: str, *args: Any) -> list[Any]:
        """Call a method on every actor; an actor found dead is replaced (it starts current)."""
        import ray.exceptions

        futures = [getattr(actor, method).remote(*args) for actor in self.actors]
        results = []
        for index, future in enumerate(futures):
            try:
                results.append(self._wait([future])[0])
            except ray.exceptions.RayActorError:
                self._replace(index)
                results.append(self._wait([self.actors[index].info.remote()])[0])
        return results

    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[Any]) -> list[list[Any]]:
        """[prompt][sample] results in the prompts' order; prompts are taken by the engines
        as they run, or go out in work items to whichever actor is free
        (sparrow/runtime/rollout/dispatch.py, whose DispatchTimes are left in self.last_dispatch)."""
        from sparrow.runtime.rollout.dispatch import dispatch

        results, self.last_dispatch = dispatch(self, prompts, params, self.work_item_prompts)
        return results

    def generate_closing(
        self, prompts: Sequence[Sequence[int]], params: Sequence[Any], rule: Any
    ) -> list[list[Any]]:
        """generate() that closes early by a dispatch.CloseRule (rollout.finish_fraction):
        whole groups in one work item per actor; unfinished samples come back open."""
        from sparrow.runtime.rollout.dispatch import dispatch_closing

        results, self.last_dispatch = dispatch_closing(self, prompts, params, rule)
        return results

    def load_weights(self, path: str, adapter_path: str = "") -> list[Any]:
        self.spec = replace(self.spec, weights_path=str(path), adapter_path=str(adapter_path))
        return self._call_each("load_weights", str(path), str(adapter_path))

    def load_shared(self, message: dict[str, Any], path: str, adapter_path: str = "") -> list[str]:
        """Every actor copies the trainer's shared CUDA buffer (or reads `path` when on
        another GPU); a replacement actor starts from `path` (and `adapter_path`)."""
        self.spec = replace(self.spec, weights_path=str(path), adapter_path=str(adapter_path))
        return self._call_each("load_shared", message, str(path), str(adapter_path))

    def device_uuids(self) -> list[str]:
        """Each actor's CUDA device uuid ("" on CPU), in actor order; a dead actor is
        replaced first."""
        return self._call_each("device_uuid")

    def sleep(self) -> None:
        self._call_each("sleep")

    def wake(self) -> list[int]:
        return self._call_each("wake")

    def memory(self) -> list[dict[str, float]]:
        return self._call_each("memory")

    def rollout_stats(self) -> list[dict[str, float]]:
        """Per actor, RolloutWorker.rollout_stats (sums since the last call)."""
        return self._call_each("rollout_stats")

    def set_schedule(self, schedule: Schedule | None) -> None:
        self.spec = replace(self.spec, schedule=schedule)
        self._call_each("set_schedule", schedule)

    def info(self) -> list[dict[str, Any]]:
        return self._call_each("info")

    def shutdown(self) -> None:
        import ray

        source = [self._source] if self._source is not None else []
        for actor in self.actors + source:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - best effort at the end of a run
                pass
        self.actors, self._source = [], None
