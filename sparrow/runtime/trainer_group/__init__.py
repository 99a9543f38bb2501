"""The trainer as a group of Ray actors: the group (group.py), one rank (rank.py), DistillSparse
on the ranks (distill.py)."""
