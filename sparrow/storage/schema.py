"""The DuckDB schema of a workdir: tables of docs/storage.md.

Every table is keyed so that a stage re-run after a crash replaces its own rows instead of
duplicating them (writers delete-then-insert by key inside one transaction). The view
`token_mismatch` reads every step's per-token Parquet file; it is created by the readers,
not stored, because its file list changes as steps land.
"""

from __future__ import annotations

SCHEMA_VERSION = 6

# statistics with a cluster-bootstrap interval (sparrow/mismatch/bootstrap.py STATISTICS; storage
# does not import the library): bin_stats holds <name>_lo and <name>_hi beside each
INTERVAL_STATISTICS = ("mean", "p1", "p5", "p10", "p50", "min", "share_below_half")
# the calibration table's statistics with intervals
CALIBRATION_INTERVALS = ("p1", "p5", "p10", "mean")

TABLES: dict[str, str] = {
    "meta": """
        CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)""",
    "runs": """
        CREATE TABLE IF NOT EXISTS runs (
            run_id VARCHAR PRIMARY KEY,
            created_at TIMESTAMP DEFAULT current_timestamp,
            model_path VARCHAR,
            config_yaml VARCHAR,
            config_hash VARCHAR,
            status VARCHAR,              -- running | finished | failed | interrupted
            mlflow_run_id VARCHAR)""",
    "stage_runs": """
        CREATE TABLE IF NOT EXISTS stage_runs (
            run_id VARCHAR, step INTEGER, stage VARCHAR,
            started_at TIMESTAMP, finished_at TIMESTAMP, duration_s DOUBLE,
            output_dir VARCHAR,
            PRIMARY KEY (run_id, step, stage))""",
    "schedules": """
        CREATE TABLE IF NOT EXISTS schedules (
            name VARCHAR, version INTEGER,
            created_at TIMESTAMP DEFAULT current_timestamp,
            run_id VARCHAR, step INTEGER, reason VARCHAR,
            page_size INTEGER, bin_tokens INTEGER, topk_pages INTEGER[],
            reserved_bos INTEGER, reserved_eos INTEGER, skip_layers INTEGER[],
            target DOUBLE, yaml_path VARCHAR,
            PRIMARY KEY (name, version))""",
    "bin_stats": """
        CREATE TABLE IF NOT EXISTS bin_stats (
            run_id VARCHAR, step INTEGER, bin INTEGER,
            n BIGINT, mean DOUBLE, p1 DOUBLE, p5 DOUBLE, p10 DOUBLE, p50 DOUBLE,
            beta_a DOUBLE, beta_b DOUBLE, beta_var DOUBLE, ks DOUBLE,
            pages_read INTEGER, schedule_name VARCHAR, schedule_version INTEGER,
            min DOUBLE, share_below_half DOUBLE,   -- lowest acceptance; share below 0.5
            {bin_stats_v5}
            PRIMARY KEY (run_id, step, bin))""",
    "threshold_events": """
        CREATE TABLE IF NOT EXISTS threshold_events (
            run_id VARCHAR, step INTEGER, bin INTEGER,
            kind VARCHAR,                -- below_target | recovered | distill_switch
            p5 DOUBLE, target DOUBLE,
            created_at TIMESTAMP DEFAULT current_timestamp,
            estimator VARCHAR,           -- the acceptance estimator of the value (bin_stats')
            PRIMARY KEY (run_id, step, bin, kind))""",
    "step_metrics": """
        CREATE TABLE IF NOT EXISTS step_metrics (
            run_id VARCHAR, step INTEGER, name VARCHAR, value DOUBLE,
            PRIMARY KEY (run_id, step, name))""",
    "study_arms": """
        CREATE TABLE IF NOT EXISTS study_arms (
            study_id VARCHAR, arm VARCHAR, arm_index INTEGER, run_id VARCHAR,
            overrides VARCHAR[],         -- every override the arm's train run gets, in order
            study_yaml VARCHAR,          -- the study definition as last run
            created_at TIMESTAMP DEFAULT current_timestamp,
            PRIMARY KEY (study_id, arm))""",
    "calibration": """
        CREATE TABLE IF NOT EXISTS calibration (
            calibration_id VARCHAR, model_path VARCHAR, topk_pages INTEGER, bin INTEGER,
            n BIGINT, p5 DOUBLE, mean DOUBLE,
            created_at TIMESTAMP DEFAULT current_timestamp,
            p1 DOUBLE, p10 DOUBLE,
            {calibration_v5}
            PRIMARY KEY (calibration_id, topk_pages, bin))""",
    "sample_stats": """
        CREATE TABLE IF NOT EXISTS sample_stats (
            run_id VARCHAR, step INTEGER, prompt INTEGER, sample INTEGER,
            tokens INTEGER,              -- generated tokens
            mismatch_sum DOUBLE,         -- S = sum over tokens of (1 - acceptance)
            lookup_tokens INTEGER,       -- tokens whose role is lookup; NULL: roles unknown
            lookup_mismatch_sum DOUBLE,  -- S over the lookup tokens; NULL: roles unknown
            min_acceptance DOUBLE,       -- lowest acceptance of the sequence
            log_weight DOUBLE,           -- sum of log p_dense - log q_actor over its tokens
            estimator VARCHAR,
            {sample_stats_v6}
            PRIMARY KEY (run_id, step, prompt, sample))""",
    "eval_results": """
        CREATE TABLE IF NOT EXISTS eval_results (
            run_id VARCHAR, step INTEGER,
            data_source VARCHAR,         -- the rows' data_source; '' for plain rows
            k INTEGER, pass_at_k DOUBLE, -- unbiased pass@k (sparrow/data/eval_scores.py)
            accuracy DOUBLE,             -- mean reward over the source's samples
            prompts INTEGER, samples_per_prompt INTEGER,
            PRIMARY KEY (run_id, step, data_source, k))""",
}

# columns added by schema version 5 (issue 36): the cluster-bootstrap bounds, the floor and
# the acceptance estimator; (table, column, type)
V5_COLUMNS = [
    ("bin_stats", "samples", "BIGINT"),  # trajectories with a token in the bin
    ("bin_stats", "counted", "BOOLEAN"),  # false: below calibrate.min_bin_tokens/_samples
    # exact | top<k>_lower_bound (sparrow/mismatch/stats.py)
    ("bin_stats", "estimator", "VARCHAR"),
    *(("bin_stats", f"{n}_{side}", "DOUBLE") for n in INTERVAL_STATISTICS for side in ("lo", "hi")),
    ("calibration", "samples", "BIGINT"),
    ("calibration", "counted", "BOOLEAN"),
    ("calibration", "estimator", "VARCHAR"),
    *(
        ("calibration", f"{n}_{side}", "DOUBLE")
        for n in CALIBRATION_INTERVALS
        for side in ("lo", "hi")
    ),
    ("threshold_events", "estimator", "VARCHAR"),
]


def _v5_ddl(table: str) -> str:
    return "".join(f"{c} {t}, " for name, c, t in V5_COLUMNS if name == table)


# columns added by schema version 6 (issue 41, docs/async.md): the policy version that
# generated a trajectory (the step whose update gave the engines their weights) and S over
# its sparse mismatch alone (acceptance against the dense policy of that version)
V6_COLUMNS = [
    ("sample_stats", "policy_version", "INTEGER"),
    ("sample_stats", "sparse_mismatch_sum", "DOUBLE"),
]


def _v6_ddl(table: str) -> str:
    return "".join(f"{c} {t}, " for name, c, t in V6_COLUMNS if name == table)


TABLES["sample_stats"] = TABLES["sample_stats"].replace(
    "{sample_stats_v6}", _v6_ddl("sample_stats")
)
TABLES["bin_stats"] = TABLES["bin_stats"].replace("{bin_stats_v5}", _v5_ddl("bin_stats"))
TABLES["calibration"] = TABLES["calibration"].replace("{calibration_v5}", _v5_ddl("calibration"))

# columns of the per-token Parquet files (aggregate_mismatch writes them)
TOKEN_COLUMNS: dict[str, str] = {
    "run_id": "VARCHAR",
    "step": "INTEGER",
    "sample": "INTEGER",
    "prompt": "INTEGER",
    "position": "INTEGER",
    "bin": "INTEGER",
    "pages_read": "INTEGER",
    "acceptance": "DOUBLE",
    "leftover_mass": "DOUBLE",
    "actor_logprob": "DOUBLE",
    "dense_logprob": "DOUBLE",
    # lookup / local / benign / answer / unknown on a chase task's reference path, else NULL
    "role": "VARCHAR",
    # schema version 6 (docs/async.md): the step whose update generated the token's sample
    # (0: the initial model; a synchronous step's is step - 1, a one-step-off step's older)
    "policy_version": "INTEGER",
    # the acceptance against the dense policy of policy_version: the sparse mismatch alone
    # (equal to acceptance, which is against the step's dense policy, when the sample is fresh)
    "sparse_acceptance": "DOUBLE",
    # the token's dense logprob under policy_version's weights (dense_logprob: the step's)
    "version_dense_logprob": "DOUBLE",
}

TOKEN_FILE_GLOB = "runs/*/step-*/aggregate_mismatch/tokens.parquet"


# columns added after a table first shipped: (table, column, type), applied to older files
# when a writer opens them (their old rows hold NULL there); readers of a file no writer has
# opened since select * and take a missing column as NULL
MIGRATIONS = [
    ("calibration", "p1", "DOUBLE"),
    ("calibration", "p10", "DOUBLE"),
    ("bin_stats", "min", "DOUBLE"),
    ("bin_stats", "share_below_half", "DOUBLE"),
    *V5_COLUMNS,
    ("schedules", "selection", "VARCHAR"),  # the page-scoring rule (NULL: centroid)
    ("schedules", "dense_heads", "INTEGER[][]"),  # (layer, KV head) pairs read whole
    *V6_COLUMNS,
]

# columns renamed after a table first shipped (version 4, docs/glossary.md): (table, old, new).
# A writer renames them in an older file; a reader of a file no writer has opened since gets
# its rows under the new names through renamed_row
RENAMED_COLUMNS = [
    ("calibration", "budget_pages", "topk_pages"),  # it held top-k alone
    ("bin_stats", "budget_pages", "pages_read"),
]  # it held pages read
# the per-token Parquet column renamed the same way (token_view_sql reads both)
OLD_TOKEN_COLUMNS = {"budget_pages": "pages_read"}


def create_tables(conn) -> None:
    for ddl in TABLES.values():
        conn.execute(ddl)
    for table, old, new in RENAMED_COLUMNS:
        if old in _columns(conn, table) and new not in _columns(conn, table):
            conn.execute(f"ALTER TABLE {table} RENAME COLUMN {old} TO {new}")
    for table, column, kind in MIGRATIONS:
        conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {kind}")
    conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])


def _columns(conn, table: str) -> set[str]:
    return {
        r[0]
        for r in conn.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = ?", [table]
        ).fetchall()
    }


def renamed_row(table: str, row: dict) -> dict:
    """A row read from a file no writer has upgraded yet, under the columns' new names."""
    for name, old, new in RENAMED_COLUMNS:
        if name == table and old in row and new not in row:
            row = {(new if k == old else k): v for k, v in row.items()}
    return row


def token_view_sql(
    files: list[str], old_files: frozenset[str] = frozenset(), present: frozenset[str] | None = None
) -> str:
    """The token_mismatch view: over the given Parquet files (sparrow.storage.token_files checks
    them first), or typed and empty when there are none. `old_files` hold a column under
    its old name (OLD_TOKEN_COLUMNS): the view gives it under the new one. `present`: the
    columns any of the files holds; a TOKEN_COLUMNS column none holds (files written before
    it) is NULL in the view, so a query naming it runs on any workdir."""
    if files:
        listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
        source = (
            f"SELECT {_token_select(files, old_files)} FROM read_parquet([{listed}], "
            f"union_by_name = true)"
        )
        known = set(present or ()) | set(OLD_TOKEN_COLUMNS.values())
        absent = [c for c in TOKEN_COLUMNS if present is not None and c not in known]
        if absent:
            nulls = ", ".join(f"CAST(NULL AS {TOKEN_COLUMNS[c]}) AS {c}" for c in absent)
            source = f"SELECT *, {nulls} FROM ({source})"
    else:
        columns = ", ".join(f"CAST(NULL AS {t}) AS {c}" for c, t in TOKEN_COLUMNS.items())
        source = f"SELECT {columns} WHERE false"
    return f"CREATE OR REPLACE TEMP VIEW token_mismatch AS {source}"


def _token_select(files: list[str], old_files: frozenset[str]) -> str:
    if not old_files & set(files):
        return "*"
    if old_files >= set(files):  # only old files: the old column takes the new name
        return "* RENAME (" + ", ".join(f"{o} AS {n}" for o, n in OLD_TOKEN_COLUMNS.items()) + ")"
    replaced = ", ".join(f"coalesce({n}, {o}) AS {n}" for o, n in OLD_TOKEN_COLUMNS.items())
    return f"* EXCLUDE ({', '.join(OLD_TOKEN_COLUMNS)}) REPLACE ({replaced})"
