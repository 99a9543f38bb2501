"""Block-sparse selection: schedules and presets, page selection, calibration."""

from sparrow_core.sparse.schedule import Schedule

__all__ = ["Schedule"]
