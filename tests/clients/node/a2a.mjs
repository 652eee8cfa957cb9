// Real-client driver for agentd's A2A server with the official JavaScript SDK
// (@a2a-js/sdk, pinned in package-lock.json).
//
// Usage:  node tests/clients/node/a2a.mjs <scenario>
// Env:    AGENTD_URL (http://127.0.0.1:PORT), AGENTD_URL2 (another replica; default
//         AGENTD_URL), AGENTD_APP, AGENTD_BINDING (JSONRPC | HTTP+JSON; default JSONRPC).
//
// The card is fetched from `${AGENTD_URL}/a2a/${AGENTD_APP}/.well-known/agent-card.json`
// by ClientFactory.createFromUrl, which picks the transport (preferredTransports).
//
// Scenarios:
//   send         sendMessage (blocking): state, text, contextId; getTask: getState
//   stream       sendMessageStream: kinds ($case of each response, in order), text
//                (artifacts aggregated by append), final (last state), then a second
//                message in the same context: secondText
//   cancel       sendMessageStream; after the first artifact chunk cancelTask (a client on
//                AGENTD_URL2): cancelState, final
//   resubscribe  sendMessageStream on AGENTD_URL, stop after the first artifact chunk;
//                resubscribeTask on AGENTD_URL2: firstKind, text, final
//
// Output: exactly one line of JSON on stdout ({"scenario", ...observations, "error"?}).

import { ClientFactory, ClientFactoryOptions } from '@a2a-js/sdk/client';
import { Role, TaskState } from '@a2a-js/sdk';
import { randomUUID } from 'node:crypto';

const scenario = process.argv[2];
const base = process.env.AGENTD_URL;
const base2 = process.env.AGENTD_URL2 || base;
const app = process.env.AGENTD_APP;
const binding = process.env.AGENTD_BINDING || 'JSONRPC';
const out = { scenario };

const stateName = (s) => TaskState[s] ?? String(s);

async function client(url) {
  const factory = new ClientFactory(
    ClientFactoryOptions.createFrom(ClientFactoryOptions.default, { preferredTransports: [binding] }),
  );
  return factory.createFromUrl(`${url}/a2a/${app}/.well-known/agent-card.json`, '');
}

function message(text, contextId = '') {
  return {
    tenant: '',
    message: {
      messageId: randomUUID(), contextId, taskId: '', role: Role.ROLE_USER,
      parts: [{ content: { $case: 'text', value: text }, metadata: undefined, filename: '', mediaType: '' }],
      metadata: undefined, extensions: [], referenceTaskIds: [],
    },
    configuration: undefined,
    metadata: undefined,
  };
}

class Collector {
  constructor() { this.kinds = []; this.artifacts = new Map(); this.final = null; this.task = null; }
  add(r) {
    const p = r.payload;
    if (!p) return 'none';
    this.kinds.push(p.$case);
    if (p.$case === 'task') {
      this.task = p.value;
      this.final = stateName(p.value.status?.state);
      for (const a of p.value.artifacts ?? []) this.artifacts.set(a.artifactId, textOf(a.parts));
    } else if (p.$case === 'artifactUpdate') {
      const a = p.value.artifact;
      const prev = this.artifacts.get(a.artifactId) ?? '';
      this.artifacts.set(a.artifactId, p.value.append ? prev + textOf(a.parts) : textOf(a.parts));
    } else if (p.$case === 'statusUpdate') {
      this.final = stateName(p.value.status?.state);
    }
    return p.$case;
  }
  text() { return [...this.artifacts.values()].join(''); }
}

const textOf = (parts) => (parts ?? []).map((p) => (p.content?.$case === 'text' ? p.content.value : '')).join('');

async function main() {
  const c = await client(base);
  out.transport = c.transport?.constructor?.name ?? null;
  if (scenario === 'send') {
    const r = await c.sendMessage(message('hello'));
    const task = r.payload?.value ?? r;
    out.state = stateName(task.status?.state);
    out.text = (task.artifacts ?? []).map((a) => textOf(a.parts)).join('');
    out.contextId = task.contextId;
    const got = await c.getTask({ tenant: '', id: task.id, historyLength: undefined });
    out.getState = stateName(got.status?.state);
  } else if (scenario === 'stream') {
    const col = new Collector();
    for await (const r of c.sendMessageStream(message('hello'))) col.add(r);
    Object.assign(out, { kinds: col.kinds, text: col.text(), final: col.final });
    const again = new Collector();
    for await (const r of c.sendMessageStream(message('hello again', col.task.contextId))) again.add(r);
    out.secondText = again.text();
    out.secondContextSame = again.task?.contextId === col.task.contextId;
  } else if (scenario === 'cancel') {
    const other = await client(base2);
    const col = new Collector();
    let cancelled = false;
    for await (const r of c.sendMessageStream(message('hello'))) {
      if (col.add(r) === 'artifactUpdate' && !cancelled) {
        cancelled = true;
        const t = await other.cancelTask({ tenant: '', id: col.task.id, metadata: undefined });
        out.cancelState = stateName(t.status?.state);
      }
    }
    out.final = col.final;
  } else if (scenario === 'resubscribe') {
    const col = new Collector();
    out.phase = 'first stream';
    for await (const r of c.sendMessageStream(message('hello'))) {
      if (col.add(r) === 'artifactUpdate') break;
    }
    out.phase = 'agent card';
    const other = await client(base2);
    const again = new Collector();
    out.phase = 'resubscribed';
    out.seen = again.kinds;
    for await (const r of other.resubscribeTask({ tenant: '', id: col.task.id })) again.add(r);
    delete out.phase;
    delete out.seen;
    Object.assign(out, { firstKind: again.kinds[0] ?? null, kinds: again.kinds, text: again.text(), final: again.final });
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
}

const timer = setTimeout(() => { out.error = 'timeout'; console.log(JSON.stringify(out)); process.exit(0); }, 60000);
main()
  .catch((e) => {
    // undici's `TypeError: terminated` says only that the body ended early; its cause says
    // how (the socket closed, a timeout, a parse error).
    const cause = e?.cause ? ` (cause: ${e.cause?.code ?? ''} ${e.cause?.message ?? e.cause})` : '';
    out.error = `${e?.constructor?.name}: ${e?.message ?? e}${cause}`;
  })
  .finally(() => { clearTimeout(timer); console.log(JSON.stringify(out)); process.exit(0); });
