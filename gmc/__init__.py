"""gmc: asynchronous RL post-training of LLMs with group-mass capping (GMC-GRPO, arXiv 2610.01896)."""

__version__ = "0.1.0"
