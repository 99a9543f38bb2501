"""Mismatch between the sparse actor and the dense policy: per-token acceptance, length bins,
tail statistics (acceptance.py), the Beta tail fit (fit.py), per-bin statistics (stats.py)."""
