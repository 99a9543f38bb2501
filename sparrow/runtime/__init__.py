"""Runtime: the machinery the stage tasks run on, below sparrow/stages/ and above the library.

    runtime = RunRuntime(cfg, run_id, store, model_path, ...); register(runtime)  # run_runtime.py
    outcome = run_stage(lookup(workdir, run_id), "reward", step, body)           # stage.py

- run_runtime.py: what a running train flow holds in memory (store, tracker, actor pool,
  trainer), registered by the flow and found by a task through (workdir, run_id);
- ledger/: the one mechanism every stage shares (stage.py: skip if recorded, fail on purpose,
  write by rename, record), the run's `runs` row (run_record.py), the schedule versions a run
  decodes under (schedules.py), pruning and repair of policy folders (retention.py);
- retry.py: which faults a stage task retries; interrupt.py: Ctrl-C at a stage boundary;
- tracking.py: MLflow, one MLflow run per Sparrow run;
- rollout/: the Ray pool of rollout engines (actors.py, worker.py, actor_sync.py), prompts to
  engines (dispatch.py), weights from a trainer group to the engines (weight_sync.py);
- trainer_group/: the trainer as Ray actors on several GPUs (group.py, rank.py, distill.py);
  placement.py: where ranks and engines go.

Roles: cli -> flows -> stages -> (runtime, reports) -> (library, storage). Nothing here imports
sparrow.stages, sparrow.reports, sparrow.flows or Prefect (tests/test_layers.py): the stage
tasks are Prefect tasks built on these pieces, and the flows compose the tasks.
"""
