// BullMQ peer (bench/peer_bullmq.py runs it; see its docstring).
//
//   node bullmq_peer.mjs enqueue HOST:PORT QUEUE TASKS JOBNAME
//       add TASKS jobs named JOBNAME with queue.addBulk in calls of 1,000;
//       prints {"rate": jobs/s} (the addBulk calls only, timed after the
//       connection is ready).
//   node bullmq_peer.mjs work HOST:PORT QUEUE TASKS CONCURRENCY
//       ONE Worker until SIGTERM; prints {"event": "first", "t": ms} at the
//       first 'completed' event and {"event": "done", "t": ms, "failed": n}
//       at the TASKS-th ('completed' is emitted after moveToCompleted has
//       returned from Redis). t is performance.now(), monotonic.
//   node bullmq_peer.mjs finish HOST:PORT QUEUE
//       prints the queue's job counts, then obliterates it (all its keys).
//
// Run with the npm install directory (bench/_node.py) as cwd: packages are
// resolved from there.
import { createRequire } from "node:module";
import { performance } from "node:perf_hooks";
import path from "node:path";
import { pathToFileURL } from "node:url";

const require = createRequire(path.join(process.cwd(), "package.json"));
const { Queue, Worker } = await import(pathToFileURL(require.resolve("bullmq")).href);

const BATCH = 1000;
const say = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

const processors = {
  noop: async () => {},
  sleep10: () => new Promise((resolve) => setTimeout(resolve, 10)),
};

function connection(address) {
  const [host, port] = address.split(":");
  return { host, port: Number(port), maxRetriesPerRequest: null };
}

async function enqueue(address, name, total, jobName) {
  const queue = new Queue(name, { connection: connection(address) });
  try {
    await queue.waitUntilReady();
    const t0 = performance.now();
    for (let start = 0; start < total; start += BATCH) {
      const n = Math.min(BATCH, total - start);
      await queue.addBulk(Array.from({ length: n }, () => ({ name: jobName, data: {} })));
    }
    say({ rate: total / ((performance.now() - t0) / 1000) });
  } finally {
    await queue.close();
  }
}

async function work(address, name, total, concurrency) {
  let completed = 0;
  let failed = 0;
  // The processor runs by job name, as graphile-worker's tasks do.
  const worker = new Worker(name, (job) => processors[job.name](), {
    connection: connection(address),
    concurrency,
    autorun: true,
    // removeOnComplete left at BullMQ's default: completed jobs are kept
    // (their hash and an entry in the completed set), so they can be counted.
  });
  worker.on("failed", () => {
    failed += 1;
  });
  worker.on("error", (err) => console.error(`bullmq worker error: ${err}`));
  worker.on("completed", () => {
    completed += 1;
    if (completed === 1) say({ event: "first", t: performance.now() });
    if (completed === total) say({ event: "done", t: performance.now(), failed });
  });
  const stop = async () => {
    await worker.close();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

async function finish(address, name) {
  const queue = new Queue(name, { connection: connection(address) });
  try {
    const counts = await queue.getJobCounts();
    await queue.obliterate({ force: true });
    say(counts);
  } finally {
    await queue.close();
  }
}

const [mode, address, name, ...rest] = process.argv.slice(2);
if (mode === "enqueue") await enqueue(address, name, Number(rest[0]), rest[1]);
else if (mode === "work") await work(address, name, Number(rest[0]), Number(rest[1]));
else if (mode === "finish") await finish(address, name);
else throw new Error(`unknown mode ${mode}`);
