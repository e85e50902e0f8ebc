/**
 * Runs the Python baseline of issue 7 (test/bench/python_baseline.py: an asyncio rollout loop built like
 * the reference Interactor, aiohttp, guess-number in Python) in a process of its own and parses its
 * one-line JSON result. It needs aiohttp (Debian: python3-aiohttp); when no interpreter has it, the
 * outcome is `{ ok: false, reason }` so the bench can say the baseline is missing instead of failing.
 *
 * Interpreters tried, first with aiohttp wins: $PYTHON, `python3` on PATH, /usr/bin/python3 (Debian's
 * package installs for the system interpreter, which a pyenv/venv `python3` on PATH does not see).
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { TrainingFigures } from '../../src/loadtest/training.ts';

export type PythonBaselineMode = 'executor' | 'direct';

export interface PythonBaselineOptions {
  /** Base URL of the inference server (the script appends /v1/chat/completions). */
  url: string;
  concurrency: number;
  seconds: number;
  mode: PythonBaselineMode;
  maxTokens: number;
}

export interface PythonBaselineResult {
  /** Inference calls recorded in the measured window (the engine side counts the same unit). */
  steps: number;
  seconds: number;
  stepsPerSecond: number;
  /** getrusage(RUSAGE_SELF) user + system over the window: every thread of the Python process. */
  cpuSeconds: number;
  cpuUsPerStep: number;
  episodes: number;
  meanReward: number | null;
  failures: number;
  mode: PythonBaselineMode;
  python: string;
  aiohttp: string;
}

export type PythonBaselineOutcome =
  | { ok: true; result: PythonBaselineResult; interpreter: string }
  | { ok: false; reason: string };

const SCRIPT = fileURLToPath(new URL('./python_baseline.py', import.meta.url));

interface Exit {
  code: number | null;
  stdout: string;
  stderr: string;
  spawnError?: Error;
}

function run(command: string, args: string[], timeoutMs: number): Promise<Exit> {
  return new Promise((resolve) => {
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr = (stderr + chunk.toString()).slice(-4_000)));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    const killOnExit = () => child.kill('SIGKILL');
    process.once('exit', killOnExit);
    const done = (exit: Exit) => {
      clearTimeout(timer);
      process.off('exit', killOnExit);
      resolve(exit);
    };
    child.once('error', (err) => done({ code: null, stdout, stderr, spawnError: err }));
    child.once('close', (code) => done({ code, stdout, stderr }));
  });
}

let chosen: Promise<{ interpreter: string | null; tried: string[] }> | null = null;

/** The first interpreter that imports aiohttp (cached); null with the candidates tried when none does. */
function findInterpreter(): Promise<{ interpreter: string | null; tried: string[] }> {
  chosen ??= (async () => {
    const candidates = [
      ...new Set([process.env.PYTHON, 'python3', '/usr/bin/python3'].filter((c): c is string => !!c)),
    ];
    const present: string[] = [];
    for (const candidate of candidates) {
      const exit = await run(candidate, ['-c', 'import aiohttp'], 15_000);
      if (exit.spawnError) continue;
      present.push(candidate);
      if (exit.code === 0) return { interpreter: candidate, tried: candidates };
    }
    // None has aiohttp: run the script with the first one present anyway, so it reports why itself.
    return { interpreter: present[0] ?? null, tried: candidates };
  })();
  return chosen;
}

/** One run of the baseline; never rejects. */
export async function runPythonBaseline(options: PythonBaselineOptions): Promise<PythonBaselineOutcome> {
  const { interpreter, tried } = await findInterpreter();
  if (interpreter === null) return { ok: false, reason: `no Python interpreter found (tried ${tried.join(', ')})` };
  const args = [
    SCRIPT,
    '--url',
    options.url,
    '--concurrency',
    String(options.concurrency),
    '--seconds',
    String(options.seconds),
    '--mode',
    options.mode,
    '--max-tokens',
    String(options.maxTokens),
  ];
  // Warm-up is at most 5 s; allow generously for start-up and shutdown on a loaded machine.
  const exit = await run(interpreter, args, (options.seconds + 60) * 1000);
  const lastLine = exit.stdout.trim().split('\n').at(-1) ?? '';
  let parsed: Record<string, unknown> | null = null;
  try {
    parsed = JSON.parse(lastLine) as Record<string, unknown>;
  } catch {
    parsed = null;
  }
  if (parsed && typeof parsed.error === 'string') {
    const where = exit.code === 3 ? ` (tried ${tried.join(', ')})` : '';
    return { ok: false, reason: `${parsed.error}${where}` };
  }
  if (exit.code !== 0 || parsed === null || typeof parsed.stepsPerSecond !== 'number') {
    const tail = exit.stderr.trim().split('\n').slice(-3).join(' | ');
    return { ok: false, reason: `${interpreter} ${SCRIPT} exited with code ${exit.code}${tail ? `: ${tail}` : ''}` };
  }
  return { ok: true, result: parsed as unknown as PythonBaselineResult, interpreter };
}

export interface PythonTrainerOptions {
  urls: readonly string[];
  groups: number;
  groupSize: number;
  turns: number;
  maxTokens: number;
  steps: number;
  /** GPU ms, as src/loadtest/training.ts takes them. */
  trainMsPerToken: number;
  loadMs: number;
  speedup: number;
  /** tasks[].messageCut of the engine's sides, so both send the same conversations. */
  messageCut: number;
}

/**
 * Issue 21's fourth side: python_baseline.py --mode sync-trainer, the seed-style loop grown into a
 * synchronous trainer against the GPU-like mocks; it prints the figures src/loadtest/training.ts
 * reports for the engine's sides. Never rejects.
 */
export async function runPythonTrainer(
  o: PythonTrainerOptions,
): Promise<{ ok: true; result: TrainingFigures; interpreter: string } | { ok: false; reason: string }> {
  const { interpreter, tried } = await findInterpreter();
  if (interpreter === null) return { ok: false, reason: `no Python interpreter found (tried ${tried.join(', ')})` };
  const args = [
    SCRIPT,
    '--mode',
    'sync-trainer',
    '--urls',
    o.urls.join(','),
    '--groups',
    String(o.groups),
    '--group-size',
    String(o.groupSize),
    '--turns',
    String(o.turns),
    '--max-tokens',
    String(o.maxTokens),
    '--steps',
    String(o.steps),
    '--train-ms-per-token',
    String(o.trainMsPerToken),
    '--load-ms',
    String(o.loadMs),
    '--speedup',
    String(o.speedup),
    '--message-cut',
    String(o.messageCut),
  ];
  const exit = await run(interpreter, args, 30 * 60_000);
  const lastLine = exit.stdout.trim().split('\n').at(-1) ?? '';
  let parsed: Record<string, unknown> | null = null;
  try {
    parsed = JSON.parse(lastLine) as Record<string, unknown>;
  } catch {
    parsed = null;
  }
  if (parsed && typeof parsed.error === 'string')
    return { ok: false, reason: `${parsed.error}${exit.code === 3 ? ` (tried ${tried.join(', ')})` : ''}` };
  if (exit.code !== 0 || parsed === null || typeof parsed.stepsPerHour !== 'number') {
    const tail = exit.stderr.trim().split('\n').slice(-3).join(' | ');
    return {
      ok: false,
      reason: `${interpreter} ${SCRIPT} --mode sync-trainer exited with code ${exit.code}${tail ? `: ${tail}` : ''}`,
    };
  }
  return { ok: true, result: parsed as unknown as TrainingFigures, interpreter };
}
