/**
 * Server-sent events framing, as inference servers stream (`data: {...}` lines, a blank line ending
 * each event, `data: [DONE]` at the end): bytes in, one event's data out. What an event means is its
 * reader's business (llm/stream-reply.ts for chat chunks, llm/generate-stream.ts for SGLang's
 * /generate).
 *
 * Lines end with \n, \r\n or \r, and an event's lines may arrive split across chunks. A \r at the very
 * end of a chunk is taken as a line end at once (its event may be complete, and a pause may hold the
 * call before the next chunk comes); a \n starting the next chunk is then its second half.
 */
export class SseFrames {
  readonly #decoder = new TextDecoder();
  /** Text after the last complete line. */
  #pending = '';
  #skipLf = false;
  /** `data:` lines of the event being read. */
  #data: string[] = [];

  /**
   * Feeds one chunk of the body; `onEvent` gets each complete event's data (its `data:` lines joined
   * by \n) and answers whether to read on — false stops at once (a bad event, or the end), and the
   * rest of the chunk is not read.
   */
  write(chunk: Uint8Array, onEvent: (data: string) => boolean): void {
    let text = this.#decoder.decode(chunk, { stream: true });
    if (this.#skipLf && text.startsWith('\n')) text = text.slice(1);
    this.#skipLf = text.endsWith('\r');
    text = this.#pending + text;
    if (text.includes('\r')) text = text.replace(/\r\n?/g, '\n');
    let start = 0;
    for (let end = text.indexOf('\n'); end !== -1; end = text.indexOf('\n', start)) {
      const line = text.slice(start, end);
      start = end + 1;
      if (!this.#line(line, onEvent)) {
        this.#pending = '';
        return;
      }
    }
    this.#pending = text.slice(start);
  }

  /** The body ended: a last line without its line end, a last event without its blank line, still count. */
  end(onEvent: (data: string) => boolean): void {
    const last = this.#pending;
    this.#pending = '';
    if (last !== '' && !this.#line(last, onEvent)) return;
    if (this.#data.length > 0) this.#dispatch(onEvent);
  }

  #line(line: string, onEvent: (data: string) => boolean): boolean {
    if (line === '') return this.#data.length > 0 ? this.#dispatch(onEvent) : true;
    // Comments (`: keep-alive`) and the other fields (event, id, retry) carry nothing for a completion.
    if (line.startsWith('data:')) this.#data.push(line.charCodeAt(5) === 32 ? line.slice(6) : line.slice(5));
    return true;
  }

  #dispatch(onEvent: (data: string) => boolean): boolean {
    const data = this.#data.length === 1 ? this.#data[0] : this.#data.join('\n');
    this.#data = [];
    return onEvent(data);
  }
}
