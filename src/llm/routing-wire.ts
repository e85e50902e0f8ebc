/**
 * Routed experts and sampling masks as each server sends them (docs/ROUTING-REPLAY.md), read into
 * domain/routing.ts's compact form, and written the same way for the mock.
 *
 * - vLLM (`--enable-return-routed-experts`; no per-request switch): `choices[0].routed_experts`, a
 *   base64 `.npy` of shape `(num_tokens − 1 − routed_experts_prompt_start, num_layers,
 *   num_experts_per_tok)`, dtype uint8 / uint16 / int32, on chat and completion choices alike; the
 *   request may skip the first N prompt tokens with `routed_experts_prompt_start`; null when the
 *   server has it off or the request was aborted before any forward pass
 *   (vllm/entrypoints/openai/chat_completion/protocol.py ChatCompletionResponseChoice,
 *   vllm/entrypoints/openai/completion/protocol.py CompletionRequest.routed_experts_prompt_start
 *   @002032ee2b18e1f7bd924ec47b62504ba3866063). Streamed chat chunks carry none.
 * - SGLang (`--enable-return-routed-experts`, and per request `return_routed_experts: true` on
 *   /generate): `meta_info.routed_experts`, base64 of the raw little-endian int32 array, no shape —
 *   `[tokens, num_hidden_layers, num_experts_per_tok]` is the model's (the capturer's buffers,
 *   python/sglang/srt/layers/moe/routed_experts_capturer.py @d4d0fc58371761f9f0da007a4ef4f0ad2bd19658;
 *   decoded as `np.frombuffer(b64decode(s), np.int32).reshape(-1, layers, topk)` by miles,
 *   miles/rollout/generate_hub/sglang_generate_wrapper.py @59bff93e562c600fa3b59220570b56e73b2057ff);
 *   `routed_experts_start_len` asks for rows from that absolute position: `[start, seqlen − 1)`.
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

/**
 * vLLM's `routed_experts` (base64 `.npy`), its rows starting at sequence position `start` (the
 * request's `routed_experts_prompt_start`). Throws a message naming what is wrong.
 */
export function readVllmRouted(b64: unknown, start: number): RoutedExperts {
  if (typeof b64 !== 'string') throw new Error(`routed_experts must be a base64 string (got ${typeof b64})`);
  const bytes = Buffer.from(b64, 'base64');
  if (bytes.length < 10 || bytes.toString('latin1', 0, 6) !== NPY_MAGIC)
    throw new Error('routed_experts is not a base64 .npy (no \\x93NUMPY magic)');
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
  const values = new Array<number>(count);
  for (let i = 0; i < count; i++) values[i] = kind.read(view, i * kind.bytes);
  const ids = narrowExpertIds(values);
  if (ids === null) throw new Error('routed_experts holds a value that is no expert id (negative or ≥ 65536)');
  return { start, rows, layers, topK, ids };
}

/**
 * SGLang's `meta_info.routed_experts` (base64 of int32, no shape), its rows starting at `start` (the
 * request's `routed_experts_start_len`), shaped by `shape`.
 */
export function readSglangRouted(b64: unknown, start: number, shape: RoutingShape | null): RoutedExperts {
  if (typeof b64 !== 'string') throw new Error(`meta_info.routed_experts must be a base64 string (got ${typeof b64})`);
  if (shape === null)
    throw new Error(
      'SGLang sends routed experts without their shape: set llm.routedExperts to {"layers": num_hidden_layers, "topK": num_experts_per_tok}',
    );
  const bytes = Buffer.from(b64, 'base64');
  const width = shape.layers * shape.topK;
  if (bytes.length % (4 * width) !== 0)
    throw new Error(
      `meta_info.routed_experts holds ${bytes.length} bytes, not whole rows of ${shape.layers} layers × ${shape.topK} int32`,
    );
  const count = bytes.length / 4;
  const values = new Array<number>(count);
  for (let i = 0; i < count; i++) values[i] = bytes.readInt32LE(i * 4);
  const ids = narrowExpertIds(values);
  if (ids === null)
    throw new Error('meta_info.routed_experts holds a value that is no expert id (negative or ≥ 65536)');
  return { start, rows: count / width, layers: shape.layers, topK: shape.topK, ids };
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

/** Base64 of raw little-endian int32: what SGLang sends. */
export function int32Base64(values: ArrayLike<number>): string {
  const out = Buffer.alloc(values.length * 4);
  for (let i = 0; i < values.length; i++) out.writeInt32LE(values[i], 4 * i);
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
