"""The study flow's last task: the study report into `<workdir>/studies/<study_id>/report/`.

    folder = study_report_task(workdir, study_id)     # inside sparrow/flows/study.py's study_flow

A thin Prefect task over sparrow/reports/study.py (write_study_report), which reads the study's rows
from DuckDB and writes the plots, summary.json and summary.md; `sparrow study report` calls
that function directly.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from sparrow.reports.study import default_out, write_study_report


@task(name="study_report", cache_policy=NONE)
def study_report_task(workdir: str, study_id: str) -> str:
    """The report into <workdir>/studies/<study_id>/report/; its folder."""
    out = default_out(workdir, study_id)
    write_study_report(workdir, study_id, out)
    return str(out)
