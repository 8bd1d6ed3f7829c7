"""`vllm-doctor mcp`: the diagnosis as tools for agents, over the Model Context Protocol.

This folder owns the MCP server (server.py: the official `mcp` SDK's MCPServer, its tools'
descriptions, stdio or streamable HTTP), the tools' work without the SDK (tools.py: thin calls into
the same pipeline the CLI calls, answered as the verdict line and the CLI's JSON) and what a client
may ask to read (guard.py: files under the --root directories, resolved, regular, at most 1 GiB;
URLs under --allow-url). It may import pipeline, render, preflight, knowledge, capacity and read;
only cli imports it, lazily inside the `mcp` command, so the SDK (installed by the `mcp` extra) is
never imported by the other commands. The order is checked by `lint-imports`.
"""
