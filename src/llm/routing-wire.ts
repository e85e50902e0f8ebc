/**
 * Routed experts and sampling masks as each server sends them (docs/ROUTING-REPLAY.md), read into
 * domain/routing.ts's compact form, and written the same way for the mock.
 *
 * - vLLM (`--enable-return-routed-experts`; no per-request switch), two forms by version:
 *   - since the aux-output connector (after 0.21): `choices[i].routed_experts`, a base64 `.npy` of
 *     shape `(num_tokens − 1 − routed_experts_prompt_start, num_layers, num_experts_per_tok)`, dtype
 *     uint8 / uint16 / int32, on chat and completion choices alike; the request may skip the first N
 *     prompt tokens with `routed_experts_prompt_start`; null when the server has it off or the
 *     request was aborted before any forward pass
 *     (vllm/entrypoints/openai/chat_completion/protocol.py ChatCompletionResponseChoice,
 *     vllm/entrypoints/openai/completion/protocol.py CompletionRequest.routed_experts_prompt_start
 *     @002032ee2b18e1f7bd924ec47b62504ba3866063; numpy2base64 in chat_completion/serving.py
 *     @006c49d485f9ca479bf4989cbb694d0ac02f44b5). Streamed chat chunks carry none.
 *   - 0.21: int16 ids as JSON lists `[rows][layers][top_k]`, split in two: the response's
 *     `prompt_routed_experts` (prompt positions `[0, prompt_len)`, shared by the choices) and each
 *     choice's `routed_experts` (the generated positions from `prompt_len` on, at most one per
 *     generated token: the last token is never forwarded unless speculative decoding ran it);
 *     `routed_experts_prompt_start` does not exist there (ignored). Positions served from the prefix
 *     cache whose routing was lost are rows of -1
 *     (chat_completion/protocol.py @0087e005dec9ed37e5564c4d13b38d350ce61992,
 *     docs/training/routed_experts_replay.md there; split_routed_experts in
 *     vllm/model_executor/layers/fused_moe/routed_experts_capturer.py).
 * - SGLang (`--enable-return-routed-experts`, and per request `return_routed_experts: true` on
 *   /generate): `meta_info.routed_experts`, base64 of the raw little-endian array, no shape —
 *   `[tokens, num_hidden_layers, num_experts_per_tok]` is the model's (the capturer's buffers,
 *   python/sglang/srt/layers/moe/routed_experts_capturer.py @d4d0fc58371761f9f0da007a4ef4f0ad2bd19658;
 *   decoded as `np.frombuffer(b64decode(s), np.int32).reshape(-1, layers, topk)` by miles,
 *   miles/rollout/generate_hub/sglang_generate_wrapper.py @59bff93e562c600fa3b59220570b56e73b2057ff).
 *   int32 unless `meta_info.routed_experts_dtype` says `uint16` or `uint8` (the server's
 *   SGLANG_ROUTED_EXPERTS_DTYPE; int32 again when an id does not fit): python/sglang/srt/
 *   state_capturer/routed_experts_wire.py and managers/tokenizer_manager.py
 *   @a6463a1003429d415506fe0d97b4c548b85444e1. `routed_experts_start_len` asks for rows from that
 *   absolute position: `[start, seqlen − 1)`; a server older than it sends them all from 0.
 * - SGLang sampling masks (`return_sampling_mask: true` on /generate, not streamed, refused without
 *   truncation): `meta_info.output_token_sampling_mask`, one list of token ids per output token (its
 *   support, holding the sampled token), `output_token_sampling_logprobs` (one logprob per token,
 *   renormalised over its support) and `output_token_sampling_mask_length`
 *   (test/registered/sampling/test_sampling_mask.py @cbc9dac0598670d685bc387da08e47cbe4a27cc6).
 *   vLLM's engine has a `return_sampling_mask` option (Model Runner V2) whose HTTP form the engine
 *   does not read: a vLLM server gives no masks here.
 */
import {
  maskFromSupports,
  narrowExpertIds,
  type RoutedExperts,
  type SamplingMask,
  type SequenceRouting,
} from '../domain/routing.ts';
import { preview } from '../errors.ts';

/** The model's routing shape where the server does not send it (SGLang): `num_hidden_layers`, `num_experts_per_tok`. */
export interface RoutingShape {
  layers: number;
  topK: number;
}

const NPY_MAGIC = '\x93NUMPY';

/** NumPy dtypes an `.npy` of expert ids may have, and how to read one value. */
const NPY_READ: Record<string, { bytes: number; read: (v: DataView, at: number) => number }> = {
  '|u1': { bytes: 1, read: (v, at) => v.getUint8(at) },
  '<u2': { bytes: 2, read: (v, at) => v.getUint16(at, true) },
  '<i2': { bytes: 2, read: (v, at) => v.getInt16(at, true) },
  '<i4': { bytes: 4, read: (v, at) => v.getInt32(at, true) },
  '<u4': { bytes: 4, read: (v, at) => v.getUint32(at, true) },
  '<i8': { bytes: 8, read: (v, at) => Number(v.getBigInt64(at, true)) },
};

/** The id vLLM 0.21 writes for a position whose routing it does not hold (a prefix-cache hit it lost). */
const UNKNOWN_ID = -1;

/**
 * `values` (`layers × topK` a row, the first row for sequence position `at`) kept from position
 * `from` on: rows before it are let go, as are leading rows of -1 (positions the server holds no
 * routing for; the turn's rows then begin after them). Any other negative id, or one ≥ 65536, is
 * the server's error, named with `field`.
 */
function keptRows(
  values: number[] | Float64Array,
  layers: number,
  topK: number,
  at: number,
  from: number,
  field: string | ((row: number, value: number) => string),
): RoutedExperts {
  const width = layers * topK;
  const rows = width === 0 ? 0 : values.length / width;
  let first = Math.max(0, from - at);
  for (; first < rows; first++) {
    let unknown = true;
    for (let j = 0; j < width && unknown; j++) unknown = values[first * width + j] === UNKNOWN_ID;
    if (!unknown) break;
  }
  // A view where the ids were decoded into a Float64Array (a reply's bytes): no copy of a whole
  // sequence's rows before they are narrowed; a JSON list is sliced.
  const from0 = Math.min(rows, first) * width;
  const kept = values instanceof Float64Array ? values.subarray(from0) : values.slice(from0);
  for (let i = 0; i < kept.length; i++) {
    const v = kept[i];
    if (!Number.isInteger(v) || v < 0 || v > 0xffff) {
      const row = first + Math.floor(i / width);
      const where = typeof field === 'string' ? `${field} holds ${preview(v)} at row ${row}` : field(row, v);
      throw new Error(`${where} (sequence position ${at + row}): not an expert id`);
    }
  }
  const ids = narrowExpertIds(kept) as Uint8Array | Uint16Array;
  return { start: at + Math.min(rows, first), rows: Math.max(0, rows - first), layers, topK, ids };
}

/**
 * Where a reply's rows begin when the request asked for them from `asked`: there — unless they are
 * every forwarded position of the `sequenceLength`-token sequence, from 0, as a server sends that
 * does not know the field (SGLang before `routed_experts_start_len`).
 */
function firstRowAt(rows: number, asked: number, sequenceLength: number | null): number {
  return asked > 0 && sequenceLength !== null && rows === sequenceLength - 1 ? 0 : asked;
}

/**
 * vLLM's `routed_experts` (base64 `.npy`), its rows starting at sequence position `start` (the
 * request's `routed_experts_prompt_start`), or at 0 when they are all `sequenceLength − 1` of them.
 * Throws a message naming what is wrong.
 */
export function readVllmRouted(b64: unknown, start: number, sequenceLength: number | null = null): RoutedExperts {
  if (typeof b64 !== 'string') throw new Error(`routed_experts must be a base64 string (got ${preview(b64)})`);
  const bytes = Buffer.from(b64, 'base64');
  if (bytes.length < 10 || bytes.toString('latin1', 0, 6) !== NPY_MAGIC)
    throw new Error(`routed_experts is not a base64 .npy (no \\x93NUMPY magic): ${preview(b64)}`);
  const major = bytes[6];
  const headerLength = major === 1 ? bytes.readUInt16LE(8) : bytes.readUInt32LE(8);
  const headerStart = major === 1 ? 10 : 12;
  const header = bytes.toString('latin1', headerStart, headerStart + headerLength);
  const descr = /'descr':\s*'([^']+)'/.exec(header)?.[1];
  const fortran = /'fortran_order':\s*(True|False)/.exec(header)?.[1];
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)?.[1];
  const kind = descr === undefined ? undefined : NPY_READ[descr];
  if (kind === undefined) throw new Error(`routed_experts has dtype ${String(descr)}, not an integer one read here`);
  if (fortran !== 'False') throw new Error('routed_experts is in Fortran order');
  const dims = (shape ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '')
    .map(Number);
  if (dims.length !== 3 || !dims.every((d) => Number.isInteger(d) && d >= 0))
    throw new Error(`routed_experts has shape (${String(shape)}), not (tokens, layers, top_k)`);
  const [rows, layers, topK] = dims;
  const count = rows * layers * topK;
  const dataStart = headerStart + headerLength;
  if (bytes.length - dataStart !== count * kind.bytes)
    throw new Error(`routed_experts holds ${bytes.length - dataStart} bytes of data for shape (${dims.join(', ')})`);
  const view = new DataView(bytes.buffer, bytes.byteOffset + dataStart, count * kind.bytes);
  const values = new Float64Array(count);
  for (let i = 0; i < count; i++) values[i] = kind.read(view, i * kind.bytes);
  return keptRows(values, layers, topK, firstRowAt(rows, start, sequenceLength), start, 'routed_experts');
}

/** A JSON `[rows][layers][top_k]` list of expert ids, flattened; throws naming `field` and what it holds. */
function nestedRows(value: unknown, field: string): { rows: number; layers: number; topK: number; values: number[] } {
  if (!Array.isArray(value)) throw new Error(`${field} must be a list of [layers][top_k] rows (got ${preview(value)})`);
  const values: number[] = [];
  let layers = -1;
  let topK = -1;
  for (let r = 0; r < value.length; r++) {
    const row = value[r];
    if (!Array.isArray(row) || (layers >= 0 && row.length !== layers))
      throw new Error(
        `${field}[${r}] must be a list of ${layers >= 0 ? layers : 'the'} layers' top-k ids (got ${preview(row)})`,
      );
    layers = row.length;
    for (let l = 0; l < row.length; l++) {
      const ids = row[l];
      if (!Array.isArray(ids) || (topK >= 0 && ids.length !== topK) || !ids.every((id) => Number.isInteger(id)))
        throw new Error(
          `${field}[${r}][${l}] must be a list of ${topK >= 0 ? topK : 'top-k'} integer expert ids (got ${preview(ids)})`,
        );
      topK = ids.length;
      for (const id of ids) values.push(id as number);
    }
  }
  return { rows: value.length, layers: Math.max(0, layers), topK: Math.max(0, topK), values };
}

/** What a vLLM reply's routing is read against: where it was asked from and the sequence's lengths, where known. */
export interface VllmRowsContext {
  /** The request's `routed_experts_prompt_start` (0 on chat). */
  start: number;
  promptLength: number | null;
  completionLength: number | null;
}

/**
 * The routed experts of a vLLM reply (`reply`, its first choice `choice`) in either of vLLM's forms
 * (see the header): a `.npy` string on the choice, or 0.21's int16 lists (`prompt_routed_experts` on
 * the reply, `routed_experts` on the choice) laid at their positions — kept from `context.start` on,
 * and, as for a `.npy`, never past the last forwarded position. Undefined when the reply has none.
 * Throws a message naming the field and what it holds.
 */
export function readVllmReplyRouted(
  reply: Record<string, unknown>,
  choice: Record<string, unknown>,
  context: VllmRowsContext,
): RoutedExperts | undefined {
  const own = choice.routed_experts;
  const prompt = reply.prompt_routed_experts;
  const { promptLength, completionLength } = context;
  if (typeof own === 'string') {
    const sequenceLength = promptLength !== null && completionLength !== null ? promptLength + completionLength : null;
    return readVllmRouted(own, context.start, sequenceLength);
  }
  if (own == null && prompt == null) return undefined;
  if (own != null && !Array.isArray(own))
    throw new Error(
      `choices[0].routed_experts must be a base64 .npy string or a list of [layers][top_k] rows (got ${preview(own)})`,
    );
  const p = prompt == null ? null : nestedRows(prompt, 'prompt_routed_experts');
  const g = own == null ? null : nestedRows(own, 'choices[0].routed_experts');
  if (p !== null && g !== null && g.rows > 0 && p.rows > 0 && (p.layers !== g.layers || p.topK !== g.topK))
    throw new Error(
      `choices[0].routed_experts has rows of ${g.layers} layers × ${g.topK}, prompt_routed_experts of ${p.layers} × ${p.topK}`,
    );
  // The generated rows begin after the prompt's: at its row count, or its token count where it sent none.
  const at = p !== null ? p.rows : promptLength;
  if (at === null)
    throw new Error(
      'choices[0].routed_experts came without prompt_routed_experts or usage.prompt_tokens: its rows have no position',
    );
  if (p !== null && promptLength !== null && p.rows !== promptLength)
    throw new Error(`prompt_routed_experts has ${p.rows} rows for a ${promptLength}-token prompt`);
  const sequenceLength = completionLength !== null ? at + completionLength : null;
  const shape = g !== null && g.rows > 0 ? g : (p ?? g);
  if (shape === null) return undefined;
  let values = p === null ? (g as { values: number[] }).values : g === null ? p.values : p.values.concat(g.values);
  // A row for the last generated token (run by speculative decoding) is one the engine keeps none of.
  const width = shape.layers * shape.topK;
  if (sequenceLength !== null && width > 0) {
    const first = p === null ? at : 0;
    const most = Math.max(0, sequenceLength - 1 - first);
    if (values.length > most * width) values = values.slice(0, most * width);
  }
  // Rows are numbered from the first sent: the prompt's, then the choice's.
  const field = (row: number, value: number): string =>
    p !== null && row < p.rows
      ? `prompt_routed_experts[${row}] holds ${value}`
      : `choices[0].routed_experts[${row - (p?.rows ?? 0)}] holds ${value}`;
  return keptRows(values, shape.layers, shape.topK, p === null ? at : 0, context.start, field);
}

/** SGLang's wire dtypes for routed experts (`meta_info.routed_experts_dtype`): bytes per id and the reader. */
const SGLANG_DTYPES: Record<
  string,
  { bytes: number; read: (b: Buffer, at: number) => number; write: (b: Buffer, value: number, at: number) => void }
> = {
  int32: { bytes: 4, read: (b, at) => b.readInt32LE(at), write: (b, v, at) => b.writeInt32LE(v, at) },
  uint16: { bytes: 2, read: (b, at) => b.readUInt16LE(at), write: (b, v, at) => b.writeUInt16LE(v, at) },
  uint8: { bytes: 1, read: (b, at) => b[at], write: (b, v, at) => b.writeUInt8(v, at) },
};

/**
 * SGLang's `meta_info.routed_experts` (base64, no shape; `dtype` its `meta_info.routed_experts_dtype`,
 * int32 when absent), its rows starting at `start` (the request's `routed_experts_start_len`) — or at
 * 0 when they are all `sequenceLength − 1` of them — shaped by `shape`.
 */
export function readSglangRouted(
  b64: unknown,
  start: number,
  shape: RoutingShape | null,
  dtype: unknown = undefined,
  sequenceLength: number | null = null,
): RoutedExperts {
  if (typeof b64 !== 'string')
    throw new Error(`meta_info.routed_experts must be a base64 string (got ${preview(b64)})`);
  if (shape === null)
    throw new Error(
      'SGLang sends routed experts without their shape: set llm.routedExperts to {"layers": num_hidden_layers, "topK": num_experts_per_tok}',
    );
  const kind = dtype == null ? SGLANG_DTYPES.int32 : typeof dtype === 'string' ? SGLANG_DTYPES[dtype] : undefined;
  if (kind === undefined)
    throw new Error(`meta_info.routed_experts_dtype is ${preview(dtype)}, not "int32", "uint16" or "uint8"`);
  const bytes = Buffer.from(b64, 'base64');
  const width = shape.layers * shape.topK;
  if (bytes.length % (kind.bytes * width) !== 0)
    throw new Error(
      `meta_info.routed_experts holds ${bytes.length} bytes, not whole rows of ${shape.layers} layers × ${shape.topK} ${dtype ?? 'int32'}`,
    );
  const count = bytes.length / kind.bytes;
  const values = new Float64Array(count);
  for (let i = 0; i < count; i++) values[i] = kind.read(bytes, i * kind.bytes);
  const at = firstRowAt(count / width, start, sequenceLength);
  return keptRows(values, shape.layers, shape.topK, at, start, 'meta_info.routed_experts');
}

/** SGLang's sampling mask of `tokens` from its meta_info; null when the reply has none. Throws naming what is wrong. */
export function readSglangMask(meta: Record<string, unknown>, tokens: readonly number[]): SamplingMask | null {
  const supports = meta.output_token_sampling_mask;
  if (supports == null) return null;
  if (!Array.isArray(supports)) throw new Error('meta_info.output_token_sampling_mask must be a list per token');
  const lp = meta.output_token_sampling_logprobs;
  const logprobs = Array.isArray(lp) && lp.every((x) => typeof x === 'number') ? (lp as number[]) : undefined;
  const mask = maskFromSupports(supports as number[][], tokens, logprobs);
  if (typeof mask === 'string') throw new Error(`meta_info.output_token_sampling_mask: ${mask}`);
  return mask;
}

// --- writing (the mock) -----------------------------------------------------------------------------

/** A base64 `.npy` (format 1.0) of `values` with `shape`, as numpy.save writes it: the reply vLLM sends. */
export function npyBase64(values: ArrayLike<number>, shape: readonly number[], dtype: '|u1' | '<u2' | '<i4'): string {
  const dims = shape.length === 1 ? `${shape[0]},` : shape.join(', ');
  let header = `{'descr': '${dtype}', 'fortran_order': False, 'shape': (${dims}), }`;
  // numpy pads the header with spaces and a newline so the data starts 64-aligned.
  const total = 10 + header.length + 1;
  header += `${' '.repeat((64 - (total % 64)) % 64)}\n`;
  const size = NPY_READ[dtype].bytes;
  const out = Buffer.alloc(10 + header.length + values.length * size);
  out.write(NPY_MAGIC, 0, 'latin1');
  out[6] = 1;
  out[7] = 0;
  out.writeUInt16LE(header.length, 8);
  out.write(header, 10, 'latin1');
  const at = 10 + header.length;
  for (let i = 0; i < values.length; i++) {
    if (size === 1) out.writeUInt8(values[i], at + i);
    else if (size === 2) out.writeUInt16LE(values[i], at + 2 * i);
    else out.writeInt32LE(values[i], at + 4 * i);
  }
  return out.toString('base64');
}

/** Base64 of raw little-endian ids of `dtype`: what SGLang sends under SGLANG_ROUTED_EXPERTS_DTYPE. */
export function sglangBase64(values: ArrayLike<number>, dtype: 'int32' | 'uint16' | 'uint8'): string {
  const kind = SGLANG_DTYPES[dtype];
  const out = Buffer.alloc(values.length * kind.bytes);
  for (let i = 0; i < values.length; i++) kind.write(out, values[i], i * kind.bytes);
  return out.toString('base64');
}

// --- the gateway's stitch and traces routes -----------------------------------------------------------

/**
 * Routed experts as the gateway's session routes write them (snake_case, beside the other arrays):
 * `ids` is base64 of the ids' little-endian bytes, `dtype` says their width — the bulk of a stitched
 * sample (layers × topK a token), a third of it as numbers in JSON. `fill` only on a sequence's rows.
 */
export interface RoutedJson {
  start: number;
  rows: number;
  layers: number;
  top_k: number;
  dtype: 'uint8' | 'uint16';
  ids: string;
  fill?: number;
}

export interface MaskJson {
  offsets: number[];
  ids: number[];
  logprobs?: number[];
}

export function routedJson(r: RoutedExperts | SequenceRouting): RoutedJson {
  const bytes = Buffer.from(r.ids.buffer, r.ids.byteOffset, r.ids.byteLength);
  return {
    start: r.start,
    rows: r.rows,
    layers: r.layers,
    top_k: r.topK,
    dtype: r.ids instanceof Uint8Array ? 'uint8' : 'uint16',
    ids: bytes.toString('base64'),
    ...('fill' in r ? { fill: r.fill } : {}),
  };
}

/** The inverse of routedJson; throws naming what is wrong. */
export function routedFromJson(json: RoutedJson): RoutedExperts & { fill?: number } {
  const bytes = Buffer.from(json.ids, 'base64');
  const count = json.rows * json.layers * json.top_k;
  const width = json.dtype === 'uint16' ? 2 : 1;
  if (bytes.length !== count * width)
    throw new Error(
      `routed experts: ${bytes.length} bytes for ${json.rows} × ${json.layers} × ${json.top_k} ${json.dtype}`,
    );
  // A copy into a buffer of its own: aligned for 16-bit ids, and not a view of Node's pooled memory.
  const own = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
  const ids = width === 2 ? new Uint16Array(own) : new Uint8Array(own);
  const r = { start: json.start, rows: json.rows, layers: json.layers, topK: json.top_k, ids };
  return json.fill === undefined ? r : { ...r, fill: json.fill };
}

export function maskJson(m: SamplingMask): MaskJson {
  return {
    offsets: Array.from(m.offsets),
    ids: Array.from(m.ids),
    ...(m.logprobs !== undefined ? { logprobs: Array.from(m.logprobs) } : {}),
  };
}

export function maskFromJson(json: MaskJson): SamplingMask {
  const m: SamplingMask = { offsets: Int32Array.from(json.offsets), ids: Int32Array.from(json.ids) };
  return json.logprobs === undefined ? m : { ...m, logprobs: Float32Array.from(json.logprobs) };
}
