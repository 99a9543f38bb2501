"""Reward functions (registry): filled in by the rewards module."""

from sparrow_core.registry import Registry

REWARD_FUNCTIONS: Registry = Registry("reward function")
