// Headless Debian Chromium for the drivers in this folder: a fresh profile each time, and
// every host but agentd's unresolvable (other hosts fail at once, without a DNS query).
//
//   const { ctx, page, done } = await launch(base, timeout);  ...  await done();
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
