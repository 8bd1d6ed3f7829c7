"""read/ owns the input: bytes in, `Line`s out, and /metrics scrapes in, facts out.

source opens an input and fills the reader's buffer (gzip by magic bytes; NUL holes dropped,
CR-only line ends made LF); logread streams it in blocks, runs the prefilter (every
rule's literal anchors, one pass over the whole buffer) and decodes only the candidate lines and
their neighbours; lineparse undoes colour codes, launcher and collector prefixes; metrics fetches
and parses a Prometheus exposition (over httpget: a total deadline, same-origin redirects); prom reads Prometheus' answers, streamed (jsonstream). A new log prefix goes in lineparse. The lowest stage (the
layers contract in pyproject.toml, checked by lint-imports): may import data, errors and facts (the
store a scrape fills); never matching, knowledge, capacity, render, preflight, serve or cli.
"""
