"""knowledge/ owns what the log means: the named checks that turn numbers
into decisions (checks: one explicit registry, referenced by name from rule files), the
prediction held against what vLLM printed (crosscheck), and the ranked diagnoses (diagnose).

The facts it reads
(version, arguments, KV capacity, the stats series, phases) are facts.py's, below every stage;
rulebook hands matching's loader the checks. A new check is a function in checks.py and one entry
in its registry. May import data, errors, versions, facts, matching/ and capacity/ (the arithmetic,
the model shape, the GPU snapshot); never render, preflight, serve or cli.
"""
