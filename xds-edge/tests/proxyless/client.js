// A proxyless gRPC client on Node's @grpc/grpc-js-xds, finding its backends through our ADS
// server alone (see ../grpc_js_xds.rs). The Node twin of client.py: the same flags, the same
// output, the same commands, plus `soak`.
//
//     NODE_PATH=<dir>/node_modules node client.js --ads-port PORT [--calls N] [--interactive]
//         [--service pay] [--node-id ID] [--region eu] [--zone zone-a] [--timeout SECONDS]
//
// <dir> is where ./scripts/install-test-peers put grpc-js-xds (WAYMARK_NODE_XDS). The xDS
// bootstrap goes in GRPC_XDS_BOOTSTRAP_CONFIG and names 127.0.0.1:PORT as the only server;
// grpc-js-xds then asks it for the Listener SERVICE (LDS), its RouteConfiguration (RDS), the
// Cluster (CDS) and its ClusterLoadAssignment (EDS), and balances /waymark.test.Echo/Who
// calls over the endpoints it got. Nothing here knows a backend's address.
//
// Output, one line each, on stdout:
//     ready                  the channel connected (after the xDS handshake)
//     answer NAME            a call answered by backend NAME
//     tally NAME N           N calls of a soak answered by backend NAME
//     error CODE DETAILS     a call failed (a soak prints its first 20)
//     soaked MS SWEEPS       a soak called for MS milliseconds, over SWEEPS sweeps
//     round OK ERR           a round of calls (or a soak) ended
//     sweep N                grpc-js's outlier detection ran its interval timer, the Nth time
// Commands on stdin (with --interactive), one a line: "calls N" runs another round;
// "soak SECONDS SWEEPS" calls without a break until at least SECONDS have passed and the
// outlier-detection timer has run SWEEPS times since the soak began (or three times
// SECONDS, which ends it with an error); "quit" (or end of input) exits. The exit code is 0
// only if every call succeeded.
//
// `sweep` comes from grpc-js's own `outlier_detection` trace, which this client turns on and
// reads through grpc's logger hook: it is the one outside sign that the timer whose success
// rate check crashed grpc-js 1.14 on our old clusters has run and returned.
//
// Set WAYMARK_GRPC_DEBUG=1 to get every grpc-js trace on stderr.
'use strict';

const { parseArgs } = require('node:util');
const readline = require('node:readline');

const DEBUG = process.env.WAYMARK_GRPC_DEBUG === '1';
// Read by grpc-js when it loads, so set before the require below.
process.env.GRPC_NODE_TRACE = DEBUG ? 'all' : 'outlier_detection';
process.env.GRPC_NODE_VERBOSITY = 'DEBUG';

const grpc = require('@grpc/grpc-js');
const grpcXds = require('@grpc/grpc-js-xds');

const SOAK_ERROR_LINES_MAX = 20;
// A soak starts a call at most this often: about 200 a second, so each backend still gets
// far more than an interval's success-rate request volume (100 in 10 s), while the client
// and the Python backends leave most of a 2-core CI machine to the tests running beside.
const SOAK_CALL_SPACING_MS = 5;
const SWEEP_MARK = '| outlier_detection | Ejection timer running';

function options() {
  const { values } = parseArgs({
    options: {
      'ads-port': { type: 'string' },
      calls: { type: 'string', default: '0' },
      interactive: { type: 'boolean', default: false },
      service: { type: 'string', default: 'pay' },
      'node-id': { type: 'string', default: 'grpc-js-xds' },
      region: { type: 'string', default: 'eu' },
      zone: { type: 'string', default: 'zone-a' },
      timeout: { type: 'string', default: '20' },
      'call-deadline': { type: 'string', default: '2' },
    },
  });
  if (values['ads-port'] === undefined) {
    throw new Error('--ads-port is required');
  }
  return {
    adsPort: Number(values['ads-port']),
    calls: Number(values.calls),
    interactive: values.interactive,
    service: values.service,
    nodeId: values['node-id'],
    region: values.region,
    zone: values.zone,
    timeoutMs: Number(values.timeout) * 1000,
    callDeadlineMs: Number(values['call-deadline']) * 1000,
  };
}

function say(line) {
  process.stdout.write(line + '\n');
}

// Counts the outlier-detection timer's runs; everything else goes to stderr (traces only
// with WAYMARK_GRPC_DEBUG=1).
let sweeps = 0;
grpc.setLogger({
  error: (...args) => console.error('E', ...args),
  info: (...args) => console.error('I', ...args),
  debug: (message, ...args) => {
    if (String(message).includes(SWEEP_MARK)) {
      sweeps += 1;
      say(`sweep ${sweeps}`);
    }
    if (DEBUG) {
      console.error('D', message, ...args);
    }
  },
});

function bootstrap(o) {
  return JSON.stringify({
    xds_servers: [
      {
        server_uri: `127.0.0.1:${o.adsPort}`,
        channel_creds: [{ type: 'insecure' }],
        server_features: ['xds_v3'],
      },
    ],
    node: {
      id: o.nodeId,
      cluster: 'waymark-test',
      locality: { region: o.region, zone: o.zone },
    },
  });
}

function who(client, deadlineMs) {
  return new Promise((resolve) => {
    client.makeUnaryRequest(
      '/waymark.test.Echo/Who',
      (b) => b,
      (b) => b,
      Buffer.alloc(0),
      new grpc.Metadata(),
      { deadline: new Date(Date.now() + deadlineMs) },
      (err, answer) => resolve(err ? { err } : { name: answer.toString() }),
    );
  });
}

function errorLine(err) {
  const code = grpc.status[err.code] ?? String(err.code);
  return `error ${code} ${String(err.details ?? err.message).replace(/\n/g, ' ')}`;
}

async function round(client, o, n) {
  const deadline = Date.now() + o.timeoutMs;
  let ok = 0;
  let bad = 0;
  for (let i = 0; i < n; i++) {
    const left = Math.max(50, Math.min(o.callDeadlineMs, deadline - Date.now()));
    const r = await who(client, left);
    if (r.err) {
      say(errorLine(r.err));
      bad += 1;
    } else {
      say(`answer ${r.name}`);
      ok += 1;
    }
  }
  say(`round ${ok} ${bad}`);
  return bad;
}

// Calls one at a time, each starting at least SOAK_CALL_SPACING_MS after the last, until
// both bounds are met; answers are tallied, not printed one by one.
async function soak(client, o, seconds, sweepsWanted) {
  // The monotonic clock, to the microsecond: the wall clock in whole milliseconds could end
  // the soak a fraction of a millisecond before SECONDS have passed on the caller's clock.
  const start = performance.now();
  const ceiling = start + 3 * seconds * 1000;
  const sweepsBefore = sweeps;
  const tally = new Map();
  let ok = 0;
  let bad = 0;
  while (performance.now() - start < seconds * 1000 || sweeps - sweepsBefore < sweepsWanted) {
    if (performance.now() > ceiling) {
      say(
        `error SOAK_CEILING ${sweeps - sweepsBefore} of ${sweepsWanted} outlier-detection ` +
          `sweeps in ${3 * seconds}s`,
      );
      bad += 1;
      break;
    }
    const callStart = performance.now();
    const r = await who(client, o.callDeadlineMs);
    const spare = SOAK_CALL_SPACING_MS - (performance.now() - callStart);
    if (spare > 0) {
      await new Promise((resolve) => setTimeout(resolve, spare));
    }
    if (r.err) {
      if (bad < SOAK_ERROR_LINES_MAX) {
        say(errorLine(r.err));
      }
      bad += 1;
    } else {
      tally.set(r.name, (tally.get(r.name) ?? 0) + 1);
      ok += 1;
    }
  }
  for (const [name, n] of [...tally].sort()) {
    say(`tally ${name} ${n}`);
  }
  say(`soaked ${Math.floor(performance.now() - start)} ${sweeps - sweepsBefore}`);
  say(`round ${ok} ${bad}`);
  return bad;
}

async function main() {
  const o = options();
  process.env.GRPC_XDS_BOOTSTRAP_CONFIG = bootstrap(o);
  grpcXds.register();
  const client = new grpc.Client(`xds:///${o.service}`, grpc.credentials.createInsecure());
  const ready = await new Promise((resolve) =>
    client.waitForReady(new Date(Date.now() + o.timeoutMs), (err) => resolve(err)),
  );
  if (ready) {
    say(`error NOT_READY channel not ready within ${o.timeoutMs / 1000}s: ${ready.message}`);
    return 1;
  }
  say('ready');
  let failures = o.calls ? await round(client, o, o.calls) : 0;
  if (o.interactive) {
    const lines = readline.createInterface({ input: process.stdin });
    for await (const line of lines) {
      const words = line.trim().split(/\s+/);
      if (words[0] === '') {
        continue;
      }
      if (words[0] === 'quit') {
        break;
      } else if (words[0] === 'calls' && words.length === 2) {
        failures += await round(client, o, Number(words[1]));
      } else if (words[0] === 'soak' && words.length === 3) {
        failures += await soak(client, o, Number(words[1]), Number(words[2]));
      } else {
        say(`error BAD_COMMAND ${line.trim()}`);
        failures += 1;
      }
    }
  }
  client.close();
  return failures === 0 ? 0 : 1;
}

// An exception in grpc-js's own timers is not caught here on purpose: it ends the process,
// which is what the test must see.
main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
