// Hatchery's in-sandbox JavaScript and TypeScript kernel: run_code in
// `javascript` and `typescript` contexts.
//
// The agent starts it as `node --expose-internals -e <this source>` with
// HATCHERY_KERNEL_LANGUAGE set to `javascript` or `typescript`, in the
// context's working directory, with the Python kernel's pipes: fd 0
// /dev/null, fd 1 and 2 raw output (child processes, direct fd writes),
// requests on fd 3 and events on fd 4, one JSON object a line (ready,
// stdout, stderr, result, error, done). One Node process per context, so
// what a cell declares (var, let, const, function, class) is there in the
// next one. A cell is a script run in the process's global context; its
// completion value (the last expression's) is the main result, and a cell
// with top-level `await` is rewritten by Node's own REPL helper (the one
// `node`'s REPL uses, hence --expose-internals) into an async function
// whose declarations stay global. TypeScript is transpiled first, types
// stripped without checking, by Debian's node-typescript (`transpileModule`).
// All of it is inside one function: `node -e` runs its source as a script
// in the global scope the cells share, where the kernel's own top-level
// names would clash with the cells' (`const fs = ...` in a cell).
(function kernel() {
'use strict';

const fs = require('fs');
const { Writable } = require('stream');
const util = require('util');
const vm = require('vm');

const LANGUAGE = process.env.HATCHERY_KERNEL_LANGUAGE === 'typescript' ? 'typescript' : 'javascript';
delete process.env.HATCHERY_KERNEL_LANGUAGE;
// Where Debian's node-typescript (and an npm -g install) put the compiler.
const TS_PATHS = ['typescript', '/usr/share/nodejs/typescript', '/usr/lib/node_modules/typescript',
  '/usr/local/lib/node_modules/typescript'];

// The kernel's pipes, reopened close-on-exec (libuv opens everything so),
// and the inherited fds closed: the cell's child processes must never hold
// them (a background child would keep the context's pipes open, or write
// events of its own). Where /proc cannot reopen them, fds 3 and 4 stay.
function reopen(fd, flags) {
  try {
    const copy = fs.openSync('/proc/self/fd/' + fd, flags); // libuv adds O_CLOEXEC
    fs.closeSync(fd);
    return copy;
  } catch (_) {
    return fd;
  }
}
const REQ_FD = reopen(3, fs.constants.O_RDONLY);
const EV_FD = reopen(4, fs.constants.O_WRONLY);

let currentId = null; // the request that output is attributed to
let count = 0; // execution_count

function emit(event) {
  const data = Buffer.from(JSON.stringify(event) + '\n', 'utf8');
  let off = 0;
  while (off < data.length) {
    try {
      off += fs.writeSync(EV_FD, data, off);
    } catch (e) {
      if (e.code === 'EAGAIN') continue;
      process.exit(1); // the agent is gone: nobody is left to serve
    }
  }
}

// process.stdout / process.stderr (and so console.*) become streams of
// events of the current run: console.log's text and newline are one
// write, so one message, as E2B's SDKs expect. They replace Node's own
// before anything touches those: Node's would put fds 1 and 2 in
// non-blocking mode, which the cell's child processes share.
function eventStream(kind, fd) {
  const stream = new Writable({
    decodeStrings: false,
    write(chunk, encoding, cb) {
      const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
      if (text) emit({ id: currentId, type: kind, text });
      cb();
    },
  });
  stream.fd = fd;
  stream.isTTY = false;
  Object.defineProperty(process, kind, { configurable: true, enumerable: true, get: () => stream });
  return stream;
}
eventStream('stdout', 1);
eventStream('stderr', 2);

function plain(value) {
  if (typeof value === 'string') return value; // as E2B's JS kernel: no quotes
  try {
    return util.inspect(value, { depth: 4, colors: false, maxArrayLength: 100, breakLength: 80 });
  } catch (_) {
    return Object.prototype.toString.call(value);
  }
}

// Deno's Jupyter protocol, which E2B's JavaScript kernel follows: an
// object with a [Symbol.for("Jupyter.display")]() method shows as the MIME
// bundle it returns.
const DISPLAY = Symbol.for('Jupyter.display');

function bundle(value) {
  const data = {};
  try {
    const fn = value !== null && (typeof value === 'object' || typeof value === 'function') ? value[DISPLAY] : null;
    const got = typeof fn === 'function' ? fn.call(value) : null;
    if (got && typeof got === 'object') {
      for (const [mime, v] of Object.entries(got)) {
        if (typeof v === 'string') data[mime] = v;
        else if (v !== undefined) {
          try {
            JSON.stringify(v);
            data[mime] = v;
          } catch (_) { /* not JSON: left out */ }
        }
      }
    }
  } catch (_) { /* a broken display method must not fail the cell */ }
  data['text/plain'] = plain(value);
  return data;
}

function result(value, main) {
  emit({ id: currentId, type: 'result', data: bundle(value), is_main_result: main });
}

// display(value): a rich result that is not the main one, as Jupyter's.
globalThis.display = function display(...values) {
  for (const v of values) result(v, false);
};

// Frames of the cell (and of what it called), not the kernel's or Node's
// own plumbing under them.
function userStack(err, headline) {
  const stack = typeof err.stack === 'string' ? err.stack : headline;
  const lines = stack.split('\n');
  const kept = [];
  for (const l of lines) {
    if (/^\s+at /.test(l) && (/\[eval\]|node:internal|node:vm|evalmachine/.test(l) || l.includes('runCell'))) continue;
    kept.push(l);
  }
  return kept.join('\n');
}

function error(err) {
  let name = 'Error';
  let value;
  let traceback;
  if (err instanceof Error || (err && typeof err === 'object' && typeof err.message === 'string')) {
    name = String(err.name || (err.constructor && err.constructor.name) || 'Error');
    value = String(err.message);
    traceback = userStack(err, name + ': ' + value);
  } else {
    // `throw 42`, `throw "text"`: E2B shows the thrown value.
    value = plain(err);
    traceback = 'Uncaught ' + value;
  }
  emit({ id: currentId, type: 'error', name, value, traceback });
}

let tsModule;
function typescript() {
  if (tsModule) return tsModule;
  for (const p of TS_PATHS) {
    try {
      tsModule = require(p);
      return tsModule;
    } catch (_) { /* next */ }
  }
  const e = new Error('no TypeScript compiler in this sandbox (Debian\'s node-typescript)');
  e.name = 'KernelError';
  throw e;
}

// Types stripped, nothing checked: what a cell means at run time. A syntax
// error is the cell's SyntaxError, with TypeScript's message and place.
function transpile(code, filename) {
  const ts = typescript();
  const out = ts.transpileModule(code, {
    fileName: filename + '.ts',
    reportDiagnostics: true,
    compilerOptions: {
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.CommonJS,
      esModuleInterop: true,
      alwaysStrict: false,
      sourceMap: false,
    },
  });
  const bad = (out.diagnostics || []).filter((d) => d.category === ts.DiagnosticCategory.Error);
  if (bad.length) {
    const d = bad[0];
    let where = '';
    if (d.file && d.start !== undefined) {
      const p = d.file.getLineAndCharacterOfPosition(d.start);
      where = ` (${filename}:${p.line + 1}:${p.character + 1})`;
    }
    const e = new SyntaxError(ts.flattenDiagnosticMessageText(d.messageText, '\n') + where);
    e.stack = 'SyntaxError: ' + e.message;
    throw e;
  }
  return out.outputText;
}

let processTopLevelAwait = null;
try {
  ({ processTopLevelAwait } = require('internal/repl/await'));
} catch (_) { /* a Node without it: cells with top-level await are wrapped plainly */ }

// A cell that awaits at the top level, as Node's REPL runs it: the
// rewritten cell returns {value} of its last expression; null if it has no
// top-level await (or does not parse, which the plain run then reports).
function awaitForm(code) {
  if (!/\bawait\b/.test(code)) return null;
  if (processTopLevelAwait) {
    try {
      return processTopLevelAwait(code);
    } catch (_) {
      return null;
    }
  }
  return null;
}

// TypeScript's CommonJS output may name these (a cell with `import`).
globalThis.require = require;
globalThis.module = module;
globalThis.exports = module.exports;

// Static ES module imports, which a script cannot hold (E2B's Deno kernel
// takes them): each becomes `var` bindings of `require`, so the names are
// globals that later cells see, as the cell's other declarations. The
// statement is rewritten on its own line(s), keeping line numbers. An
// `import ... from` at the start of a line inside a template string is
// rewritten too: the price of not parsing the cell.
const ESM_IMPORT = /^([ \t]*)import[ \t]+(?:([\w$]+)[ \t]*,?\s*)?(?:\*\s*as\s+([\w$]+)\s*|\{([^}]*)\}\s*)?(?:from\s*)?(['"])([^'"\n]+)\5[ \t]*;?/gm;
Object.defineProperty(globalThis, '__hatchery_default__', {
  // What `import x from 'm'` binds for a CommonJS module: its exports.
  value: (m) => (m && m.__esModule && 'default' in m ? m.default : m),
});

function esmImports(code) {
  if (!/^[ \t]*import[ \t]/m.test(code)) return code;
  return code.replace(ESM_IMPORT, (all, indent, def, star, named, _q, spec) => {
    const mod = `require(${JSON.stringify(spec)})`;
    const parts = [];
    if (star) parts.push(`var ${star} = ${mod};`);
    if (def) parts.push(`var ${def} = __hatchery_default__(${mod});`);
    if (named !== undefined) {
      const names = named.split(',').map((n) => n.trim()).filter(Boolean)
        .map((n) => n.replace(/^([\w$]+)\s+as\s+([\w$]+)$/, '$1: $2'));
      parts.push(`var { ${names.join(', ')} } = ${mod};`);
    }
    if (!parts.length) parts.push(`${mod};`);
    return indent + parts.join(' ') + '\n'.repeat((all.match(/\n/g) || []).length);
  });
}

async function runCell(code, filename) {
  const source = LANGUAGE === 'typescript' ? transpile(code, filename) : esmImports(code);
  const wrapped = awaitForm(source);
  if (wrapped !== null) {
    const got = await vm.runInThisContext(wrapped, { filename });
    return got && typeof got === 'object' ? got.value : undefined;
  }
  return vm.runInThisContext(source, { filename });
}

// Errors of a cell's callbacks that fire after it: reported on stderr of
// whatever run is current, never the end of the kernel.
process.on('uncaughtException', (err) => {
  process.stderr.write('Uncaught ' + (err && err.stack ? err.stack : plain(err)) + '\n');
});
process.on('unhandledRejection', (err) => {
  process.stderr.write('Unhandled promise rejection: ' + (err && err.stack ? err.stack : plain(err)) + '\n');
});
// A run is stopped by killing the context's unit, not by SIGINT.
process.on('SIGINT', () => {});

function parse(line) {
  const req = JSON.parse(line);
  if (!req || typeof req !== 'object' || Array.isArray(req)) throw new Error('a request must be a JSON object');
  if (!Number.isInteger(req.id)) throw new Error("'id' must be an integer");
  currentId = req.id;
  if (typeof req.code !== 'string') throw new Error("'code' must be a string");
  const env = req.env || {};
  if (typeof env !== 'object' || Array.isArray(env) || !Object.values(env).every((v) => typeof v === 'string')) {
    throw new Error("'env' must map strings to strings");
  }
  if (req.chdir !== undefined && req.chdir !== null && typeof req.chdir !== 'string') {
    throw new Error("'chdir' must be a string");
  }
  return { code: req.code, env, chdir: req.chdir };
}

function kernelError(message) {
  emit({ id: currentId, type: 'error', name: 'KernelError', value: message, traceback: 'KernelError: ' + message });
}

async function handle(line) {
  currentId = null;
  let req;
  try {
    req = parse(line);
  } catch (e) {
    return kernelError('malformed request: ' + e.message);
  }
  if (req.chdir) {
    try {
      process.chdir(req.chdir);
    } catch (e) {
      process.stderr.write(`cannot change the working directory to ${req.chdir}: ${e.message}\n`);
    }
  }
  // The run's env for this run only: the previous values come back after.
  const saved = {};
  for (const k of Object.keys(req.env)) saved[k] = process.env[k];
  try {
    for (const [k, v] of Object.entries(req.env)) process.env[k] = v;
  } catch (e) {
    return kernelError('bad env: ' + e.message);
  }
  count += 1;
  try {
    const value = await runCell(req.code, `<cell-${count}>`);
    if (value !== undefined) result(value, true);
  } catch (e) {
    error(e);
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

// Requests one at a time: a line is served only when the previous cell,
// awaits included, has finished.
function main() {
  if (LANGUAGE === 'typescript') {
    // Loaded now, not in the first run's time. Without it the kernel
    // stops before it is ready, saying why on its raw stderr (the agent
    // offers no TypeScript context then, so this is a template's mistake).
    try {
      typescript();
    } catch (e) {
      fs.writeSync(2, e.message + '\n');
      process.exit(1);
    }
  }
  const input = fs.createReadStream(null, { fd: REQ_FD, highWaterMark: 65536 });
  let buf = '';
  let busy = false;
  const queue = [];
  async function drain() {
    if (busy) return;
    busy = true;
    while (queue.length) {
      const line = queue.shift();
      try {
        await handle(line);
      } catch (e) {
        kernelError('internal error: ' + (e && e.message));
      }
      emit({ id: currentId, type: 'done', execution_count: count });
    }
    busy = false;
  }
  input.setEncoding('utf8');
  input.on('data', (chunk) => {
    buf += chunk;
    let at;
    while ((at = buf.indexOf('\n')) >= 0) {
      queue.push(buf.slice(0, at));
      buf = buf.slice(at + 1);
    }
    drain();
  });
  // The agent closed fd 3: exit 0.
  input.on('end', () => process.exit(0));
  input.on('error', () => process.exit(1));
  emit({ type: 'ready', pid: process.pid, language: LANGUAGE, version: process.version });
}

main();
})();
