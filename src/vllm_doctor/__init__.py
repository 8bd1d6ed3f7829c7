"""vllm-doctor: explain why vllm serve failed or queues requests."""

__version__ = "0.1.0"
