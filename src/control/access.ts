/**
 * Who may drive the control API from where: the Host allow-list and the Origin check (against web
 * pages: DNS rebinding and cross-site requests), the loopback test `rollout serve` generates a token
 * by, and the confinement of checkpoint paths to the run dir.
 *
 * Why Host: a page on attacker.example can rebind its name to 127.0.0.1 and then reach a loopback
 * server as same-origin; the one thing it cannot change is the Host header its requests carry, which
 * names the attacker's host. Ports are not compared: a rebinding attack is told apart by the name,
 * and forwarding (`ssh -L 9000:127.0.0.1:8100`, `docker -p`) changes the port a client sends.
 *
 * Why Origin: a page on another origin of an allowed host (http://localhost:3000, any local dev
 * server) sends the right Host; its browser names the page in Origin, which must then be the
 * request's own origin (scheme aside) or an `allowHosts` name.
 */
import { realpathSync } from 'node:fs';
import { BlockList, isIP } from 'node:net';
import { hostname, networkInterfaces } from 'node:os';
import { basename, dirname, isAbsolute, join, relative, resolve, sep } from 'node:path';
import { preview, RolloutEngineError } from '../protocol/errors.ts';
import { HttpError } from './http.ts';

const LOOPBACK_NAMES = ['localhost', '127.0.0.1', '[::1]'];
const WILDCARDS = new Set(['0.0.0.0', '::', '[::]', '']);

const LOOPBACK = new BlockList();
LOOPBACK.addSubnet('127.0.0.0', 8, 'ipv4');
LOOPBACK.addAddress('::1', 'ipv6');

/** An address only this machine can reach: `localhost`, 127.0.0.0/8, ::1 (IPv4-mapped ones too). */
export function isLoopback(host: string): boolean {
  const h = host.toLowerCase().replace(/^\[(.*)\]$/, '$1');
  if (h === 'localhost') return true;
  const family = isIP(h);
  return family !== 0 && LOOPBACK.check(h, family === 4 ? 'ipv4' : 'ipv6');
}

/** A host name as Host headers carry it: lower case, IPv6 addresses in brackets, no port. */
function hostName(host: string): string {
  const h = host.trim().toLowerCase();
  return isIP(h) === 6 ? `[${h}]` : h;
}

/** The name part of a Host header (`name`, `name:port`, `[v6]`, `[v6]:port`); null if malformed. */
function nameOfAuthority(authority: string): string | null {
  const m = /^(\[[0-9a-f:.]+\]|[^\s:[\]/@]+)(?::\d{1,5})?$/i.exec(authority.trim());
  return m === null ? null : m[1].toLowerCase();
}

/** A name for `allowHosts` (`--allow-host`), checked once: a DNS name or an IP address, no port. */
export function checkAllowedHost(value: string): string {
  const name = hostName(value);
  if (
    isIP(name.replace(/^\[(.*)\]$/, '$1')) === 0 &&
    !/^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*\.?$/.test(name)
  ) {
    throw new RolloutEngineError(
      'ERR_INVALID_ARGUMENT',
      `allowHosts: ${preview(value)} is not a host name or an IP address (give it without a scheme or port)`,
    );
  }
  return name;
}

export class HostAllowList {
  /** Names a Host header may carry: loopback, the bound host, the machine's own when bound to all, `extra`. */
  readonly #names: ReadonlySet<string>;
  /** The names the user added: an Origin naming one is accepted whatever the Host (a proxy in front). */
  readonly #extra: ReadonlySet<string>;

  constructor(boundHost: string, extra: readonly string[]) {
    const names = new Set(LOOPBACK_NAMES);
    if (WILDCARDS.has(boundHost)) {
      // Bound to every interface: the machine's own addresses and name are how clients reach it, and
      // none of them can be a rebinding attacker's name.
      for (const list of Object.values(networkInterfaces()))
        for (const a of list ?? []) if (!a.address.includes('%')) names.add(hostName(a.address));
      names.add(hostName(hostname()));
    } else names.add(hostName(boundHost));
    this.#extra = new Set(extra.map(checkAllowedHost));
    for (const name of this.#extra) names.add(name);
    this.#names = names;
  }

  /** Throws 403 unless the request's Host is allowed and its Origin, if any, is its own or an allowed name's. */
  check(host: string | undefined, origin: string | undefined): void {
    const name = host === undefined ? null : nameOfAuthority(host);
    if (name === null || !this.#names.has(name)) {
      // The allowed names stay out of the message: a rebound page reads this answer, and the list can
      // hold the machine's own addresses and name.
      throw new HttpError(
        403,
        'ERR_FORBIDDEN_HOST',
        `Host ${preview(host ?? null)} is not a name this server answers to; add it with --allow-host (allowHosts)`,
      );
    }
    if (origin === undefined) return;
    let url: URL | null = null;
    try {
      url = new URL(origin);
    } catch {
      // "null" (a sandboxed or file: page) and anything unparsable: refused below
    }
    const fromOrigin =
      url !== null && (url.protocol === 'http:' || url.protocol === 'https:') ? nameOfAuthority(url.host) : null;
    const sameOrigin = url !== null && url.host.toLowerCase() === host!.trim().toLowerCase();
    if (fromOrigin === null || !(sameOrigin || this.#extra.has(fromOrigin))) {
      throw new HttpError(
        403,
        'ERR_FORBIDDEN_ORIGIN',
        `Origin ${preview(origin)} may not drive this server: requests from web pages are accepted only from the server's own origin or an --allow-host (allowHosts) name`,
      );
    }
  }
}

/**
 * Where `POST /checkpoint {"path"}` may write: a `.ckpt` file inside `dir` (the run dir), the path
 * relative to it. Anything else would let a client overwrite any file the process can write (or the
 * run's own records: batches, step records, the lock). Symbolic links inside the dir are followed
 * before the check, so a link out of it does not lead the write out.
 */
export function checkpointPathIn(dir: string | null, path: unknown): string {
  if (typeof path !== 'string' || path === '')
    throw new HttpError(400, 'ERR_BAD_BODY', `path must be a non-empty string (got ${preview(path)})`);
  if (dir === null)
    throw new HttpError(
      400,
      'ERR_BAD_BODY',
      `path ${preview(path)} cannot be written: this server has no run dir to keep checkpoints in (rollout serve --run-dir; listen({ checkpointDir }))`,
    );
  if (isAbsolute(path))
    throw new HttpError(400, 'ERR_BAD_BODY', `path must be relative to the run dir (got ${preview(path)})`);
  if (path.includes('\0')) throw new HttpError(400, 'ERR_BAD_BODY', `path must not contain NUL (got ${preview(path)})`);
  if (!path.endsWith('.ckpt'))
    throw new HttpError(
      400,
      'ERR_BAD_BODY',
      `path must name a .ckpt file (got ${preview(path)}): the run dir's other files are not the API's to overwrite`,
    );
  const root = realOrSelf(resolve(dir));
  const target = resolve(root, path);
  const real = join(realAncestor(dirname(target)), basename(target));
  if (!inside(root, target) || !inside(root, real))
    throw new HttpError(400, 'ERR_BAD_BODY', `path must stay inside the run dir ${root} (got ${preview(path)})`);
  return target;
}

function inside(root: string, path: string): boolean {
  const rel = relative(root, path);
  return rel !== '' && rel !== '..' && !rel.startsWith(`..${sep}`) && !isAbsolute(rel);
}

function realOrSelf(path: string): string {
  try {
    return realpathSync(path);
  } catch {
    return path;
  }
}

/** `path` with its longest existing prefix resolved through symbolic links (the rest is created later). */
function realAncestor(path: string): string {
  for (let existing = path; ; existing = dirname(existing)) {
    try {
      return join(realpathSync(existing), relative(existing, path));
    } catch {
      if (dirname(existing) === existing) return path;
    }
  }
}
