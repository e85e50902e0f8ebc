/**
 * Which model step an inference reply's weight version stands for, and whether it is the weights the
 * engine said were served: one reading for the workers (worker/pause-gate.ts, worker/inference-call.ts)
 * and the gateway's agent calls (gateway/chat.ts), so both tag and count alike.
 */

/** Announced weight versions remembered: replies from before a few syncs back are not expected. */
const ANNOUNCED_KEPT = 16;

/** Weight versions the trainer announced at each resume → the model step they name, oldest first. */
export class AnnouncedVersions {
  readonly #steps = new Map<string, number>();

  /** `version` names the weights of `step` from now on (a version announced again moves to the newest). */
  announce(version: string, step: number): void {
    this.#steps.delete(version);
    this.#steps.set(version, step);
    if (this.#steps.size > ANNOUNCED_KEPT) this.#steps.delete(this.#steps.keys().next().value!);
  }

  /**
   * The model step a reply's weight version stands for, `modelStep` being the step resumed with last:
   * - no version in the reply: `modelStep`;
   * - a version the trainer announced (`resume({ modelStep, weightVersion })`): that announcement's step;
   * - the trainer never announced one: a version that is a whole number is the step itself (the
   *   mock, SGLang `--weight-version N`) unless it is newer than `newest` (−1, below); any other name
   *   ("default") says nothing: `modelStep`;
   * - versions were announced and this is none of them: −1 — the server is not serving the weights
   *   the trainer said it loaded (the caller reports it and tags `modelStep`).
   *
   * `newest` is the newest step a version may name: `modelStep` where it is the trainer's (a
   * long-lived server after a trainer restart would make staleness negative), unbounded where the
   * model step is only a label for replies without a version (a gateway of its own).
   */
  stepOf(version: string | null, modelStep: number, newest = modelStep): number {
    if (version === null) return modelStep;
    const announced = this.#steps.get(version);
    if (announced !== undefined) return announced;
    if (this.#steps.size > 0) return -1;
    if (/^\d{1,10}$/.test(version)) {
      const n = Number(version);
      if (n <= 0x7fffffff) return n > newest ? -1 : n;
    }
    return modelStep;
  }
}

/**
 * The step to tag a reply's tokens with, `known` being what its version stands for
 * (AnnouncedVersions.stepOf), `sentAt` the step served when the call went out and `modelStep` the
 * current one. Weights older than `sentAt` (the server has not loaded what the trainer announced
 * since) are tagged as what they are; a version nobody named is tagged `modelStep`. Either is a
 * mismatch, given to `onMismatch` with the step expected and the step tagged: the one place the
 * weight-version mismatch counter (`rollout_engine_weight_version_mismatches`) is fed from replies.
 */
export function replyStep(
  known: number,
  sentAt: number,
  modelStep: number,
  onMismatch: (expected: number, tagged: number) => void,
): number {
  if (known >= sentAt) return known;
  if (known >= 0) {
    onMismatch(sentAt, known);
    return known;
  }
  onMismatch(modelStep, modelStep);
  return modelStep;
}
