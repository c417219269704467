// serve.mjs starts fauxqs (a faithful SQS emulator) for sinkbatch's tests,
// bound to 127.0.0.1 only: fauxqs's own CLI and startFauxqs listen on
// 0.0.0.0, so this builds the app and listens itself.
//
// Usage: node serve.mjs [port] [portfile]
//   port      0 (the default) picks a free port.
//   portfile  when given, the bound port is written there once listening.
// It exits on SIGINT/SIGTERM, and when the process named by
// SINKBATCH_FAUXQS_PARENT (a pid) is gone, so a CI run leaves nothing behind.
import { writeFileSync } from "node:fs";
import { buildApp } from "fauxqs";

const port = Number.parseInt(process.argv[2] ?? "0", 10);
const portFile = process.argv[3];
const app = buildApp({ logger: false, defaultRegion: "us-east-1" });
const address = await app.listen({ port, host: "127.0.0.1" });
const bound = new URL(address).port;
console.error(`fauxqs ${address} (pid ${process.pid})`);
if (portFile) {
  writeFileSync(portFile, `${bound}\n`);
}

async function stop(reason) {
  console.error(`fauxqs stopping: ${reason}`);
  await app.close();
  process.exit(0);
}
process.on("SIGINT", () => stop("SIGINT"));
process.on("SIGTERM", () => stop("SIGTERM"));

const parent = Number.parseInt(process.env.SINKBATCH_FAUXQS_PARENT ?? "", 10);
if (parent > 0) {
  setInterval(() => {
    try {
      process.kill(parent, 0);
    } catch {
      stop(`parent ${parent} exited`);
    }
  }, 1000).unref();
}
