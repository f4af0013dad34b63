// graphile-worker peer (bench/peer_graphile.py runs it; see its docstring).
//
//   node graphile_peer.mjs enqueue DSN TASKS TASK
//       install graphile-worker's schema, then add TASKS jobs of task TASK
//       with addJobs in calls of 1,000; prints {"rate": jobs/s} (the addJobs
//       calls only, timed after the schema and the connection are ready).
//   node graphile_peer.mjs work DSN TASKS CONCURRENCY
//       ONE worker (run(), the "perf configuration") until SIGTERM; prints
//       {"event": "ready", "pids": [...]} with the PostgreSQL backend pids of
//       its pre-opened connections, {"event": "first", "t": ms} at the first
//       job success and {"event": "done", "t": ms, "failed": n} when the N-th
//       job has succeeded and its delete is committed (the jobs table holds
//       nothing but failed jobs). t is performance.now(), monotonic.
//
// Run with the npm install directory (bench/_node.py) as cwd: packages are
// resolved from there.
import { createRequire } from "node:module";
import { EventEmitter } from "node:events";
import { performance } from "node:perf_hooks";
import path from "node:path";
import { pathToFileURL } from "node:url";

const require = createRequire(path.join(process.cwd(), "package.json"));
const load = (name) => import(pathToFileURL(require.resolve(name)).href);

const { run, runMigrations, makeWorkerUtils, Logger } = await load("graphile-worker");
const pg = (await load("pg")).default;

const BATCH = 1000;
const POOL_SIZE = 10; // graphile-worker's default maxPoolSize, and ringod's pool_size
const say = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

// Warnings and errors to stderr; the per-job info lines are not written at all.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`graphile-worker ${level}: ${message}`);
});

const tasks = {
  noop: async () => {},
  sleep10: () => new Promise((resolve) => setTimeout(resolve, 10)),
};

async function enqueue(dsn, total, task) {
  await runMigrations({ connectionString: dsn, logger });
  const utils = await makeWorkerUtils({ connectionString: dsn, logger });
  try {
    await utils.withPgClient((client) => client.query("select 1"));
    const t0 = performance.now();
    for (let start = 0; start < total; start += BATCH) {
      const n = Math.min(BATCH, total - start);
      await utils.addJobs(Array.from({ length: n }, () => ({ identifier: task, payload: {} })));
    }
    say({ rate: total / ((performance.now() - t0) / 1000) });
  } finally {
    await utils.release();
  }
}

async function work(dsn, total, concurrency) {
  // Our own pool, opened in full up front so the bench knows the backends'
  // pids before the first job (their CPU is read from the first completion on).
  const pgPool = new pg.Pool({ connectionString: dsn, max: POOL_SIZE, idleTimeoutMillis: 0 });
  const onError = (err) => console.error(`graphile peer: pg error: ${err}`);
  pgPool.on("error", onError);
  pgPool.on("connect", (client) => client.on("error", onError));
  const clients = await Promise.all(Array.from({ length: POOL_SIZE }, () => pgPool.connect()));
  const pids = [];
  for (const client of clients) {
    pids.push((await client.query("select pg_backend_pid() as pid")).rows[0].pid);
  }
  clients.forEach((client) => client.release());
  const checker = new pg.Client({ connectionString: dsn });
  await checker.connect();
  pids.push((await checker.query("select pg_backend_pid() as pid")).rows[0].pid);

  let succeeded = 0;
  let failed = 0;
  let localQueueSize = null;
  const events = new EventEmitter();
  events.on("localQueue:init", ({ localQueue }) => {
    localQueueSize = localQueue.getJobBatchSize;
  });
  events.on("job:error", () => {
    failed += 1;
  });
  events.on("job:success", () => {
    succeeded += 1;
    if (succeeded === 1) say({ event: "first", t: performance.now() });
    if (succeeded === total) void finish();
  });
  async function finish() {
    // The N-th success is reported before its delete is committed (deletes
    // are batched); wait for the table to hold nothing but failures.
    for (;;) {
      const { rows } = await checker.query(
        "select count(*)::int as n from graphile_worker._private_jobs",
      );
      if (rows[0].n <= failed) break;
      await new Promise((resolve) => setTimeout(resolve, 1));
    }
    say({ event: "done", t: performance.now(), failed, localQueue: localQueueSize });
  }

  say({ event: "ready", pids });
  const runner = await run({
    pgPool,
    logger,
    events,
    concurrency,
    noHandleSignals: false,
    taskList: tasks,
    preset: {
      worker: {
        localQueue: { size: 500 },
        completeJobBatchDelay: 0,
        failJobBatchDelay: 0,
      },
    },
  });
  await runner.promise;
  await checker.end();
  await pgPool.end();
}

const [mode, dsn, total, arg] = process.argv.slice(2);
if (mode === "enqueue") await enqueue(dsn, Number(total), arg);
else if (mode === "work") await work(dsn, Number(total), Number(arg));
else throw new Error(`unknown mode ${mode}`);
