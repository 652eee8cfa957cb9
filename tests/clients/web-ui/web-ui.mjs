#!/usr/bin/env node
// Drives ADK's dev UI (the `cli/browser` bundle of the google-adk wheel, served by
// `agentd serve --web-ui-dir DIR` at /dev-ui/) in headless Debian Chromium, as a person would:
// open the page with the app preselected, type a message, send it, wait for the agent's
// reply, open the State tab and read it.
//
// Environment:
//   AGENTD_URL           base URL of agentd (default http://127.0.0.1:8000)
//   AGENTD_APP           app to select (?app=NAME); unset: the UI's choice (it picks a sole app)
//   AGENTD_MESSAGE       what to type (default "hello")
//   AGENTD_EXPECT_REPLY  text the agent's reply must contain; unset: any non-empty reply
//   AGENTD_TIMEOUT_MS    per-step timeout (default 30000)
//   AGENTD_SCREENSHOT    PNG path (default $TMPDIR/agentd-web-ui-<pid>.png)
//   AGENTD_TOKEN         optional; sent as `Authorization: Bearer` to AGENTD_URL's origin only
//   CHROMIUM             browser binary (default /usr/bin/chromium)
//
// Prints ONE JSON line:
//   {loaded, appSelected, replySeen, runFinished, consentDialog, replyText, snackbar,
//    stateText, sessionId, url, consoleErrors, failedRequests:[{url,status,error?}],
//    externalRequests, screenshot, error?}
// failedRequests holds only requests to AGENTD_URL's origin that got status >= 400 or failed
// (status 0). Requests to other hosts (the bundle's Google Fonts links) never leave the
// machine: the resolver maps every other host to NOTFOUND; they are only counted in
// externalRequests. Exit 0 when the driver ran (whatever it saw), 2 when it could not run.
//
// Selectors (google-adk 2.13.0 bundle):
//   chat box      textarea.chat-input-box        (Enter sends; button.send-message-btn too)
//   app picker    button.selector-button[mattooltip="Select an app"]  (text holds the app name)
//   reply rows    app-event-row.bot              (user rows: app-event-row.user)
//   run streaming button.stop-message-btn present; finished: it is gone, send button back
//   errors        mat-snack-bar-container        (e.g. an SSE `{"error": ...}` frame)
//   reply text    app-event-row.bot markdown
//   State tab     role=tab name "State"; its body: mat-tab-body.mat-mdc-tab-body-active

import os from 'node:os';
import path from 'node:path';
import { drive } from './browser.mjs';

const base = (process.env.AGENTD_URL || 'http://127.0.0.1:8000').replace(/\/+$/, '');
const app = process.env.AGENTD_APP || '';
const message = process.env.AGENTD_MESSAGE || 'hello';
const expect = process.env.AGENTD_EXPECT_REPLY || '';
const timeout = Number(process.env.AGENTD_TIMEOUT_MS || 30000);
const token = process.env.AGENTD_TOKEN || '';
const screenshot = process.env.AGENTD_SCREENSHOT
  || path.join(os.tmpdir(), `agentd-web-ui-${process.pid}.png`);
const origin = new URL(base).origin;

const out = {
  loaded: false,
  appSelected: false,
  replySeen: false,
  runFinished: false,
  consentDialog: false,
  replyText: '',
  snackbar: '',
  stateText: '',
  sessionId: '',
  url: '',
  consoleErrors: [],
  failedRequests: [],
  externalRequests: 0,
  screenshot: '',
};

const flat = (t) => t.split('\n').map((s) => s.trim()).filter(Boolean).join(' ')
  .replace(/ : /g, ': ');

await drive(base, timeout, out, async (page) => {

  if (token) {
    await page.route((u) => u.origin === origin, (route) => route.continue({
      headers: { ...route.request().headers(), authorization: `Bearer ${token}` },
    }));
  }
  page.on('console', (m) => {
    if (m.type() === 'error' && out.consoleErrors.length < 100) {
      out.consoleErrors.push(m.text().slice(0, 500));
    }
  });
  page.on('pageerror', (e) => {
    if (out.consoleErrors.length < 100) out.consoleErrors.push(`pageerror: ${String(e).slice(0, 500)}`);
  });
  const ours = (u) => { try { return new URL(u).origin === origin; } catch { return false; } };
  page.on('request', (r) => { if (!ours(r.url())) out.externalRequests += 1; });
  page.on('response', (r) => {
    if (r.status() >= 400 && ours(r.url())) out.failedRequests.push({ url: r.url(), status: r.status() });
  });
  page.on('requestfailed', (r) => {
    const error = r.failure()?.errorText || '';
    // An aborted SSE read after completion is not a failure of agentd.
    if (ours(r.url()) && error !== 'net::ERR_ABORTED') out.failedRequests.push({ url: r.url(), status: 0, error });
  });

  const query = app ? `?app=${encodeURIComponent(app)}` : '';
  await page.goto(`${base}/dev-ui/${query}`, { waitUntil: 'load' });
  const input = page.locator('textarea.chat-input-box');
  await input.waitFor({ state: 'visible' });
  out.loaded = true;

  // ADK's telemetry-consent modal opens unless runtime-config.json says `"telemetry": false`;
  // it covers the page, so it is noted (consentDialog) and dismissed with "No Thanks".
  const dismissConsent = async (wait) => {
    const dialog = page.locator('app-telemetry-consent-dialog');
    try { await dialog.waitFor({ state: 'visible', timeout: wait }); } catch { return; }
    out.consentDialog = true;
    await dialog.getByRole('button', { name: 'No Thanks' }).click();
    await dialog.waitFor({ state: 'detached' }).catch(() => {});
  };

  const picker = page.locator('button.selector-button[mattooltip="Select an app"]');
  try {
    await picker.filter({ hasText: app || /\S/ }).waitFor({ state: 'visible' });
    const names = flat(await picker.innerText()).split(' ');
    out.appSelected = app ? names.includes(app) : names.length > 0;
  } catch { /* stays false */ }

  await dismissConsent(1500);
  await input.fill(message);
  await input.press('Enter');
  const reply = page.locator('app-event-row.bot', expect ? { hasText: expect } : {}).first();
  try {
    await reply.waitFor({ state: 'visible' });
    out.replySeen = true;
  } catch { /* stays false */ }
  // While the run streams, the send button is swapped for a stop button.
  try {
    await page.locator('button.stop-message-btn').waitFor({ state: 'detached' });
    await page.locator('button.send-message-btn').waitFor({ state: 'visible' });
    out.runFinished = true;
  } catch { /* stays false */ }
  out.replyText = (await page.locator('app-event-row.bot markdown').allInnerTexts())
    .map((t) => t.trim()).filter(Boolean).join('\n');
  // `data: {"error": ...}` frames and failed sends surface as a snack bar.
  out.snackbar = (await page.locator('mat-snack-bar-container').allInnerTexts()).map(flat).join(' | ');

  await dismissConsent(100);
  const stateTab = page.getByRole('tab', { name: 'State', exact: true });
  if (await stateTab.count()) {
    await stateTab.click();
    const body = page.locator('mat-tab-body.mat-mdc-tab-body-active');
    await page.waitForTimeout(500);
    out.stateText = flat(await body.innerText());
  }

}, async (page) => {
  out.url = page.url();
  try { out.sessionId = new URL(out.url).searchParams.get('session') || ''; } catch { /* about:blank */ }
  await page.screenshot({ path: screenshot }).then(() => { out.screenshot = screenshot; }, () => {});
});
