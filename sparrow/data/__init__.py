"""Data: dataset readers, synthetic verifiable tasks, reward functions."""
