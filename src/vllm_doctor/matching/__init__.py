"""matching/ owns the rules engine: loading and validating the rule files in rules/ (loader),
the condition and template language they use (expr), the linear-time subset (RE2) that --rules
patterns compile in (linear), the ReDoS guard of the built-in patterns (redos), matching candidate
lines, wrapped or split ones too (engine), and the documentation `rules show` prints (ruledoc).

The engine knows nothing about vLLM: vLLM's wording lives in rules/*.toml. A new rule is a TOML
file there plus a fixture (rules/README.md). May import data, errors, cache, read/ (Line, the
prefilter), knowledge.facts (the store matches fill, the fact names and phases) and the checks'
declarations in knowledge.checks (what a rule's names are checked against, on load only); never
knowledge.diagnose, capacity, render, serve or cli. Named `matching`,
not `rules`, because the wheel ships the rule data as vllm_doctor/rules.
"""
