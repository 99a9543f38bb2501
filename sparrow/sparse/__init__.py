"""Block-sparse selection: schedules and presets, page selection (calibration: control/)."""

from sparrow.sparse.io import load_schedule_yaml, resolve_schedule, save_schedule_yaml
from sparrow.sparse.presets import PRESETS, get_preset
from sparrow.sparse.schedule import Schedule, ScheduleError

__all__ = [
    "PRESETS",
    "Schedule",
    "ScheduleError",
    "get_preset",
    "load_schedule_yaml",
    "resolve_schedule",
    "save_schedule_yaml",
]
