/**
 * What SGLang answers on its routes for pausing generation around a weight update, shared by the
 * default dialect's admin routes and the SGLang dialect: POST /pause_generation with
 * PauseGenerationReqInput {mode: "abort" | "retract" | "in_place"} (default "abort"), then
 * POST /continue_generation. Modes (docs/advanced_features/sglang_for_rl.md at
 * 067bfe93626b99d33a934c78ac24c0c71e5e5e17): abort answers every request at once, as abort_request
 * with abort_all; retract moves running requests back to the waiting queue, their KV recomputed later;
 * in_place leaves them as they are, KV and all. In every mode the engine is paused: nothing generates,
 * and new requests wait, until continue_generation. Replies: python/sglang/srt/entrypoints/
 * http_server.py (pause_generation, continue_generation).
 */
export const PAUSE_MODES = ['abort', 'retract', 'in_place'] as const;
export type PauseMode = (typeof PAUSE_MODES)[number];

export const isPauseMode = (value: unknown): value is PauseMode => PAUSE_MODES.includes(value as PauseMode);
export const PAUSED_REPLY = { message: 'Generation paused successfully.', status: 'ok' } as const;
export const CONTINUED_REPLY = { message: 'Generation continued successfully.', status: 'ok' } as const;
