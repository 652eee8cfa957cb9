#!/usr/bin/env python3
"""Measure agentd's scale-out: cross-replica cancel latency and PostgreSQL writes/s, RSS and
CPU with 1,000 and 5,000 open streams on one replica.

Standard library only. Build first (`cargo build --release -p agentd`), then run
`python3 bench/scale_out.py` from the repository root. It needs PostgreSQL at 127.0.0.1:5432
(user postgres, trust auth; `psql` on PATH), creates and drops a scratch database, starts two
replicas (A and B) of target/release/agentd, prints a JSON summary and writes it to
$MEASURE_OUT/results.json (default: a new temporary directory). Results: README, Performance.
"""

import asyncio
import json
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(REPO, "target", "release", "agentd")
# Smoke-test hooks (unset for the real run): another binary, and a tiny workload.
SMOKE_BINARY = os.environ.get("MEASURE_SMOKE_BINARY")
if SMOKE_BINARY:
    BINARY = SMOKE_BINARY
OUT_DIR = os.environ.get("MEASURE_OUT") or tempfile.mkdtemp(prefix="agentd-scale-out-")
APPS_DIR = os.path.join(OUT_DIR, "apps")
RESULTS = os.path.join(OUT_DIR, "results.json")
PG = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-v", "ON_ERROR_STOP=1"]

BINARY_WAIT_S = 15 * 60
RUN_BUDGET_S = 12 * 60          # whole measurement, once the binary exists
CANCEL_SAMPLES = 50
STREAM_COUNTS = [1000, 5000]
SESSION_CONCURRENCY = 50
OPEN_CONCURRENCY = 200
FIRST_PARTIAL_WAIT_S = 60
SAMPLE_WINDOW_S = 20
CLOSE_WAIT_S = 5
SETTLE_MAX_S = 120
# Before the first counter sample: PostgreSQL backends flush their pending stats at most once a
# second and, when idle, up to 10 s later; waiting this long keeps the open phase's writes out of
# the window.
QUIET_BEFORE_SAMPLE_S = 11
if SMOKE_BINARY:
    CANCEL_SAMPLES, STREAM_COUNTS, SAMPLE_WINDOW_S = 5, [50, 100], 5
    OUT_DIR = os.path.join(OUT_DIR, "smoke")
    APPS_DIR = os.path.join(OUT_DIR, "apps")
    RESULTS = os.path.join(OUT_DIR, "results.json")


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


class MeasureError(Exception):
    pass


NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# ------------------------------------------------------------------------------ processes

def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass


def wait_for_binary():
    if not (os.path.exists(BINARY) and os.access(BINARY, os.X_OK)):
        raise MeasureError(f"{BINARY} is missing: run `cargo build --release -p agentd` first")

def psql(sql, db="postgres", timeout=60):
    cmd = PG + ["-d", db, "-tA", "-c", sql]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise MeasureError(f"psql timed out after {timeout}s: {sql}")
    if p.returncode != 0:
        raise MeasureError(f"psql failed ({p.returncode}) on {sql!r}: {p.stderr.strip()}")
    return p.stdout.strip()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_limits():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Replica:
    def __init__(self, name, db_url):
        self.name = name
        self.port = free_port()
        self.out_path = os.path.join(OUT_DIR, f"agentd_{name}.stdout")
        self.err_path = os.path.join(OUT_DIR, f"agentd_{name}.stderr")
        env = dict(os.environ, RUST_LOG="agentd=warn")
        self.out = open(self.out_path, "wb")
        self.err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(
            [BINARY, "serve", "--bind", f"127.0.0.1:{self.port}", "--database-url", db_url,
             "--apps-dir", APPS_DIR, "--replica-id", name],
            stdout=self.out, stderr=self.err, stdin=subprocess.DEVNULL, env=env,
            preexec_fn=child_limits)

    def stderr_tail(self, n=2000):
        try:
            with open(self.err_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def wait_healthy(self, timeout=60):
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.port}/health"
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise MeasureError(f"agentd {self.name} exited with {self.proc.returncode}; "
                                   f"stderr tail:\n{self.stderr_tail()}")
            try:
                with NO_PROXY.open(url, timeout=2) as r:
                    if r.status == 200:
                        log(f"replica {self.name} healthy on :{self.port} (pid {self.proc.pid})")
                        return
                    last = f"status {r.status}"
            except urllib.error.HTTPError as e:
                last = f"status {e.code}"
            except OSError as e:
                last = repr(e)
            time.sleep(0.1)
        raise MeasureError(f"agentd {self.name} not healthy after {timeout}s (last: {last}); "
                           f"stderr tail:\n{self.stderr_tail()}")

    def rss_mib(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return round(int(line.split()[1]) / 1024, 1)
        except OSError:
            pass
        return None

    def cpu_seconds(self):
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None

    def fd_count(self):
        try:
            return len(os.listdir(f"/proc/{self.proc.pid}/fd"))
        except OSError:
            return None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.out.close()
        self.err.close()


# ------------------------------------------------------------------------------ HTTP

def build_request(method, port, path, body):
    data = b"" if body is None else json.dumps(body).encode()
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
            f"Accept: */*\r\n")
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    return head.encode() + b"\r\n" + data


def parse_head(raw):
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise MeasureError(f"bad status line {lines[0]!r}")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


def dechunk(body):
    out = bytearray()
    i = 0
    while True:
        j = body.find(b"\r\n", i)
        if j < 0:
            break
        size = int(body[i:j].split(b";")[0].strip() or b"0", 16)
        if size == 0:
            break
        out += body[j + 2:j + 2 + size]
        i = j + 2 + size + 2
    return bytes(out)


async def http_request(port, method, path, body=None, timeout=30):
    """One HTTP/1.1 request with Connection: close. Returns (status, headers, body bytes)."""
    async def go():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(build_request(method, port, path, body))
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if not sep:
            raise MeasureError(f"{method} {path}: incomplete response ({len(raw)} bytes)")
        status, headers = parse_head(head)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            rest = dechunk(rest)
        return status, headers, rest
    try:
        return await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        raise MeasureError(f"{method} :{port}{path} timed out after {timeout}s")


class SSEClient(asyncio.Protocol):
    """A streaming POST read as SSE over a raw connection (chunked transfer-encoding decoded
    incrementally). With drain_after_first_partial, stops parsing after the first partial and
    only counts bytes (cheap, keeps the socket drained)."""

    def __init__(self, request, drain_after_first_partial=False):
        loop = asyncio.get_running_loop()
        self.request = request
        self.drain_after = drain_after_first_partial
        self.transport = None
        self.head_buf = bytearray()
        self.status = None
        self.headers = {}
        self.chunked = False
        self.raw = bytearray()       # undecoded body bytes waiting for chunk framing
        self.chunk_left = 0          # bytes of the current chunk still to read
        self.chunk_crlf = 0          # CRLF bytes after a chunk still to skip
        self.body_ended = False
        self.sse = bytearray()
        self.parse = True
        self.bytes = 0
        self.messages = 0
        self.error_body = bytearray()
        self.head_fut = loop.create_future()
        self.first_partial = loop.create_future()
        self.done = loop.create_future()
        self.closed = loop.create_future()

    # protocol callbacks
    def connection_made(self, transport):
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data):
        self.bytes += len(data)
        if not self.parse:
            return
        if self.status is None:
            self.head_buf += data
            i = self.head_buf.find(b"\r\n\r\n")
            if i < 0:
                return
            try:
                self.status, self.headers = parse_head(bytes(self.head_buf[:i]))
            except Exception as e:  # noqa: BLE001
                self._fail(e)
                return
            self.chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
            data = bytes(self.head_buf[i + 4:])
            self.head_buf = bytearray()
            if not self.head_fut.done():
                self.head_fut.set_result(self.status)
        if self.status != 200:
            self.error_body += data
            return
        if self.chunked:
            self._dechunk(data)
        else:
            self._sse(data)

    def _dechunk(self, data):
        self.raw += data
        buf = self.raw
        pos = 0
        out = bytearray()
        while pos < len(buf) and not self.body_ended:
            if self.chunk_crlf:
                take = min(self.chunk_crlf, len(buf) - pos)
                pos += take
                self.chunk_crlf -= take
                continue
            if self.chunk_left:
                take = min(self.chunk_left, len(buf) - pos)
                out += buf[pos:pos + take]
                pos += take
                self.chunk_left -= take
                if self.chunk_left == 0:
                    self.chunk_crlf = 2
                continue
            j = buf.find(b"\r\n", pos)
            if j < 0:
                break
            size = int(bytes(buf[pos:j]).split(b";")[0].strip() or b"0", 16)
            pos = j + 2
            if size == 0:
                self.body_ended = True
            else:
                self.chunk_left = size
        del buf[:pos]
        if out:
            self._sse(bytes(out))

    def _sse(self, data):
        self.sse += data
        while self.parse:
            i = self.sse.find(b"\n\n")
            if i < 0:
                break
            msg = bytes(self.sse[:i]).decode("utf-8", errors="replace")
            del self.sse[:i + 2]
            self._message(msg)

    def _message(self, msg):
        self.messages += 1
        now = time.perf_counter()
        lines = msg.split("\n")
        if not self.first_partial.done() and '"partial":true' in msg:
            self.first_partial.set_result(now)
            if self.drain_after:
                self.parse = False
                self.sse = bytearray()
                self.raw = bytearray()
        if "event: done" in lines and not self.done.done():
            data = next((ln[5:].strip() for ln in lines if ln.startswith("data:")), "")
            self.done.set_result((now, data))

    def _fail(self, exc):
        for fut in (self.head_fut, self.first_partial, self.done):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # mark retrieved

    def connection_lost(self, exc):
        self._fail(ConnectionError(f"connection closed ({exc!r}) after {self.bytes} bytes, "
                                   f"status={self.status}, messages={self.messages}"))
        if not self.closed.done():
            self.closed.set_result(True)

    def close(self):
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    @property
    def run_id(self):
        return self.headers.get("x-agentd-run-id")


async def open_run(port, session, text, drain_after_first_partial=False, timeout=30):
    body = {"appName": "slow", "userId": "u1", "sessionId": session,
            "newMessage": {"role": "user", "parts": [{"text": text}]}}
    proto = SSEClient(build_request("POST", port, "/run", body), drain_after_first_partial)
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(
            loop.create_connection(lambda: proto, "127.0.0.1", port), timeout)
        status = await asyncio.wait_for(asyncio.shield(proto.head_fut), timeout)
    except asyncio.TimeoutError:
        proto.close()
        raise MeasureError(f"POST /run ({session}) got no response headers in {timeout}s")
    except BaseException:
        proto.close()
        raise
    if status != 200:
        try:
            await asyncio.wait_for(asyncio.shield(proto.closed), 3)
        except asyncio.TimeoutError:
            pass
        proto.close()
        raise MeasureError(f"POST /run ({session}) answered {status}: "
                           f"{bytes(proto.error_body[:500]).decode(errors='replace')}")
    return proto


async def create_session(port, sid):
    status, _, body = await http_request(port, "POST", "/apps/slow/users/u1/sessions",
                                         {"sessionId": sid})
    if status != 200:
        raise MeasureError(f"create session {sid}: {status} {body[:300]!r}")


def percentile(values, p):
    s = sorted(values)
    if not s:
        return None
    k = (len(s) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# ------------------------------------------------------------------------------ phases

async def measure_cancel(a, b, results):
    lat, statuses, done_statuses, errors = [], {}, {}, []
    results["cancel_ms"] = {"n": 0}
    for i in range(CANCEL_SAMPLES):
        sid = f"c{i}"
        stream = None
        try:
            await create_session(a.port, sid)
            stream = await open_run(a.port, sid, "x" * 2000)
            run_id = stream.run_id
            if not run_id:
                raise MeasureError(f"no x-agentd-run-id header: {stream.headers}")
            await asyncio.wait_for(asyncio.shield(stream.first_partial), 30)
            t0 = time.perf_counter()
            cancel = asyncio.ensure_future(
                http_request(b.port, "POST", f"/runs/{run_id}/cancel", {}))
            try:
                t1, done_data = await asyncio.wait_for(asyncio.shield(stream.done), 30)
            except asyncio.TimeoutError:
                cancel.cancel()
                raise MeasureError(f"sample {i}: no 'event: done' within 30s of the cancel")
            except BaseException:
                cancel.cancel()
                raise
            status, _, cbody = await cancel
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            if status != 202:
                errors.append(f"sample {i}: cancel answered {status}: {cbody[:200]!r}")
            try:
                outcome = json.loads(done_data).get("status")
            except ValueError:
                outcome = f"unparsable: {done_data[:80]}"
            done_statuses[str(outcome)] = done_statuses.get(str(outcome), 0) + 1
            lat.append((t1 - t0) * 1000)
        except Exception as e:  # noqa: BLE001
            errors.append(f"sample {i}: {e}")
            log(f"cancel sample {i} failed: {e}")
            if len(errors) > 10:
                log("too many cancel errors; stopping this phase")
                break
        finally:
            if stream is not None:
                stream.close()
        r = results["cancel_ms"]
        r.update({"n": len(lat), "statuses": statuses, "done_statuses": done_statuses,
                  "errors": errors[:20]})
        if lat:
            r.update({"p50": round(percentile(lat, 50), 1), "p90": round(percentile(lat, 90), 1),
                      "p99": round(percentile(lat, 99), 1), "max": round(max(lat), 1),
                      "min": round(min(lat), 1), "mean": round(statistics.fmean(lat), 1)})
    log(f"cancel: {json.dumps(results['cancel_ms'])}")


def pg_counters(db):
    row = psql("SELECT xact_commit, tup_inserted, tup_updated, tup_deleted "
               f"FROM pg_stat_database WHERE datname = '{db}'", db=db)
    commit, ins, upd, dele = (int(x) for x in row.split("|"))
    tables = psql("SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) "
                  "FROM pg_stat_user_tables", db=db)
    return {"t": time.monotonic(), "commits": commit, "writes": ins + upd + dele,
            "ins": ins, "upd": upd, "del": dele, "table_writes": int(tables)}


def running_runs(db):
    try:
        return int(psql("SELECT count(*) FROM runs WHERE status = 'running'", db=db))
    except MeasureError as e:
        log(f"could not count running runs: {e}")
        return None


async def gather_limited(n, limit, make, deadline):
    """Runs make(i) for i in range(n) with at most `limit` in flight; returns (results, errors)."""
    sem = asyncio.Semaphore(limit)
    out = [None] * n
    errors = []

    async def one(i):
        async with sem:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                errors.append(f"#{i}: phase deadline passed")
                return
            try:
                out[i] = await asyncio.wait_for(make(i), remaining)
            except Exception as e:  # noqa: BLE001
                errors.append(f"#{i}: {e!r}"[:300])
    await asyncio.gather(*(one(i) for i in range(n)))
    return out, errors


async def measure_streams(a, db, n, results):
    entry = {"n": n}
    results["streams"].append(entry)
    log(f"streams N={n}: creating sessions")
    t = time.monotonic()
    _, errs = await gather_limited(
        n, SESSION_CONCURRENCY, lambda i: create_session(a.port, f"s{n}_{i}"),
        time.monotonic() + 180)
    entry["session_create_s"] = round(time.monotonic() - t, 1)
    if errs:
        entry["session_errors"] = len(errs)
        entry["session_error_samples"] = errs[:5]
        log(f"streams N={n}: {len(errs)} session errors, e.g. {errs[:2]}")

    log(f"streams N={n}: opening streams")
    t = time.monotonic()
    streams, errs = await gather_limited(
        n, OPEN_CONCURRENCY,
        lambda i: open_run(a.port, f"s{n}_{i}", "y" * 3000, drain_after_first_partial=True),
        time.monotonic() + 180)
    streams = [s for s in streams if s is not None]
    entry["opened"] = len(streams)
    entry["open_s"] = round(time.monotonic() - t, 1)
    if errs:
        entry["open_errors"] = len(errs)
        entry["open_error_samples"] = errs[:5]
        log(f"streams N={n}: {len(errs)} open errors, e.g. {errs[:2]}")
    try:
        log(f"streams N={n}: {len(streams)} opened in {entry['open_s']}s; "
            "waiting for first partials")
        waits = [s.first_partial for s in streams]
        if waits:
            await asyncio.wait(waits, timeout=FIRST_PARTIAL_WAIT_S)
        entry["first_partial"] = sum(1 for s in streams
                                     if s.first_partial.done()
                                     and not s.first_partial.exception())
        entry["ready_s"] = round(time.monotonic() - t, 1)
        entry["running_runs_before"] = running_runs(db)
        log(f"streams N={n}: {entry['first_partial']} got a partial; sampling "
            f"{SAMPLE_WINDOW_S}s after {QUIET_BEFORE_SAMPLE_S}s")

        await asyncio.sleep(QUIET_BEFORE_SAMPLE_S)
        bytes0 = sum(s.bytes for s in streams)
        cpu0 = a.cpu_seconds()
        c0 = pg_counters(db)
        await asyncio.sleep(SAMPLE_WINDOW_S)
        c1 = pg_counters(db)
        cpu1 = a.cpu_seconds()
        bytes1 = sum(s.bytes for s in streams)
        dt = c1["t"] - c0["t"]
        entry["window_s"] = round(dt, 2)
        entry["row_writes_per_s"] = round((c1["writes"] - c0["writes"]) / dt, 2)
        entry["commits_per_s"] = round((c1["commits"] - c0["commits"]) / dt, 2)
        entry["table_row_writes_per_s"] = round((c1["table_writes"] - c0["table_writes"]) / dt, 2)
        entry["row_writes_detail"] = {k: c1[k] - c0[k] for k in ("ins", "upd", "del")}
        entry["agentd_rss_mib"] = a.rss_mib()
        entry["agentd_fds"] = a.fd_count()
        if cpu0 is not None and cpu1 is not None:
            entry["agentd_cpu_pct"] = round((cpu1 - cpu0) / dt * 100, 1)
        entry["client_mib_per_s"] = round((bytes1 - bytes0) / dt / 2**20, 2)
        entry["still_open_after_window"] = sum(1 for s in streams if not s.closed.done())
        entry["running_runs_after"] = running_runs(db)
        log(f"streams N={n}: {json.dumps(entry)}")
    except asyncio.CancelledError:
        for s in streams:
            s.close()
        raise
    finally:
        for s in streams:
            s.close()
    if True:
        await asyncio.sleep(CLOSE_WAIT_S)
        t = time.monotonic()
        left = None
        while time.monotonic() - t < SETTLE_MAX_S:
            left = running_runs(db)
            if left == 0 or left is None:
                break
            await asyncio.sleep(1)
        entry["settle_s"] = round(CLOSE_WAIT_S + time.monotonic() - t, 1)
        entry["running_after_settle"] = left
        log(f"streams N={n}: closed; running runs after settle: {left}")


async def measure(a, b, db, results):
    await measure_cancel(a, b, results)
    results["streams"] = []
    for n in STREAM_COUNTS:
        await measure_streams(a, db, n, results)


def machine():
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return {"nproc": int(nproc) if nproc.isdigit() else nproc, "model_name": model}


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    raise_nofile()
    results = {"cancel_ms": None, "streams": [], "machine": machine()}
    db = None
    replicas = []
    status = 1
    try:
        wait_for_binary()
        started = time.monotonic()
        os.makedirs(os.path.join(APPS_DIR, "slow"), exist_ok=True)
        with open(os.path.join(APPS_DIR, "slow", "root_agent.yaml"), "w") as f:
            f.write("agent_class: EchoAgent\nname: slow\nchunks: 100000\nchunk_delay_ms: 50\n")
        name = f"measure_{random.randrange(16**8):08x}"
        psql(f"CREATE DATABASE {name}")
        db = name
        url = f"postgres://postgres@127.0.0.1:5432/{db}"
        log(f"database {db}")
        results["database"] = db
        # A first (it runs the migrations), then B.
        a = Replica("a", url)
        replicas.append(a)
        a.wait_healthy()
        b = Replica("b", url)
        replicas.append(b)
        b.wait_healthy()
        budget = RUN_BUDGET_S - (time.monotonic() - started)
        try:
            asyncio.run(asyncio.wait_for(measure(a, b, db, results), budget))
        except asyncio.TimeoutError:
            raise MeasureError(f"the measurement did not finish within {RUN_BUDGET_S}s")
        for r in replicas:
            if r.proc.poll() is not None:
                raise MeasureError(f"agentd {r.name} died with {r.proc.returncode} during the "
                                   f"run; stderr tail:\n{r.stderr_tail()}")
        status = 0
    except KeyboardInterrupt:
        results["error"] = "interrupted"
    except Exception as e:  # noqa: BLE001
        results["error"] = f"{type(e).__name__}: {e}"
        log(f"ERROR: {results['error']}")
    finally:
        for r in replicas:
            try:
                r.stop()
                results.setdefault("exit_codes", {})[r.name] = r.proc.returncode
            except Exception as e:  # noqa: BLE001
                log(f"stopping agentd {r.name}: {e}")
        if db is not None:
            try:
                psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
                log(f"dropped {db}")
            except Exception as e:  # noqa: BLE001
                log(f"could not drop {db}: {e}")
        out = json.dumps(results, indent=2)
        print(out, flush=True)
        with open(RESULTS, "w") as f:
            f.write(out + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
