"""`sparrow schedule`: list the schedule presets, show one schedule bin by bin.

    sparrow schedule list [--json]
    sparrow schedule show qwen3-1.7b-0.86 [--json]
    sparrow schedule show my-schedule.yaml
    sparrow schedule show calibrated-tiny-qwen3-0.86 --workdir ./sparrow-work     # newest version
    sparrow schedule show calibrated-tiny-qwen3-0.86@2 --workdir ./sparrow-work   # version 2

`show` takes a preset name or a schedule file (.yaml, .yml, .json); its JSON is the file
format (docs/schedules.md). It also takes a stored schedule (calibrated, or a version the
train flow's controller made) by name (newest version) or name@version, read from the DuckDB
`schedules` table of --workdir, or of ./sparrow-work when that holds one (the default workdir
of the other commands); a stored name shadows a preset. Pages read per step are top-k plus reserved_bos + reserved_eos.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sparrow.cli.output import print_json, print_table
from sparrow.config.schema import PipelineConfig
from sparrow.sparse.io import resolve_schedule, schedule_to_dict
from sparrow.sparse.presets import PRESETS
from sparrow.sparse.schedule import Schedule


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("schedule", help="list schedule presets, show a schedule")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="one line per preset")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(func=run_list)
    show = actions.add_parser("show", help="one schedule, bin by bin")
    show.add_argument("schedule", metavar="NAME_OR_FILE", help="a preset name or a schedule file")
    show.add_argument("--json", action="store_true", help="print the schedule as JSON")
    show.add_argument(
        "--workdir",
        default=None,
        help="also look up NAME or NAME@VERSION in this workdir's schedules table "
        f"(default: {PipelineConfig.workdir} when it holds a DuckDB file)",
    )
    show.set_defaults(func=run_show)


def summary_row(schedule: Schedule) -> dict:
    """One line of `schedule list`."""
    return {
        "name": schedule.name,
        "target": schedule.target,
        "bins": schedule.num_bins,
        "page_size": schedule.page_size,
        "bin_tokens": schedule.bin_tokens,
        "first_topk": schedule.topk_pages[0],
        "last_topk": schedule.topk_pages[-1],
        "last_pages_read": schedule.pages_for_topk(schedule.topk_pages[-1]),
    }


def bin_rows(schedule: Schedule) -> list[dict]:
    """One row per bin: total positions covered, top-k, pages read, KV budget in tokens."""
    rows = []
    for index, topk in enumerate(schedule.topk_pages):
        start, end = schedule.bin_bounds(index)
        pages = schedule.pages_for_topk(topk)
        rows.append(
            {
                "bin": index,
                "positions": f"{start}-{end - 1}" if end is not None else f"{start}-",
                "topk_pages": topk,
                "pages_read": pages,
                "budget_tokens": pages * schedule.page_size,
            }
        )
    return rows


# short headers keep the table inside 80 columns (rich cuts preset names otherwise)
LIST_LABELS = {
    "name": "name",
    "target": "target",
    "bins": "bins",
    "page_size": "page",
    "bin_tokens": "bin",
    "first_topk": "first",
    "last_topk": "last",
    "last_pages_read": "read",
}
LIST_LEGEND = (
    "page: page size (tokens); bin: bin width (tokens); first/last: top-k pages in the first "
    "and last bin; read: pages read per step in the last bin (top-k + reserved)"
)


def run_list(args: argparse.Namespace) -> int:
    rows = [summary_row(s) for s in PRESETS.values()]
    if args.json:
        print_json(rows)
        return 0
    labelled = [{LIST_LABELS[k]: v for k, v in row.items()} for row in rows]
    print_table(labelled, title="schedule presets", digits=2)
    print(LIST_LEGEND)
    return 0


def stored_schedule(workdir: str, spec: str) -> Schedule | None:
    """NAME or NAME@VERSION from the workdir's schedules table; None when it has no such name."""
    from sparrow.sparse.io import schedule_from_dict
    from sparrow.sparse.schedule import ScheduleError
    from sparrow.storage.schedule_rows import stored_schedule as stored_row

    name, sep, version = spec.rpartition("@") if "@" in spec else (spec, "", "")
    if sep and not version.isdigit():
        raise ScheduleError(f"schedule {spec!r}: the version after @ must be a whole number")
    found = stored_row(workdir, name, int(version) if sep else None)
    if found is None:
        if sep:
            raise ScheduleError(f"schedule {name!r} has no version {version} in {workdir}")
        return None
    data, number, reason = found
    data["description"] = f"version {number} from {workdir} ({reason})"
    return schedule_from_dict(data, source=f"schedules row ({name}, v{number})")


def default_workdir() -> str | None:
    """The other commands' default workdir, when it holds a DuckDB file to look in."""
    from sparrow.storage.layout import db_path

    found = db_path(Path(PipelineConfig.workdir))
    return PipelineConfig.workdir if found.is_file() else None


def run_show(args: argparse.Namespace) -> int:
    workdir = args.workdir or default_workdir()
    schedule = stored_schedule(workdir, args.schedule) if workdir else None
    if schedule is None:
        schedule = resolve_schedule(args.schedule)
    if args.json:
        print_json(schedule_to_dict(schedule))
        return 0
    print(f"schedule {schedule.name}: {schedule.description}".rstrip(": "))
    print(
        f"target {schedule.target}, page_size {schedule.page_size}, "
        f"bin_tokens {schedule.bin_tokens}, reserved_bos {schedule.reserved_bos}, "
        f"reserved_eos {schedule.reserved_eos}, "
        f"skip_layers {list(schedule.skip_layers)}"
    )
    print_table(bin_rows(schedule))
    return 0
