#!/usr/bin/env node
// Opens agentd's API page (GET /docs, Swagger UI served by agentd itself) in headless Debian
// Chromium, with every host but agentd's unresolvable, and reads what a person would see:
// the title, the operations listed, and one operation opened (its request body schema).
//
// Environment:
//   AGENTD_URL         base URL of agentd (default http://127.0.0.1:8000)
//   AGENTD_OPEN        an operation to open, as "METHOD /path" (default "POST /run_sse")
//   AGENTD_TIMEOUT_MS  per-step timeout (default 30000)
//   CHROMIUM           browser binary (default /usr/bin/chromium)
//
// Prints ONE JSON line:
//   {loaded, title, operations, opened, openedText, consoleErrors, failedRequests,
//    externalRequests:[url], error?}
// `operations` is the number of operation blocks on the page; externalRequests lists every
// request to another origin (the page must make none). Exit 0 when the driver ran (whatever it
// saw), 2 when it could not run.

import { drive } from './browser.mjs';

const base = (process.env.AGENTD_URL || 'http://127.0.0.1:8000').replace(/\/+$/, '');
const open = process.env.AGENTD_OPEN || 'POST /run_sse';
const timeout = Number(process.env.AGENTD_TIMEOUT_MS || 30000);
const origin = new URL(base).origin;

const out = {
  loaded: false,
  title: '',
  operations: 0,
  opened: false,
  openedText: '',
  consoleErrors: [],
  failedRequests: [],
  externalRequests: [],
};

await drive(base, timeout, out, async (page) => {
  const ours = (u) => { try { return new URL(u).origin === origin; } catch { return true; } };
  page.on('request', (r) => {
    if (!ours(r.url()) && out.externalRequests.length < 50) out.externalRequests.push(r.url());
  });
  page.on('response', (r) => {
    if (r.status() >= 400 && ours(r.url())) out.failedRequests.push({ url: r.url(), status: r.status() });
  });
  page.on('requestfailed', (r) => {
    if (ours(r.url())) out.failedRequests.push({ url: r.url(), status: 0, error: r.failure()?.errorText || '' });
  });
  page.on('console', (m) => {
    if (m.type() === 'error' && out.consoleErrors.length < 50) out.consoleErrors.push(m.text().slice(0, 500));
  });
  page.on('pageerror', (e) => {
    if (out.consoleErrors.length < 50) out.consoleErrors.push(`pageerror: ${String(e).slice(0, 500)}`);
  });

  await page.goto(`${base}/docs`, { waitUntil: 'load' });
  await page.locator('.opblock').first().waitFor({ state: 'visible' });
  out.loaded = true;
  out.title = (await page.locator('.info .title').first().innerText()).trim();
  out.operations = await page.locator('.opblock').count();

  const [method, route] = open.split(' ');
  const block = page.locator(`.opblock-${method.toLowerCase()}`)
    .filter({ has: page.locator(`.opblock-summary-path[data-path="${route}"]`) })
    .first();
  await block.locator('.opblock-summary').first().click();
  await block.locator('.opblock-body').first().waitFor({ state: 'visible' });
  // The request body's schema tab shows the model's name once expanded.
  await page.waitForTimeout(300);
  out.openedText = (await block.locator('.opblock-body').first().innerText()).slice(0, 4000);
  out.opened = true;
});
