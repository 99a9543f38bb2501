"""Sparrow's library: models, rollout engine, sparse selection, mismatch, cost model, RL math.

It imports no orchestrator (Prefect, Ray, MLflow, DuckDB); sparrow/runtime/, sparrow/reports/, sparrow/stages/ and
sparrow/flows/ build on it.
"""

__version__ = "0.1.0"
