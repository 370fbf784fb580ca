"""Policy updates: the GRPO family of losses, the trainer, its checkpoints and config."""
