/**
 * Reads README.md's section "With vLLM / SGLang / llama.cpp" the way a newcomer copies it: the shell
 * lines of its code blocks (continuations joined, comments dropped) and the code spans of its prose,
 * per server. Shared by test/readme-launch.test.ts (every name cited in
 * test/fixtures/server-launch-facts.json) and test/real-server/readme-launch.test.ts (llama.cpp
 * launched with exactly those flags).
 */
import { readFileSync } from 'node:fs';

export const README_PATH = new URL('../../README.md', import.meta.url);
export const SECTION_HEADING = '## With vLLM / SGLang / llama.cpp';

export type ServerKey = 'vllm' | 'sglang' | 'llamacpp';

/** The bold label that opens each server's part of the section. */
export const SERVER_LABELS: Record<ServerKey, string> = { vllm: 'vLLM', sglang: 'SGLang', llamacpp: 'llama.cpp' };

export interface SectionParts {
  /** Text that speaks of every server: before the first server's label, and the closing paragraph. */
  common: string;
  servers: Record<ServerKey, string>;
}

export function readmeServersSection(readme = readFileSync(README_PATH, 'utf8')): string {
  const start = readme.indexOf(`\n${SECTION_HEADING}\n`);
  if (start < 0) throw new Error(`README.md has no "${SECTION_HEADING}" section`);
  const end = readme.indexOf('\n## ', start + 1 + SECTION_HEADING.length);
  return readme.slice(start + 1, end < 0 ? undefined : end);
}

/** Splits the section at `**vLLM**`, `**SGLang**`, `**llama.cpp**`; "Any other …" closes the last part. */
export function sectionParts(section: string): SectionParts {
  const keys = Object.keys(SERVER_LABELS) as ServerKey[];
  const at = keys.map((key) => {
    const i = section.indexOf(`\n**${SERVER_LABELS[key]}**`);
    if (i < 0) throw new Error(`the section has no **${SERVER_LABELS[key]}** part`);
    return i;
  });
  for (let k = 1; k < at.length; k++)
    if (at[k] < at[k - 1]) throw new Error('the servers are not in the order vLLM, SGLang, llama.cpp');
  const tailAt = section.indexOf('\nAny other OpenAI-compatible server', at[at.length - 1]);
  const end = tailAt < 0 ? section.length : tailAt;
  const servers = {} as Record<ServerKey, string>;
  keys.forEach((key, k) => {
    servers[key] = section.slice(at[k], k + 1 < at.length ? at[k + 1] : end);
  });
  return { common: section.slice(0, at[0]) + section.slice(end), servers };
}

/** The shell lines of the text's fenced code blocks: `\` continuations joined, `# …` comments dropped. */
export function codeLines(text: string): string[] {
  const lines: string[] = [];
  for (const block of text.matchAll(/^```[a-z]*\n([\s\S]*?)^```$/gm)) {
    const joined = block[1].replace(/\\\n/g, ' ');
    for (const raw of joined.split('\n')) {
      const line = raw.replace(/(^|\s)#.*$/, '').trim();
      if (line !== '') lines.push(line);
    }
  }
  return lines;
}

/** The text outside fenced code blocks. */
export function prose(text: string): string {
  return text.replace(/^```[\s\S]*?^```$/gm, '');
}

/** The prose's inline code spans, in order. */
export function codeSpans(text: string): string[] {
  return [
    ...prose(text)
      .replace(/\n/g, ' ')
      .matchAll(/`([^`]+)`/g),
  ].map((m) => m[1].trim());
}

/** Whitespace-separated words (the section's commands quote nothing). */
export function words(line: string): string[] {
  return line.split(/\s+/).filter((w) => w !== '');
}

/** The section's `npx rollout run …` line for a server, as arguments after `run`. */
export function engineRunArgs(part: string): string[] {
  const line = codeLines(part).find((l) => l.startsWith('npx rollout run '));
  if (line === undefined) throw new Error('no `npx rollout run` line');
  return words(line).slice(3);
}

/** The section's server launch line for a server (the code line that is not the engine's). */
export function serverLaunchWords(part: string): string[] {
  const lines = codeLines(part).filter((l) => !l.startsWith('npx rollout '));
  if (lines.length !== 1) throw new Error(`expected one server launch line, found ${lines.length}`);
  return words(lines[0]);
}
