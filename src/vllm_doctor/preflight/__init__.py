"""preflight/ owns `vllm-doctor check` and `serve --preflight`: the failures a start would hit,
found before `vllm serve` runs, from its command line and environment (args.py), the model, the
GPUs and the host (context.py, procfs.py). Each check is a small named function (fit.py,
parallel.py, gpunow.py, host.py, model.py) listed in the one map in checks.py; run.py runs them and
builds the Report the renderers show, gate.py is what serve does with it.

Its texts are data: each finding is a rule file (rules/preflight/, kind "preflight") that finding.py
renders from the numbers a check computes; its tables (capabilities, method lists) are
rules/tables/preflight.toml (tables.py).

It may import data, errors, versions, capacity/ (the model's shape, the plan's budget, the
arithmetic, the one NVML adapter), matching/'s template language and knowledge/rulebook (to read and render its rule files), and
huggingface_hub lazily; never render/ or serve/ (cli and serve call it), and never vllm or torch: their installed package metadata and files
are read as text.
"""
