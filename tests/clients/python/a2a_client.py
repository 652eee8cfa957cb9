#!/usr/bin/env python3
"""Real-client driver: exercises agentd's A2A server with the official `a2a-sdk` Python
client (version pinned in requirements.txt beside this file).

Invocation (by a Rust integration test):
    <venv>/bin/python tests/clients/python/a2a_client.py <scenario>

Environment:
    AGENTD_URL      required, e.g. http://127.0.0.1:PORT (the card is fetched from
                    AGENTD_URL/a2a/AGENTD_APP/.well-known/agent-card.json)
    AGENTD_URL2     another replica (resubscribe), default AGENTD_URL
    AGENTD_APP      required
    AGENTD_BINDING  JSONRPC (default) or HTTP+JSON: the transport the client picks
    AGENTD_API_KEY  optional bearer token
    AGENTD_PROMPT   optional, default "hello"

Output: exactly ONE JSON line on stdout: {"scenario", "sdk_version", ...observations...,
["error": {"type", "message"}]}. Exit 0 when it ran (check "error"), 2 on bad usage.

Scenarios and the keys they add:
  card         name, description, bindings: [str], streaming, push
  send         non-streaming send: state, context_id, task_id, artifact_text, history_roles;
               get (historyLength 1): get_history; list (this context): listed
  stream       streaming send: kinds (task/status/artifact in order), text (artifacts
               aggregated by append), final_state, task_id, context_id; then a second
               message in the same context: second_context_same, second_text
  cancel       streaming send, cancel after the first artifact chunk (a second client, on
               AGENTD_URL2): cancel_state, final_state (from the stream), get_state
  resubscribe  streaming send on AGENTD_URL, stop after the first artifact chunk; then
               subscribe on AGENTD_URL2: first_kind, text (aggregated), final_state
  input        a message that ends waiting for input: state, waiting_call; then the
               answer (a function_response data part with the task id): answer_state,
               answer_context_same, first_after (the first task's state once answered)
  errors       error types the SDK raised: unknown_task, not_cancelable, terminal
  push         a local receiver (this process) gets the task's end: a message sent with
               a push config (token and Bearer credentials): pushed_state, pushed_task,
               token, authorization; then configs on a working task (created, got, listed,
               listed_after_delete) and a private URL refused (private_url)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid

OUT: dict = {}


def emit() -> None:
    print(json.dumps(OUT), flush=True)


async def main(scenario: str) -> None:
    import httpx
    from importlib.metadata import version

    from a2a.client import ClientConfig, ClientFactory
    from a2a.client.card_resolver import A2ACardResolver
    from a2a.types.a2a_pb2 import (
        CancelTaskRequest,
        GetTaskRequest,
        ListTasksRequest,
        Message,
        Part,
        Role,
        SendMessageRequest,
        SubscribeToTaskRequest,
        TaskPushNotificationConfig,
        TaskState,
    )
    from google.protobuf import json_format, struct_pb2

    OUT["sdk_version"] = version("a2a-sdk")
    base = os.environ["AGENTD_URL"]
    base2 = os.environ.get("AGENTD_URL2", base)
    app = os.environ["AGENTD_APP"]
    binding = os.environ.get("AGENTD_BINDING", "JSONRPC")
    prompt = os.environ.get("AGENTD_PROMPT", "hello")
    headers = {}
    if os.environ.get("AGENTD_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['AGENTD_API_KEY']}"
    http = httpx.AsyncClient(timeout=30, headers=headers)

    async def client_for(url: str, streaming: bool = True):
        card = await A2ACardResolver(http, f"{url}/a2a/{app}").get_agent_card()
        config = ClientConfig(
            streaming=streaming,
            httpx_client=http,
            supported_protocol_bindings=[binding],
        )
        client = ClientFactory(config).create(card)
        OUT["transport"] = type(client._transport).__name__
        return client, card

    def message(text: str, context_id: str = "", task_id: str = "") -> SendMessageRequest:
        m = Message(
            message_id=str(uuid.uuid4()),
            role=Role.ROLE_USER,
            parts=[Part(text=text)],
            context_id=context_id,
            task_id=task_id,
        )
        return SendMessageRequest(message=m)

    def state_name(s: int) -> str:
        return TaskState.Name(s)

    class Collector:
        """Aggregates a stream the way a client shows it: artifacts by id, append or not."""

        def __init__(self) -> None:
            self.kinds: list[str] = []
            self.artifacts: dict[str, str] = {}
            self.order: list[str] = []
            self.final = None
            self.task_id = ""
            self.context_id = ""

        def add(self, ev) -> str:
            kind = ev.WhichOneof("payload")
            self.kinds.append(kind)
            if kind == "task":
                self.task_id, self.context_id = ev.task.id, ev.task.context_id
                self.final = state_name(ev.task.status.state)
                for a in ev.task.artifacts:
                    self.artifacts[a.artifact_id] = "".join(p.text for p in a.parts)
                    self.order.append(a.artifact_id)
            elif kind == "artifact_update":
                u = ev.artifact_update
                text = "".join(p.text for p in u.artifact.parts)
                aid = u.artifact.artifact_id
                if aid not in self.artifacts:
                    self.order.append(aid)
                    self.artifacts[aid] = ""
                self.artifacts[aid] = (self.artifacts[aid] + text) if u.append else text
            elif kind == "status_update":
                self.final = state_name(ev.status_update.status.state)
            return kind

        def text(self) -> str:
            return "".join(self.artifacts[a] for a in self.order)

    if scenario == "card":
        _, card = await client_for(base)
        OUT["name"] = card.name
        OUT["description"] = card.description
        OUT["bindings"] = [i.protocol_binding for i in card.supported_interfaces]
        OUT["streaming"] = card.capabilities.streaming
        OUT["push"] = card.capabilities.push_notifications
        OUT["skills"] = [s.id for s in card.skills]
    elif scenario == "send":
        client, _ = await client_for(base, streaming=False)
        task = None
        async for ev in client.send_message(message(prompt)):
            task = ev.task
        OUT["state"] = state_name(task.status.state)
        OUT["context_id"] = task.context_id
        OUT["task_id"] = task.id
        OUT["artifact_text"] = "".join(p.text for a in task.artifacts for p in a.parts)
        OUT["history_roles"] = [Role.Name(m.role) for m in task.history]
        got = await client.get_task(GetTaskRequest(id=task.id, history_length=1))
        OUT["get_history"] = len(got.history)
        OUT["get_state"] = state_name(got.status.state)
        listed = await client.list_tasks(ListTasksRequest(context_id=task.context_id))
        OUT["listed"] = [t.id for t in listed.tasks]
    elif scenario == "stream":
        client, _ = await client_for(base)
        c = Collector()
        async for ev in client.send_message(message(prompt)):
            c.add(ev)
        OUT.update(kinds=c.kinds, text=c.text(), final_state=c.final,
                   task_id=c.task_id, context_id=c.context_id)
        c2 = Collector()
        async for ev in client.send_message(message(prompt + " again", c.context_id)):
            c2.add(ev)
        OUT["second_context_same"] = c2.context_id == c.context_id
        OUT["second_task_differs"] = c2.task_id != c.task_id
        OUT["second_text"] = c2.text()
    elif scenario == "cancel":
        client, _ = await client_for(base)
        other, _ = await client_for(base2)
        c = Collector()
        canceled = False
        async for ev in client.send_message(message(prompt)):
            kind = c.add(ev)
            if kind == "artifact_update" and not canceled:
                canceled = True
                t = await other.cancel_task(CancelTaskRequest(id=c.task_id))
                OUT["cancel_state"] = state_name(t.status.state)
        OUT["final_state"] = c.final
        got = await other.get_task(GetTaskRequest(id=c.task_id))
        OUT["get_state"] = state_name(got.status.state)
    elif scenario == "resubscribe":
        client, _ = await client_for(base)
        c = Collector()
        stream = client.send_message(message(prompt))
        async for ev in stream:
            if c.add(ev) == "artifact_update":
                break
        await stream.aclose()
        OUT["cut_after"] = c.kinds
        other, _ = await client_for(base2)
        c2 = Collector()
        async for ev in other.subscribe(SubscribeToTaskRequest(id=c.task_id)):
            c2.add(ev)
        OUT["first_kind"] = c2.kinds[0] if c2.kinds else None
        OUT["kinds"] = c2.kinds
        OUT["text"] = c2.text()
        OUT["final_state"] = c2.final
    elif scenario == "input":
        client, _ = await client_for(base, streaming=False)
        task = None
        async for ev in client.send_message(message(prompt)):
            task = ev.task
        OUT["state"] = state_name(task.status.state)
        calls = [json_format.MessageToDict(p.data) for p in task.status.message.parts]
        OUT["waiting_call"] = calls[0]["name"] if calls and calls[0] else None
        call_id = calls[0]["id"] if calls and calls[0] else ""
        data = struct_pb2.Value()
        data.struct_value.update({"id": call_id, "name": OUT["waiting_call"] or "",
                                  "response": {"answer": "yes"}})
        meta = struct_pb2.Struct()
        meta.update({"adk_type": "function_response"})
        answer = SendMessageRequest(message=Message(
            message_id=str(uuid.uuid4()), role=Role.ROLE_USER,
            parts=[Part(data=data, metadata=meta)],
            context_id=task.context_id, task_id=task.id))
        second = None
        async for ev in client.send_message(answer):
            second = ev.task
        OUT["answer_state"] = state_name(second.status.state)
        OUT["answer_context_same"] = second.context_id == task.context_id
        first = await client.get_task(GetTaskRequest(id=task.id))
        OUT["first_after"] = state_name(first.status.state)
    elif scenario == "errors":
        client, _ = await client_for(base, streaming=False)

        async def kind(coro):
            try:
                await coro
                return None
            except Exception as e:  # noqa: BLE001 - the type is the observation
                return type(e).__name__

        OUT["unknown_task"] = await kind(client.get_task(GetTaskRequest(id="no-such-task")))
        task = None
        async for ev in client.send_message(message(prompt)):
            task = ev.task
        OUT["not_cancelable"] = await kind(client.cancel_task(CancelTaskRequest(id=task.id)))

        async def send_terminal():
            async for _ in client.send_message(message(prompt, task.context_id, task.id)):
                pass

        OUT["terminal"] = await kind(send_terminal())
    elif scenario == "push":
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        got: list = []

        class Hook(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                got.append({"headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": json.loads(body)})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        hook = f"http://127.0.0.1:{server.server_port}/a2a-hook"
        from a2a.types.a2a_pb2 import (
            AuthenticationInfo,
            DeleteTaskPushNotificationConfigRequest,
            GetTaskPushNotificationConfigRequest,
            ListTaskPushNotificationConfigsRequest,
            StreamResponse,
        )

        client, _ = await client_for(base, streaming=False)
        req = message(prompt)
        req.configuration.task_push_notification_config.CopyFrom(TaskPushNotificationConfig(
            url=hook, token="tok-1",
            authentication=AuthenticationInfo(scheme="Bearer", credentials="s3cret")))
        task = None
        async for ev in client.send_message(req):
            task = ev.task
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.1)
        if got:
            pushed = json_format.ParseDict(got[0]["body"], StreamResponse(),
                                           ignore_unknown_fields=False)
            OUT["pushed_state"] = state_name(pushed.status_update.status.state)
            OUT["pushed_task"] = pushed.status_update.task_id == task.id
            OUT["token"] = got[0]["headers"].get("x-a2a-notification-token")
            OUT["authorization"] = got[0]["headers"].get("authorization")
        # Configs on a task that is still working.
        req = message(prompt)
        req.configuration.return_immediately = True
        async for ev in client.send_message(req):
            working = ev.task
        made = await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=working.id, id="c2", url=hook, token="tok-2"))
        OUT["created"] = made.id
        one = await client.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=working.id, id="c2"))
        OUT["got"] = one.url == hook
        # A config read back never shows its token (a bearer credential of the receiver).
        OUT["got_token"] = one.token
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=working.id))
        OUT["listed_tokens"] = [c.token for c in listed.configs]
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=working.id))
        OUT["listed"] = [c.id for c in listed.configs]
        await client.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=working.id, id="c2"))
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=working.id))
        OUT["listed_after_delete"] = [c.id for c in listed.configs]
        try:
            await client.create_task_push_notification_config(TaskPushNotificationConfig(
                task_id=working.id, url="http://10.0.0.1/hook"))
            OUT["private_url"] = None
        except Exception as e:  # noqa: BLE001 - the type is the observation
            OUT["private_url"] = type(e).__name__
        server.shutdown()
    else:
        print(f"unknown scenario {scenario!r}", file=sys.stderr)
        sys.exit(2)
    await http.aclose()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    OUT["scenario"] = sys.argv[1]
    try:
        asyncio.run(asyncio.wait_for(main(sys.argv[1]), 60))
    except Exception as e:  # noqa: BLE001 - reported to the test, which asserts on it
        OUT["error"] = {"type": type(e).__name__, "message": str(e)}
    emit()
