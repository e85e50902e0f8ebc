/**
 * The default dialect's `/admin/*` routes: abort every in-flight completion, read or set the
 * weight version a trainer syncs after each update, and read the GPU-like mock's metrics (404
 * without option capacity). The dialects have none (dialect-routes.ts). Beside them, SGLang's names
 * for abort and for pausing generation around a weight update (its dialect has the same, strictly).
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { RouteTable } from './dialect-routes.ts';
import type { Gpu } from './gpu.ts';
import { isPauseMode, PAUSE_MODES, PAUSED_REPLY, CONTINUED_REPLY, type PauseMode } from './pause-routes.ts';
import { sendJson, type Rejections } from './http-replies.ts';
import type { WeightVersion } from './weight-version.ts';

export interface AdminParts {
  abortAll(): number;
  pause(mode: PauseMode): number;
  resume(): void;
  version: WeightVersion;
  readBody(req: IncomingMessage): Promise<string>;
  rejections: Rejections;
  gpu: Gpu | null;
}

export function adminRoutes(parts: AdminParts): RouteTable {
  const abort = {
    POST: (req: IncomingMessage, res: ServerResponse) => (
      req.resume(), sendJson(res, 200, { aborted: parts.abortAll() })
    ),
  };
  const weightVersion = (req: IncomingMessage, res: ServerResponse) => weightVersionRoute(parts, req, res);
  return {
    '/admin/abort': abort,
    // SGLang's name for the abort endpoint; the body (rid / abort_all) is ignored: everything is aborted.
    '/abort_request': abort,
    '/admin/weight_version': { GET: weightVersion, POST: weightVersion },
    // SGLang's pause and continue (pause-routes.ts); here the body may be empty (mode abort).
    '/pause_generation': { POST: (req: IncomingMessage, res: ServerResponse) => pauseRoute(parts, req, res) },
    '/continue_generation': {
      POST: (req: IncomingMessage, res: ServerResponse) => (
        req.resume(), parts.resume(), sendJson(res, 200, CONTINUED_REPLY)
      ),
    },
    ...(parts.gpu === null
      ? {}
      : {
          '/admin/gpu': {
            GET: (req: IncomingMessage, res: ServerResponse) => (
              req.resume(), sendJson(res, 200, parts.gpu!.metrics())
            ),
          },
        }),
  };
}

/** `POST {"mode": "abort" | "retract" | "in_place"}` (default abort); 400 naming the field otherwise. */
async function pauseRoute(parts: AdminParts, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const raw = await parts.readBody(req);
  let mode: unknown = 'abort';
  if (raw.trim() !== '') {
    try {
      mode = (JSON.parse(raw) as { mode?: unknown } | null)?.mode ?? 'abort';
    } catch (error) {
      parts.rejections.reject(res, 400, `request body is not valid JSON: ${(error as Error).message}`);
      return;
    }
  }
  if (!isPauseMode(mode)) {
    parts.rejections.reject(
      res,
      400,
      `mode must be one of ${PAUSE_MODES.join(', ')} (got ${JSON.stringify(mode)})`,
      'mode',
    );
    return;
  }
  parts.pause(mode);
  sendJson(res, 200, PAUSED_REPLY);
}

/** `GET` reads the version; `POST {"weight_version": n}` sets it (400 naming the field otherwise). */
async function weightVersionRoute(parts: AdminParts, req: IncomingMessage, res: ServerResponse): Promise<void> {
  if (req.method === 'GET') {
    req.resume();
    sendJson(res, 200, { weight_version: parts.version.number });
    return;
  }
  const raw = await parts.readBody(req);
  let value: unknown;
  try {
    value = (JSON.parse(raw) as { weight_version?: unknown } | null)?.weight_version;
  } catch (error) {
    parts.rejections.reject(res, 400, `request body is not valid JSON: ${(error as Error).message}`);
    return;
  }
  try {
    parts.version.set(value);
  } catch (error) {
    parts.rejections.reject(res, 400, (error as Error).message, 'weight_version');
    return;
  }
  sendJson(res, 200, { weight_version: parts.version.number });
}
