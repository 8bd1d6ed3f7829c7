"""knowledge/ owns what the log means: the facts it states (facts: version, arguments, KV
capacity, memory profile, the stats series, startup phases), the named checks that turn numbers
into decisions (checks: one explicit registry, referenced by name from rule files), the
prediction held against what vLLM printed (crosscheck), and the ranked diagnoses (diagnose).

A new check is a function in checks.py and one entry in its registry. May import data, errors,
versions, matching.expr (conditions and templates) and capacity/ (the arithmetic, the model
shape, the GPU snapshot); never read, render, serve or cli.
"""
