"""Prefect (and MLflow) settings for running flows on a machine with no Prefect server, quietly.

    from sparrow.flows.prefect_env import quiet_prefect
    quiet_prefect()          # before the first `import prefect`

Without PREFECT_API_URL, Prefect starts a temporary local API server for the flow run (its
"ephemeral" mode, database under PREFECT_HOME, ~/.prefect by default). These defaults allow
that mode, give a slow 2-core machine time to start it, turn off usage analytics, and keep
Prefect's INFO logs (flow run started, task finished, server address) off the console, where
the train flow prints its own per-step table. Anything already set in the environment or a
Prefect profile wins: with PREFECT_API_URL pointing at a server, flows report to it.
"""

from __future__ import annotations

import os
from pathlib import Path

from sparrow.errors import SparrowError

QUIET_DEFAULTS = {
    "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "true",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_LOGGING_SERVER_LEVEL": "WARNING",
    "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    # a failed stage is one error line from the caller; the API (a server's UI) keeps the log
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "CRITICAL",
    "PREFECT_UI_ENABLED": "false",
    # MLflow's database set-up banners (INFO) would land in the middle of the table
    "MLFLOW_LOGGING_LEVEL": "WARNING",
}


def quiet_prefect() -> None:
    """Set QUIET_DEFAULTS in os.environ where unset and make PREFECT_HOME; call before Prefect
    is imported."""
    for key, value in QUIET_DEFAULTS.items():
        os.environ.setdefault(key, value)
    make_prefect_home()


def make_prefect_home() -> None:
    """Make PREFECT_HOME, parents included. Prefect makes only its last folder, and with the
    parent missing its temporary API server then fails to start for minutes of retries."""
    home = os.environ.get("PREFECT_HOME")
    if not home:
        return
    try:
        Path(home).expanduser().mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise SparrowError(
            f"PREFECT_HOME={home} cannot be made ({err.strerror}): Prefect keeps its database "
            "there; set it to a folder this user can write"
        ) from None
