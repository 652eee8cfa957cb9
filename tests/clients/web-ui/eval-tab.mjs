#!/usr/bin/env node
// Drives the Evals tab of ADK's dev UI (google-adk 2.13.0's bundle, served by
// `agentd serve --web-ui-dir DIR`) in headless Debian Chromium, as a person would: open a
// session, open Evals, create an eval set, add the current session to it as a case, open the
// case and read what the UI shows of it; then, on a fresh load, open the set, run it with the
// metrics the run dialog offers, and read the result the UI shows.
//
// Environment:
//   AGENTD_URL         base URL of agentd (default http://127.0.0.1:8000)
//   AGENTD_APP         the app (?app=NAME)
//   AGENTD_SESSION     the session to add (?session=ID)
//   AGENTD_EVAL_SET    the new set's name
//   AGENTD_EVAL_CASE   the case's name (default: the UI's, the session id)
//   AGENTD_TIMEOUT_MS  per-step timeout (default 30000)
//   AGENTD_SHOT        a PNG path: a screenshot of the page when the driver ends
//   CHROMIUM           browser binary (default /usr/bin/chromium)
//
// Prints ONE JSON line:
//   {loaded, setListed, caseListed, caseText, runDialogText, ran, resultText, alerts,
//    evalRequests:[{method,url,status}], runBody, error?}
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
//   run              button "Run All" in the set's toolbar (no case ticked); its dialog (metrics with
//                    thresholds, "Run evaluation") starts with button "Run"; the result opens
//                    in the history, its summary "N PASS" / "N FAIL"

import { drive } from './browser.mjs';

const base = (process.env.AGENTD_URL || 'http://127.0.0.1:8000').replace(/\/+$/, '');
const app = process.env.AGENTD_APP || '';
const session = process.env.AGENTD_SESSION || '';
const setName = process.env.AGENTD_EVAL_SET || 'golden';
const caseName = process.env.AGENTD_EVAL_CASE || '';
const timeout = Number(process.env.AGENTD_TIMEOUT_MS || 30000);

const out = {
  loaded: false, setListed: false, caseListed: false, caseText: '', runDialogText: '', ran: false,
  resultText: '', alerts: [], evalRequests: [], runBody: null,
};
const flat = (t) => t.split('\n').map((s) => s.trim()).filter(Boolean).join(' ');

await drive(base, timeout, out, async (page) => {
  page.on('response', (r) => {
    if (r.url().includes(`/dev/apps/${app}/eval`)) {
      out.evalRequests.push({ method: r.request().method(), url: r.url(), status: r.status() });
    }
  });
  page.on('request', (r) => {
    if (r.url().endsWith(`/eval-sets/${setName}/run`)) out.runBody = r.postDataJSON();
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

  // A fresh load: the set, run with the dialog's metrics, its result.
  await page.goto(`${base}/dev-ui/?app=${encodeURIComponent(app)}&session=${encodeURIComponent(session)}`,
    { waitUntil: 'load' });
  await page.locator('textarea.chat-input-box').waitFor({ state: 'visible' });
  await page.getByRole('tab', { name: 'Evals', exact: true }).click();
  const tab = page.locator('mat-tab-body.mat-mdc-tab-body-active');
  await tab.getByText(setName, { exact: true }).click();
  await tab.getByText(name, { exact: true }).first().waitFor({ state: 'visible' });
  await tab.locator('button', { hasText: 'Run All' }).click();
  const dialog = page.locator('mat-dialog-container');
  const start = dialog.locator('button', { hasText: /Run\s*$/ });
  await start.waitFor({ state: 'visible' });
  out.runDialogText = flat(await dialog.innerText());
  await start.click();
  await dialog.waitFor({ state: 'detached' });
  // The history's summary of the run: "1 PASS" (or FAIL), the metrics' scores below it.
  const verdict = page.getByText(/^\s*\d+\s+(PASS|FAIL)\s*$/).first();
  await verdict.waitFor({ state: 'visible', timeout: timeout * 2 });
  out.ran = true;
  await page.waitForTimeout(500);
  out.resultText = flat(await page.locator('body').innerText());
}, async (page) => {
  if (process.env.AGENTD_SHOT) await page.screenshot({ path: process.env.AGENTD_SHOT });
});
