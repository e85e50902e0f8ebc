"""The reference policy server: a small model that samples for real, behind SGLang's native HTTP API.

    python3 -m rollout_engine.policy.server --model DIR [--host 127.0.0.1] [--port 0] [--device cpu|cuda]
        [--weight-version V] [--seed N] [--decode-delay-ms MS]

prints ``policy server listening on http://HOST:PORT`` once it serves. ``DIR`` is what
``save_pretrained`` wrote (``config.json``, ``model.pt`` and the tokenizer files): the same directory
is the engine's ``llm.tokenizer``. Only the standard library's HTTP server and torch.

Routes, each as SGLang answers it (python/sglang/srt/entrypoints/http_server.py
@0025436eab0556737d615b36a4dd3e1e26e82f3d unless said otherwise):

- ``POST|PUT /generate`` — ``input_ids`` (or ``text``), ``sampling_params``, ``return_logprob``,
  ``top_logprobs_num``, ``return_text_in_logprobs``, ``rid``, ``stream``. The reply is
  ``{text, output_ids, meta_info}`` (TokenizerManager._handle_batch_output, tokenizer_manager.py
  @001067fffe33427bee0ed2f007fb7551a1d76b44): meta_info has ``id``, ``finish_reason``,
  ``prompt_tokens``, ``weight_version``, ``num_retractions``, with ``return_logprob``
  ``input_token_logprobs`` (empty: logprob_start_len -1; with ``max_new_tokens: 0`` and
  ``logprob_start_len`` L >= 0, ``[logprob, id, text]`` for each prompt id from L on, the first logprob
  null — prompt scoring, as the engine's consistency audit asks it), ``output_token_logprobs`` as
  ``[logprob, token id, text or null]``, ``output_token_logprobs_length``, then
  ``reasoning_tokens``, ``completion_tokens``, ``cached_tokens``, ``weight_versions`` (spans
  ``{version, start, end}`` over the output tokens, utils/weight_versions.py
  @19f93835d3f8a0b84485592090245d11de783289: which weights sampled which tokens; ``weight_version``
  is the newest span's) and, once finished, ``e2e_latency``. Streamed: server-sent events
  ``data: {...}`` per step, cumulative ``output_ids`` and logprobs (incremental with
  ``--incremental-streaming-output``, as SGLang's flag), then ``data: [DONE]``. A chunk never mixes
  weight versions (see scheduler.py). A client that hangs up aborts its request.
- ``POST /pause_generation`` ``{"mode": "abort" | "retract" | "in_place"}``, ``POST /continue_generation``
  → ``{"message": "Generation paused successfully.", "status": "ok"}`` / ``... continued ...``.
- ``POST /abort_request`` ``{"rid": ..., "abort_all": bool}`` → 200, empty body.
- ``POST /update_weights_from_disk`` ``{"model_path", "weight_version", "flush_cache", "abort_all_requests", ...}``
  → ``{"success", "message", "num_paused_requests"}``, 200 or 400.
- ``POST /update_weight_version`` ``{"new_version", "abort_all_requests"}``.
- ``GET /health`` (200, empty body), ``GET /get_model_info``, ``GET /get_weight_version``,
  ``GET /get_server_info`` (with ``internal_states``: counters of requests and tokens),
  ``GET /v1/models`` (``owned_by: "sglang"``, ``max_model_len``: the engine tells the dialect and
  the context from it), ``GET|POST /flush_cache``.

Errors: a body that is not JSON, or a control route's field of the wrong type, answers FastAPI's
validation error as SGLang reshapes it, 400 ``{"object": "error", "message", "type": "Bad Request",
"param": null, "code": 400}``; a /generate that SGLang would refuse with a ValueError answers
``{"error": {"message"}}``, 400 (_create_error_response) — or, streamed, 200 with that object as the
only event before ``[DONE]`` (stream_results). Unknown paths 404 ``{"detail": "Not Found"}``,
a route asked with the wrong method 405 ``{"detail": "Method Not Allowed"}`` (Starlette): the engine
probes POST-only routes with GET and reads a non-404 as "the route exists".
"""
from __future__ import annotations

import argparse
import json
import math
import queue
import select
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import vocab
from .model import TinyLM, load_pretrained
from .sampling import SamplingError, parse_sampling_params
from .scheduler import PAUSE_MODES, Request, Scheduler, SchedulerStopped, Update, output_text

__all__ = ["PolicyServer", "RunningServer", "main", "start_server"]

VERSION = "rollout-engine-policy-server 0.1.0"
DEFAULT_MAX_BODY_BYTES = 16 << 20
#: How often a handler waiting for tokens checks whether its client hung up.
_POLL_S = 0.25

#: /generate fields SGLang serves and this server does not: refused when set, not silently dropped.
_UNSUPPORTED_GENERATE = (
    "input_embeds",
    "image_data",
    "video_data",
    "audio_data",
    "lora_path",
    "session_params",
    "custom_logit_processor",
    "token_ids_logprob",
)


class HttpError(Exception):
    def __init__(self, status: int, body: Dict[str, Any]) -> None:
        super().__init__(json.dumps(body))
        self.status = status
        self.body = body


def validation_error(message: str, status: int = 400) -> HttpError:
    """FastAPI's RequestValidationError as SGLang's handler reshapes it (ErrorResponse, 400)."""
    return HttpError(
        status,
        {"object": "error", "message": message, "type": "Bad Request" if status == 400 else str(status), "param": None, "code": status},
    )


def native_error(message: str) -> HttpError:
    """SGLang's native-route error for a ValueError (_create_error_response): ``{"error": {"message"}}``, 400."""
    return HttpError(400, {"error": {"message": message}})


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class PolicyServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Each engine worker keeps connections open; the default backlog of 5 drops bursts of new ones.
    request_queue_size = 256

    def __init__(
        self,
        address: Tuple[str, int],
        scheduler: Scheduler,
        *,
        served_model_name: str,
        tokenizer_path: str,
        device: str,
        seed: int,
        incremental_streaming_output: bool = False,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        log_requests: bool = False,
    ) -> None:
        super().__init__(address, PolicyHandler)
        self.scheduler = scheduler
        self.served_model_name = served_model_name
        self.tokenizer_path = tokenizer_path
        self.device = device
        self.seed = seed
        self.incremental_streaming_output = incremental_streaming_output
        self.max_body_bytes = max_body_bytes
        self.log_requests = log_requests
        self.started = time.time()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that drops its connection between requests is routine here (the engine closes
        # pools, tests hang up mid-stream): not worth a traceback. Anything else is.
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def host(self) -> str:
        host = self.server_address[0]
        return host.decode() if isinstance(host, bytes) else str(host)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


Route = Callable[["PolicyHandler", Dict[str, Any]], None]


class PolicyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: PolicyServer
    server_version = "policy-server"

    # ------------------------------------------------------------------ plumbing

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.log_requests:
            super().log_message(format, *args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        routes = ROUTES.get(path)
        if routes is None and path.startswith("/v1/models/"):
            routes = {"GET": PolicyHandler._model_card}
        try:
            if routes is None:
                self._drain_body()
                raise HttpError(404, {"detail": "Not Found"})
            handler = routes.get(method)
            if handler is None:
                self._drain_body()
                raise HttpError(405, {"detail": "Method Not Allowed"})
            body = self._read_body() if method in ("POST", "PUT") else {}
            handler(self, body)
        except HttpError as err:
            self._send_json(err.status, err.body)
        except SchedulerStopped as err:
            self._send_json(503, {"error": {"message": str(err)}})
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _drain_body(self) -> None:
        length = self.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) <= self.server.max_body_bytes:
            self.rfile.read(int(length))
        elif length is not None:
            self.close_connection = True

    def _read_body(self) -> Dict[str, Any]:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise validation_error("Transfer-Encoding chunked request bodies are not accepted: send Content-Length", 411)
        raw_length = self.headers.get("Content-Length")
        if raw_length is None:
            return {}
        if not raw_length.isdigit():
            self.close_connection = True
            raise validation_error(f"Content-Length {raw_length!r} is not a byte count")
        length = int(raw_length)
        if length > self.server.max_body_bytes:
            self.close_connection = True  # the body stays unread: the connection cannot carry another request
            raise validation_error(
                f"request body of {length} bytes is over the server's limit of {self.server.max_body_bytes} bytes (--max-body-bytes)",
                413,
            )
        data = self.rfile.read(length)
        if not data.strip():
            return {}
        try:
            body = json.loads(data, parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError) as err:
            raise validation_error(f"request body is not valid JSON: {err}") from None
        if not isinstance(body, dict):
            raise validation_error(f"request body must be a JSON object, got {_show(body)}")
        return body

    def _send_bytes(self, status: int, data: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _send_json(self, status: int, body: Any) -> None:
        self._send_bytes(status, json.dumps(body, allow_nan=False).encode())

    def _client_gone(self) -> bool:
        """Whether the client closed its side (a readable socket with nothing to read)."""
        sock = self.connection
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return False
            return bool(sock.recv(1, socket.MSG_PEEK) == b"")
        except (OSError, ValueError):
            return True

    # ------------------------------------------------------------------ info routes

    def _health(self, body: Dict[str, Any]) -> None:
        self._send_bytes(200 if self.server.scheduler.alive() else 503, b"", "text/plain")

    def _model_info(self, body: Dict[str, Any]) -> None:
        s = self.server
        self._send_json(
            200,
            {
                "model_path": s.scheduler.model_path,
                "tokenizer_path": s.tokenizer_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": s.scheduler.version,
            },
        )

    def _weight_version(self, body: Dict[str, Any]) -> None:
        self._send_json(200, {"weight_version": self.server.scheduler.version})

    def _server_info(self, body: Dict[str, Any]) -> None:
        # SGLang: {**asdict(server_args), **scheduler_info, "internal_states", "version"}; the server
        # args an engine reads, plus this server's own, and its counters as the internal state.
        s = self.server
        sch = s.scheduler
        self._send_json(
            200,
            {
                "model_path": sch.model_path,
                "tokenizer_path": s.tokenizer_path,
                "served_model_name": s.served_model_name,
                "context_length": sch.config.max_len,
                "weight_version": sch.version,
                "host": s.host,
                "port": s.port,
                "device": s.device,
                "random_seed": s.seed,
                "max_running_requests": sch.max_running_requests,
                "max_prefill_tokens": sch.max_prefill_tokens,
                "decode_delay_ms": sch.decode_delay_s * 1000.0,
                "incremental_streaming_output": s.incremental_streaming_output,
                "skip_tokenizer_init": False,
                "tp_size": 1,
                "dp_size": 1,
                "model_config": sch.config.to_dict(),
                "internal_states": [sch.state()],
                "uptime_s": round(time.time() - s.started, 3),
                "version": VERSION,
            },
        )

    def _card(self) -> Dict[str, Any]:
        s = self.server
        return {
            "id": s.served_model_name,
            "object": "model",
            "created": int(s.started),
            "owned_by": "sglang",
            "root": s.served_model_name,
            "max_model_len": s.scheduler.config.max_len,
        }

    def _models(self, body: Dict[str, Any]) -> None:
        # available_models: ModelList of one ModelCard (protocol.py ModelCard
        # @9b116dffe828b2dfa7ec0e4d061555b6c354b67a: owned_by "sglang", max_model_len = context_len).
        self._send_json(200, {"object": "list", "data": [self._card()]})

    def _model_card(self, body: Dict[str, Any]) -> None:
        model = self.path.split("?", 1)[0][len("/v1/models/") :]
        if model != self.server.served_model_name:
            raise HttpError(
                404,
                {
                    "error": {
                        "message": f"The model '{model}' does not exist",
                        "type": "invalid_request_error",
                        "param": "model",
                        "code": "model_not_found",
                    }
                },
            )
        self._send_json(200, self._card())

    # ------------------------------------------------------------------ control routes

    def _flag(self, body: Dict[str, Any], name: str, default: bool) -> bool:
        value = body.get(name, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise validation_error(f"{name} must be true or false, got {_show(value)}")
        return value

    def _optional_str(self, body: Dict[str, Any], name: str) -> Optional[str]:
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            raise validation_error(f"{name} must be a string, got {_show(value)}")
        return value

    def _pause(self, body: Dict[str, Any]) -> None:
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            # PauseGenerationReqInput.mode is Literal["abort", "retract", "in_place"] (io_struct.py @001067ff).
            raise validation_error(f"mode must be one of 'abort', 'retract', 'in_place', got {_show(mode)}")
        self.server.scheduler.pause(mode)
        self._send_json(200, {"message": "Generation paused successfully.", "status": "ok"})

    def _continue(self, body: Dict[str, Any]) -> None:
        self._flag(body, "torch_empty_cache", True)  # ContinueGenerationReqInput; nothing to empty here
        self.server.scheduler.resume()
        self._send_json(200, {"message": "Generation continued successfully.", "status": "ok"})

    def _abort(self, body: Dict[str, Any]) -> None:
        rid = body.get("rid")
        if rid is None:
            rid = ""
        if not isinstance(rid, str):
            raise validation_error(f"rid must be a string, got {_show(rid)}")
        abort_all = self._flag(body, "abort_all", False)
        sch = self.server.scheduler
        # TokenizerManager.abort_request: a rid that is not in flight aborts nothing.
        if abort_all or (rid and sch.is_in_flight(rid)):
            sch.abort(rid, abort_all)
        self._send_bytes(200, b"", "text/plain")

    def _update_weights(self, body: Dict[str, Any]) -> None:
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise validation_error(f"model_path is required: the directory with the new weights (got {_show(path)})")
        version = self._optional_str(body, "weight_version")
        flush = self._flag(body, "flush_cache", True)
        abort_all = self._flag(body, "abort_all_requests", False)
        # UpdateWeightFromDiskReqInput's other fields (load_format, is_async, torch_empty_cache,
        # keep_pause, recapture_cuda_graph, token_step, manifest) change nothing here.
        success, message = self.server.scheduler.update_weights(str(Path(path)), version, flush, abort_all)
        if success and version is not None:
            message += f" Weight version updated to {version}."
        self._send_json(200 if success else 400, {"success": success, "message": message, "num_paused_requests": 0})

    def _update_weight_version(self, body: Dict[str, Any]) -> None:
        version = body.get("new_version")
        if not isinstance(version, str):
            raise validation_error(f"new_version must be a string, got {_show(version)}")
        self.server.scheduler.set_version(version, self._flag(body, "abort_all_requests", False))
        self._send_json(
            200, {"success": True, "message": f"Weight version updated to {version}", "new_version": version}
        )

    def _flush_cache(self, body: Dict[str, Any]) -> None:
        ok = self.server.scheduler.flush_cache()
        text = (
            "Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n"
        )
        self._send_bytes(200 if ok else 400, text.encode(), "text/plain; charset=utf-8")

    # ------------------------------------------------------------------ /generate

    def _parse_generate(self, body: Dict[str, Any]) -> Tuple[Request, bool, bool, bool]:
        sch = self.server.scheduler
        config = sch.config
        for name in _UNSUPPORTED_GENERATE:
            if body.get(name) not in (None, [], ""):
                raise native_error(f"{name} is not supported by the reference policy server (got {_show(body[name])}).")
        if body.get("return_hidden_states") or body.get("return_sampling_mask"):
            name = "return_hidden_states" if body.get("return_hidden_states") else "return_sampling_mask"
            raise native_error(f"{name} is not supported by the reference policy server.")
        ids = body.get("input_ids")
        text = body.get("text")
        if ids is None and text is None:
            raise native_error("Either text, input_ids or input_embeds should be provided.")
        if ids is not None:
            if not isinstance(ids, list) or len(ids) == 0:
                raise native_error(f"input_ids must be a non-empty list of token ids, got {_show(ids)}.")
            if isinstance(ids[0], list):
                raise native_error(
                    "input_ids: a batch (a list of lists) is not served by the reference policy server; send one prompt per request."
                )
            for i, token in enumerate(ids):
                if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < config.vocab_size:
                    raise native_error(
                        f"input_ids[{i}]: {_show(token)} is not a token id of this model (0..{config.vocab_size - 1})."
                    )
            prompt: List[int] = list(ids)
        else:
            if not isinstance(text, str) or not text:
                raise native_error(
                    f"text must be a non-empty string (a batch of texts is not served here), got {_show(text)}."
                )
            try:
                prompt = vocab.encode(text)
            except ValueError as err:
                raise native_error(str(err)) from None
        try:
            params = parse_sampling_params(body.get("sampling_params"), config.vocab_size)
        except SamplingError as err:
            raise native_error(str(err)) from None

        # TokenizerManager._validate_one_request (tokenizer_manager.py @001067ff): the context check.
        context = config.max_len
        if len(prompt) >= context:
            raise native_error(
                f"The input ({len(prompt)} tokens) is longer than the model's context length ({context} tokens)."
            )
        if params.max_new_tokens is not None and params.max_new_tokens + len(prompt) > context:
            raise native_error(
                f"Requested token count exceeds the model's maximum context length of {context} tokens. You requested a "
                f"total of {params.max_new_tokens + len(prompt)} tokens: {len(prompt)} tokens from the input messages and "
                f"{params.max_new_tokens} tokens for the completion. Please reduce the number of tokens in the input "
                "messages or the completion to fit within the limit."
            )

        def flag(name: str, default: bool) -> bool:
            value = body.get(name)
            if value is None:
                return default
            if not isinstance(value, bool):
                raise native_error(f"{name} must be true or false, got {_show(value)}.")
            return value

        return_logprob = flag("return_logprob", False)
        stream = flag("stream", False)
        text_in_logprobs = flag("return_text_in_logprobs", False)
        top_n = body.get("top_logprobs_num")
        if top_n is None:
            top_n = 0
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0:
            raise native_error(f"top_logprobs_num must be a non-negative integer, got {_show(top_n)}.")
        start = body.get("logprob_start_len")
        if start is None:
            start = -1
        if isinstance(start, bool) or not isinstance(start, int) or start < -1:
            raise native_error(f"logprob_start_len must be an integer >= -1, got {_show(start)}.")
        if start >= 0 and (not return_logprob or params.max_new_tokens != 0):
            # Prompt logprobs are served for scoring only: a prefill with nothing sampled.
            raise native_error(
                f"logprob_start_len={start}: prompt logprobs are served by the reference policy server only to score a "
                "prompt (return_logprob true, sampling_params.max_new_tokens 0)."
            )
        if start >= len(prompt):
            raise native_error(f"logprob_start_len={start} is not a position of the {len(prompt)}-token prompt.")
        rid = body.get("rid")
        if rid is None:
            rid = uuid.uuid4().hex
        if not isinstance(rid, str) or not rid:
            raise native_error(f"rid must be a non-empty string, got {_show(rid)}.")
        seed = params.sampling_seed if params.sampling_seed is not None else sch.draw_seed()
        request = Request(
            rid=rid,
            prompt=prompt,
            params=params,
            seed=seed,
            top_n=top_n if return_logprob else 0,
            stream=stream,
            logprob_start_len=start,
        )
        return request, return_logprob, stream, text_in_logprobs

    def _generate(self, body: Dict[str, Any]) -> None:
        try:
            request, return_logprob, stream, text_in_logprobs = self._parse_generate(body)
            try:
                self.server.scheduler.submit(request)
            except ValueError as err:
                raise native_error(str(err)) from None
        except HttpError as err:
            if body.get("stream") is True and "error" in err.body:
                # SGLang checks a request inside the streaming generator: a streamed request it refuses
                # gets 200 and one error event, then [DONE] (http_server.py generate_request, stream_results).
                self._open_stream()
                self._write_event(json.dumps(err.body).encode())
                self._end_stream()
                return
            raise
        reply = _Reply(request, return_logprob, text_in_logprobs)
        if stream:
            self._stream(request, reply)
        else:
            self._whole(request, reply)

    def _next_updates(self, request: Request, block: bool) -> List[Update]:
        """The updates waiting for ``request``; when ``block``, waits up to one poll interval for the first."""
        got: List[Update] = []
        while True:
            try:
                got.append(request.updates.get(block=block and not got, timeout=_POLL_S))
            except queue.Empty:
                return got

    def _whole(self, request: Request, reply: "_Reply") -> None:
        while reply.finish is None and reply.error is None:
            updates = self._next_updates(request, block=True)
            if not updates and self._client_gone():
                # A client that hung up: its request is aborted (SGLang's _wait_one_response checks
                # request.is_disconnected() and calls abort_request).
                self.server.scheduler.abort_one(request)
                self.close_connection = True
                return
            for update in updates:
                reply.add(update)
        if reply.error is not None:
            raise HttpError(503, {"error": {"message": reply.error}})
        self._send_json(200, reply.body(finished=True))

    def _open_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _end_stream(self) -> None:
        self._write_event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _stream(self, request: Request, reply: "_Reply") -> None:
        self._open_stream()
        incremental = self.server.incremental_streaming_output
        pending: List[Update] = []
        try:
            self._write_chunk(b"")  # nothing: the headers are out, so a client sees the stream open
            while reply.finish is None and reply.error is None:
                pending += self._next_updates(request, block=not pending)
                if not pending:
                    if self._client_gone():
                        raise BrokenPipeError
                    continue
                # One chunk per weight version: the updates of one version coalesce (a slow
                # reader gets fewer, larger chunks), a version change always starts a new chunk.
                head = pending[0].versions[0] if pending[0].versions else None
                take = 1
                while take < len(pending) and set(pending[take].versions) <= {head}:
                    take += 1
                batch, pending = pending[:take], pending[take:]
                offset = len(reply.ids)
                for update in batch:
                    reply.add(update)
                if reply.error is not None:
                    break
                chunk = reply.body(finished=reply.finish is not None, since=offset if incremental else None)
                self._write_event(json.dumps(chunk, allow_nan=False).encode())
            if reply.error is not None:
                self._write_event(json.dumps({"error": {"message": reply.error}}).encode())
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError, OSError):
            # The client hung up mid-stream: SGLang aborts the request (create_abort_task).
            self.close_connection = True
            if reply.finish is None:
                self.server.scheduler.abort_one(request)

    def _write_chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _write_event(self, data: bytes) -> None:
        self._write_chunk(b"data: " + data + b"\n\n")


class _Reply:
    """A request's reply, built from its updates on the HTTP thread (the scheduler never shares a
    mutable list with it)."""

    def __init__(self, request: Request, return_logprob: bool, text_in_logprobs: bool) -> None:
        self.request = request
        self.return_logprob = return_logprob
        self.text_in_logprobs = text_in_logprobs
        self.ids: List[int] = []
        self.logprobs: List[float] = []
        self.top: List[List[Tuple[float, int]]] = []
        self.versions: List[str] = []  # per token
        self.version_now = ""
        self.finish: Optional[Dict[str, Any]] = None
        self.error: Optional[str] = None
        self.retractions = 0
        self.created = time.time()

    def add(self, update: Update) -> None:
        self.ids += update.ids
        self.logprobs += update.logprobs
        self.top += update.top
        self.versions += update.versions
        self.version_now = update.version
        self.retractions = update.retractions
        if update.finish is not None:
            self.finish = update.finish
        if update.error is not None:
            self.error = update.error

    def spans(self) -> List[Dict[str, Any]]:
        """SGLang's weight_versions: run-length spans of the version that sampled each output token
        (compute_weight_version_spans); with no tokens, one empty span of the current version."""
        spans: List[Dict[str, Any]] = []
        for i, version in enumerate(self.versions):
            if spans and spans[-1]["version"] == version:
                spans[-1]["end"] = i + 1
            else:
                spans.append({"version": version, "start": i, "end": i + 1})
        return spans or [{"version": self.version_now, "start": 0, "end": 0}]

    def _entry(self, logprob: Optional[float], token: int) -> List[Any]:
        return [logprob, token, vocab.TOKENS[token] if self.text_in_logprobs and token < vocab.VOCAB_SIZE else None]

    def body(self, finished: bool, since: Optional[int] = None) -> Dict[str, Any]:
        r = self.request
        spans = self.spans()
        meta: Dict[str, Any] = {
            "id": r.rid,
            "finish_reason": self.finish,
            "prompt_tokens": len(r.prompt),
            "weight_version": spans[-1]["version"],
            "num_retractions": self.retractions,
        }
        lo = since or 0
        if self.return_logprob:
            scored = r.input_logprobs
            start = max(r.logprob_start_len, 0)
            meta["input_token_logprobs"] = (
                [] if scored is None else [self._entry(lp, t) for lp, t in zip(scored, r.prompt[start:])]
            )
            meta["output_token_logprobs"] = [self._entry(lp, t) for lp, t in zip(self.logprobs[lo:], self.ids[lo:])]
            meta["output_token_logprobs_length"] = len(self.logprobs)
            if r.top_n > 0:
                meta["input_top_logprobs"] = []
                meta["output_top_logprobs"] = [[self._entry(lp, t) for lp, t in row] for row in self.top[lo:]]
        meta["reasoning_tokens"] = 0
        meta["completion_tokens"] = len(self.ids)
        meta["cached_tokens"] = 0
        meta["weight_versions"] = spans
        if finished:
            meta["e2e_latency"] = time.time() - self.created
        if since is not None:
            text = output_text(self.ids[since:], r.params, self.finish)
            return {"text": text, "output_ids": self.ids[since:], "meta_info": meta}
        return {"text": output_text(self.ids, r.params, self.finish), "output_ids": list(self.ids), "meta_info": meta}


ROUTES: Dict[str, Dict[str, Route]] = {
    "/health": {"GET": PolicyHandler._health},
    "/health_generate": {"GET": PolicyHandler._health},
    "/get_model_info": {"GET": PolicyHandler._model_info},
    "/model_info": {"GET": PolicyHandler._model_info},
    "/get_weight_version": {"GET": PolicyHandler._weight_version},
    "/get_server_info": {"GET": PolicyHandler._server_info},
    "/server_info": {"GET": PolicyHandler._server_info},
    "/v1/models": {"GET": PolicyHandler._models},
    "/generate": {"POST": PolicyHandler._generate, "PUT": PolicyHandler._generate},
    "/pause_generation": {"POST": PolicyHandler._pause},
    "/continue_generation": {"POST": PolicyHandler._continue},
    "/abort_request": {"POST": PolicyHandler._abort},
    "/update_weights_from_disk": {"POST": PolicyHandler._update_weights},
    "/update_weight_version": {"POST": PolicyHandler._update_weight_version},
    "/flush_cache": {"GET": PolicyHandler._flush_cache, "POST": PolicyHandler._flush_cache},
}


class RunningServer:
    """A policy server serving on a thread of this process (tests, notebooks): ``url``, ``close()``."""

    def __init__(self, server: PolicyServer) -> None:
        self.server = server
        self.scheduler = server.scheduler
        self.url = server.url
        self._thread = threading.Thread(target=server.serve_forever, name="policy-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.scheduler.stop()
        self._thread.join(timeout=10)

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def build_server(
    model: TinyLM,
    *,
    model_path: str,
    host: str = "127.0.0.1",
    port: int = 0,
    weight_version: str = "default",
    seed: int = 0,
    decode_delay_ms: float = 0.0,
    max_running_requests: int = 64,
    max_prefill_tokens: int = 8192,
    served_model_name: Optional[str] = None,
    tokenizer_path: Optional[str] = None,
    incremental_streaming_output: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    log_requests: bool = False,
) -> PolicyServer:
    scheduler = Scheduler(
        model,
        model_path=model_path,
        weight_version=weight_version,
        seed=seed,
        max_running_requests=max_running_requests,
        max_prefill_tokens=max_prefill_tokens,
        decode_delay_ms=decode_delay_ms,
    )
    try:
        return PolicyServer(
            (host, port),
            scheduler,
            served_model_name=served_model_name or model_path,
            tokenizer_path=tokenizer_path or model_path,
            device=str(model.embed.weight.device),
            seed=seed,
            incremental_streaming_output=incremental_streaming_output,
            max_body_bytes=max_body_bytes,
            log_requests=log_requests,
        )
    except BaseException:
        scheduler.stop()
        raise


def start_server(model_dir: str, *, device: str = "cpu", **options: Any) -> RunningServer:
    """Loads ``model_dir`` and serves it on a thread of this process (port 0 by default)."""
    model = load_pretrained(model_dir, device=device)
    return RunningServer(build_server(model, model_path=str(Path(model_dir)), **options))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m rollout_engine.policy.server",
        description="The reference policy server: a small model that samples, behind SGLang's native API.",
    )
    p.add_argument("--model", required=True, help="directory written by save_pretrained (config.json, model.pt, tokenizer files)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = any free port (the line on stdout says which)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--weight-version", default="default", help='the version replies report until an update names another (SGLang: "default")')
    p.add_argument("--seed", type=int, default=0, help="seeds the draws of requests that bring no sampling_seed")
    p.add_argument("--decode-delay-ms", type=float, default=0.0, help="sleep after each scheduler iteration (tests: keeps requests in flight)")
    p.add_argument("--max-running-requests", type=int, default=64, help="requests decoding at once (KV cache slots)")
    p.add_argument("--max-prefill-tokens", type=int, default=8192, help="prompt tokens prefilled in one iteration")
    p.add_argument("--served-model-name", default=None, help="the id /v1/models lists (default: the model path)")
    p.add_argument("--incremental-streaming-output", action="store_true", help="streamed chunks carry only their new tokens (SGLang's flag)")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    p.add_argument("--log-requests", action="store_true")
    return p


def _check_args(args: argparse.Namespace) -> Optional[str]:
    if not Path(args.model).is_dir():
        return f"--model: {args.model!r} is not a directory (write one with rollout_engine.policy.save_pretrained)"
    for name in ("max_running_requests", "max_prefill_tokens", "max_body_bytes"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')}: {getattr(args, name)} must be at least 1"
    if not 0 <= args.port < 65536:
        return f"--port: {args.port} is not a port number"
    if not math.isfinite(args.decode_delay_ms) or args.decode_delay_ms < 0:
        return f"--decode-delay-ms: {args.decode_delay_ms} must be a non-negative number"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return f"--device: {args.device!r} but torch sees no CUDA device"
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    problem = _check_args(args)
    if problem is not None:
        print(f"policy server: {problem}", file=sys.stderr)
        return 2
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        model = load_pretrained(args.model, device=args.device)
    except ValueError as err:
        print(f"policy server: {err}", file=sys.stderr)
        return 2
    try:
        server = build_server(
            model,
            model_path=str(Path(args.model)),
            host=args.host,
            port=args.port,
            weight_version=args.weight_version,
            seed=args.seed,
            decode_delay_ms=args.decode_delay_ms,
            max_running_requests=args.max_running_requests,
            max_prefill_tokens=args.max_prefill_tokens,
            served_model_name=args.served_model_name,
            incremental_streaming_output=args.incremental_streaming_output,
            max_body_bytes=args.max_body_bytes,
            log_requests=args.log_requests,
        )
    except OSError as err:
        print(f"policy server: cannot listen on {args.host}:{args.port}: {err}", file=sys.stderr)
        return 2

    def stop(signum: int, frame: Any) -> None:
        # shutdown() waits for serve_forever to return: call it off the main thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"policy server listening on {server.url}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        server.scheduler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
