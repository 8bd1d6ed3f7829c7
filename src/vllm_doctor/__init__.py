"""vllm-doctor: why `vllm serve` failed or queues requests, from its log or its /metrics.

The tree follows the pipeline: read/ (bytes -> Lines) -> matching/ (rules -> matches and facts)
-> knowledge/ (checks -> ranked diagnoses) -> render/ (text, markdown, json), with capacity/
(model config, KV arithmetic, GPU, plan) beside it and serve/ wrapping `vllm serve`. pipeline.py
builds every Report; data.py holds the dataclasses every stage passes on, facts.py the fact schema
and store; errors.py the one user-facing error type; cli/ the thin commands on top. The order is a
contract `lint-imports` checks (pyproject.toml). CONTRIBUTING.md maps where new things go.
"""

__version__ = "0.1.0"
