// Real-client driver for the Vercel AI SDK UI message stream protocol.
//
// Usage:  node tests/clients/node/ai-sdk.mjs <major:5|6|7> <scenario>
// Env:    AGENTD_URL (e.g. http://127.0.0.1:PORT), AGENTD_APP, AGENTD_USER,
//         AGENTD_CHAT_ID (optional; default "chat-<random>").
//
// Uses the pinned `ai` package of that major (7 -> "ai", 6 -> "ai-v6",
// 5 -> "ai-v5"): DefaultChatTransport + AbstractChat (with a minimal in-memory
// ChatState, like @ai-sdk/react's). api = `${AGENTD_URL}/apps/${AGENTD_APP}/chat`,
// header `x-agentd-user-id: ${AGENTD_USER}`, chat id = AGENTD_CHAT_ID.
//
// Scenarios:
//   text         sendMessage({text:'hello'}), wait until idle (status ready|error).
//   tool         same (the server runs a server-side tool).
//   client-tool  same, plus onToolCall answers every tool with
//                addToolOutput({tool, toolCallId, output:{answer:42}}) and
//                sendAutomaticallyWhen = lastAssistantMessageIsCompleteWithToolCalls;
//                waits for the automatic second POST to finish.
//   approval     (6, 7 only) sendMessage; once idle, every tool part in state
//                'approval-requested' gets addToolApprovalResponse({id, approved:true});
//                sendAutomaticallyWhen = lastAssistantMessageIsCompleteWithApprovalResponses.
//   deny         (6, 7 only) same with approved:false.
//   resume       the POST body is cut (fetch aborted, stream errored with
//                TypeError('network error'), i.e. a disconnect) right after the
//                first complete SSE frame containing "text-delta"; then
//                chat.resumeStream() on the same Chat (GET `${api}/${chatId}/stream`).
//   resume-reload  same cut, then a NEW Chat (same id) whose initial messages are
//                the old ones minus the trailing partial assistant message (a page
//                reload, useChat({resume:true})) calls resumeStream(); the output
//                describes the new Chat.
//   cancel       after the first text-delta frame arrives the driver itself sends
//                POST `${AGENTD_URL}/apps/${APP}/chat/${chatId}/stop` (same user
//                header, empty body) and waits for the chat stream to end.
//   regenerate   two turns, then regenerate() (the last answer), then
//                regenerate({messageId: <first assistant message id>});
//                `messagesBefore` / `messagesAfterRegenerate` hold the lists in between.
//   edit         two turns, then sendMessage({text:'first question, edited',
//                messageId: <first user message id>}) (an edit in place).
//
// Output: exactly one line of JSON on stdout:
// {
//   "major": 7, "scenario": "text", "chatId": "...",
//   "status": "ready" | "error" | "streaming" | "submitted",   // final chat.status
//   "error": null | "<error message>",                        // final chat.error
//   "errors": ["..."],           // every onError message, in order (each cut to 2000 chars)
//   "messages": [UIMessage...],  // final chat.messages (JSON)
//   "finishes": [{"isAbort","isDisconnect","isError","finishReason"}], // onFinish calls (v5: no finishReason)
//   "toolCalls": [{"toolName","toolCallId","input"}],          // onToolCall calls
//   "posts": 2,                  // POSTs made by the transport to `${api}`
//   "requests": [{"method","url","status","body": <parsed JSON request body|null>,
//                 "raw": ["<data payload>", ...], "error": "<fetch error>"?}],
//   "raw": ["<data payload>", ...],  // every `data:` payload received, all requests, in order
//   // scenario specific:
//   "approvals": [{"id","toolCallId","state"}],       // approval|deny: parts answered
//   "autoSent": true|false,                            // client-tool|approval|deny: posts >= 2
//   "statusAfterCut": "...", "errorAfterCut": "...",   // resume*: after the cut POST settled
//   "messagesAfterCut": [UIMessage...],                // resume-reload: the old Chat's messages
//   "resumeStatus": 200|204|...|null, "resumeUrl": "...",  // resume*: the GET
//   "stopStatus": 200|...|null, "stopBody": "...",     // cancel: the stop POST
//   "timedOut": true                                   // only with exit code 124
// }
// Exit code: 0 if the driver ran (server misbehaviour is recorded in the JSON),
// 2 on usage error, 1 on driver crash, 124 after the 30 s overall timeout.

const [, , majorArg, scenario] = process.argv;
const MAJORS = { 5: 'ai-v5', 6: 'ai-v6', 7: 'ai' };
const SCENARIOS = ['text', 'tool', 'client-tool', 'approval', 'deny', 'resume', 'resume-reload', 'cancel', 'regenerate', 'edit'];
if (!MAJORS[majorArg] || !SCENARIOS.includes(scenario)) {
  process.stderr.write(`usage: ai-sdk.mjs <5|6|7> <${SCENARIOS.join('|')}>\n`);
  process.exit(2);
}
if ((scenario === 'approval' || scenario === 'deny') && majorArg === '5') {
  process.stderr.write('approval/deny need ai >= 6\n');
  process.exit(2);
}

// Keep stdout for the single JSON line: library logging goes to stderr.
console.log = console.error;
console.info = console.error;
console.warn = console.error;
console.debug = console.error;

const BASE = (process.env.AGENTD_URL ?? '').replace(/\/+$/, '');
const APP = process.env.AGENTD_APP ?? '';
const USER = process.env.AGENTD_USER ?? '';
const CHAT_ID = process.env.AGENTD_CHAT_ID || `chat-${Math.random().toString(36).slice(2, 10)}`;
const API = `${BASE}/apps/${APP}/chat`;
const HEADERS = { 'x-agentd-user-id': USER };

const ai = await import(MAJORS[majorArg]);
const { AbstractChat, DefaultChatTransport } = ai;

const out = {
  major: Number(majorArg),
  scenario,
  chatId: CHAT_ID,
  status: null,
  error: null,
  errors: [],
  messages: [],
  finishes: [],
  toolCalls: [],
  posts: 0,
  requests: [],
  raw: [],
};

let printed = false;
function emit(code) {
  if (printed) return;
  printed = true;
  if (chat) {
    out.status = chat.status;
    out.error = errText(chat.error);
    out.messages = toJson(chat.messages);
  }
  process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(code));
}
function errText(e) {
  if (e == null) return null;
  return String(e?.message ?? e).slice(0, 2000);
}
function toJson(v) {
  try {
    return JSON.parse(JSON.stringify(v ?? null));
  } catch {
    return String(v);
  }
}
const overall = setTimeout(() => {
  out.timedOut = true;
  emit(124);
}, 30_000);
overall.unref?.();

// ---------------------------------------------------------------- fetch tee
let inflight = 0;
let onDataLine = null; // (payload, rec) => void
let cutFirstPost = false;

async function recordingFetch(url, init = {}) {
  const method = (init.method ?? 'GET').toUpperCase();
  let body = null;
  if (typeof init.body === 'string') {
    try {
      body = JSON.parse(init.body);
    } catch {
      body = init.body;
    }
  }
  const rec = { method, url: String(url), status: null, body, raw: [] };
  out.requests.push(rec);
  if (method === 'POST' && String(url) === API) out.posts++;
  const cut = cutFirstPost && method === 'POST';
  if (cut) cutFirstPost = false;

  // Our own controller so that a cut really tears the connection down.
  const ctrl = new AbortController();
  if (init.signal) {
    if (init.signal.aborted) ctrl.abort(init.signal.reason);
    else init.signal.addEventListener('abort', () => ctrl.abort(init.signal.reason), { once: true });
  }
  inflight++;
  let res;
  try {
    res = await fetch(url, { ...init, signal: ctrl.signal });
  } catch (e) {
    inflight--;
    rec.error = String(e?.message ?? e);
    throw e;
  }
  rec.status = res.status;
  if (!res.body || [101, 204, 205, 304].includes(res.status)) {
    inflight--;
    return res;
  }

  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  const encoder = new TextEncoder();
  let lineBuf = '';
  let frameBuf = ''; // cut mode: re-chunk at frame boundaries
  let done = false;
  const finish = () => {
    if (!done) {
      done = true;
      inflight--;
    }
  };
  const scanLines = (text) => {
    lineBuf += text;
    let i;
    while ((i = lineBuf.indexOf('\n')) >= 0) {
      let line = lineBuf.slice(0, i);
      lineBuf = lineBuf.slice(i + 1);
      if (line.endsWith('\r')) line = line.slice(0, -1);
      if (line.startsWith('data:')) {
        const payload = line.slice(5).replace(/^ /, '');
        rec.raw.push(payload);
        out.raw.push(payload);
        try {
          onDataLine?.(payload, rec);
        } catch (e) {
          process.stderr.write(`onDataLine: ${e}\n`);
        }
      }
    }
  };
  const stream = new ReadableStream({
    async pull(controller) {
      try {
        for (;;) {
          const { value, done: eof } = await reader.read();
          if (eof) {
            const rest = decoder.decode();
            if (rest) scanLines(rest);
            if (cut && frameBuf) controller.enqueue(encoder.encode(frameBuf));
            finish();
            controller.close();
            return;
          }
          const text = decoder.decode(value, { stream: true });
          scanLines(text);
          if (!cut) {
            controller.enqueue(value);
            return;
          }
          frameBuf += text;
          let emitted = false;
          let j;
          while ((j = frameBuf.search(/\r?\n\r?\n/)) >= 0) {
            const m = frameBuf.slice(j).match(/^\r?\n\r?\n/);
            const frame = frameBuf.slice(0, j + m[0].length);
            frameBuf = frameBuf.slice(j + m[0].length);
            controller.enqueue(encoder.encode(frame));
            emitted = true;
            if (frame.includes('"text-delta"')) {
              rec.cut = true;
              ctrl.abort(new Error('driver cut'));
              reader.cancel().catch(() => {});
              finish();
              // What a browser reports when the connection drops mid-body.
              controller.error(new TypeError('network error'));
              return;
            }
          }
          if (emitted) return;
        }
      } catch (e) {
        finish();
        if (!rec.cut) rec.error = String(e?.message ?? e);
        controller.error(e);
      }
    },
    cancel(reason) {
      finish();
      return reader.cancel(reason).catch(() => {});
    },
  });
  return new Response(stream, { status: res.status, statusText: res.statusText, headers: res.headers });
}

// ---------------------------------------------------------------- chat state
class MemoryChatState {
  constructor(messages = []) {
    this.status = 'ready';
    this.error = undefined;
    this.messages = messages;
  }
  pushMessage = (message) => {
    this.messages = this.messages.concat(message);
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
  };
  replaceMessage = (index, message) => {
    this.messages = [...this.messages.slice(0, index), this.snapshot(message), ...this.messages.slice(index + 1)];
  };
  snapshot = (value) => structuredClone(value);
}

class Chat extends AbstractChat {
  constructor({ messages, ...init }) {
    super({ ...init, state: new MemoryChatState(messages) });
  }
}

let chat = null;

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

// Idle = status ready|error, no request in flight, no active response, stable for 300 ms.
async function waitIdle() {
  let stableSince = null;
  for (;;) {
    const idle =
      (chat.status === 'ready' || chat.status === 'error') && inflight === 0 && chat.activeResponse == null;
    if (idle) {
      stableSince ??= Date.now();
      if (Date.now() - stableSince >= 300) return;
    } else stableSince = null;
    await sleep(20);
  }
}

async function main() {
  const transport = new DefaultChatTransport({ api: API, headers: HEADERS, fetch: recordingFetch });
  const init = {
    id: CHAT_ID,
    transport,
    onError: (e) => out.errors.push(errText(e)),
    onFinish: ({ isAbort, isDisconnect, isError, finishReason }) =>
      out.finishes.push(toJson({ isAbort, isDisconnect, isError, finishReason })),
    onToolCall: ({ toolCall }) => {
      out.toolCalls.push(
        toJson({ toolName: toolCall.toolName, toolCallId: toolCall.toolCallId, input: toolCall.input }),
      );
      if (scenario === 'client-tool') {
        // Not awaited: awaiting inside onToolCall deadlocks the job executor.
        chat
          .addToolOutput({ tool: toolCall.toolName, toolCallId: toolCall.toolCallId, output: { answer: 42 } })
          .catch((e) => out.errors.push(`addToolOutput: ${e?.message ?? e}`));
      }
    },
  };
  if (scenario === 'client-tool') init.sendAutomaticallyWhen = ai.lastAssistantMessageIsCompleteWithToolCalls;
  if (scenario === 'approval' || scenario === 'deny')
    init.sendAutomaticallyWhen = ai.lastAssistantMessageIsCompleteWithApprovalResponses;
  chat = new Chat(init);

  switch (scenario) {
    case 'text':
    case 'tool':
      await chat.sendMessage({ text: 'hello' });
      await waitIdle();
      break;

    case 'client-tool':
      await chat.sendMessage({ text: 'hello' });
      await waitIdle();
      out.autoSent = out.posts >= 2;
      break;

    case 'approval':
    case 'deny': {
      await chat.sendMessage({ text: 'hello' });
      await waitIdle();
      out.approvals = [];
      for (const m of chat.messages) {
        for (const p of m.parts) {
          if (p.state === 'approval-requested' && p.approval?.id) {
            out.approvals.push({ id: p.approval.id, toolCallId: p.toolCallId, state: p.state });
          }
        }
      }
      if (out.approvals.length === 0) out.errors.push('driver: no tool part reached approval-requested');
      for (const a of out.approvals) {
        await chat.addToolApprovalResponse({ id: a.id, approved: scenario === 'approval' });
      }
      await waitIdle();
      out.autoSent = out.posts >= 2;
      break;
    }

    case 'resume':
    case 'resume-reload': {
      cutFirstPost = true;
      await chat.sendMessage({ text: 'hello' });
      await waitIdle();
      out.statusAfterCut = chat.status;
      out.errorAfterCut = errText(chat.error);
      if (scenario === 'resume-reload') {
        out.messagesAfterCut = toJson(chat.messages);
        const kept = structuredClone(chat.messages);
        if (kept.at(-1)?.role === 'assistant') kept.pop();
        chat = new Chat({ ...init, messages: kept });
      }
      const before = out.requests.length;
      await chat.resumeStream();
      await waitIdle();
      const get = out.requests.slice(before).find((r) => r.method === 'GET');
      out.resumeStatus = get?.status ?? null;
      out.resumeUrl = get?.url ?? null;
      break;
    }

    // Two turns, then `regenerate()` of the last answer and a regenerate of the first answer
    // by its id (both re-send the list up to the user message before it).
    case 'regenerate': {
      await chat.sendMessage({ text: 'first question' });
      await waitIdle();
      await chat.sendMessage({ text: 'second question' });
      await waitIdle();
      out.messagesBefore = toJson(chat.messages);
      await chat.regenerate();
      await waitIdle();
      out.messagesAfterRegenerate = toJson(chat.messages);
      const first = chat.messages.find((m) => m.role === 'assistant');
      await chat.regenerate({ messageId: first.id });
      await waitIdle();
      break;
    }

    // Two turns, then the first user message edited in place (`sendMessage` with its id).
    case 'edit': {
      await chat.sendMessage({ text: 'first question' });
      await waitIdle();
      await chat.sendMessage({ text: 'second question' });
      await waitIdle();
      out.messagesBefore = toJson(chat.messages);
      const user = chat.messages.find((m) => m.role === 'user');
      await chat.sendMessage({ text: 'first question, edited', messageId: user.id });
      await waitIdle();
      break;
    }

    case 'cancel': {
      let stopPromise = null;
      onDataLine = (payload) => {
        if (stopPromise || !payload.includes('"text-delta"')) return;
        out.stopStatus = null;
        stopPromise = fetch(`${BASE}/apps/${APP}/chat/${encodeURIComponent(CHAT_ID)}/stop`, {
          method: 'POST',
          headers: HEADERS,
        })
          .then(async (r) => {
            out.stopStatus = r.status;
            out.stopBody = await r.text();
          })
          .catch((e) => {
            out.stopError = String(e?.message ?? e);
          });
      };
      await chat.sendMessage({ text: 'hello' });
      await waitIdle();
      if (stopPromise) await stopPromise;
      else out.errors.push('driver: no text-delta arrived, stop was not sent');
      break;
    }
  }
}

try {
  await main();
  emit(0);
} catch (e) {
  out.crash = String(e?.stack ?? e);
  process.stderr.write(`driver crash: ${out.crash}\n`);
  emit(1);
}
