#!/usr/bin/env python3
"""ADK-Python's own RemoteA2aAgent (google-adk, pinned with its dependencies in
requirements.txt beside this file) calling an agentd app over A2A: ADK's Runner, with an
in-memory session, runs a root RemoteA2aAgent whose card is agentd's.

Invocation (by a Rust integration test):
    <venv>/bin/python tests/clients/adk/remote_a2a.py

Environment:
    AGENTD_CARD     required: the app's agent card URL (…/a2a/APP/.well-known/agent-card.json)
    AGENTD_PROMPT   optional, default "hello"

Output: exactly ONE JSON line: {"adk_version", "texts": [final text of each turn],
"authors": [...], "custom_metadata": {...} of the last event, ["error": {...}]}. Two turns
are run in one ADK session (the second continues the remote context).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

OUT: dict = {}


async def main() -> None:
    from importlib.metadata import version

    from google.adk.agents.remote_a2a_agent import RemoteA2aAgent
    from google.adk.runners import Runner
    from google.adk.sessions import InMemorySessionService
    from google.genai import types

    OUT["adk_version"] = version("google-adk")
    agent = RemoteA2aAgent(name="agentd_app", agent_card=os.environ["AGENTD_CARD"])
    sessions = InMemorySessionService()
    runner = Runner(app_name="adk_side", agent=agent, session_service=sessions)
    session = await sessions.create_session(app_name="adk_side", user_id="u1")
    prompt = os.environ.get("AGENTD_PROMPT", "hello")
    OUT["texts"], OUT["authors"] = [], []
    for text in (prompt, prompt + " again"):
        final = ""
        async for event in runner.run_async(
            user_id="u1",
            session_id=session.id,
            new_message=types.Content(role="user", parts=[types.Part(text=text)]),
        ):
            OUT["authors"].append(event.author)
            if event.content and event.content.parts and not event.partial:
                said = "".join(p.text or "" for p in event.content.parts)
                if said:
                    final = said
            if event.custom_metadata:
                OUT["custom_metadata"] = {k: str(v) for k, v in event.custom_metadata.items()}
        OUT["texts"].append(final)


if __name__ == "__main__":
    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    except BaseException as e:  # noqa: BLE001 - reported to the test, which asserts on it
        if isinstance(e, SystemExit):
            raise
        while isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]
        OUT["error"] = {"type": type(e).__name__, "message": str(e)[:2000]}
    print(json.dumps(OUT), flush=True)
    sys.exit(0)
