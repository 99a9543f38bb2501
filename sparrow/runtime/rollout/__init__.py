"""The Ray pool of rollout engines: an engine as an actor (worker.py, actor_sync.py), the pool
(actors.py), prompts to engines (dispatch.py), weights from a trainer group (weight_sync.py)."""
