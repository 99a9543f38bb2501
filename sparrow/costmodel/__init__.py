"""The eFLOPs cost model: a step's cost dense and sparse (eflops.py), hardware and model presets
(presets.py), a schedule's cost over length segments (segments.py)."""

from sparrow.costmodel.eflops import attended_tokens, dense_cost, sparse_cost
from sparrow.costmodel.presets import (
    HARDWARE,
    MODELS,
    CostModelError,
    Hardware,
    ModelShape,
    get_hardware,
    get_model,
)
from sparrow.costmodel.segments import (
    SCORING_PRICES,
    VARIANTS,
    BinCost,
    Cost,
    ScheduleCost,
    check_scoring,
    check_variant,
    schedule_cost,
    segment_cost,
)

__all__ = [
    "HARDWARE",
    "MODELS",
    "SCORING_PRICES",
    "VARIANTS",
    "BinCost",
    "Cost",
    "CostModelError",
    "Hardware",
    "ModelShape",
    "ScheduleCost",
    "attended_tokens",
    "check_scoring",
    "check_variant",
    "dense_cost",
    "get_hardware",
    "get_model",
    "schedule_cost",
    "segment_cost",
    "sparse_cost",
]
