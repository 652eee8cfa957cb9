#!/usr/bin/env python3
"""Real-client driver: exercises agentd's OpenAI-compatible endpoints with the
official `openai` Python SDK (version pinned in requirements.txt beside this file).

Invocation (by a Rust integration test):
    <venv>/bin/python tests/clients/python/openai_client.py <scenario>

Environment:
    AGENTD_URL      required, e.g. http://127.0.0.1:PORT  (base_url = AGENTD_URL + "/v1")
    AGENTD_APP      required, sent as `model`
    AGENTD_USER     required, sent as `user`
    AGENTD_API_KEY  optional, default "unused"
    AGENTD_PROMPT   optional, first user message, default "hello"
    AGENTD_PROMPT2  optional, follow-up message (the *-continue scenarios), default "again"

Output: exactly ONE JSON line on stdout:
    {"scenario": "<name>", "sdk_version": "x.y.z", ...observations..., ["error": {...}]}
If the SDK (or our code) raises, the observations gathered so far are kept and
    "error": {"type": "<exception class>", "message": str,
              "status_code": int|null, "body": <error body>|null}
is added; the exit code is still 0. Exit codes: 0 = ran (check "error"),
2 = bad usage/env, 124 = 30 s overall timeout (partial JSON still printed, with
error.type "DriverTimeout"). Requests use max_retries=0 and a 20 s timeout.

Scenarios and the keys they add:
  models              ids: [str]
  chat                non-stream chat.completions.create
                      id, content, finish_reason, usage: {prompt_tokens,...}|null,
                      session_header (response header x-agentd-session-id)
  chat-stream         stream=True, stream_options={"include_usage": true}
                      id, content (concatenated deltas), finish_reason, chunks (count),
                      usage_chunks (chunks with choices == []), usage, session_header
  chat-continue       first: {content, session_header}; second (sent with header
                      x-agentd-session-id and only the new message):
                      {content, session_header}
  chat-client-tool    first via client.chat.completions.stream(tools=[confirm_booking]):
                      first: {finish_reason, tool_calls: [{id, name, arguments}],
                              event_types: [str], session_header}
                      then the tool result (role tool, content '{"ok":true}') with the
                      prior messages and the session header, again via .stream():
                      second: {content, finish_reason, session_header}
  responses           non-stream responses.create: id, status, output_text, usage
  responses-stream    responses.stream(...) helper: types: [str], seqs: [int],
                      delta_text, id, status, output_text (get_final_response())
  responses-continue  first: {id, output_text}; second (previous_response_id=first.id):
                      {id, output_text, previous_response_id}
  responses-branch    first, second (after first), then third with previous_response_id =
                      first.id (a branch), then fourth after second: each {id, output_text},
                      and second_again = responses.retrieve(second.id).output_text
  background          create(background=True) then poll retrieve():
                      id, statuses (distinct, in order, incl. create's), status, output_text
  background-resume   create(background=True, stream=True), read until
                      sequence_number >= 2, close; then resume twice:
                      first: {id, types, seqs}
                      resume_helper: responses.stream(response_id=, starting_after=last)
                        -> {types, seqs, output_text}. NOTE: the SDK sends
                        GET /responses/{id}?stream=true WITHOUT starting_after and
                        filters seq <= last locally; its state machine needs the
                        replay to start at response.created.
                      resume_raw: responses.retrieve(id, stream=True, starting_after=last)
                        -> GET ...?starting_after=N&stream=true; {types, seqs, output_text}
                        (output_text from the response.completed event, if any)
  cancel              create(background=True); cancel(); retrieve() (polled up to 5 s
                      until terminal): id, created_status, cancel_status, retrieve_status
  error               chat stream expecting a mid-stream `data: {"error": {...}}`:
                      content (before the error), chunks, finish_reason, plus "error"
                      (openai.APIError, message = error.message, body = the error object)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

OUT: dict = {}
_printed = False
_print_lock = threading.Lock()


def emit(code: int) -> None:
    global _printed
    with _print_lock:
        if not _printed:
            _printed = True
            sys.stdout.write(json.dumps(OUT, default=str) + "\n")
            sys.stdout.flush()
    if code:
        os._exit(code)


class DriverTimeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise DriverTimeout("driver exceeded 30 s")


def _hard_kill():
    OUT.setdefault("error", {"type": "DriverTimeout", "message": "hard timeout", "status_code": None, "body": None})
    emit(124)


def err_record(e: BaseException) -> dict:
    return {
        "type": type(e).__name__,
        "message": str(getattr(e, "message", None) or e),
        "status_code": getattr(e, "status_code", None),
        "body": getattr(e, "body", None),
    }


def dump(obj):
    if obj is None:
        return None
    return obj.model_dump(mode="json", exclude_unset=True) if hasattr(obj, "model_dump") else obj


# --------------------------------------------------------------------------- scenarios

TERMINAL = ("completed", "failed", "cancelled", "incomplete")
SESSION = "x-agentd-session-id"

TOOL = {
    "type": "function",
    "function": {
        "name": "confirm_booking",
        "description": "Ask the user to confirm a booking.",
        "parameters": {
            "type": "object",
            "properties": {"when": {"type": "string"}},
            "required": ["when"],
        },
    },
}


def sc_models(c, env, out):
    out["ids"] = [m.id for m in c.models.list()]


def sc_chat(c, env, out):
    raw = c.chat.completions.with_raw_response.create(
        model=env["app"], messages=[{"role": "user", "content": env["prompt"]}], user=env["user"]
    )
    out["session_header"] = raw.headers.get(SESSION)
    r = raw.parse()
    out["id"] = r.id
    out["content"] = r.choices[0].message.content if r.choices else None
    out["finish_reason"] = r.choices[0].finish_reason if r.choices else None
    out["usage"] = dump(r.usage)


def sc_chat_stream(c, env, out):
    raw = c.chat.completions.with_raw_response.create(
        model=env["app"],
        messages=[{"role": "user", "content": env["prompt"]}],
        user=env["user"],
        stream=True,
        stream_options={"include_usage": True},
    )
    out["session_header"] = raw.headers.get(SESSION)
    _consume_chat_stream(raw.parse(), out)


def _consume_chat_stream(stream, out):
    out.update(id=None, content="", finish_reason=None, chunks=0, usage_chunks=0, usage=None)
    with stream:
        for ch in stream:
            out["chunks"] += 1
            out["id"] = ch.id
            if not ch.choices:
                out["usage_chunks"] += 1
            for choice in ch.choices:
                if choice.delta and choice.delta.content:
                    out["content"] += choice.delta.content
                if choice.finish_reason:
                    out["finish_reason"] = choice.finish_reason
            if ch.usage is not None:
                out["usage"] = dump(ch.usage)


def sc_chat_continue(c, env, out):
    raw = c.chat.completions.with_raw_response.create(
        model=env["app"], messages=[{"role": "user", "content": env["prompt"]}], user=env["user"]
    )
    sid = raw.headers.get(SESSION)
    r = raw.parse()
    out["first"] = {"content": r.choices[0].message.content, "session_header": sid}
    raw2 = c.chat.completions.with_raw_response.create(
        model=env["app"],
        messages=[{"role": "user", "content": env["prompt2"]}],
        user=env["user"],
        extra_headers={SESSION: sid} if sid else None,
    )
    r2 = raw2.parse()
    out["second"] = {"content": r2.choices[0].message.content, "session_header": raw2.headers.get(SESSION)}


def sc_chat_client_tool(c, env, out):
    messages = [{"role": "user", "content": env["prompt"]}]
    first = out["first"] = {"event_types": []}
    with c.chat.completions.stream(model=env["app"], messages=messages, tools=[TOOL], user=env["user"]) as s:
        # ChatCompletionStream keeps the httpx response privately; headers only from there.
        resp = getattr(s, "_response", None)
        sid = resp.headers.get(SESSION) if resp is not None else None
        first["session_header"] = sid
        for ev in s:
            if not first["event_types"] or first["event_types"][-1] != ev.type:
                first["event_types"].append(ev.type)
        final = s.get_final_completion()
    msg = final.choices[0].message
    first["finish_reason"] = final.choices[0].finish_reason
    first["tool_calls"] = [
        {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments} for tc in (msg.tool_calls or [])
    ]
    if not msg.tool_calls:
        return
    messages.append(
        {
            "role": "assistant",
            "content": msg.content,
            "tool_calls": [
                {"id": tc.id, "type": "function", "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
                for tc in msg.tool_calls
            ],
        }
    )
    for tc in msg.tool_calls:
        messages.append({"role": "tool", "tool_call_id": tc.id, "content": '{"ok":true}'})
    second = out["second"] = {}
    with c.chat.completions.stream(
        model=env["app"],
        messages=messages,
        tools=[TOOL],
        user=env["user"],
        extra_headers={SESSION: sid} if sid else None,
    ) as s:
        resp = getattr(s, "_response", None)
        second["session_header"] = resp.headers.get(SESSION) if resp is not None else None
        final2 = s.get_final_completion()
    second["content"] = final2.choices[0].message.content
    second["finish_reason"] = final2.choices[0].finish_reason


def sc_responses(c, env, out):
    r = c.responses.create(model=env["app"], input=env["prompt"], user=env["user"])
    out.update(id=r.id, status=r.status, output_text=r.output_text, usage=dump(r.usage))


def sc_responses_stream(c, env, out):
    out.update(types=[], seqs=[], delta_text="")
    with c.responses.stream(model=env["app"], input=env["prompt"], user=env["user"]) as s:
        for ev in s:
            out["types"].append(ev.type)
            out["seqs"].append(ev.sequence_number)
            if ev.type == "response.output_text.delta":
                out["delta_text"] += ev.delta
        final = s.get_final_response()
    out.update(id=final.id, status=final.status, output_text=final.output_text)


def sc_responses_continue(c, env, out):
    r1 = c.responses.create(model=env["app"], input=env["prompt"], user=env["user"])
    out["first"] = {"id": r1.id, "output_text": r1.output_text}
    r2 = c.responses.create(model=env["app"], input=env["prompt2"], user=env["user"], previous_response_id=r1.id)
    out["second"] = {
        "id": r2.id,
        "output_text": r2.output_text,
        "previous_response_id": getattr(r2, "previous_response_id", None),
    }


def sc_responses_branch(c, env, out):
    def create(name, prev):
        r = c.responses.create(model=env["app"], input=f"{name} question", user=env["user"],
                               previous_response_id=prev)
        out[name] = {"id": r.id, "output_text": r.output_text}
        return r.id
    first = create("first", None)
    second = create("second", first)
    create("third", first)
    create("fourth", second)
    out["second_again"] = c.responses.retrieve(second).output_text


def _poll(c, rid, statuses, deadline):
    r = None
    while time.monotonic() < deadline:
        r = c.responses.retrieve(rid)
        if not statuses or statuses[-1] != r.status:
            statuses.append(r.status)
        if r.status in TERMINAL:
            break
        time.sleep(0.1)
    return r


def sc_background(c, env, out):
    r = c.responses.create(model=env["app"], input=env["prompt"], user=env["user"], background=True)
    out["id"] = r.id
    statuses = out["statuses"] = [r.status]
    r = _poll(c, r.id, statuses, time.monotonic() + 20)
    out["status"] = r.status if r else None
    out["output_text"] = r.output_text if r else None


def _raw_events(stream, part, stop_at=None):
    completed = None
    for ev in stream:
        part["types"].append(ev.type)
        part["seqs"].append(ev.sequence_number)
        if ev.type == "response.created":
            part["id"] = ev.response.id
        if ev.type == "response.completed":
            completed = ev.response
        if stop_at is not None and ev.sequence_number >= stop_at:
            break
    return completed


def sc_background_resume(c, env, out):
    first = out["first"] = {"id": None, "types": [], "seqs": []}
    s = c.responses.create(model=env["app"], input=env["prompt"], user=env["user"], background=True, stream=True)
    try:
        _raw_events(s, first, stop_at=2)
    finally:
        s.close()
    rid, last = first["id"], (first["seqs"][-1] if first["seqs"] else -1)
    if not rid:
        raise RuntimeError("no response.created event in first part")

    helper = out["resume_helper"] = {"types": [], "seqs": [], "output_text": None}
    try:
        with c.responses.stream(response_id=rid, starting_after=last) as s2:
            for ev in s2:
                helper["types"].append(ev.type)
                helper["seqs"].append(ev.sequence_number)
            helper["output_text"] = s2.get_final_response().output_text
    except Exception as e:  # keep going: the raw resume is independent
        helper["error"] = err_record(e)

    raw = out["resume_raw"] = {"types": [], "seqs": [], "output_text": None}
    try:
        s3 = c.responses.retrieve(rid, stream=True, starting_after=last)
        with s3:
            completed = _raw_events(s3, raw)
        raw.pop("id", None)
        raw["output_text"] = completed.output_text if completed is not None else None
    except Exception as e:
        raw["error"] = err_record(e)


def sc_cancel(c, env, out):
    r = c.responses.create(model=env["app"], input=env["prompt"], user=env["user"], background=True)
    out.update(id=r.id, created_status=r.status)
    cr = c.responses.cancel(r.id)
    out["cancel_status"] = cr.status
    statuses = []
    rr = _poll(c, r.id, statuses, time.monotonic() + 5)
    out["retrieve_status"] = rr.status if rr else None


def sc_error(c, env, out):
    s = c.chat.completions.create(
        model=env["app"],
        messages=[{"role": "user", "content": env["prompt"]}],
        user=env["user"],
        stream=True,
    )
    _consume_chat_stream(s, out)


SCENARIOS = {
    "models": sc_models,
    "chat": sc_chat,
    "chat-stream": sc_chat_stream,
    "chat-continue": sc_chat_continue,
    "chat-client-tool": sc_chat_client_tool,
    "responses": sc_responses,
    "responses-stream": sc_responses_stream,
    "responses-continue": sc_responses_continue,
    "responses-branch": sc_responses_branch,
    "background": sc_background,
    "background-resume": sc_background_resume,
    "cancel": sc_cancel,
    "error": sc_error,
}


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in SCENARIOS:
        sys.stderr.write(f"usage: {sys.argv[0]} <{'|'.join(SCENARIOS)}>\n")
        sys.exit(2)
    missing = [k for k in ("AGENTD_URL", "AGENTD_APP", "AGENTD_USER") if not os.environ.get(k)]
    if missing:
        sys.stderr.write(f"missing env: {', '.join(missing)}\n")
        sys.exit(2)

    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(30)
    hard = threading.Timer(33, _hard_kill)
    hard.daemon = True
    hard.start()

    OUT["scenario"] = sys.argv[1]
    try:
        import openai

        OUT["sdk_version"] = openai.__version__
        env = {
            "app": os.environ["AGENTD_APP"],
            "user": os.environ["AGENTD_USER"],
            "prompt": os.environ.get("AGENTD_PROMPT", "hello"),
            "prompt2": os.environ.get("AGENTD_PROMPT2", "again"),
        }
        client = openai.OpenAI(
            base_url=os.environ["AGENTD_URL"].rstrip("/") + "/v1",
            api_key=os.environ.get("AGENTD_API_KEY") or "unused",
            max_retries=0,
            timeout=20.0,
        )
        try:
            SCENARIOS[sys.argv[1]](client, env, OUT)
        except Exception as e:
            OUT["error"] = err_record(e)
    except DriverTimeout as e:
        OUT["error"] = {"type": "DriverTimeout", "message": str(e), "status_code": None, "body": None}
        emit(124)
    signal.alarm(0)
    emit(0)


if __name__ == "__main__":
    main()
