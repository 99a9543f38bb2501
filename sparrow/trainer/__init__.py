"""The trainer system: the policy trainer (one process, or FSDP2 ranks), logprobs and scoring,
checkpoints, offload, the DistillSparse LoRA, weight packing and broadcast to the engines.
The RL mathematics it applies lives in sparrow/rl/."""
