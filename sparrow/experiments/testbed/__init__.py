"""The GPU testbed model's training pieces: pointer_chase_long data along a length curriculum,
the step plan that fits a wall-clock budget, the adaptive walk through the curriculum's
stages, and its held-out evaluation.

scripts/train_testbed_model.py puts them together; docs/testbed.md says what the testbed is
and how to train it. Tests: `python -m pytest -q tests/experiments/testbed`.
"""
