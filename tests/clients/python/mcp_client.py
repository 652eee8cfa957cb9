#!/usr/bin/env python3
"""Real-client driver: exercises agentd's MCP server with the official `mcp` Python SDK
(`streamable_http_client`; version pinned in requirements.txt beside this file).

Invocation (by a Rust integration test):
    <venv>/bin/python tests/clients/python/mcp_client.py <scenario>

Environment:
    AGENTD_MCP_URL  required, e.g. http://127.0.0.1:PORT/mcp or …/apps/APP/mcp
    AGENTD_TOOL     the tool (app) to call
    AGENTD_API_KEY  optional bearer token
    AGENTD_PROMPT   optional, default "hello"

Output: exactly ONE JSON line on stdout: {"scenario", "sdk_version", ...observations...,
["error": {"type", "message"}]}. Exit 0 when it ran (check "error"), 2 on bad usage.

Scenarios and the keys they add:
  list      protocol (negotiated version), server (name), tools: [names], required (of
            AGENTD_TOOL's input schema), has_output_schema
  call      text, is_error, status, session_id, run_id; then the same session again:
            again_text, again_session_same; ping: pinged
  progress  a call with a progress callback: progress (count), progress_text (messages
            joined), increasing, text
  cancel    a call abandoned after 0.5 s (the SDK sends notifications/cancelled):
            cancelled (true when it was abandoned)
  errors    unknown_tool (the error's type), missing_message (isError of the result)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

OUT: dict = {}


async def main(scenario: str) -> None:
    from importlib.metadata import version

    import anyio
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    OUT["sdk_version"] = version("mcp")
    url = os.environ["AGENTD_MCP_URL"]
    tool = os.environ.get("AGENTD_TOOL", "")
    prompt = os.environ.get("AGENTD_PROMPT", "hello")
    headers = {}
    if os.environ.get("AGENTD_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['AGENTD_API_KEY']}"
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60))
    async with http, streamable_http_client(url, http_client=http) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            OUT["protocol"] = init.protocol_version
            OUT["server"] = init.server_info.name
            if scenario == "list":
                tools = (await session.list_tools()).tools
                OUT["tools"] = [t.name for t in tools]
                mine = [t for t in tools if t.name == tool]
                OUT["required"] = mine[0].input_schema.get("required") if mine else None
                OUT["has_output_schema"] = bool(mine and mine[0].output_schema)
            elif scenario == "call":
                r = await session.call_tool(tool, {"message": prompt})
                s = r.structured_content or {}
                OUT.update(text="".join(c.text for c in r.content if c.type == "text"),
                           is_error=r.is_error, status=s.get("status"),
                           session_id=s.get("session_id"), run_id=s.get("run_id"))
                r2 = await session.call_tool(
                    tool, {"message": prompt + " again", "session_id": s.get("session_id")})
                s2 = r2.structured_content or {}
                OUT["again_text"] = "".join(c.text for c in r2.content if c.type == "text")
                OUT["again_session_same"] = s2.get("session_id") == s.get("session_id")
                await session.send_ping()
                OUT["pinged"] = True
            elif scenario == "progress":
                seen: list = []

                async def on_progress(progress, total, message):
                    seen.append((progress, message))

                r = await session.call_tool(tool, {"message": prompt},
                                            progress_callback=on_progress)
                OUT["progress"] = len(seen)
                OUT["progress_text"] = "".join(m or "" for _, m in seen)
                OUT["increasing"] = all(a[0] < b[0] for a, b in zip(seen, seen[1:]))
                OUT["text"] = "".join(c.text for c in r.content if c.type == "text")
            elif scenario == "cancel":
                OUT["cancelled"] = False
                with anyio.move_on_after(0.5) as scope:
                    await session.call_tool(tool, {"message": prompt})
                OUT["cancelled"] = scope.cancelled_caught
                # Give the notification its way out before the session closes.
                await anyio.sleep(0.5)
            elif scenario == "errors":
                try:
                    await session.call_tool("no_such_tool", {"message": "x"})
                    OUT["unknown_tool"] = None
                except Exception as e:  # noqa: BLE001 - the type is the observation
                    OUT["unknown_tool"] = type(e).__name__
                r = await session.call_tool(tool, {})
                OUT["missing_message"] = r.is_error
            else:
                print(f"unknown scenario {scenario!r}", file=sys.stderr)
                sys.exit(2)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    OUT["scenario"] = sys.argv[1]
    try:
        asyncio.run(asyncio.wait_for(main(sys.argv[1]), 60))
    except BaseException as e:  # noqa: BLE001 - reported to the test, which asserts on it
        if isinstance(e, SystemExit):
            raise
        # anyio wraps what a task group raised: report the innermost first error.
        while isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]
        OUT["error"] = {"type": type(e).__name__, "message": str(e)[:2000]}
    print(json.dumps(OUT), flush=True)
