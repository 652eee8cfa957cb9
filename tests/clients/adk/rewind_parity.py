#!/usr/bin/env python3
"""ADK-Python's own Runner.rewind_async over a session agentd stored: the session's events
and artifact versions are replayed into ADK's InMemorySessionService and
InMemoryArtifactService, then ADK rewinds it; the test compares ADK's rewind event and the
state and artifacts after it with agentd's.

Invocation (by a Rust integration test):
    <venv>/bin/python tests/clients/adk/rewind_parity.py

Environment:
    AGENTD_PARITY_INPUT  required: a JSON file {"app", "user", "session", "initialState",
                         "events": [agentd's events], "artifacts": {filename: [inline_data
                         of version 0, 1, …]}, "before": invocation id}

Output: exactly ONE JSON line: {"adk_version", "stateDelta", "artifactDelta", "state",
"artifacts": {filename: inline_data of the latest version, or null}, ["error": "..."]}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

OUT: dict = {}


async def main() -> None:
    from importlib.metadata import version

    from google.adk.agents import LlmAgent
    from google.adk.artifacts import InMemoryArtifactService
    from google.adk.events import Event
    from google.adk.runners import Runner
    from google.adk.sessions import InMemorySessionService
    from google.genai import types

    OUT["adk_version"] = version("google-adk")
    with open(os.environ["AGENTD_PARITY_INPUT"], encoding="utf-8") as f:
        data = json.load(f)
    app, user, sid = data["app"], data["user"], data["session"]
    sessions = InMemorySessionService()
    artifacts = InMemoryArtifactService()
    session = await sessions.create_session(
        app_name=app, user_id=user, session_id=sid, state=data["initialState"]
    )
    # Artifact versions first, in order (the events only name them).
    for filename, versions in data["artifacts"].items():
        for blob in versions:
            part = types.Part(
                inline_data=types.Blob(
                    mime_type=blob.get("mimeType"), data=_b64(blob.get("data", ""))
                )
            )
            await artifacts.save_artifact(
                app_name=app, user_id=user, session_id=sid, filename=filename, artifact=part
            )
    for raw in data["events"]:
        await sessions.append_event(session, Event.model_validate(raw))
    runner = Runner(
        app_name=app,
        agent=LlmAgent(name="unused", model="gemini-2.0-flash"),
        session_service=sessions,
        artifact_service=artifacts,
    )
    await runner.rewind_async(user_id=user, session_id=sid, rewind_before_invocation_id=data["before"])
    after = await sessions.get_session(app_name=app, user_id=user, session_id=sid)
    rewind = after.events[-1]
    OUT["stateDelta"] = rewind.actions.state_delta
    OUT["artifactDelta"] = rewind.actions.artifact_delta
    OUT["state"] = after.state
    latest = {}
    for filename in data["artifacts"]:
        part = await artifacts.load_artifact(
            app_name=app, user_id=user, session_id=sid, filename=filename
        )
        blob = part.inline_data if part is not None else None
        latest[filename] = (
            None
            if blob is None or not blob.data
            else {"mimeType": blob.mime_type, "data": _b64out(blob.data)}
        )
    OUT["artifacts"] = latest


def _b64(text: str) -> bytes:
    import base64

    text = text.replace("-", "+").replace("_", "/")
    return base64.b64decode(text + "=" * (-len(text) % 4))


def _b64out(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as e:  # reported in the JSON, so the test shows it
        import traceback

        OUT["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    sys.stdout.write(json.dumps(OUT) + "\n")
