"""The stage ledger: skip a recorded stage, write by rename, record (stage.py); the run's row
(run_record.py); schedule versions (schedules.py); retention and repair (retention.py)."""
