/**
 * The mock's open sockets, so close() never hangs: it cuts idle keep-alive sockets at once, including
 * ones a client opened but never used (server.closeIdleConnections() misses those), and cuts busy
 * ones as soon as their last answer is flushed.
 *
 * Invariant: every open socket is in the map with the number of its requests not yet closed.
 */
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

export class Connections {
  readonly #sockets = new Map<Socket, number>();
  /** True once close() was called. */
  readonly #closing: () => boolean;

  constructor(closing: () => boolean) {
    this.#closing = closing;
  }

  /** Before the server listens: every socket is known from its opening, used or not. */
  watch(server: Server): void {
    server.on('connection', (socket: Socket) => {
      this.#sockets.set(socket, 0);
      socket.once('close', () => this.#sockets.delete(socket));
    });
  }

  /** Counts the request open on its socket until its response closes. */
  track(req: IncomingMessage, res: ServerResponse): void {
    const sockets = this.#sockets;
    const socket = req.socket;
    sockets.set(socket, (sockets.get(socket) ?? 0) + 1);
    res.once('close', () => {
      const open = (sockets.get(socket) ?? 1) - 1;
      if (open > 0) sockets.set(socket, open);
      else if (this.#closing()) socket.destroy();
      else if (sockets.has(socket)) sockets.set(socket, 0);
    });
  }

  /** On close: the idle sockets go now; the busy ones when their last response closes (track()). */
  cutIdle(): void {
    for (const [socket, open] of this.#sockets) if (open === 0) socket.destroy();
  }
}
