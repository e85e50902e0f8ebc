/**
 * Everything a worker thread holds: the inference router, one environment actor pool per task, the
 * episode hooks, counters, and the control API it exposes to the coordinator. The entry point in
 * workers/ is a thin shell around this.
 *
 * Invariant: `runGroup` never rejects — each rollout carries its own status, and whatever throws
 * fails rollouts with the reason (worker/group-run.ts) — so one bad environment cannot take the other
 * groups sharing this worker down with it.
 */
import { readlinkSync } from 'node:fs';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { threadId } from 'node:worker_threads';
import { createActorPool, type ActorPool } from '../env/actor-pool.ts';
import { settleWithin, timeoutError } from '../env/bounded.ts';
import { createRemoteEnvironments } from '../env/remote.ts';
import { createVerifiersEnvironments, verifiersSampling } from '../env/verifiers.ts';
import { loadEnvironmentFactory, loadExport } from '../env/loader.ts';
import { McpServers } from '../env/mcp.ts';
import type { Environment } from '../env/types.ts';
import { LlmRouter } from '../llm/router.ts';
import { createLogger, type Logger } from '../log.ts';
import { EnvWatchSlot } from '../protocol/env-watch.ts';
import { describeError, preview } from '../errors.ts';
import {
  PROTOCOL_VERSION,
  type GroupResultMessage,
  type PromptLine,
  type RunGroupMessage,
  type TaskCheck,
  type WorkerControl,
  type EndpointUpdate,
  type WorkerInit,
  type WorkerTaskSettings,
  type WorkerStats,
} from '../protocol/messages.ts';
import { restartFromPrompt, Status, type RolloutGroup, type RolloutState } from '../domain/rollout.ts';
import { sessionIdOf, StepRecordWriter } from '../records/step-records.ts';
import { handBack, runEpisode } from './agent-loop.ts';
import { resumeAfterInfra } from './continuation.ts';
import type { EpisodeContext, EpisodeHooks } from './episode-context.ts';
import { runBlackBoxEpisode, type BlackBoxAgent } from './blackbox-loop.ts';
import { settleEpisode, settleGroup, type GroupRun } from './group-run.ts';
import { EnvGuard } from './env-guard.ts';
import { PauseGate } from './pause-gate.ts';
import { Slots } from '../slots.ts';

/** This thread's Linux tid, read once (/proc/thread-self links to <pid>/task/<tid>); null off Linux. */
const OS_THREAD_ID = ((): number | null => {
  try {
    const tid = Number(readlinkSync('/proc/thread-self').split('/').pop());
    return Number.isInteger(tid) ? tid : null;
  } catch {
    return null;
  }
})();

interface TaskRuntime {
  settings: WorkerTaskSettings;
  actors: ActorPool | null;
  /** Bounds and watches the calls into the task's environment and hooks; null without an environment. */
  guard: EnvGuard | null;
  close(): Promise<void>;
  hooks: Promise<EpisodeHooks | null>;
  blackbox: Promise<BlackBoxAgent> | null;
  /** The context every episode of this task runs with, once its hooks have loaded. */
  episodes?: EpisodeContext;
  /** The task's MCP servers for its episodes (`tasks[].tools.mcp`); undefined without any. */
  mcp?: EpisodeContext['mcp'];
}

export class WorkerRuntime implements WorkerControl {
  readonly #init: WorkerInit;
  readonly #llm: LlmRouter;
  readonly #log: Logger;
  readonly #gate: PauseGate;
  readonly #tasks = new Map<string, TaskRuntime>();
  readonly #records: StepRecordWriter | null;
  /** This worker's slot in the shared env watch; null when not watched or no slot was free. */
  readonly #watch: EnvWatchSlot | null;
  /** Group id → the pool's number for its run (RunGroupMessage.dispatch), while the group is here. */
  readonly #dispatches = new Map<string, number>();
  readonly #dispatchOf = (groupId: string): number => this.#dispatches.get(groupId) ?? 0;
  #episodesStarted = 0;
  readonly #loopDelay = monitorEventLoopDelay({ resolution: 10 });
  #inFlightGroups = 0;
  #inFlightRollouts = 0;
  /**
   * Episodes running (holding a slot). A rollout whose episode ended gives its slot to a waiting one at
   * once, even while its siblings still play: calls in flight stay at the bound instead of dropping
   * as each group's shorter episodes finish (the slots count episodes, the group waits for its last).
   */
  readonly #episodeSlots: Slots;
  /** Episodes being played, with or without a slot bound (the slots only count when bounded). */
  #episodesRunning = 0;
  /** `#episodesRunning--`, made once: a closure made per episode would live as long as the episode. */
  readonly #episodeEnded = () => void this.#episodesRunning--;
  #groupsDone = 0;
  #rolloutsDone = 0;
  #steps = 0;
  /** Replies whose weight version the trainer did not announce (PauseGate.stepOfVersion); warned of once. */
  #versionMismatches = 0;
  /** Tasks whose chat template was found rewriting an episode's history (TurnRecord.historyRewrite); warned of once each. */
  readonly #historyRewriteTasks = new Set<string>();
  readonly #rolloutsByStatus: Record<string, number> = {};

  constructor(init: WorkerInit) {
    if (init?.v !== PROTOCOL_VERSION)
      throw new Error(`worker init v must be ${PROTOCOL_VERSION}, got ${JSON.stringify(init?.v)}`);
    this.#init = init;
    this.#log = createLogger(init.logLevel, { worker: threadId }, init.prettyLogs);
    this.#gate = new PauseGate(init.control);
    this.#episodeSlots = new Slots(init.rolloutsPerWorker ?? Infinity);
    const gate = this.#gate;
    const log = this.#log;
    this.#llm = new LlmRouter(init.llm, {
      paused: () => gate.paused,
      onSend: () => gate.noteSend(),
      hold: () => gate.hold,
      warn: (message) => log.warn(message),
    });
    this.#loopDelay.enable();
    this.#records =
      init.recordsDir === null
        ? null
        : new StepRecordWriter({ dir: init.recordsDir, fileName: `steps-${process.pid}-${threadId}.jsonl` });
    const watch = init.envWatch === null ? null : new EnvWatchSlot(init.envWatch, threadId);
    if (watch !== null && !watch.watched)
      this.#log.warn(
        'no free env watch slot: a death of this worker cannot be blamed on one rollout (its groups are retried instead)',
      );
    this.#watch = watch?.watched ? watch : null;
    for (const [name, settings] of Object.entries(init.tasks)) this.#tasks.set(name, this.#taskRuntime(name, settings));
  }

  /** Never rejects (worker/group-run.ts): whatever throws comes back as FAILED rollouts with the reason. */
  runGroup(message: RunGroupMessage): Promise<GroupResultMessage> {
    return settleGroup(message, this.#groupRun);
  }

  /** How this worker runs a group, made once: a set of closures per group would live as long as the group. */
  readonly #groupRun: GroupRun = {
    workerId: threadId,
    begin: ({ group, dispatch }) => {
      this.#inFlightGroups++;
      this.#inFlightRollouts += group.rollouts.length;
      if (dispatch) this.#dispatches.set(group.id, dispatch);
    },
    play: ({ group, enqueuedAt }) => this.#playGroup(group, Math.max(0, Date.now() - enqueuedAt)),
    end: (group) => {
      this.#dispatches.delete(group.id);
      this.#inFlightGroups--;
      this.#inFlightRollouts -= group.rollouts.length;
      this.#groupsDone++;
      this.#rolloutsDone += group.rollouts.length;
      for (const rollout of group.rollouts)
        this.#rolloutsByStatus[rollout.status] = (this.#rolloutsByStatus[rollout.status] ?? 0) + 1;
    },
    report: (group, reason) => this.#log.error({ group: group.id }, reason),
  };

  /** Plays every rollout of `group` side by side, each in an episode slot; throws when the task cannot run. */
  async #playGroup(group: RolloutGroup, queueMs: number): Promise<void> {
    const task = this.#tasks.get(group.taskName);
    if (task === undefined)
      throw new Error(
        `unknown task ${JSON.stringify(group.taskName)} (worker knows ${[...this.#tasks.keys()].join(', ')})`,
      );
    let episode: (rollout: RolloutState, queueMs: number) => Promise<void>;
    // How an episode failed by infrastructure goes on: a black-box agent's run cannot be replayed (its
    // own loop drove the environment), so it starts again; an in-process one resumes at its last step.
    let afterInfra: (rollout: RolloutState) => void = restartFromPrompt;
    if (task.blackbox !== null) {
      const agent = await task.blackbox;
      const ctx = {
        agent,
        gatewayUrl: this.#init.gatewayUrl!,
        actors: task.actors,
        guard: task.guard ?? undefined,
        gate: this.#gate,
        workerId: threadId,
        onProblem: (r: { id: string; status: string }, reason: string) =>
          this.#log.warn({ rollout: r.id, status: r.status }, reason),
      };
      episode = (rollout, ms) => runBlackBoxEpisode(rollout, ctx, ms);
    } else {
      if (task.actors === null) throw new Error(`task ${group.taskName} has no environment`);
      // One context per task, made once: every group of it shares its callbacks (a set of closures per
      // group lived as long as the group).
      const hooks = await task.hooks;
      const ctx = (task.episodes ??= this.#episodeContext(task, task.actors, hooks));
      episode = (rollout, ms) => runEpisode(rollout, ctx, ms);
      afterInfra = resumeAfterInfra;
    }
    await Promise.all(
      group.rollouts.map((rollout) =>
        settleEpisode(rollout, threadId, () =>
          this.#inSlot(rollout, (waitedMs) =>
            this.#maskingInfra(rollout, task.settings.agent.infraRetries, afterInfra, (waited) =>
              episode(rollout, waited ? queueMs + waitedMs : 0),
            ),
          ),
        ),
      ),
    );
  }

  /**
   * Runs `episode` and, while it ends FAILED by infrastructure (domain/failure.ts), runs it again in the
   * same slot on a fresh actor, up to `retries` times: `afterInfra` readies the rollout — resumed at its last
   * finished step, or reset to its prompt — so that nothing the failure touched is trained as the
   * policy's outcome, and the group keeps its size. During a pause it is readied but not run: it goes
   * back ABORTED with its group, which is sent again after the resume and goes on from there. (Left
   * FAILED, it failed its group, which was dropped.)
   */
  async #maskingInfra(
    rollout: RolloutState,
    retries: number | undefined,
    afterInfra: (rollout: RolloutState) => void,
    episode: (first: boolean) => Promise<void>,
  ): Promise<void> {
    await episode(true);
    // Counted over the rollout's life (`maskedFailures`), so a retry handed back across a pause does not
    // get the budget afresh.
    for (let n = (rollout.maskedFailures ?? 0) + 1; n <= (retries ?? 0); n++) {
      if (rollout.status !== Status.FAILED || rollout.failureKind !== 'infrastructure') return;
      const paused = this.#gate.paused;
      this.#log.warn(
        { rollout: rollout.id, retry: n, of: retries },
        `${rollout.error}: not the policy's failure; the episode goes on with a fresh actor${paused ? ' after the resume' : ''}, the failed step is not trained`,
      );
      rollout.maskedFailures = (rollout.maskedFailures ?? 0) + 1;
      afterInfra(rollout);
      if (paused) {
        handBack(rollout, threadId);
        return;
      }
      await episode(false);
    }
  }

  /**
   * The start-up check, run once per task before production (coordinator/engine-core.ts): the task's
   * modules load, its environment factory makes an instance from `env.params`, and that instance's
   * `checkResetParams` accepts each of `prompts`. A broken module is then one error at start instead
   * of a FAILED group after another. Never throws; the instance is closed after.
   */
  async checkTask(name: string, prompts: PromptLine[]): Promise<TaskCheck> {
    const settings = this.#tasks.get(name)?.settings;
    const fail = (message: string, line: number | null = null): TaskCheck => ({
      problem: { line, message },
      checksPrompts: false,
    });
    if (settings === undefined) return fail(`unknown task ${JSON.stringify(name)}`);
    for (const [kind, module] of [
      ['hooks', settings.hooks],
      ['agent', settings.blackbox],
    ] as const) {
      if (module === null) continue;
      try {
        await loadExport(
          module.moduleUrl,
          module.exportName,
          `${kind}.export`,
          kind === 'hooks' ? 'object' : 'function',
        );
      } catch (err) {
        return fail(`${kind} module ${module.moduleUrl} cannot be loaded (${startupReason(err)})`);
      }
    }
    const env = settings.env;
    if (env === null || env.kind !== 'module') return { problem: null, checksPrompts: false }; // env servers: checked by their prewarm
    let instance: Environment;
    try {
      const factory = await loadEnvironmentFactory(env.moduleUrl, env.exportName);
      try {
        instance = await factory(env.params);
      } catch (err) {
        return fail(
          `env module ${env.moduleUrl}: its factory throws on env.params ${preview(env.params)} (${startupReason(err)})`,
        );
      }
    } catch (err) {
      return fail(`env module ${env.moduleUrl} cannot be loaded (${startupReason(err)})`);
    }
    try {
      if (typeof instance?.checkResetParams !== 'function') return { problem: null, checksPrompts: false };
      for (const { line, params } of prompts) {
        try {
          instance.checkResetParams(params);
        } catch (err) {
          return fail(startupReason(err), line);
        }
      }
      return { problem: null, checksPrompts: true };
    } finally {
      await Promise.resolve()
        .then(() => instance.close?.())
        .catch(() => undefined);
    }
  }

  stats(): WorkerStats {
    const stats: WorkerStats = {
      workerId: threadId,
      osThreadId: OS_THREAD_ID,
      inFlightGroups: this.#inFlightGroups,
      inFlightRollouts: this.#inFlightRollouts,
      episodesRunning: this.#episodesRunning,
      groupsDone: this.#groupsDone,
      rolloutsDone: this.#rolloutsDone,
      steps: this.#steps,
      weightVersionMismatches: this.#versionMismatches,
      rolloutsByStatus: { ...this.#rolloutsByStatus },
      heapUsedBytes: process.memoryUsage().heapUsed,
      eventLoopDelayP99Ms: this.#loopDelay.percentile(99) / 1e6,
      eventLoopDelayMeanMs: Number.isNaN(this.#loopDelay.mean) ? 0 : this.#loopDelay.mean / 1e6,
    };
    this.#loopDelay.reset();
    return stats;
  }

  /** The fleet changed: new sessions go to these endpoints (llm/router.ts setEndpoints). */
  setEndpoints(update: EndpointUpdate): void {
    this.#llm.setEndpoints(update.urls, update.servers);
    this.#log.info({ endpoints: update.urls }, 'inference endpoints changed');
  }

  /** Write buffered step records to disk (on a pause, and before the pool shuts down). */
  async flush(): Promise<void> {
    await this.#records?.flush();
  }

  async close(): Promise<void> {
    this.#gate.close();
    this.#loopDelay.disable();
    try {
      await this.#records?.close();
    } finally {
      // Actors are deleted and connections closed even when the last record write failed.
      await Promise.allSettled([...this.#tasks.values()].map((t) => t.close()));
      await this.#llm.close();
    }
  }

  #taskRuntime(name: string, settings: WorkerTaskSettings): TaskRuntime {
    const runtime = this.#envRuntime(name, settings);
    const tools = settings.agent.tools;
    if (tools === undefined || tools.mcp.length === 0) return runtime;
    // `worker`: one set of sessions for every episode of the task, closed with the worker; `episode`: a set each.
    const shared = tools.mcpSessions === 'worker' ? new McpServers(tools.mcp) : null;
    const mcp: NonNullable<EpisodeContext['mcp']> =
      shared !== null
        ? { acquire: () => shared, release: async () => {} }
        : { acquire: () => new McpServers(tools.mcp), release: (servers) => servers.close() };
    const close = runtime.close;
    return {
      ...runtime,
      mcp,
      close: async () => {
        await Promise.allSettled([close(), shared?.close()]);
      },
    };
  }

  #envRuntime(name: string, settings: WorkerTaskSettings): TaskRuntime {
    const { env } = settings;
    const hooks =
      settings.hooks === null
        ? Promise.resolve(null)
        : (loadExport(
            settings.hooks.moduleUrl,
            settings.hooks.exportName,
            'hooks.export',
            'object',
          ) as Promise<EpisodeHooks>);
    hooks.catch(() => undefined); // reported by each episode that awaits it
    const blackbox =
      settings.blackbox === null
        ? null
        : (loadExport(
            settings.blackbox.moduleUrl,
            settings.blackbox.exportName,
            'agent.export',
            'function',
          ) as Promise<BlackBoxAgent>);
    blackbox?.catch(() => undefined);
    if (env === null) return { settings, actors: null, guard: null, hooks, blackbox, close: async () => {} };
    // Without a configured size, the pool never makes an episode wait: the worker's own concurrency bounds it.
    const size = env.poolSize ?? Number.MAX_SAFE_INTEGER;
    const guard = new EnvGuard({
      taskName: name,
      timeoutMs: env.timeoutMs,
      gate: this.#gate,
      watch: this.#watch,
      dispatchOf: this.#dispatchOf,
    });
    const bound = (call: string) => ({
      timeoutMs: env.timeoutMs,
      timedOut: () =>
        timeoutError('ERR_ENV_TIMEOUT', name, `environment ${call}`, env.timeoutMs, 'the actor is discarded'),
    });
    const bounds = { timeoutMs: env.timeoutMs, timedOut: bound('close()').timedOut };
    if (env.kind === 'http' && env.http.protocol === 'verifiers') {
      // The server runs each episode, calling the model through the gateway: a black-box agent's episode.
      const servers = createVerifiersEnvironments(env.http);
      const run = {
        model: this.#init.llm.default.model,
        sampling: verifiersSampling(settings.agent),
        timeoutMs: env.timeoutMs,
      };
      const agent: BlackBoxAgent = (input) => servers.run(input, run);
      servers.prewarm().catch((err) => this.#log.warn({ err: describeError(err) }, 'environment prewarm failed'));
      return {
        settings,
        actors: null,
        guard: null,
        hooks,
        blackbox: Promise.resolve(agent),
        close: () => servers.close(),
      };
    }
    if (env.kind === 'http') {
      const servers = createRemoteEnvironments(env.http);
      const actors = createActorPool({
        size,
        create: () => servers.create(),
        prewarm: () => servers.prewarm(),
        ...bounds,
      });
      // Open connections before the first episode needs them; a failure here shows again on first use.
      actors.prewarm().catch((err) => this.#log.warn({ err: describeError(err) }, 'environment prewarm failed'));
      return {
        settings,
        actors,
        guard,
        hooks,
        blackbox,
        close: async () => {
          await actors.close();
          await servers.close();
        },
      };
    }
    const factory = loadEnvironmentFactory(env.moduleUrl, env.exportName);
    factory.catch(() => undefined); // reported by each episode that awaits it
    const create = async () => {
      // The import is not bounded (a module's first load may take seconds): the factory call is.
      const made = (await factory)(env.params) as Environment | Promise<Environment>;
      try {
        return await settleWithin(made, bound('factory call'));
      } catch (err) {
        // A late actor is nobody's: closed as soon as it exists (its close errors go nowhere).
        Promise.resolve(made)
          .then((late) => late.close?.())
          .catch(() => undefined);
        throw err;
      }
    };
    const actors = createActorPool({ size, create, ...bounds });
    return { settings, actors, guard, hooks, blackbox, close: () => actors.close() };
  }

  /** What every episode of a task is given: made on the task's first group and kept (TaskRuntime.episodes). */
  #episodeContext(task: TaskRuntime, actors: ActorPool, hooks: EpisodeHooks | null): EpisodeContext {
    const { guard, mcp } = task;
    const settings = task.settings.agent;
    const recorder = this.#records;
    return {
      actors,
      ...(mcp !== undefined ? { mcp } : {}),
      ...(guard !== null ? { guard } : {}),
      llm: this.#llm,
      settings,
      gate: this.#gate,
      workerId: threadId,
      hooks,
      startDelayMs: () => this.#startDelay(),
      onStep: () => this.#steps++,
      onTurn:
        recorder === null
          ? undefined
          : (rollout, turns, info) => {
              turns.forEach((turn, i) => {
                recorder.record({
                  type: 'step',
                  sessionId: sessionIdOf(rollout.id, rollout.attempt),
                  rolloutId: rollout.id,
                  groupId: rollout.groupId,
                  taskName: rollout.taskName,
                  attempt: rollout.attempt,
                  step: turn.step,
                  agentId: turn.agentId,
                  messages: turn.messages,
                  response: turn.response,
                  stepReward: turn.reward,
                  cumulativeReward: rollout.reward,
                  envState: { weightVersion: turn.modelStep, info },
                  terminated: turn.terminated,
                  truncated: turn.truncated,
                  trainable: turn.trainable,
                  finishReason: turn.finishReason,
                  // A single agent's step of several calls called tools: each call is a round of it.
                  ...(turn.agentId === null && turns.length > 1 ? { round: i } : {}),
                  ...(turn.toolCalls !== undefined ? { toolCalls: turn.toolCalls } : {}),
                  time: Date.now(),
                });
              });
            },
      onEpisodeEnd:
        recorder === null
          ? undefined
          : (rollout) => {
              if (rollout.status === Status.ABORTED) return; // it continues later: the session is not over
              recorder.recordEnd({
                type: 'end',
                sessionId: sessionIdOf(rollout.id, rollout.attempt),
                rolloutId: rollout.id,
                groupId: rollout.groupId,
                taskName: rollout.taskName,
                attempt: rollout.attempt,
                status: rollout.status,
                totalReward: rollout.reward,
                steps: rollout.turns.at(-1)?.step ?? 0,
                time: Date.now(),
              });
            },
      onProblem: (rollout, reason) => this.#log.warn({ rollout: rollout.id, status: rollout.status }, reason),
      onHistoryRewrite: (rollout, turn, rewrite) => {
        if (this.#historyRewriteTasks.has(rollout.taskName)) return;
        this.#historyRewriteTasks.add(rollout.taskName);
        const handling =
          rewrite.mode === 'kept'
            ? 'llm.historyMode "keep-sampled": the prompt goes on from the sampled ids, the episode stays one sequence'
            : rewrite.fallback !== undefined
              ? `split all the same: ${rewrite.fallback}; the prompt is the re-rendered history, a new training segment`
              : 'llm.historyMode "split": the prompt is the re-rendered history, a new training segment';
        this.#log.warn(
          {
            task: rollout.taskName,
            rollout: rollout.id,
            step: turn.step,
            agent: turn.agentId,
            token: rewrite.token,
            char: rewrite.char,
            sampled: rewrite.sampledText,
            rendered: rewrite.renderedText,
          },
          `task ${JSON.stringify(rollout.taskName)}: the chat template does not render rollout ${rollout.id}'s history as it was sampled: at turn ${turn.step} the re-rendered prompt leaves the previous prompt + sampled ids at token ${rewrite.token} (character ${rewrite.char}): sampled ${JSON.stringify(rewrite.sampledText)}, re-rendered ${JSON.stringify(rewrite.renderedText)}. ${handling} (docs/TEMPLATES.md); counted in batch stats historyRewrites / historySplits, said once per task`,
        );
      },
      onVersionMismatch: (version, expected, tagged) => {
        if (this.#versionMismatches++ > 0) return;
        const which =
          tagged === expected
            ? 'none the trainer announced, or newer'
            : `the weights of model step ${tagged}: the server has not loaded what the trainer announced since`;
        this.#log.warn(
          { weightVersion: version, modelStep: expected, taggedStep: tagged },
          `an inference server answered with weight version ${JSON.stringify(version)}, which is not the weights of model step ${expected} the call was sent at (${which}): tokens tagged with step ${tagged}; counted in weightVersionMismatches, said once`,
        );
      },
    };
  }

  /** Runs one episode holding one of the worker's episode slots; the wait counts as queue time. */
  #inSlot(rollout: RolloutState, run: (waitedMs: number) => Promise<void>): Promise<void> {
    if (rollout.status === Status.COMPLETED) return Promise.resolve(); // a sibling kept from an earlier run needs no slot
    // Without a bound there is nothing to hold: no extra suspended frame per episode in flight.
    if (this.#episodeSlots.size !== Infinity) return this.#heldSlot(rollout, run);
    this.#episodesRunning++;
    const episode = run(0);
    episode.then(this.#episodeEnded, this.#episodeEnded);
    return episode;
  }

  async #heldSlot(rollout: RolloutState, run: (waitedMs: number) => Promise<void>): Promise<void> {
    const t = performance.now();
    try {
      await this.#episodeSlots.acquire(this.#gate.signal);
    } catch {
      handBack(rollout, threadId); // cancelled for a weight update before it started: it runs after the resume
      return;
    }
    this.#episodesRunning++;
    try {
      await run(performance.now() - t);
    } finally {
      this.#episodesRunning--;
      this.#episodeSlots.release();
    }
  }

  /** Start-up jitter: the first wave of episodes spreads its first inference calls over the window. */
  #startDelay(): number {
    const jitter = this.#init.llm.startupJitterMs;
    if (jitter <= 0 || this.#episodesStarted >= this.#init.firstWave) return 0;
    this.#episodesStarted++;
    return Math.random() * jitter;
  }
}

/** An error as the start-up check says it: one that is not a plain Error keeps its class (`SyntaxError: …`). */
function startupReason(err: unknown): string {
  if (!(err instanceof Error) || err.name === 'Error' || typeof (err as { code?: unknown }).code === 'string')
    return describeError(err);
  return `${err.name}: ${err.message}`;
}
