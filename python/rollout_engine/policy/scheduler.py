"""The policy server's scheduler: one thread that owns the model and its KV cache and does continuous
batching — each iteration prefills the requests it admits (one right-padded forward) and decodes one
token for every running request (one batched forward over the cache), then hands each request the
tokens it got.

Everything that changes the model or the set of requests — pause, continue, abort, a weight update —
is a command run by this thread *between* iterations, never during a forward. So every token is
sampled under exactly one set of weights, and the tokens handed out in one iteration carry the
version that sampled them: a streamed chunk never mixes versions, and a weight update always falls
on a chunk boundary.

SGLang's behaviour reproduced here (python/sglang/srt/managers/scheduler.py @0003215cf1464f44b389cd0b18d0b4c56f2a3da6
unless said otherwise):

- pause_generation ``in_place``: the requests stay where they are, KV cache and all; nothing is
  scheduled until continue_generation. After a weight update they go on decoding over keys and
  values computed with the old weights (so their next tokens match no single set of weights).
- ``retract``: running requests give up their KV cache and go back to the waiting queue
  (retract_all); on continue they are prefilled again, prompt + output so far, under the weights of
  that moment. ``num_retractions`` counts it (tokenizer_manager.py @001067fffe33427bee0ed2f007fb7551a1d76b44).
- ``abort`` (the default): every request in flight ends at once with finish_reason
  ``{"type": "abort"}`` and the tokens it has; requests that arrive after the pause wait
  (TokenizerManager.pause_generation: ``is_pause`` set in every mode, new requests hold at
  generate_request until continue).
- abort_request: by ``rid`` (every request whose rid starts with it, Scheduler.abort_request) or
  ``abort_all``; a rid that is not in flight is ignored (TokenizerManager.abort_request).
- update_weights_from_disk while paused applies at once; otherwise it waits until the requests that
  arrived before it have finished, new ones queuing behind it (TokenizerManager.update_weights_from_disk:
  the model_update_lock writer, tokenizer_manager.py @001067ff). ``flush_cache`` (default true) cannot
  flush a KV cache that requests paused in place still hold: SGLang asserts there
  ("Cache flush failed after updating weights", scheduler_components/weight_updater.py
  @00a2ca2e56d59f0a19186d7a8a58bdda5201023f); this server refuses the update instead, weights
  unchanged, and says to send ``flush_cache: false``.
- The weight version changes only when the update names one (Scheduler.record_weight_version_change:
  none or the same version is a no-op).
- Finish checks in SGLang's order (Req.check_finished, schedule_batch.py
  @000eaffacf048e51b64d4d72985ef8f0b7054b39): max_new_tokens first (``{"type": "length", "length": n}``),
  then a stop token or the eos token unless ``ignore_eos`` (``{"type": "stop", "matched": id}``), then
  a stop string (``{"type": "stop", "matched": "..."}``); an abort is
  ``{"type": "abort", "message": "Aborted", "status_code": null, "err_type": null}`` (FINISH_ABORT).
"""
from __future__ import annotations

import collections
import math
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import torch

from . import vocab
from .model import KVCache, TinyLM, load_state, read_config
from .sampling import SamplingParams, sample, truncated_logprobs

PAUSE_MODES = ("abort", "retract", "in_place")


def finish_length(length: int) -> Dict[str, Any]:
    return {"type": "length", "length": length}


def finish_abort(message: str = "Aborted") -> Dict[str, Any]:
    return {"type": "abort", "message": message, "status_code": None, "err_type": None}


@dataclass
class Update:
    """What a request got since its last update: the tokens sampled, their logprobs, the weight
    version that sampled each, and the finish reason once it ended. A streamed request gets one per
    iteration (one version each); a whole one only its last, holding everything — its HTTP thread is
    not woken for every token."""

    ids: List[int]
    logprobs: List[float]
    top: List[List[Tuple[float, int]]]
    #: Per token, the weight version that sampled it.
    versions: List[str]
    #: The server's version when the update was made (a reply without tokens reports it).
    version: str
    finish: Optional[Dict[str, Any]] = None
    retractions: int = 0
    #: Set when the server stopped: the request ends with this error, not a finish reason.
    error: Optional[str] = None


@dataclass(eq=False)
class Request:
    rid: str
    prompt: List[int]
    params: SamplingParams
    seed: int
    top_n: int = 0
    #: Deliver every iteration's tokens as they come (a streamed reply), or only the whole at the end.
    stream: bool = True
    #: SGLang's logprob_start_len: with max_new_tokens 0, score the prompt from here (-1: do not).
    logprob_start_len: int = -1
    #: Set with the finish of a scoring request: the logprob of each prompt id from logprob_start_len
    #: on, the first None (SGLang pads it), under the weights current when it ran.
    input_logprobs: Optional[List[Optional[float]]] = None
    # Set by the scheduler.
    seq: int = 0
    output: List[int] = field(default_factory=list)
    slot: Optional[int] = None
    kv_len: int = 0
    retractions: int = 0
    finished: bool = False
    updates: "queue.Queue[Update]" = field(default_factory=queue.Queue)
    pending: Optional[Update] = None

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.output)


@dataclass(eq=False)
class _Command:
    kind: str
    args: Dict[str, Any]
    seq: int
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None


@dataclass
class Counters:
    requests: int = 0
    finished: int = 0
    aborted: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    generated_tokens: int = 0
    forward_passes: int = 0
    weight_updates: int = 0
    retractions: int = 0


class SchedulerStopped(RuntimeError):
    pass


class Scheduler:
    def __init__(
        self,
        model: TinyLM,
        *,
        model_path: str,
        weight_version: str = "default",
        seed: int = 0,
        max_running_requests: int = 64,
        max_prefill_tokens: int = 8192,
        decode_delay_ms: float = 0.0,
    ) -> None:
        self.model = model
        self.config = model.config
        self.device = model.embed.weight.device
        self.model_path = model_path
        self.version = weight_version
        self.max_running_requests = max_running_requests
        self.max_prefill_tokens = max_prefill_tokens
        self.decode_delay_s = decode_delay_ms / 1000.0
        self.cache = KVCache(self.config, max_running_requests, self.device)
        self.counters = Counters()
        self.paused = False
        self.pause_mode: Optional[str] = None
        self._rng = random.Random(seed)
        self._cond = threading.Condition()
        self._seq = 0
        self._incoming: Deque[Request] = collections.deque()
        self._commands: List[_Command] = []
        self._in_flight: Dict[str, Request] = {}  # rid → request, for duplicate rids and abort by rid
        # Owned by the scheduler thread.
        self._waiting: Deque[Request] = collections.deque()
        self._running: List[Request] = []
        self._stopping = False
        self._last_throughput = 0.0
        self._thread = threading.Thread(target=self._run, name="policy-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------------
    # Called from HTTP threads
    # ------------------------------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Queues ``request``; raises ValueError naming a rid already in flight."""
        with self._cond:
            if self._stopping:
                raise SchedulerStopped("the server is shutting down")
            if request.rid in self._in_flight:
                raise ValueError(f"rid: {request.rid!r} is already in flight (request ids must be unique)")
            self._seq += 1
            request.seq = self._seq
            self._in_flight[request.rid] = request
            self._incoming.append(request)
            self.counters.requests += 1
            self.counters.prompt_tokens += len(request.prompt)
            self._cond.notify_all()

    def draw_seed(self) -> int:
        """A seed for a request that brought none, from the server's seeded generator."""
        with self._cond:
            return self._rng.getrandbits(63)

    def is_in_flight(self, rid: str) -> bool:
        with self._cond:
            return rid in self._in_flight

    def _command(self, kind: str, **args: Any) -> Any:
        with self._cond:
            if self._stopping:
                raise SchedulerStopped("the server is shutting down")
            self._seq += 1
            command = _Command(kind, args, self._seq)
            self._commands.append(command)
            self._cond.notify_all()
        command.done.wait()
        if isinstance(command.result, BaseException):
            raise command.result
        return command.result

    def abort(self, rid: str = "", abort_all: bool = False) -> int:
        """Ends the matching requests with an abort (SGLang's: every rid that starts with ``rid``); returns how many."""
        return int(self._command("abort", rid=rid, abort_all=abort_all, only=None))

    def abort_one(self, request: Request) -> None:
        """Ends ``request`` alone (its client hung up), if it is still in flight."""
        self._command("abort", rid=request.rid, abort_all=False, only=request)

    def pause(self, mode: str) -> None:
        self._command("pause", mode=mode)

    def resume(self) -> None:
        self._command("continue")

    def update_weights(
        self, model_path: str, weight_version: Optional[str], flush_cache: bool, abort_all_requests: bool
    ) -> Tuple[bool, str]:
        result: Tuple[bool, str] = self._command(
            "update",
            model_path=model_path,
            weight_version=weight_version,
            flush_cache=flush_cache,
            abort_all_requests=abort_all_requests,
        )
        return result

    def set_version(self, new_version: str, abort_all_requests: bool) -> None:
        self._command("version", new_version=new_version, abort_all_requests=abort_all_requests)

    def flush_cache(self) -> bool:
        return bool(self._command("flush"))

    def state(self) -> Dict[str, Any]:
        with self._cond:
            waiting = len(self._waiting) + len(self._incoming)
            running = len(self._running)
        c = self.counters
        return {
            "num_running_reqs": running,
            "num_waiting_reqs": waiting,
            "paused": self.paused,
            "pause_mode": self.pause_mode,
            "weight_version": self.version,
            "requests_total": c.requests,
            "requests_finished": c.finished,
            "requests_aborted": c.aborted,
            "prompt_tokens_total": c.prompt_tokens,
            "prefill_tokens_total": c.prefill_tokens,
            "generated_tokens_total": c.generated_tokens,
            "forward_passes": c.forward_passes,
            "weight_updates": c.weight_updates,
            "retractions": c.retractions,
            "last_gen_throughput": round(self._last_throughput, 2),
        }

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    # ------------------------------------------------------------------------------------------
    # The scheduler thread
    # ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while True:
                        self._waiting.extend(self._incoming)
                        self._incoming.clear()
                        self._run_commands()
                        if self._stopping:
                            break
                        admitted, decoding = self._plan()
                        if admitted or decoding:
                            break
                        self._cond.wait()
                if self._stopping:
                    break
                started = time.perf_counter()
                made = self._iterate(admitted, decoding)
                elapsed = time.perf_counter() - started
                if made and elapsed > 0:
                    self._last_throughput = made / elapsed
                if self.decode_delay_s > 0:
                    time.sleep(self.decode_delay_s)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            self._waiting.extend(self._incoming)
            self._incoming.clear()
            for request in [*self._waiting, *self._running]:
                if not request.finished:
                    request.finished = True
                    self._deliver(request, [], [], [], self.version, error="the policy server is shutting down")
            self._waiting.clear()
            self._running.clear()
            self._in_flight.clear()
            for command in self._commands:
                command.result = SchedulerStopped("the server is shutting down")
                command.done.set()
            self._commands.clear()

    def _run_commands(self) -> None:
        """Runs queued commands in order (the lock is held). An update that must wait for the
        requests older than it stays queued, and so do the updates behind it."""
        kept: List[_Command] = []
        for command in self._commands:
            if command.kind == "update" and (kept and any(k.kind == "update" for k in kept) or self._must_wait(command)):
                kept.append(command)
                continue
            try:
                command.result = getattr(self, f"_do_{command.kind}")(command)
            except Exception as err:  # a command must answer its caller, whatever happened
                command.result = err
            command.done.set()
        self._commands = kept

    def _must_wait(self, command: _Command) -> bool:
        if self.paused:
            return False
        return any(r.seq < command.seq for r in [*self._waiting, *self._running])

    def _blocking_seq(self) -> float:
        return min((c.seq for c in self._commands if c.kind == "update"), default=math.inf)

    def _plan(self) -> Tuple[List[Request], List[Request]]:
        """The requests to prefill (admitted now) and those to decode this iteration."""
        if self.paused:
            return [], []
        decoding = [r for r in self._running if r.slot is not None]
        admitted: List[Request] = []
        budget = self.max_prefill_tokens
        limit = self._blocking_seq()
        free = self.cache.free
        skipped: List[Request] = []
        while self._waiting and free > 0:
            request = self._waiting[0]
            if request.seq > limit:
                # Behind a weight update that waits for older requests: it holds until the update ran.
                skipped.append(self._waiting.popleft())
                continue
            if admitted and request.length > budget:
                break
            self._waiting.popleft()
            if request.params.max_new_tokens == 0 and not request.output:
                # Nothing to sample: SGLang prefills and answers 0 tokens with finish length 0, with the
                # prompt's logprobs when asked (logprob_start_len >= 0).
                if request.logprob_start_len >= 0:
                    request.input_logprobs = self._score(request)
                self._finish(request, finish_length(0), [], [], [])
                continue
            budget -= request.length
            request.slot = self.cache.allocate()
            free -= 1
            admitted.append(request)
            self._running.append(request)
        self._waiting.extendleft(reversed(skipped))
        return admitted, decoding

    # ------------------------------------------------------------------------------------------

    def _score(self, r: Request) -> List[Optional[float]]:
        """The logprob of each prompt id from ``logprob_start_len`` on given the ones before it, under the
        distribution a token is sampled from with the request's settings (temperature and truncation,
        as ``output_token_logprobs`` reports them), through the full-sequence forward: the decode path's
        KV cache is not used, so comparing with sampled logprobs measures the server's own numerical
        noise (docs/AUDIT.md). SGLang's shape: the first entry None (scheduler_output_processor_mixin.py
        _process_input_token_logprobs @5294b03c42e7f098131b9825a9a2b23e10f4ae35)."""
        start = min(r.logprob_start_len, len(r.prompt) - 1)
        out: List[Optional[float]] = [None]
        if start + 1 >= len(r.prompt):
            return out
        p = r.params
        with torch.no_grad():
            ids = torch.tensor([r.prompt], dtype=torch.long, device=self.device)
            logits = self.model(ids)[0, start:-1].float()
            rows = logits.shape[0]
            # The same tensors sample() builds for a row of these settings.
            lp = truncated_logprobs(
                logits,
                torch.tensor([p.temperature] * rows, device=self.device),
                torch.tensor([min(p.top_k, logits.shape[-1])] * rows, device=self.device),
                torch.tensor([p.top_p] * rows, device=self.device),
                torch.tensor([p.min_p] * rows, device=self.device),
            )
            targets = ids[0, start + 1 :]
            out += lp.gather(-1, targets[:, None])[:, 0].tolist()
        self.counters.prefill_tokens += len(r.prompt)
        return out

    def _banned(self, requests: List[Request]) -> Optional[torch.Tensor]:
        """Stop tokens a request may not sample yet (min_new_tokens), as a ``[B, V]`` mask."""
        rows = [i for i, r in enumerate(requests) if len(r.output) < r.params.min_new_tokens]
        if not rows:
            return None
        mask = torch.zeros((len(requests), self.config.vocab_size), dtype=torch.bool)
        for i in rows:
            params = requests[i].params
            stops = set(params.stop_token_ids)
            if not params.ignore_eos:
                stops.add(self.config.eos_token_id)
            for token in stops:
                mask[i, token] = True
        return mask.to(self.device)

    def _sample(self, requests: List[Request], logits: torch.Tensor) -> Tuple[List[int], List[float], List[List[Tuple[float, int]]]]:
        draw = sample(
            logits,
            [r.params for r in requests],
            [r.seed for r in requests],
            # The position the new token takes in the whole sequence: the same for a continuation
            # sent as prompt + tokens so far, so a seeded draw repeats under the same weights.
            [r.length for r in requests],
            self._banned(requests),
            [r.top_n for r in requests] if any(r.top_n for r in requests) else (),
        )
        return draw.tokens, draw.logprobs, draw.top

    def _iterate(self, admitted: List[Request], decoding: List[Request]) -> int:
        version = self.version
        made = 0
        if admitted:
            sequences = [r.prompt + r.output for r in admitted]
            logits = self.model.prefill(self.cache, [r.slot for r in admitted if r.slot is not None], sequences)
            for r, s in zip(admitted, sequences):
                r.kv_len = len(s)
                self.counters.prefill_tokens += len(s)
            tokens, logprobs, top = self._sample(admitted, logits)
            self.counters.forward_passes += 1
            for i, r in enumerate(admitted):
                self._append(r, tokens[i], logprobs[i], top[i] if top else [], version)
            made += len(admitted)
        if decoding:
            slots = torch.tensor([r.slot for r in decoding], dtype=torch.long, device=self.device)
            positions = torch.tensor([r.kv_len for r in decoding], dtype=torch.long, device=self.device)
            last = torch.tensor([r.output[-1] for r in decoding], dtype=torch.long, device=self.device)
            logits = self.model.decode(self.cache, slots, positions, last)
            for r in decoding:
                r.kv_len += 1
            tokens, logprobs, top = self._sample(decoding, logits)
            self.counters.forward_passes += 1
            for i, r in enumerate(decoding):
                self._append(r, tokens[i], logprobs[i], top[i] if top else [], version)
            made += len(decoding)
        self.counters.generated_tokens += made
        return made

    def _append(self, r: Request, token: int, logprob: float, top: List[Tuple[float, int]], version: str) -> None:
        r.output.append(token)
        finish = self._check_finished(r, token)
        if finish is not None:
            self._finish(r, finish, [token], [logprob], [top] if r.top_n else [], version)
        else:
            self._deliver(r, [token], [logprob], [top] if r.top_n else [], version)

    def _check_finished(self, r: Request, token: int) -> Optional[Dict[str, Any]]:
        params = r.params
        if params.max_new_tokens is not None and len(r.output) >= params.max_new_tokens:
            return finish_length(params.max_new_tokens)
        if not params.ignore_eos and (token == self.config.eos_token_id or token in params.stop_token_ids):
            return {"type": "stop", "matched": token}
        if params.stop:
            longest = max(len(s) for s in params.stop)
            # Enough trailing tokens to hold the longest stop string (a token is at least one character).
            tail = _text(r.output[-longest:], params.skip_special_tokens)
            for stop in params.stop:
                if stop in tail:
                    return {"type": "stop", "matched": stop}
        if r.length >= self.config.max_len:
            return finish_length(len(r.output))
        return None

    def _release(self, r: Request) -> None:
        if r.slot is not None:
            self.cache.release(r.slot)
            r.slot = None
        r.kv_len = 0

    def _finish(
        self,
        r: Request,
        finish: Dict[str, Any],
        ids: List[int],
        logprobs: List[float],
        top: List[List[Tuple[float, int]]],
        version: Optional[str] = None,
    ) -> None:
        self._release(r)
        r.finished = True
        if r in self._running:
            self._running.remove(r)
        with self._cond:
            self._in_flight.pop(r.rid, None)
        if finish["type"] == "abort":
            self.counters.aborted += 1
        else:
            self.counters.finished += 1
        self._deliver(r, ids, logprobs, top, version or self.version, finish=finish)

    def _deliver(
        self,
        r: Request,
        ids: List[int],
        logprobs: List[float],
        top: List[List[Tuple[float, int]]],
        version: str,
        finish: Optional[Dict[str, Any]] = None,
        error: Optional[str] = None,
    ) -> None:
        update = r.pending or Update([], [], [], [], version)
        update.ids += ids
        update.logprobs += logprobs
        update.top += top
        update.versions += [version] * len(ids)
        update.version = self.version if not ids else version
        update.retractions = r.retractions
        update.finish = finish
        update.error = error
        if r.stream or finish is not None or error is not None:
            r.pending = None
            r.updates.put(update)
        else:
            r.pending = update

    # ------------------------------------------------------------------------------------------
    # Commands (the scheduler thread, lock held)
    # ------------------------------------------------------------------------------------------

    def _abort_matching(self, match: Callable[[Request], bool]) -> int:
        targets = [r for r in [*self._running, *self._waiting] if not r.finished and match(r)]
        for r in targets:
            if r in self._waiting:
                self._waiting.remove(r)
            self._finish(r, finish_abort(), [], [], [])
        return len(targets)

    def _do_abort(self, command: _Command) -> int:
        rid: str = command.args["rid"]
        abort_all: bool = command.args["abort_all"]
        only: Optional[Request] = command.args["only"]
        if only is not None:
            return self._abort_matching(lambda r: r is only)
        if not abort_all and not rid:
            return 0  # an empty rid would match every request (TokenizerManager.abort_request ignores it)
        return self._abort_matching(lambda r: abort_all or r.rid.startswith(rid))

    def _do_pause(self, command: _Command) -> None:
        mode = command.args["mode"]
        self.paused = True
        self.pause_mode = mode
        if mode == "abort":
            # Only what arrived before the pause: later requests wait for continue_generation.
            self._abort_matching(lambda r: r.seq < command.seq)
        elif mode == "retract":
            retracted = [r for r in self._running if r.slot is not None]
            for r in retracted:
                self._release(r)
                r.retractions += 1
                self.counters.retractions += 1
                self._running.remove(r)
            self._waiting.extendleft(reversed(retracted))

    def _do_continue(self, command: _Command) -> None:
        self.paused = False
        self.pause_mode = None

    def _do_flush(self, command: _Command) -> bool:
        # SGLang flushes only a fully idle scheduler (Scheduler.flush_cache → is_fully_idle).
        return not self._running and not self._waiting

    def _do_version(self, command: _Command) -> None:
        if command.args["abort_all_requests"]:
            self._abort_matching(lambda r: True)
        self.version = command.args["new_version"]

    def _do_update(self, command: _Command) -> Tuple[bool, str]:
        path: str = command.args["model_path"]
        if command.args["abort_all_requests"]:
            self._abort_matching(lambda r: True)
        holders = [r for r in self._running if r.slot is not None]
        if command.args["flush_cache"] and holders:
            return (
                False,
                f"flush_cache: true, but {len(holders)} request(s) paused in place hold a KV cache computed with the current "
                "weights, which cannot be flushed (SGLang asserts 'Cache flush failed after updating weights' here); send "
                "flush_cache: false to keep it, or pause with mode retract. The weights were not changed.",
            )
        try:
            config = read_config(path)
            if config != self.config:
                diff = ", ".join(
                    f"{k} {v!r} (served: {getattr(self.config, k)!r})"
                    for k, v in config.to_dict().items()
                    if getattr(self.config, k) != v
                )
                raise ValueError(f"model_path: {path!r} is a different model: {diff}")
            state = load_state(path, config)
        except ValueError as err:
            return False, f"Failed to update weights: {err}. The weights were not changed."
        with torch.no_grad():
            self.model.load_state_dict(state)
        self.model_path = path
        self.counters.weight_updates += 1
        version = command.args["weight_version"]
        if version is not None:
            self.version = version
        return True, "Succeeded to update model weights."


def _text(ids: List[int], skip_special_tokens: bool) -> str:
    special = len(vocab.SPECIAL_TOKENS)
    return "".join(
        vocab.TOKENS[i] for i in ids if 0 <= i < vocab.VOCAB_SIZE and not (skip_special_tokens and i < special)
    )


def output_text(ids: List[int], params: SamplingParams, finish: Optional[Dict[str, Any]]) -> str:
    """``text`` of a reply: the output decoded (special tokens skipped unless asked), the matched stop
    token or string cut unless ``no_stop_trim`` (SGLang's DetokenizerManager.trim_matched_stop)."""
    if finish is not None and finish.get("type") == "stop" and not params.no_stop_trim:
        matched = finish.get("matched")
        if isinstance(matched, int) and ids and ids[-1] == matched:
            return _text(ids[:-1], params.skip_special_tokens)
        if isinstance(matched, str):
            text = _text(ids, params.skip_special_tokens)
            at = text.find(matched)
            return text[:at] if at >= 0 else text
    return _text(ids, params.skip_special_tokens)
