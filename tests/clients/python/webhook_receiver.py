#!/usr/bin/env python3
"""Webhook receiver for agentd's integration tests: accepts webhook deliveries and
checks their Standard Webhooks signatures with the `standardwebhooks` package
(version pinned in requirements.txt beside this file).

Invocation (by a Rust integration test):
    <venv>/bin/python tests/clients/python/webhook_receiver.py --secret whsec_... \
        [--fail N] [--delay-secs S] [--port P]

    --secret      required, the endpoint secret ("whsec_" + base64 of the key bytes)
    --fail        answer 500 to the first N verified deliveries (counted over all
                  webhook ids), default 0
    --delay-secs  sleep S seconds before answering a delivery with 200, default 0
    --port        listen on port P (default: a free one)

It serves HTTP on 127.0.0.1 and runs until SIGTERM (or SIGINT),
then exits 0.

Every POST, on any path, is a delivery. The body is checked with
Webhook(secret).verify(body, headers), which needs the webhook-id,
webhook-timestamp and webhook-signature headers and a timestamp within 5 minutes
of now. The answer is
    400  verification failed
    500  verified, and this is one of the first N verified deliveries (--fail N)
    200  verified otherwise (after --delay-secs)
with an empty body. Other methods get http.server's default 501.

Output on stdout, one JSON object per line, each flushed:
    first line:      {"port": <port>}
    then one line per delivery, printed after the answer has been sent:
        {"webhookId": str|null, "webhookTimestamp": int|str|null,
         "verified": bool, "status": <status sent>,
         "attempt": <1-based count of deliveries seen with this webhook-id,
                     failed verifications included>,
         "receivedAt": <time.time() when the request arrived>,
         "payload": <the body parsed as JSON, or null>, "path": str}
    plus "error": str (why) when verified is false.
webhookTimestamp is the header as an int, or the raw string if it is not one.
"""

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook

_out_lock = threading.Lock()


def emit(obj: dict) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


class State:
    def __init__(self, webhook: Webhook, fail: int, delay_secs: float) -> None:
        self.webhook = webhook
        self.fail = fail
        self.delay_secs = delay_secs
        self.lock = threading.Lock()
        self.verified_total = 0
        self.attempts: dict = {}


class Handler(BaseHTTPRequestHandler):
    server_version = "webhook-receiver"
    state: State  # set on the subclass made in main()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's name
        pass

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    # trailers, up to the empty line
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def do_POST(self) -> None:
        received_at = time.time()
        state = self.state
        body = self._read_body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        webhook_id = headers.get("webhook-id")
        raw_ts = headers.get("webhook-timestamp")
        try:
            webhook_ts = int(raw_ts) if raw_ts is not None else None
        except ValueError:
            webhook_ts = raw_ts

        error = None
        try:
            # Raises WebhookVerificationError on a missing header, a stale timestamp or
            # no matching signature; a malformed header can raise other errors too.
            state.webhook.verify(body, headers, json_parse=False)
            verified = True
        except Exception as e:  # noqa: BLE001 - any failure means "not verified"
            verified = False
            error = f"{type(e).__name__}: {e}"

        with state.lock:
            attempt = state.attempts.get(webhook_id, 0) + 1
            state.attempts[webhook_id] = attempt
            if not verified:
                status = 400
            else:
                state.verified_total += 1
                status = 500 if state.verified_total <= state.fail else 200

        if status == 200 and state.delay_secs > 0:
            time.sleep(state.delay_secs)

        try:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            self.wfile.flush()
        except OSError:
            pass  # the sender gave up (e.g. timed out); still report what we sent

        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = None
        line = {
            "webhookId": webhook_id,
            "webhookTimestamp": webhook_ts,
            "verified": verified,
            "status": status,
            "attempt": attempt,
            "receivedAt": received_at,
            "payload": payload,
            "path": self.path,
        }
        if error is not None:
            line["error"] = error
        emit(line)


def _on_term(signum, frame) -> None:
    raise SystemExit(0)


def main() -> None:
    p = argparse.ArgumentParser(description="Standard Webhooks receiver for agentd tests")
    p.add_argument("--secret", required=True, help="whsec_... endpoint secret")
    p.add_argument("--fail", type=int, default=0, help="answer 500 to the first N verified deliveries")
    p.add_argument("--delay-secs", type=float, default=0.0, help="sleep before answering 200")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default: any free one)")
    args = p.parse_args()

    try:
        webhook = Webhook(args.secret)
    except Exception as e:  # noqa: BLE001
        print(f"bad --secret: {e}", file=sys.stderr)
        sys.exit(2)

    handler = type("BoundHandler", (Handler,), {"state": State(webhook, args.fail, args.delay_secs)})
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    emit({"port": server.server_address[1]})
    try:
        server.serve_forever()
    except SystemExit:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
