/**
 * A minimal ZMTP 3.x peer over node:net: what a ZeroMQ DEALER (or, for test doubles, ROUTER) socket
 * puts on a TCP connection, with the NULL security mechanism. Spoken by env/verifiers.ts to a
 * verifiers env server (a pyzmq ROUTER). The wire format is ZMTP 3.0 (rfc.zeromq.org/spec/23):
 *
 *   greeting (64 bytes)  0xFF, 8 × 0x00, 0x7F │ major 3, minor 0 │ mechanism "NULL" padded to 20 │
 *                        as-server 0 │ 31 × 0x00
 *   frame                flags (bit 0 MORE, bit 1 LONG, bit 2 COMMAND) │ size: 1 byte, or 8 bytes
 *                        big-endian when LONG │ body
 *   command body         name length (1 byte) │ name │ for READY: properties, each name length
 *                        (1 byte) │ name │ value length (4 bytes big-endian) │ value
 *
 * After the greetings each side sends one READY command naming its Socket-Type; a message is the
 * frames up to the first without MORE. A peer at minor version 1 (libzmq 4.2+: ZMTP 3.1) may also
 * send PING, answered with PONG; other commands are ignored, an ERROR command ends the connection.
 *
 * One connection, never re-made: when it ends (closed, reset, a protocol violation), `closed`
 * settles with why and the owner decides what to do with what was pending. Bounded: the handshake by
 * `timeoutMs`, a frame by `maxFrameBytes` (a larger one is a protocol violation, nothing buffered).
 */
import { connect, type Socket } from 'node:net';

export type ZmtpSocketType = 'DEALER' | 'ROUTER';

/** Which socket types may talk to which (rfc 23, "Socket types"), for the two spoken here. */
const COMPATIBLE: Record<ZmtpSocketType, readonly string[]> = {
  DEALER: ['ROUTER', 'DEALER', 'REP'],
  ROUTER: ['DEALER', 'ROUTER', 'REQ'],
};

const FLAG_MORE = 0x01;
const FLAG_LONG = 0x02;
const FLAG_COMMAND = 0x04;
const GREETING_BYTES = 64;

/** Why a connection ended: `protocol` (the peer broke ZMTP: a parse failure), `closed` (the connection ended), `timeout` (the handshake). */
export class ZmtpError extends Error {
  readonly kind: 'protocol' | 'closed' | 'timeout' | 'too-large';
  constructor(kind: ZmtpError['kind'], message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'ZmtpError';
    this.kind = kind;
  }
}

/** This side's 64-byte greeting: ZMTP 3.0, NULL, not as-server. */
export function greeting(): Buffer {
  const g = Buffer.alloc(GREETING_BYTES);
  g[0] = 0xff;
  g[9] = 0x7f;
  g[10] = 3;
  g[11] = 0;
  g.write('NULL', 12, 'ascii');
  return g;
}

/** One frame: flags, size (short or long), body. */
export function frame(body: Buffer, options: { more?: boolean; command?: boolean } = {}): Buffer {
  const long = body.length > 255;
  const header = Buffer.alloc(long ? 9 : 2);
  header[0] = (options.more ? FLAG_MORE : 0) | (long ? FLAG_LONG : 0) | (options.command ? FLAG_COMMAND : 0);
  if (long) header.writeBigUInt64BE(BigInt(body.length), 1);
  else header[1] = body.length;
  return Buffer.concat([header, body]);
}

/** A command's body: its name, then its data. */
export function command(name: string, data: Buffer = Buffer.alloc(0)): Buffer {
  const n = Buffer.from(name, 'ascii');
  return Buffer.concat([Buffer.from([n.length]), n, data]);
}

/** READY's properties: name length, name, 4-byte value length, value. */
export function readyCommand(socketType: ZmtpSocketType): Buffer {
  const props: Buffer[] = [];
  const add = (name: string, value: Buffer) => {
    const n = Buffer.from(name, 'ascii');
    const len = Buffer.alloc(4);
    len.writeUInt32BE(value.length);
    props.push(Buffer.from([n.length]), n, len, value);
  };
  add('Socket-Type', Buffer.from(socketType, 'ascii'));
  // A DEALER without an identity: the ROUTER makes one up for the connection (libzmq does).
  if (socketType === 'DEALER') add('Identity', Buffer.alloc(0));
  return frame(command('READY', Buffer.concat(props)), { command: true });
}

/** A message as frames on the wire (MORE on every frame but the last). */
export function encodeMessage(parts: Buffer[]): Buffer {
  return Buffer.concat(parts.map((p, i) => frame(p, { more: i < parts.length - 1 })));
}

export interface ZmtpPeerOptions {
  socketType: ZmtpSocketType;
  /** What each whole message is handed to. */
  onMessage: (parts: Buffer[]) => void;
  /** A frame larger than this ends the connection (ZmtpError 'too-large'). */
  maxFrameBytes: number;
  /** For messages: `tcp://host:port`. */
  label: string;
}

/**
 * One side of one ZMTP connection over an open socket. `ready` settles once both READY commands
 * crossed; `closed` settles (never rejects) with why the connection ended.
 */
export class ZmtpPeer {
  readonly ready: Promise<void>;
  readonly closed: Promise<ZmtpError>;
  /** The peer's READY properties (Socket-Type, Identity, …). */
  peerProperties: Record<string, Buffer> = {};
  readonly #socket: Socket;
  readonly #options: ZmtpPeerOptions;
  #buffer: Buffer = Buffer.alloc(0);
  #stage: 'greeting' | 'ready' | 'traffic' | 'ended' = 'greeting';
  #parts: Buffer[] = [];
  #resolveReady!: () => void;
  #rejectReady!: (err: ZmtpError) => void;
  #resolveClosed!: (err: ZmtpError) => void;
  #minor = 0;

  constructor(socket: Socket, options: ZmtpPeerOptions) {
    this.#socket = socket;
    this.#options = options;
    this.ready = new Promise((resolve, reject) => {
      this.#resolveReady = resolve;
      this.#rejectReady = reject;
    });
    this.ready.catch(() => undefined);
    this.closed = new Promise((resolve) => {
      this.#resolveClosed = resolve;
    });
    socket.setNoDelay(true);
    socket.on('data', (chunk: Buffer) => this.#receive(chunk));
    socket.on('error', (err) => this.#end(new ZmtpError('closed', `${options.label}: ${err.message}`, { cause: err })));
    socket.on('close', () => this.#end(new ZmtpError('closed', `${options.label}: the connection was closed`)));
    socket.write(greeting());
  }

  get open(): boolean {
    return this.#stage !== 'ended';
  }

  send(parts: Buffer[]): boolean {
    if (this.#stage !== 'traffic') return false;
    this.#socket.write(encodeMessage(parts));
    return true;
  }

  /** Writes raw bytes (test doubles: a malformed frame). */
  sendRaw(bytes: Buffer): void {
    this.#socket.write(bytes);
  }

  close(reason = 'closed by this side'): void {
    this.#end(new ZmtpError('closed', `${this.#options.label}: ${reason}`));
  }

  #end(err: ZmtpError): void {
    if (this.#stage === 'ended') return;
    this.#stage = 'ended';
    this.#socket.destroy();
    this.#rejectReady(err);
    this.#resolveClosed(err);
  }

  #fail(kind: ZmtpError['kind'], what: string): void {
    this.#end(new ZmtpError(kind, `${this.#options.label}: ${what}`));
  }

  #receive(chunk: Buffer): void {
    this.#buffer = this.#buffer.length === 0 ? chunk : Buffer.concat([this.#buffer, chunk]);
    while (this.#stage !== 'ended') {
      if (this.#stage === 'greeting') {
        // The signature is checked as soon as it is in: a peer that is not ZMTP fails at once.
        if (this.#buffer.length >= 10 && (this.#buffer[0] !== 0xff || this.#buffer[9] !== 0x7f)) {
          this.#fail('protocol', `not a ZMTP peer (greeting starts ${this.#buffer.subarray(0, 10).toString('hex')})`);
          return;
        }
        if (this.#buffer.length < GREETING_BYTES) return;
        const g = this.#buffer.subarray(0, GREETING_BYTES);
        if (g[10] < 3) {
          this.#fail('protocol', `the peer speaks ZMTP ${g[10]}.${g[11]}, not 3.x`);
          return;
        }
        const mechanism = g.subarray(12, 32).toString('ascii').replace(/\0+$/, '');
        if (mechanism !== 'NULL') {
          this.#fail('protocol', `the peer wants security mechanism ${JSON.stringify(mechanism)}, not NULL`);
          return;
        }
        this.#minor = g[11];
        this.#buffer = this.#buffer.subarray(GREETING_BYTES);
        this.#stage = 'ready';
        this.#socket.write(readyCommand(this.#options.socketType));
        continue;
      }
      if (this.#buffer.length < 2) return;
      const flags = this.#buffer[0];
      if ((flags & ~(FLAG_MORE | FLAG_LONG | FLAG_COMMAND)) !== 0) {
        this.#fail('protocol', `malformed frame (flags 0x${flags.toString(16)})`);
        return;
      }
      const long = (flags & FLAG_LONG) !== 0;
      const headerBytes = long ? 9 : 2;
      if (this.#buffer.length < headerBytes) return;
      const size = long ? this.#buffer.readBigUInt64BE(1) : BigInt(this.#buffer[1]);
      if (size > BigInt(this.#options.maxFrameBytes)) {
        this.#fail('too-large', `a frame of ${size} bytes is larger than the limit of ${this.#options.maxFrameBytes}`);
        return;
      }
      const end = headerBytes + Number(size);
      if (this.#buffer.length < end) return;
      const body = this.#buffer.subarray(headerBytes, end);
      this.#buffer = this.#buffer.subarray(end);
      if ((flags & FLAG_COMMAND) !== 0) this.#command(Buffer.from(body));
      else if (this.#stage !== 'traffic') {
        this.#fail('protocol', 'a message frame before READY');
        return;
      } else {
        this.#parts.push(Buffer.from(body));
        if ((flags & FLAG_MORE) === 0) {
          const parts = this.#parts;
          this.#parts = [];
          this.#options.onMessage(parts);
        }
      }
    }
  }

  #command(body: Buffer): void {
    if (body.length < 1 || body.length < 1 + body[0]) {
      this.#fail('protocol', 'malformed command');
      return;
    }
    const name = body.subarray(1, 1 + body[0]).toString('ascii');
    const data = body.subarray(1 + body[0]);
    if (name === 'READY') {
      if (this.#stage !== 'ready') {
        this.#fail('protocol', 'a second READY');
        return;
      }
      const props = parseProperties(data);
      if (props === null) {
        this.#fail('protocol', 'malformed READY properties');
        return;
      }
      this.peerProperties = props;
      const type = props['Socket-Type']?.toString('ascii') ?? '';
      if (!COMPATIBLE[this.#options.socketType].includes(type)) {
        this.#fail('protocol', `a ${this.#options.socketType} cannot talk to a ${JSON.stringify(type)} socket`);
        return;
      }
      this.#stage = 'traffic';
      this.#resolveReady();
      return;
    }
    if (name === 'ERROR') {
      const reason = data.length > 0 ? data.subarray(1, 1 + data[0]).toString('utf8') : '';
      this.#fail('closed', `the peer ended the connection: ${reason}`);
      return;
    }
    if (name === 'PING' && this.#minor >= 1 && data.length >= 2) {
      // PING: TTL (2 bytes) and up to 16 bytes of context, echoed in PONG (rfc 37, ZMTP 3.1).
      this.#socket.write(frame(command('PONG', data.subarray(2, 18)), { command: true }));
    }
  }
}

function parseProperties(data: Buffer): Record<string, Buffer> | null {
  const props: Record<string, Buffer> = {};
  let at = 0;
  while (at < data.length) {
    const nameLength = data[at];
    if (at + 1 + nameLength + 4 > data.length) return null;
    const name = data.subarray(at + 1, at + 1 + nameLength).toString('ascii');
    at += 1 + nameLength;
    const valueLength = data.readUInt32BE(at);
    at += 4;
    if (at + valueLength > data.length) return null;
    props[name] = Buffer.from(data.subarray(at, at + valueLength));
    at += valueLength;
  }
  return props;
}

/** `tcp://host:port` → host and port, or null. */
export function parseTcpUrl(url: string): { host: string; port: number } | null {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return null;
  }
  const port = Number(parsed.port);
  if (parsed.protocol !== 'tcp:' || parsed.hostname === '' || !Number.isInteger(port) || port <= 0) return null;
  if ((parsed.pathname !== '' && parsed.pathname !== '/') || parsed.search || parsed.hash) return null;
  return { host: parsed.hostname.replace(/^\[(.*)\]$/, '$1'), port };
}

/**
 * Opens a DEALER connection to `tcp://host:port` and completes the handshake within `timeoutMs`
 * (ZmtpError 'timeout' or 'closed' otherwise: nothing is retried here).
 */
export async function connectDealer(
  url: string,
  options: { timeoutMs: number; maxFrameBytes: number; onMessage: (parts: Buffer[]) => void },
): Promise<ZmtpPeer> {
  const target = parseTcpUrl(url);
  if (target === null) throw new ZmtpError('protocol', `${url}: not a tcp://host:port address`);
  const socket = connect({ host: target.host, port: target.port });
  const peer = new ZmtpPeer(socket, {
    socketType: 'DEALER',
    onMessage: options.onMessage,
    maxFrameBytes: options.maxFrameBytes,
    label: url,
  });
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      const err = new ZmtpError('timeout', `${url}: no ZMTP handshake within ${options.timeoutMs} ms`);
      peer.close(err.message);
      reject(err);
    }, options.timeoutMs);
  });
  try {
    await Promise.race([peer.ready, timeout]);
  } finally {
    clearTimeout(timer);
  }
  return peer;
}
