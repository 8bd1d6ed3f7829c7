"""matching/ owns the rules engine: loading and validating the rule files in rules/ (loader),
the condition and template language they use (expr), the linear-time subset (RE2) that every
pattern compiles in (linear), matching candidate lines, wrapped or split ones too (engine), and the documentation `rules show` prints (ruledoc).

The engine knows nothing about vLLM: vLLM's wording lives in rules/*.toml. A new rule is a TOML
file there plus a fixture (rules/README.md). May import data, errors, read/ (Line, the
prefilter, the cache) and facts (the store matches fill, the fact names and phases); the checks'
declarations a rule's names are checked against are handed to the loader (`checks`, by
knowledge/rulebook.py). Never knowledge, capacity, render, preflight, serve or cli. Named `matching`,
not `rules`, because the wheel ships the rule data as vllm_doctor/rules.
"""
