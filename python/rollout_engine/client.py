"""A client for the engine's control API (``rollout serve``, ``engine.listen()``).

The contract it keeps for the trainer:

- **A train step is asked for by number**, always: ``POST /batch {"trainStep": n}``. Asked again for
  the step it handed out last, the engine hands out the same batch, so a reply lost on the way (a
  reset connection, a timeout, the engine restarted from its checkpoint) is recovered by asking again
  — the retry can neither skip a batch nor take the next one twice.
- **Retries** with exponential backoff on what may pass: no answer (refused, reset, timed out) and
  5xx; 429 after its ``Retry-After``. Never on another 4xx: a refused step or body is the trainer's
  bug, and asking again would hide it. Every route is safe to send again: a batch by its step, a
  pause while paused, a resume with the same model step, a checkpoint to the same path.
- **Not-NORMAL batches are outcomes**, not errors: :meth:`ControlClient.batch` returns them
  (``status`` EXPIRED_BATCH / UPDATE_WEIGHT_AND_ABORT) and :meth:`ControlClient.batches` hands
  them to the loop as :class:`ExpiredBatch` / :class:`WeightUpdateInProgress` so it can sync weights.
"""
from __future__ import annotations

import http.client
import json
import random
import socket
import time
import urllib.parse
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generator, Iterator, Mapping, Optional, Tuple, Union, cast

import msgpack

from .batch import Batch, decode_batch
from .errors import ControlApiError, EngineUnreachableError
from .types import CheckpointReply, EngineStatus, Health, PauseReport, ResumeReply

# What "no answer" looks like from http.client: the request may or may not have reached the engine,
# which is why only routes that are safe to repeat are sent again (all of them, see the module doc).
_TRANSPORT_ERRORS = (ConnectionError, socket.timeout, TimeoutError, http.client.HTTPException, OSError)


class IncompleteReply(Exception):
    """A reply cut short on the way (its body shorter than its length, or not decodable): asked again."""


@dataclass
class RetryPolicy:
    """How long to keep asking: ``attempts`` in all, waiting ``backoff_s × 2^k`` (capped, with jitter) between."""

    attempts: int = 10
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def delay(self, attempt: int) -> float:
        base = min(self.max_backoff_s, self.backoff_s * 2.0**attempt)
        return base * (0.5 + random.random() / 2)


@dataclass
class ExpiredBatch:
    """EXPIRED_BATCH: the served weights are too stale for ``train_step``. Sync weights, then it is asked again."""

    train_step: int


@dataclass
class WeightUpdateInProgress:
    """UPDATE_WEIGHT_AND_ABORT: the engine is paused for a weight update. Resume, then it is asked again."""

    train_step: int


BatchOutcome = Union[Batch, ExpiredBatch, WeightUpdateInProgress]


class ControlClient:
    """One engine's control API. Not thread-safe: one connection, used by one trainer loop.

    ``url`` is the API's base (``http://127.0.0.1:8100``); ``token`` the bearer token, when the
    engine requires one. Batches come as msgpack (``use_msgpack``, the default): token arrays arrive
    as raw bytes and decode to numpy views without a copy. ``timeout_s`` bounds each request (a
    ``POST /batch`` waits while the batch is produced, a ``POST /pause`` while groups come back).
    """

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        *,
        use_msgpack: bool = True,
        timeout_s: float = 600.0,
        retry: Optional[RetryPolicy] = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"url must be http(s)://host:port (got {url!r})")
        self._host: str = parsed.hostname
        self.url = url.rstrip("/")
        self.token = token
        self.use_msgpack = use_msgpack
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self._parsed = parsed
        self._base_path = parsed.path.rstrip("/")
        self._conn: Optional[http.client.HTTPConnection] = None
        self._wait_s = 0.0  # the wait before the next attempt: set by the failure that calls for it

    # --- routes ---------------------------------------------------------------------------------

    def health(self) -> Health:
        """``GET /health``: liveness, no token needed."""
        return cast(Health, self.request("GET", "/health"))

    def status(self) -> EngineStatus:
        """``GET /status``: model step, next train step, paused, group counts, buffer counts, inference URL."""
        return cast(EngineStatus, self.request("GET", "/status"))

    def batch(self, train_step: int, *, compact: bool = False) -> Batch:
        """``POST /batch`` for ``train_step``: the batch, or a not-NORMAL status with no groups.

        ``compact`` asks for the compact form (expanded while decoding: the result is the same).
        Asked again for the last step handed out, this returns the same batch.
        """
        if not isinstance(train_step, int) or isinstance(train_step, bool) or train_step < 1:
            raise ValueError(f"train_step must be a positive integer (got {train_step!r})")
        body: Dict[str, Any] = {"trainStep": train_step}
        if compact:
            body["compact"] = True
        return decode_batch(self.request("POST", "/batch", body))

    def pause(self) -> PauseReport:
        """``POST /pause``: stop production for a weight update; answers once every group in flight is back."""
        return cast(PauseReport, self.request("POST", "/pause"))

    def resume(self, model_step: int, weight_version: Optional[str] = None) -> ResumeReply:
        """``POST /resume``: the new weights are loaded; tokens from now on carry ``model_step``."""
        body: Dict[str, Any] = {"modelStep": model_step}
        if weight_version is not None:
            body["weightVersion"] = weight_version
        return cast(ResumeReply, self.request("POST", "/resume", body))

    def checkpoint(self, path: str) -> CheckpointReply:
        """``POST /checkpoint``: write the engine's state to ``path``, a ``.ckpt`` file relative to its run dir."""
        return cast(CheckpointReply, self.request("POST", "/checkpoint", {"path": path}))

    def metrics(self) -> str:
        """``GET /metrics``: Prometheus text."""
        return cast(str, self.request("GET", "/metrics"))

    # --- the trainer loop -----------------------------------------------------------------------

    def batches(
        self,
        start_step: Optional[int] = None,
        *,
        steps: Optional[int] = None,
        compact: bool = False,
    ) -> Iterator[BatchOutcome]:
        """Batches for ``start_step``, ``start_step + 1``, … (default: the engine's next train step).

        Yields a :class:`Batch` per step; when the engine answers EXPIRED_BATCH or
        UPDATE_WEIGHT_AND_ABORT it yields :class:`ExpiredBatch` / :class:`WeightUpdateInProgress`
        instead and, once the loop body returns (having synced weights or resumed), asks for the
        same step again. Stops after ``steps`` batches, or never.
        """
        step = self.status()["nextTrainStep"] if start_step is None else start_step
        taken = 0
        while steps is None or taken < steps:
            batch = self.batch(step, compact=compact)
            if batch.status == "EXPIRED_BATCH":
                yield ExpiredBatch(step)
                continue
            if batch.status == "UPDATE_WEIGHT_AND_ABORT":
                yield WeightUpdateInProgress(step)
                continue
            yield batch
            taken += 1
            step += 1

    @contextmanager
    def weight_update(self, model_step: int, weight_version: Optional[str] = None) -> Generator[PauseReport, None, None]:
        """Pause, yield the pause report while the body loads the weights, resume with ``model_step``.

        If the body raises, the engine stays paused (nothing resumes on weights that did not load)
        and the error propagates; resume it yourself once the weights are in.
        """
        report = self.pause()
        yield report
        self.resume(model_step, weight_version)

    # --- transport ------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None) -> Any:
        """One route, with the retries of the module doc; the decoded answer."""
        last: Optional[BaseException] = None
        route = f"{method} {path}"
        for attempt in range(self.retry.attempts):
            if attempt > 0:
                time.sleep(self._wait_s)
            try:
                status, headers, payload = self._send(method, path, body)
                value = self._decode(headers, payload)
            except (*_TRANSPORT_ERRORS, IncompleteReply) as err:
                self._close()
                last = err
                self._wait_s = self.retry.delay(attempt)
                continue
            if status < 400:
                return value
            code, message = _error_of(value, status)
            if status == 429 or status >= 500:
                last = ControlApiError(status, code, message, route)
                retry_after = headers.get("retry-after")
                self._wait_s = max(self.retry.delay(attempt), float(retry_after) if retry_after and retry_after.isdigit() else 0.0)
                continue
            raise ControlApiError(status, code, message, route)
        if isinstance(last, ControlApiError):
            raise last
        assert last is not None
        raise EngineUnreachableError(route, self.retry.attempts, last)

    def _send(self, method: str, path: str, body: Optional[Mapping[str, Any]]) -> Tuple[int, Dict[str, str], bytes]:
        conn = self._connection()
        headers: Dict[str, str] = {"accept": "application/msgpack" if self.use_msgpack else "application/json"}
        data: Optional[bytes] = None
        if body is not None:
            # JSON bodies: they are small, and JSON is the type every engine version reads.
            data = json.dumps(body).encode()
            headers["content-type"] = "application/json"
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        conn.request(method, self._base_path + path, body=data, headers=headers)
        res = conn.getresponse()
        payload = res.read()
        if res.will_close:
            self._close()
        return res.status, {k.lower(): v for k, v in res.getheaders()}, payload

    def _decode(self, headers: Mapping[str, str], payload: bytes) -> Any:
        # A connection cut inside the headers leaves http.client reading "until close" with no length to
        # check: a body that is short of its length, or does not parse, is a lost reply, not an answer.
        declared = headers.get("content-length")
        if declared is None and headers.get("transfer-encoding", "").lower() != "chunked":
            raise IncompleteReply(f"{len(payload)} bytes of a reply with neither a length nor chunks (cut inside its headers)")
        if declared is not None and (not declared.isdigit() or int(declared) != len(payload)):
            raise IncompleteReply(f"{len(payload)} bytes of a reply declaring content-length {declared}")
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        try:
            if kind in ("application/msgpack", "application/x-msgpack"):
                return msgpack.unpackb(payload, raw=False)
            if kind == "application/json":
                return json.loads(payload) if payload else {}
        except ValueError as err:  # msgpack's and json's errors for a truncated or garbled body
            raise IncompleteReply(f"a {kind} reply that does not decode ({err})") from None
        return payload.decode("utf-8", errors="replace")

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls: Callable[..., http.client.HTTPConnection] = http.client.HTTPSConnection if self._parsed.scheme == "https" else http.client.HTTPConnection
            self._conn = cls(self._host, self._parsed.port, timeout=self.timeout_s)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Close the connection (the next request opens another)."""
        self._close()

    def __enter__(self) -> "ControlClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _error_of(value: Any, status: int) -> Tuple[str, str]:
    if isinstance(value, dict) and isinstance(value.get("error"), dict):
        err = value["error"]
        return str(err.get("code", f"HTTP_{status}")), str(err.get("message", ""))
    return f"HTTP_{status}", str(value)[:200]


__all__ = ["ControlClient", "RetryPolicy", "ExpiredBatch", "WeightUpdateInProgress", "BatchOutcome"]
