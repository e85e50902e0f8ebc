/**
 * The weight version the mock reports. The default dialect's version is an integer; SGLang's (and
 * vLLM's dev-mode one) is a string label. Invariant: a label made of digits is also the integer
 * version, so a trainer that sets either form reads back the same number.
 */
import { validateWeightVersion } from './options.ts';

export class WeightVersion {
  /** The last integer version set (0 if none): `metadata.weight_version` of the default dialect. */
  #number: number;
  /** The version as the string-versioned dialects report it. */
  #label: string;
  /** Called after every set: new weights invalidate what a server computed with the old ones (its prefix cache). */
  readonly #onSet: () => void;

  constructor(initial: number | string, onSet: () => void = () => {}) {
    this.#onSet = onSet;
    this.#number = typeof initial === 'number' ? initial : /^\d+$/.test(initial) ? Number(initial) : 0;
    this.#label = String(initial);
  }

  get number(): number {
    return this.#number;
  }

  get label(): string {
    return this.#label;
  }

  /** From the library or `/admin/weight_version`: a non-negative integer, else the error names the field. */
  set(version: unknown): number {
    this.#number = validateWeightVersion(version);
    this.#label = String(version);
    this.#onSet();
    return this.#number;
  }

  /** From a dialect's own update route, which takes any label. */
  setLabel(label: string): void {
    this.#label = label;
    if (/^\d+$/.test(label)) this.#number = Number(label);
    this.#onSet();
  }
}
