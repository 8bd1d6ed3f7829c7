"""`vllm-doctor mcp`: the tools (tools.py) on the official MCP SDK's MCPServer, over stdio or, with
--http, its streamable HTTP on 127.0.0.1. Each answer is one text block, the verdict line first and
then the JSON (also as structured content); each refusal a tool error of one sentence, after
which the server goes on answering."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from vllm_doctor.errors import DoctorError
from vllm_doctor.mcp import tools
from vllm_doctor.mcp.guard import Guard

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)

EXPLAIN = (
    "Diagnose a vLLM server log (vllm serve's output): why it failed to start, crashed or queues requests. "
    "Give `paths` (log files under the server's allowed roots; .gz works) or `text` (the log itself). The "
    "answer's first line is the verdict (failed / degraded / healthy / unknown and the failure's category), "
    "then the report as JSON (schema vllm-doctor/report/1): each diagnosis with its rule, evidence lines, "
    "numbers and ordered fixes, and the corrected vllm serve command. Optional: a model `config` "
    "(config.json under a root), `target_concurrency` and `target_len` for the capacity arithmetic, "
    "`lifetime` (1-based) to lead with an earlier server start. Same result as `vllm-doctor explain -f json`."
)
CHECK = (
    "Before starting vLLM: find what a `vllm serve` command line would fail on (fit in GPU memory, "
    "tensor-parallel size against heads, context length, quantization, the model's config, the host). "
    "Give `argv`, the command's words: the model first, then its flags (a leading `vllm serve` is dropped). "
    "Runs offline, without asking the GPUs or the installed vLLM. The first line is the verdict, then the "
    "report as JSON (vllm-doctor/report/1); the same as `vllm-doctor check --no-ask-vllm --no-gpu -f json`."
)
PLAN = (
    "The KV-cache and weight arithmetic before a start: weights, KV bytes per token, tokens and sequences "
    "that fit, valid TP sizes and a ready vllm serve line. Give the GPU's memory (`gpu_memory`, e.g. 80GB) "
    "and either a model `config` (config.json under a root) or the shape (`params` like 7B, `layers`, "
    "`kv_heads`, `head_dim`, ...). The first line says whether it fits, then the plan as JSON "
    "(vllm-doctor/plan/1), as `vllm-doctor plan -f json` prints it."
)
RULES = (
    "The diagnosis rules vllm-doctor knows. Without `rule_id`: every rule (id, kind, category, severity, "
    "title) as a JSON list. With a rule id or a category (from a report's `rule` or `category`): its "
    "documentation, what it matches, why it happens and its fixes, as `vllm-doctor rules show ID` prints it."
)
METRICS = (
    "Diagnose a running vLLM server from its Prometheus /metrics: give `sources`, /metrics URLs (only under "
    "the prefixes the server was started with --allow-url) or saved scrapes (files under a root); several in "
    "time order make a series (queueing, a full KV cache, stalls). The first line is the verdict, then the "
    "report as JSON (vllm-doctor/report/1), as `vllm-doctor explain --metrics ... -f json` prints it."
)

Positive = Annotated[int, Field(ge=1, le=1 << 40)]


def _answer(work: Callable[[], tools.Answer]) -> CallToolResult:
    """The work's verdict and JSON, or its refusal as one sentence; never a traceback."""
    try:
        verdict, document = work()
    except DoctorError as e:
        return _error(str(e))
    except Exception as e:  # our own bug: named in one line, the server stays up
        return _error(f"Internal error ({type(e).__name__}); the CLI with VLLM_DOCTOR_DEBUG=1 shows the traceback.")
    structured: dict[str, Any] | None = None
    try:
        loaded = json.loads(document)
        structured = loaded if isinstance(loaded, dict) else {"items": loaded}
    except ValueError:
        pass
    return CallToolResult(
        content=[TextContent(type="text", text=f"{verdict}\n{document}")], structured_content=structured
    )


def _error(sentence: str) -> CallToolResult:
    line = " ".join(sentence.split())  # one line, whatever the message held
    line += "" if line.endswith((".", "?", "!")) else "."
    return CallToolResult(content=[TextContent(type="text", text=line)], is_error=True)


async def _one_sentence(ctx: Any, call_next: Any) -> Any:
    """The SDK's own refusals of a tool call (arguments that fail the input schema: pydantic's
    several lines and a link) said in one sentence too, naming the field and what it should be."""
    result = await call_next(ctx)
    if ctx.method != "tools/call" or not isinstance(result, dict) or not result.get("isError"):
        return result
    content = result.get("content") or [{}]
    lines = [line.strip() for line in str(content[0].get("text", "")).splitlines() if line.strip()]
    if len(lines) < 2:
        return result
    if "validation error" in lines[0] and len(lines) >= 3:
        tool = lines[0].removeprefix("Error executing tool ").split(":", 1)[0]
        why = lines[2].split(" [type=", 1)[0].rstrip(".")
        return _error(f"The {tool} tool's argument {lines[1]!r} is invalid: {why}.").model_dump(
            mode="json", by_alias=True, exclude_none=True
        )
    return {**result, "content": [{"type": "text", "text": lines[0]}]}


def build(guard: Guard) -> MCPServer:
    from vllm_doctor import __version__

    server: MCPServer = MCPServer(
        "vllm-doctor",
        version=__version__,
        instructions="Reads vLLM server logs, command lines and model shapes; names the failure and the fixes.",
        log_level="WARNING",
        middleware=[_one_sentence],
    )

    @server.tool(name="explain", description=EXPLAIN, annotations=READ_ONLY)
    def explain(
        paths: list[str] | None = None,
        text: str | None = None,
        config: str | None = None,
        target_concurrency: Positive | None = None,
        target_len: Positive | None = None,
        lifetime: Positive | None = None,
    ) -> CallToolResult:
        return _answer(lambda: tools.explain(guard, paths, text, config, target_concurrency, target_len, lifetime))

    @server.tool(name="check", description=CHECK, annotations=READ_ONLY)
    def check(argv: list[str]) -> CallToolResult:
        return _answer(lambda: tools.check(argv, guard))

    @server.tool(name="plan", description=PLAN, annotations=READ_ONLY)
    def plan(
        gpu_memory: str,
        config: str | None = None,
        params: str | None = None,
        layers: Positive | None = None,
        heads: Positive | None = None,
        kv_heads: Positive | None = None,
        head_dim: Positive | None = None,
        dtype: str | None = None,
        gpus: Positive | None = None,
        max_model_len: Positive | None = None,
        tp: Positive | None = None,
        kv_cache_dtype: str | None = None,
        quantization: str | None = None,
        target_concurrency: Positive | None = None,
        utilization: Annotated[float, Field(gt=0, le=1)] | None = None,
    ) -> CallToolResult:
        shape = {k: v for k, v in locals().items() if k in tools.PLAN_KEYS}
        return _answer(lambda: tools.plan(guard, config, **shape))

    @server.tool(name="rules", description=RULES, annotations=READ_ONLY)
    def rules(rule_id: str | None = None) -> CallToolResult:
        return _answer(lambda: tools.rules(rule_id))

    @server.resource("rule://{rule_id}", name="rule", mime_type="text/markdown",
                     description="A rule's documentation (an id or a category from a report), as `rules show` prints it.")  # fmt: skip
    def rule_doc(rule_id: str) -> str:
        return tools.rule_doc(rule_id)

    @server.tool(
        name="metrics", description=METRICS, annotations=READ_ONLY.model_copy(update={"open_world_hint": True})
    )
    def metrics(sources: list[str]) -> CallToolResult:
        return _answer(lambda: tools.metrics(guard, sources))

    return server


def run(roots: list[str], urls: list[str], http: bool, host: str, port: int) -> None:
    server = build(Guard.of(roots, urls))
    if http:
        server.run("streamable-http", host=host, port=port)
    else:
        server.run("stdio")
