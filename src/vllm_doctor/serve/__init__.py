"""serve/ owns `vllm-doctor serve`: starting `vllm serve` in its own process group, passing its
output through untouched, capturing it, forwarding signals, reaping survivors, watching the
stats lines live, and on a bad exit the incident report directory (report.md, report.json,
server.log, env.txt) built through the pipeline.

May import everything below it (read, matching, knowledge, capacity, render, pipeline); only the
cli imports serve.
"""
