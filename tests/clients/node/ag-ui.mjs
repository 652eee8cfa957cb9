// Real-client driver for the AG-UI protocol (@ag-ui/client HttpAgent, pinned in package.json).
//
// Usage:  node tests/clients/node/ag-ui.mjs <scenario>
// Env:    AGENTD_URL (e.g. http://127.0.0.1:PORT), AGENTD_APP, AGENTD_USER,
//         AGENTD_THREAD_ID (optional; default "thread-<random>").
//
// HttpAgent({url: `${AGENTD_URL}/apps/${AGENTD_APP}/ag-ui`,
//            headers: {'x-agentd-user-id': AGENTD_USER}, threadId: AGENTD_THREAD_ID});
// addMessage({id, role:'user', content:'hello'}); runAgent(...); every event the
// client applies is recorded through a subscriber (onEvent), in order.
//
// Scenarios:
//   text         one run, no tools.
//   tool         one run; the server runs a server-side tool.
//   state        one run; output agent.state afterwards (same as every scenario).
//   error        one run; the server is expected to end it with RUN_ERROR.
//   client-tool  run 1 with tools: [confirm_booking]; for every confirm_booking
//                tool call left unanswered in agent.messages, addMessage({id,
//                role:'tool', toolCallId, content:'{"ok":true}'}); then run 2 with
//                the same tools. (If run 1 produced no such call, no run 2 and an
//                "errors" entry.)
//   edit         run 1 ('hello'), run 2 ('second question'); then the thread cut
//                after run 1's answer, a new user message 'second question, edited'
//                (new id) added, run 3: the thread diverges from the stored one.
//   regenerate   runs 1 and 2; then the thread cut after the second user message
//                (its answer dropped), run 3.
//
// Output: exactly one line of JSON on stdout:
// {
//   "scenario": "text", "threadId": "...",
//   "events": ["RUN_STARTED", ...],      // event types of all runs, in order
//   "rawEvents": [{...event}, ...],       // the events themselves, all runs, in order
//   "runs": [{"events": [types], "error": null|"<message>", "runError": null|{RUN_ERROR event},
//             "result": <RUN_FINISHED result>|null, "newMessages": [...]}],
//   "messages": [...],                    // agent.messages after the last run
//   "state": {...},                       // agent.state after the last run
//   "error": null | "<message>",          // first run failure (runAgent rejection or
//                                         //  RUN_ERROR message), else null
//   "errors": ["..."],                    // every failure / driver note, in order
//   "requests": [{"url","status","body": <RunAgentInput sent>, "raw": ["<data payload>",...]}],
//   "raw": ["<data payload>", ...],       // every `data:` payload received, in order
//   "timedOut": true                      // only with exit code 124
// }
// Exit code: 0 if the driver ran (server misbehaviour is recorded in the JSON),
// 2 on usage error, 1 on driver crash, 124 after the 30 s overall timeout.

const [, , scenario] = process.argv;
const SCENARIOS = ['text', 'tool', 'state', 'error', 'client-tool', 'edit', 'regenerate'];
if (!SCENARIOS.includes(scenario)) {
  process.stderr.write(`usage: ag-ui.mjs <${SCENARIOS.join('|')}>\n`);
  process.exit(2);
}

// Keep stdout for the single JSON line: library logging goes to stderr.
console.log = console.error;
console.info = console.error;
console.warn = console.error;
console.debug = console.error;

const { HttpAgent } = await import('@ag-ui/client');

const BASE = (process.env.AGENTD_URL ?? '').replace(/\/+$/, '');
const APP = process.env.AGENTD_APP ?? '';
const USER = process.env.AGENTD_USER ?? '';
const THREAD_ID = process.env.AGENTD_THREAD_ID || `thread-${Math.random().toString(36).slice(2, 10)}`;
const URL_ = `${BASE}/apps/${APP}/ag-ui`;

const CONFIRM_BOOKING = {
  name: 'confirm_booking',
  description: 'Ask the user to confirm a booking.',
  parameters: { type: 'object', properties: { when: { type: 'string' } } },
};

const out = {
  scenario,
  threadId: THREAD_ID,
  events: [],
  rawEvents: [],
  runs: [],
  messages: [],
  state: null,
  error: null,
  errors: [],
  requests: [],
  raw: [],
};

let agent = null;
let printed = false;
function toJson(v) {
  try {
    return JSON.parse(JSON.stringify(v ?? null));
  } catch {
    return String(v);
  }
}
function errText(e) {
  if (e == null) return null;
  return String(e?.message ?? e).slice(0, 2000);
}
function emit(code) {
  if (printed) return;
  printed = true;
  if (agent) {
    out.messages = toJson(agent.messages);
    out.state = toJson(agent.state);
  }
  out.error = out.errors.find((e) => !e.startsWith('driver:')) ?? null;
  process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(code));
}
const overall = setTimeout(() => {
  out.timedOut = true;
  emit(124);
}, 30_000);
overall.unref?.();

async function recordingFetch(url, init = {}) {
  let body = null;
  if (typeof init.body === 'string') {
    try {
      body = JSON.parse(init.body);
    } catch {
      body = init.body;
    }
  }
  const rec = { url: String(url), status: null, body, raw: [] };
  out.requests.push(rec);
  let res;
  try {
    res = await fetch(url, init);
  } catch (e) {
    rec.error = errText(e);
    throw e;
  }
  rec.status = res.status;
  if (!res.body || [101, 204, 205, 304].includes(res.status)) return res;
  const decoder = new TextDecoder();
  let buf = '';
  const tap = new TransformStream({
    transform(chunk, controller) {
      buf += decoder.decode(chunk, { stream: true });
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        let line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (line.endsWith('\r')) line = line.slice(0, -1);
        if (line.startsWith('data:')) {
          const payload = line.slice(5).replace(/^ /, '');
          rec.raw.push(payload);
          out.raw.push(payload);
        }
      }
      controller.enqueue(chunk);
    },
  });
  return new Response(res.body.pipeThrough(tap), { status: res.status, statusText: res.statusText, headers: res.headers });
}

async function run(params) {
  const r = { events: [], error: null, runError: null, result: null, newMessages: [] };
  out.runs.push(r);
  const sub = agent.subscribe({
    onEvent: ({ event }) => {
      r.events.push(event.type);
      out.events.push(event.type);
      out.rawEvents.push(toJson(event));
    },
    onRunErrorEvent: ({ event }) => {
      r.runError = toJson(event);
      out.errors.push(errText(event.message ?? 'RUN_ERROR'));
    },
  });
  try {
    const { result, newMessages } = await agent.runAgent(params);
    r.result = toJson(result ?? null);
    r.newMessages = toJson(newMessages);
  } catch (e) {
    r.error = errText(e);
    if (!out.errors.includes(r.error)) out.errors.push(r.error);
  } finally {
    sub.unsubscribe();
  }
  return r;
}

async function main() {
  agent = new HttpAgent({
    url: URL_,
    headers: { 'x-agentd-user-id': USER },
    threadId: THREAD_ID,
    fetch: recordingFetch,
  });
  agent.addMessage({ id: crypto.randomUUID(), role: 'user', content: 'hello' });

  if (scenario === 'edit' || scenario === 'regenerate') {
    await run({});
    agent.addMessage({ id: crypto.randomUUID(), role: 'user', content: 'second question' });
    await run({});
    out.messagesBefore = toJson(agent.messages);
    // The thread in conversation order: the server's closing MESSAGES_SNAPSHOT.
    const snapshot = [...out.rawEvents].reverse().find((e) => e.type === 'MESSAGES_SNAPSHOT');
    const thread = snapshot?.messages ?? agent.messages;
    const users = thread
      .map((m, i) => [m, i])
      .filter(([m]) => m.role === 'user');
    const second = users[1][1];
    const kept = thread.slice(0, scenario === 'edit' ? second : second + 1);
    agent.setMessages(structuredClone(kept));
    if (scenario === 'edit')
      agent.addMessage({ id: crypto.randomUUID(), role: 'user', content: 'second question, edited' });
    await run({});
    return;
  }

  if (scenario !== 'client-tool') {
    await run({});
    if (scenario === 'error' && out.runs[0].runError == null)
      out.errors.push('driver: run did not end with RUN_ERROR');
    return;
  }

  const tools = [CONFIRM_BOOKING];
  await run({ tools });
  const answered = new Set(agent.messages.filter((m) => m.role === 'tool').map((m) => m.toolCallId));
  const pending = [];
  for (const m of agent.messages) {
    for (const tc of m.toolCalls ?? []) {
      if (tc.function?.name === CONFIRM_BOOKING.name && !answered.has(tc.id)) pending.push(tc.id);
    }
  }
  if (pending.length === 0) {
    out.errors.push('driver: run 1 left no confirm_booking tool call to answer');
    return;
  }
  for (const toolCallId of pending) {
    agent.addMessage({ id: crypto.randomUUID(), role: 'tool', toolCallId, content: '{"ok":true}' });
  }
  await run({ tools });
}

try {
  await main();
  emit(0);
} catch (e) {
  out.crash = String(e?.stack ?? e);
  process.stderr.write(`driver crash: ${out.crash}\n`);
  emit(1);
}
