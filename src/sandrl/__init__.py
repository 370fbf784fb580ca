"""sandrl: agentic RL post-training with fast, isolated Linux sandboxes."""

__version__ = "0.1.0"
