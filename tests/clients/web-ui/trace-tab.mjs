#!/usr/bin/env node
// Drives the Trace tab of ADK's dev UI (google-adk 2.13.0's bundle, served by
// `agentd serve --web-ui-dir DIR`) in headless Debian Chromium, as a person would: open the
// app, send a message, wait for the reply, and read what the trace shows:
// first the reply's event and its request (from the trace), then the Traces view of the
// invocation and one model call's span.
//
// Environment:
//   AGENTD_URL           base URL of agentd (default http://127.0.0.1:8000)
//   AGENTD_APP           the app (?app=NAME)
//   AGENTD_MESSAGE       what to type (default "hello")
//   AGENTD_EXPECT_REPLY  text the agent's reply contains
//   AGENTD_TIMEOUT_MS    per-step timeout (default 30000)
//   AGENTD_SHOT          a PNG path: a screenshot of the page when the driver ends
//   CHROMIUM             browser binary (default /usr/bin/chromium)
//
// Prints ONE JSON line:
//   {loaded, replySeen, sessionId, traceShown, traceText, spanText, eventText, consoleErrors,
//    traceRequests:[{url,status}], error?}
// Exit 0 when the driver ran (whatever it saw), 2 when it could not run.
//
// Selectors (google-adk 2.13.0 bundle):
//   chat box      textarea.chat-input-box (Enter sends)
//   reply rows    app-event-row.bot
//   an event      clicking a reply row opens its details; the side bar's `input` icon shows
//                 its request, from the trace's `generate_content` span of that event
//   Traces view   mat-button-toggle "Traces" above the chat: one row per span (the agent's
//                 span by its name, `invoke_agent ` and `execute_tool ` cut off) under a header
//                 "INVOCATION ID: …" (the root span); a row opens the span's details in the
//                 side panel ("Span N of M", Name, Span ID, Parent ID, …, the event it made)

import { drive } from './browser.mjs';

const base = (process.env.AGENTD_URL || 'http://127.0.0.1:8000').replace(/\/+$/, '');
const app = process.env.AGENTD_APP || '';
const message = process.env.AGENTD_MESSAGE || 'hello';
const expect = process.env.AGENTD_EXPECT_REPLY || '';
const timeout = Number(process.env.AGENTD_TIMEOUT_MS || 30000);

const out = {
  loaded: false, replySeen: false, sessionId: '', traceShown: false, traceText: '', spanText: '',
  eventText: '', consoleErrors: [], traceRequests: [],
};
const flat = (t) => t.split('\n').map((s) => s.trim()).filter(Boolean).join(' ');

await drive(base, timeout, out, async (page) => {
  page.on('console', (m) => { if (m.type() === 'error') out.consoleErrors.push(m.text().slice(0, 300)); });
  page.on('response', (r) => {
    if (r.url().includes('/debug/trace/')) out.traceRequests.push({ url: r.url(), status: r.status() });
  });
  await page.goto(`${base}/dev-ui/?app=${encodeURIComponent(app)}`, { waitUntil: 'load' });
  const input = page.locator('textarea.chat-input-box');
  await input.waitFor({ state: 'visible' });
  out.loaded = true;
  const consent = page.locator('app-telemetry-consent-dialog');
  if (await consent.count()) await consent.getByRole('button', { name: 'No Thanks' }).click();

  await input.fill(message);
  await input.press('Enter');
  const reply = page.locator('app-event-row.bot', expect ? { hasText: expect } : {}).first();
  await reply.waitFor({ state: 'visible' });
  out.replySeen = true;
  await page.locator('button.stop-message-btn').waitFor({ state: 'detached' });
  try { out.sessionId = new URL(page.url()).searchParams.get('session') || ''; } catch { /* none */ }

  // The reply's event (the UI selects the last one): its request, from the trace's model call.
  await reply.click();
  const request = page.locator('button:has(mat-icon:text-is("input"))').first();
  await request.click();
  await page.getByText('Report the weather.').first().waitFor({ state: 'visible' });
  out.eventText = flat(await page.locator('body').innerText());

  // The Traces view: one row per span of the invocation, a row opens the span.
  await page.locator('mat-button-toggle', { hasText: 'Traces' }).click();
  const rows = page.getByText('generate_content trace-model');
  await rows.first().waitFor({ state: 'visible' });
  out.traceShown = true;
  await page.waitForTimeout(300);
  out.traceText = flat(await page.locator('body').innerText());
  await rows.first().click();
  await page.getByText('Parent ID').first().waitFor({ state: 'visible' });
  out.spanText = flat(await page.locator('body').innerText());
}, async (page) => {
  if (process.env.AGENTD_SHOT) await page.screenshot({ path: process.env.AGENTD_SHOT });
});
