"""Runtime: the machinery the stage tasks run on, below tasks/ and above the library.

    runtime = RunRuntime(cfg, run_id, store, model_path, ...); register(runtime)  # run_runtime.py
    outcome = run_stage(lookup(workdir, run_id), "reward", step, body)           # stage.py

- run_runtime.py: what a running train flow holds in memory (store, tracker, actor pool,
  trainer), registered by the flow and found by a task through (workdir, run_id);
- stage.py: the one mechanism every stage shares (skip if recorded, fail on purpose, write
  by rename, record); retry.py: which faults a stage task retries; interrupt.py: Ctrl-C at a
  stage boundary;
- run_record.py: the run's `runs` row (open, resume with the same config, finish);
  schedules.py: the schedule versions a run starts with and decodes under; retention.py:
  pruning of old policy folders and repair of unsaved ones on resume;
- tracking.py: MLflow, one MLflow run per Sparrow run;
- rollout_actors.py, rollout_dispatch.py: the Ray pool of rollout engines and its work items;
  trainer_group.py, placement.py, weight_sync.py: the trainer as Ray actors on several GPUs,
  where ranks and engines go, and the weights from ranks to engines.

Layers: pipelines -> tasks -> (runtime, reports) -> (sparrow_core, storage). Nothing here
imports tasks/, reports/, pipelines/ or Prefect (tests/test_layers.py): the stage tasks are
Prefect tasks built on these pieces, and the flows compose the tasks.
"""
