#!/usr/bin/env node
// Drives the Evals tab of ADK's dev UI (google-adk 2.13.0's bundle, served by
// `agentd serve --web-ui-dir DIR`) in headless Debian Chromium, as a person would: open a
// session, open Evals, create an eval set, add the current session to it as a case, open the
// case and read what the UI shows of it.
//
// Environment:
//   AGENTD_URL         base URL of agentd (default http://127.0.0.1:8000)
//   AGENTD_APP         the app (?app=NAME)
//   AGENTD_SESSION     the session to add (?session=ID)
//   AGENTD_EVAL_SET    the new set's name
//   AGENTD_EVAL_CASE   the case's name (default: the UI's, the session id)
//   AGENTD_TIMEOUT_MS  per-step timeout (default 30000)
//   CHROMIUM           browser binary (default /usr/bin/chromium)
//
// Prints ONE JSON line:
//   {loaded, setListed, caseListed, caseText, alerts, evalRequests:[{method,url,status}],
//    error?}
// evalRequests holds every request the UI made to /dev/apps/{app}/eval… paths. Exit 0 when
// the driver ran (whatever it saw), 2 when it could not run.
//
// Selectors (google-adk 2.13.0 bundle):
//   Evals tab        role=tab name "Evals"; its body: mat-tab-body.mat-mdc-tab-body-active
//   new set          button "New" in the tab's header; dialog app-new-eval-set-dialog-component
//                    (input, buttons "Cancel" / "Create")
//   a set            its name in the list; inside it, button "From Current Session"
//   add-case dialog  mat-dialog-container (input prefilled with the session id, "Create")
//   a case           its name in the set's list; opening it shows its turns

import { drive } from './browser.mjs';

const base = (process.env.AGENTD_URL || 'http://127.0.0.1:8000').replace(/\/+$/, '');
const app = process.env.AGENTD_APP || '';
const session = process.env.AGENTD_SESSION || '';
const setName = process.env.AGENTD_EVAL_SET || 'golden';
const caseName = process.env.AGENTD_EVAL_CASE || '';
const timeout = Number(process.env.AGENTD_TIMEOUT_MS || 30000);

const out = {
  loaded: false, setListed: false, caseListed: false, caseText: '', alerts: [], evalRequests: [],
};
const flat = (t) => t.split('\n').map((s) => s.trim()).filter(Boolean).join(' ');

await drive(base, timeout, out, async (page) => {
  page.on('response', (r) => {
    if (r.url().includes(`/dev/apps/${app}/eval`)) {
      out.evalRequests.push({ method: r.request().method(), url: r.url(), status: r.status() });
    }
  });
  // The UI reports a failed add with window.alert.
  page.on('dialog', (d) => { out.alerts.push(d.message()); d.dismiss().catch(() => {}); });

  await page.goto(`${base}/dev-ui/?app=${encodeURIComponent(app)}&session=${encodeURIComponent(session)}`,
    { waitUntil: 'load' });
  await page.locator('textarea.chat-input-box').waitFor({ state: 'visible' });
  out.loaded = true;
  const consent = page.locator('app-telemetry-consent-dialog');
  if (await consent.count()) await consent.getByRole('button', { name: 'No Thanks' }).click();

  await page.getByRole('tab', { name: 'Evals', exact: true }).click();
  const body = page.locator('mat-tab-body.mat-mdc-tab-body-active');
  await body.locator('button', { hasText: 'New' }).click();
  const create = page.locator('app-new-eval-set-dialog-component');
  await create.locator('input').fill(setName);
  await create.getByRole('button', { name: 'Create' }).click();
  await create.waitFor({ state: 'detached' });
  const set = body.getByText(setName, { exact: true });
  await set.waitFor({ state: 'visible' });
  out.setListed = true;

  await set.click();
  await body.locator('button', { hasText: 'From Current Session' }).click();
  const add = page.locator('mat-dialog-container');
  const input = add.locator('input');
  await input.waitFor({ state: 'visible' });
  if (caseName) await input.fill(caseName);
  const name = await input.inputValue();
  await add.getByRole('button', { name: 'Create' }).click();
  await add.waitFor({ state: 'detached' });
  const item = body.getByText(name, { exact: true });
  await item.first().waitFor({ state: 'visible' });
  out.caseListed = true;

  await item.first().click();
  await page.getByText(`Case: ${name}`).first().waitFor({ state: 'visible' });
  await page.waitForTimeout(500);
  out.caseText = flat(await page.locator('body').innerText());
});
