"""matching/ owns the rules engine: loading and validating the rule files in rules/ (loader),
the condition and template language they use (expr), the ReDoS guard (redos), matching candidate
lines, wrapped or split ones too (engine), and the documentation `rules show` prints (ruledoc).

The engine knows nothing about vLLM: vLLM's wording lives in rules/*.toml. A new rule is a TOML
file there plus a fixture (rules/README.md). May import data, errors, cache, read/ (Line, the
prefilter), and knowledge.facts (the store matches fill, and the fact names rules are checked
against); never knowledge's checks or diagnose, capacity, render, serve or cli. Named `matching`,
not `rules`, because the wheel ships the rule data as vllm_doctor/rules.
"""
