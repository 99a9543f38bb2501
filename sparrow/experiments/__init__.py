"""Experiments on top of the library: the stability study's numbers (study.py) and the GPU
testbed (testbed/)."""
