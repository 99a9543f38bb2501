"""RL mathematics: advantage estimators and policy losses, each in a registry."""

from sparrow_core.registry import Registry

ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator")
POLICY_LOSSES: Registry = Registry("policy loss")
