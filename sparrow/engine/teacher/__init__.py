"""The teacher-forced form of block-sparse attention: every position of a given sequence at
once, each query with its own page set (calibration and DistillSparse)."""
