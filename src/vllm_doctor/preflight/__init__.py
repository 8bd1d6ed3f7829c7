"""preflight/ owns `vllm-doctor check` and `serve --preflight`: the failures a start would hit,
found before `vllm serve` runs, from its command line and environment (args.py), the model, the
GPUs and the host (context.py, procfs.py). Each check is a small named function (fit.py,
parallel.py, gpunow.py, host.py, model.py) listed in the one map in checks.py; run.py runs them and
builds the Report the renderers show, gate.py is what serve does with it.

It may import data, errors, versions and capacity/ (the model's shape, the plan's budget, the
arithmetic, the one NVML adapter), and huggingface_hub lazily; never read/, matching/, knowledge/,
render/ or serve/ (cli and serve call it), and never vllm or torch: their installed package
metadata and files are read as text.
"""
