"""capacity/ owns the numbers behind a fit: the model's config.json and shape (modelcfg, through
huggingface_hub), parameter counts, the KV-cache arithmetic (arithmetic: pure functions, the same
for explain, plan and serve), this machine's GPUs (gpu: the one NVML adapter), and `plan`.

May import data, errors and versions; never read, matching, knowledge, render, serve or cli.
"""
