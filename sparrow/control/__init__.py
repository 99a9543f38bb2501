"""Calibration and online control of a schedule: they replay sequences on the engine, so they
sit above it (sparse/ holds the schedule and the selection rule, below the kernels)."""
