"""The Prefect tasks the flows call: one file per stage of the RL step, the calibrate flow's and
the study's.

- the step (sparrow/flows/train.py's rl_step): rollout.py, reward.py, dense_score.py,
  aggregate_mismatch.py, reoptimize_schedule.py, policy_update.py, distill_lora.py,
  sync_weights.py, checkpoint.py, evaluate.py; distill_switch.py is the DistillSparse switch
  that distill_lora measures and reoptimize_schedule decides on;
- calibration (sparrow/flows/calibrate.py): calibrate.py (sample, replay, time generation),
  calibrate_store.py (choose and store);
- the study (sparrow/flows/study.py): study_arms.py (plan the arms), study_report.py (the report,
  a thin task over sparrow/reports/study.py).

Roles (tests/test_layers.py): cli -> flows -> stages -> (runtime, reports) -> (library,
storage). The machinery a stage runs on is sparrow/runtime/'s, the reports are
sparrow/reports/'s; stages take plain values (ids, paths, overrides) and return references.
"""
