#!/usr/bin/env python3
"""Replays agentd's per-run SQL and ceiling (c)'s with pgbench, to see what PostgreSQL spends
on the statements alone (no HTTP, no sqlx pings): docs/performance.md, "What stands in the
way of (c)".

    cargo build --release -p agentd
    python3 bench/pgbench/replay.py [--url postgres://postgres@127.0.0.1:5432] [--clients 32]
        [--seconds 15] [--variant all|no-outcome] [--setup "SQL run after the migrations"]

It creates a fresh database `agentd_replay` (dropped at the end), migrates it with
target/release/agentd, and reads the statements from the source (src/store/*.rs), with
literal values where agentd binds parameters (close to, not exactly, agentd's plans). Each
pgbench transaction is one run: agentd = session create, admission with the user event, the
reply's append, the outcome; (c) = session insert, user event insert, reply + state delta.
`synchronous_commit=off` for both, so that CPU, not the WAL flush, is what is compared.
PostgreSQL's CPU is summed over its processes from /proc while pgbench runs.
"""
import argparse, os, re, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HZ = os.sysconf("SC_CLK_TCK")


def const(src, name):
    m = re.search(r"const " + name + r': &str =\s*(r#)?"(.*?)"#?;', src, re.S)
    if not m:
        sys.exit(f"cannot find {name} in the source")
    return m.group(2)


def statements():
    runs = open(os.path.join(ROOT, "src/store/runs.rs")).read()
    pg = open(os.path.join(ROOT, "src/store/postgres.rs")).read()
    now = "extract(epoch from clock_timestamp())::double precision"
    live = const(runs, "PG_LIVE_TICKET")
    asyncc = const(runs, "ASYNC_COMMIT")
    m = re.search(r'pub fn pg_insert_run_sql\(\) -> String \{\s*format!\(\s*"(.*?)"\s*\)\s*\}', runs, re.S)
    admit = (m.group(1).replace("{PG_LIVE_TICKET}", live).replace("{PG_NOW}", now)
             .replace("{{", "{").replace("}}", "}").replace('\\"', '"'))
    i = runs.index("async fn finish_run(", runs.index("impl RunStore for PgStore"))
    m = re.search(r'format!\(\s*"(.*?)"\s*\)', runs[i:], re.S)
    finish = m.group(1).replace("{ASYNC_COMMIT}", asyncc).replace("{PG_NOW}", now)
    return const(pg, "CREATE_SQL"), admit, const(pg, "APPEND_SQL"), finish


def sub(sql, args):
    sql = " ".join(sql.split())
    for n in range(len(args), 0, -1):
        sql = sql.replace("$" + str(n), args[n - 1])
    return sql


def lit(s):
    return "'" + s.replace("'", "''") + "'"


def scripts(variant):
    create, admit, append, finish = statements()
    sid = "'p' || :client_id || '-' || :sid"
    run = "'r' || :client_id || '-' || :sid"
    text = "m" * 320
    ev = ('{"id":"x","author":"user","invocationId":"e-1","content":{"role":"user","parts":[{"text":"'
          + text + '"}]},"actions":{"stateDelta":{},"artifactDelta":{}},"timestamp":1.0}')
    rep = ev.replace('"author":"user"', '"author":"bench_echo"').replace('"stateDelta":{}', '"stateDelta":{"turns":1}')
    agentd = [
        sub(create, ["'bench'", "'u1'", sid, "'{}'", "1.0", "1.0"]),
        sub(admit, [run, "'bench'", "'u1'", sid, "'e-1'", "'replica'", "true", "NULL", "90.0", "true",
                    "'{}'", "'{}'", "'{}'", "1.0", "'ev-u-' || :client_id || '-' || :sid", "'e-1'", "'user'", lit(ev)]),
        sub(append, ["'bench'", "'u1'", sid, "'{\"turns\": 1}'", "'{}'", "'{}'", "2.0",
                     "'ev-r-' || :client_id || '-' || :sid", "'e-1'", "'bench_echo'", lit(rep), run, "NULL::text"]),
    ]
    if variant != "no-outcome":
        agentd.append(sub(finish, [run, "'completed'", "2", "NULL"]))
    c = [
        "INSERT INTO adk_sessions (app_name, user_id, id, state, create_time, update_time) "
        "VALUES ('bench', 'u1', " + sid + ", '{}', 1.0, 1.0)",
        "INSERT INTO adk_events (app_name, user_id, session_id, event) VALUES ('bench', 'u1', "
        + sid + ", " + lit(ev) + "::jsonb)",
        "WITH s AS (UPDATE adk_sessions SET state = state || '{\"turns\": 1}'::jsonb, update_time = 2.0 "
        "WHERE app_name = 'bench' AND user_id = 'u1' AND id = " + sid + " RETURNING id) "
        "INSERT INTO adk_events (app_name, user_id, session_id, event) SELECT 'bench', 'u1', "
        + sid + ", " + lit(rep) + "::jsonb FROM s RETURNING seq",
    ]
    hdr = "\\set sid random(1, 2000000000)\n"
    return hdr + ";\n".join(agentd) + ";\n", hdr + ";\n".join(c) + ";\n"


def pg_ticks():
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if not open(f"/proc/{pid}/comm").read().startswith("postgres"):
                continue
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except OSError:
            pass
    return total


def pgbench(url, script, clients, secs):
    path = os.path.join("/tmp", f"agentd-replay-{os.getpid()}.sql")
    open(path, "w").write(script)
    env = dict(os.environ, PGOPTIONS="-c synchronous_commit=off")
    p = subprocess.Popen(["pgbench", "-n", "-M", "prepared", "-c", str(clients), "-j", "2",
                          "-T", str(secs), "-f", path, url],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    time.sleep(3)
    t0, w0 = pg_ticks(), time.time()
    time.sleep(secs - 5)
    t1, w1 = pg_ticks(), time.time()
    out = p.communicate()[0]
    os.unlink(path)
    m = re.search(r"tps = ([\d.]+)", out)
    if p.returncode != 0 or not m:
        sys.exit("pgbench failed:\n" + out)
    tps = float(m.group(1))
    cpu = (t1 - t0) / HZ / (w1 - w0)
    return tps, cpu * 1000 / tps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="postgres://postgres@127.0.0.1:5432")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--variant", choices=["all", "no-outcome"], default="all")
    ap.add_argument("--setup", help="SQL to run after the migrations, e.g. "
                    "'DROP INDEX sessions_by_owner_update_time' to see what an index costs")
    a = ap.parse_args()
    agentd_bin = os.path.join(ROOT, "target/release/agentd")
    if not os.access(agentd_bin, os.X_OK):
        sys.exit("build it first: cargo build --release -p agentd")
    admin, db = a.url + "/postgres", a.url + "/agentd_replay"
    subprocess.run(["psql", admin, "-qc", "DROP DATABASE IF EXISTS agentd_replay"], check=True)
    subprocess.run(["psql", admin, "-qc", "CREATE DATABASE agentd_replay"], check=True)
    try:
        subprocess.run([agentd_bin, "migrate", "--database-url", db], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(["psql", db, "-qc",
                        "CREATE TABLE adk_sessions (app_name text, user_id text, id text, state jsonb NOT NULL,"
                        " create_time double precision, update_time double precision,"
                        " PRIMARY KEY (app_name, user_id, id));"
                        "CREATE TABLE adk_events (seq bigserial PRIMARY KEY, app_name text, user_id text,"
                        " session_id text, event jsonb NOT NULL);"], check=True)
        if a.setup:
            subprocess.run(["psql", db, "-qc", a.setup], check=True)
        agentd, c = scripts(a.variant)
        for name, script in (("agentd", agentd), ("ceiling (c)", c)):
            tps, ms = pgbench(db, script, a.clients, a.seconds)
            print(f"{name} ({a.variant if name == 'agentd' else 'all'}): {tps:.0f} runs/s, "
                  f"{ms:.3f} ms of PostgreSQL CPU per run")
    finally:
        subprocess.run(["psql", admin, "-qc", "DROP DATABASE IF EXISTS agentd_replay WITH (FORCE)"])


if __name__ == "__main__":
    main()
