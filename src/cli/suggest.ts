/** "Did you mean": the nearest known name to a mistyped command or flag, when one is near enough. */

/** Edit distance (insertions, deletions, substitutions, and a swap of two neighbours counted as one). */
export function editDistance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) =>
    Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)),
  );
  for (let i = 1; i <= a.length; i++)
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      d[i][j] = Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1])
        d[i][j] = Math.min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.length][b.length];
}

/**
 * The known name nearest to `word`, or null when none is near enough to be what was meant: at most
 * 1 edit for a short name, 2 from five characters, 3 from nine; a name `word` is a prefix of counts.
 */
export function closest(word: string, known: Iterable<string>): string | null {
  let best: string | null = null;
  let bestDistance = Infinity;
  for (const name of known) {
    const distance = name.startsWith(word) && word.length >= 3 ? 1 : editDistance(word, name);
    if (distance < bestDistance) [best, bestDistance] = [name, distance];
  }
  const allowed = word.length < 5 ? 1 : word.length < 9 ? 2 : 3;
  return bestDistance <= allowed ? best : null;
}

/** The long flags a command's help text lists (`--run-dir <dir>` → `--run-dir`). */
export function flagsOf(help: string): string[] {
  return [...new Set([...help.matchAll(/^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)/gm)].map((m) => m[1]))];
}
