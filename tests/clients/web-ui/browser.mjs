// Headless Debian Chromium for the drivers in this folder: a fresh profile each time, and
// every host but agentd's unresolvable (other hosts fail at once, without a DNS query).
//
//   const { ctx, page, done } = await launch(base, timeout);  ...  await done();
//
// or, for a driver that prints one JSON line of what it saw:
//
//   await drive(base, timeout, out, async (page) => { ...; out.loaded = true; ... });
//
// CHROMIUM names the browser binary (default /usr/bin/chromium).

import { chromium } from 'playwright-core';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export async function launch(base, timeout) {
  const host = new URL(base).hostname;
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'agentd-browser-profile-'));
  let ctx;
  try {
    ctx = await chromium.launchPersistentContext(userDataDir, {
      executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
      headless: true,
      viewport: { width: 1400, height: 900 },
      args: [
        '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
        '--disable-background-networking', '--disable-component-update', '--disable-sync',
        `--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE ${host}`,
      ],
    });
  } catch (e) {
    fs.rmSync(userDataDir, { recursive: true, force: true });
    throw e;
  }
  const page = ctx.pages()[0] || (await ctx.newPage());
  page.setDefaultTimeout(timeout);
  const done = async () => {
    await ctx.close().catch(() => {});
    fs.rmSync(userDataDir, { recursive: true, force: true });
  };
  return { ctx, page, done };
}

// Runs `steps(page)` in a fresh browser, then prints `out` as one JSON line and exits: 0 when
// the driver ran (whatever it saw; a failed step is `out.error`), 2 when the page never loaded
// (`out.loaded` still false). `last(page)`, if given, runs after the steps however they ended
// (a screenshot, the final URL).
export async function drive(base, timeout, out, steps, last) {
  let browser;
  let code = 0;
  try {
    browser = await launch(base, timeout);
    await steps(browser.page);
  } catch (e) {
    out.error = String(e?.message || e).split('\n')[0].slice(0, 500);
    code = out.loaded ? 0 : 2;
  } finally {
    if (browser && last) await last(browser.page).catch(() => {});
    if (browser) await browser.done();
  }
  process.stdout.write(`${JSON.stringify(out)}\n`);
  process.exit(code);
}
