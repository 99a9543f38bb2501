"""The Prefect tasks the flows call: one file per stage of the RL step, the calibrate flow's and
the study's.

- the step (pipelines/train.py's rl_step): rollout.py, reward.py, dense_score.py,
  aggregate_mismatch.py, reoptimize_schedule.py, policy_update.py, distill_lora.py,
  sync_weights.py, checkpoint.py, evaluate.py; distill_switch.py is the DistillSparse switch
  that distill_lora measures and reoptimize_schedule decides on;
- calibration (pipelines/calibrate.py): calibrate.py (sample, replay, time generation),
  calibrate_store.py (choose and store);
- the study (pipelines/study.py): study_arms.py (plan the arms), study_report.py (the report,
  a thin task over reports/study.py).

Layers (tests/test_layers.py): pipelines -> tasks -> (runtime, reports) -> (sparrow_core,
storage). The machinery a stage runs on is runtime/'s, the reports are reports/'s; tasks take
plain values (ids, paths, overrides) and return references.
"""
