"""The eFLOPs cost model: a step's cost dense and sparse (eflops.py), hardware and model presets
(presets.py), a schedule's cost over length segments (segments.py)."""
