#!/usr/bin/env python3
"""A real policy learns through the engine by GRPO, and every trained token checks out.

    python3 examples/grpo_learn.py --strategy sync  --out runs/learn-sync
    python3 examples/grpo_learn.py --strategy async --out runs/learn-async          # + partial rollouts, in-place pause
    python3 examples/grpo_learn.py --strategy async --pause-mode abort --out runs/learn-abort
    python3 examples/grpo_learn.py --device cuda --large --out runs/learn-gpu       # the GPU script's run

It initialises the reference policy (``rollout_engine.policy``: a small transformer over a character
vocabulary, seeded), saves it, starts the reference policy server on it (SGLang's native API, port 0),
and launches ``rollout serve`` on the built-in ``echo-digit`` task (each turn shows a digit; a turn
scores when the reply's first digit is that digit; ``messageCut: 0``, so every turn's prompt is the
whole conversation and later turns extend earlier ones). Then per train step it takes the batch, runs
the TOKEN CHECK, takes one Adam step on the clipped GRPO loss (advantages normalised within each group,
per turn; importance ratio against the logprobs the server recorded), saves the new weights, and loads
them into the server (``POST /update_weights_from_disk``) inside ``client.weight_update(model_step=k)``
— between the engine's pause and its resume — so the next tokens carry model step k.

The token check, for every token the trainer trains on: its logprob recomputed by the trainer under the
weights of the model step the engine tagged it with (the whole sequence — prompt, earlier turns,
observations — at the temperature it was sampled with) equals the recorded one within --tolerance;
the action mask covers exactly the response tokens; each later turn's prompt ids begin with the
previous turn's prompt + response ids (nothing re-tokenised); every tagged model step is one this
trainer produced. Tokens the engine marks inexact — sampled on a KV cache computed with earlier
weights (an in-place weight update), or in a turn that spans weight versions without a per-token
split — match no single set of weights: they are counted, and their drift against the tagged weights
is reported beside the check instead of inside it. Any other mismatch stops the run (exit 2) with a
line naming the rollout, the turn and the token.

Output: a line per step, a summary line, and in --out: ``curve.json`` and ``curve.csv`` (per-step mean
reward and check figures), ``curve.svg`` (the curve, drawn here: no plotting library needed), the
engine's and the server's logs. ``--plot OUT.svg RUN/curve.json …`` draws several runs into one SVG.
docs/LEARNING.md has the figures measured with the defaults.
"""
from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
try:
    import rollout_engine
except ImportError:  # run from a clone without `pip install ./python`: the package beside this file
    sys.path.insert(0, str(REPO / "python"))
    import rollout_engine

import torch

from rollout_engine import Batch, ExpiredBatch, Rollout, Turn
from rollout_engine.policy import ModelConfig, TinyLM, init_model, save_pretrained, token_logprobs
from rollout_engine.policy import vocab

TASK = "echo-digit"
SMALL = {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_len": 256}
LARGE = {"d_model": 256, "n_layers": 4, "n_heads": 8, "max_len": 256}
#: The name the server lists on /v1/models: the engine checks llm.model against it at start.
MODEL_NAME = "tiny-lm"
_LISTENING = re.compile(r"policy server listening on (http://\S+)")


class TokenCheckError(Exception):
    """A trained token whose record does not check out: the message names rollout, turn and token."""


class ServerError(Exception):
    """The policy server would not start, died, or refused a weight update."""


# --- the policy server -------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when this trainer dies in any way (SIGKILL included),
    where neither atexit nor a finally block runs."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: the finally block and atexit stop it
        pass


class PolicyServer:
    """``python3 -m rollout_engine.policy.server`` as a child process, its output in ``log_path``."""

    def __init__(self, model_dir: Path, log_path: Path, *, device: str, seed: int, weight_version: str, threads: int, startup_timeout_s: float = 120.0) -> None:
        self.log_path = log_path
        package_root = str(Path(rollout_engine.__file__).resolve().parents[1])
        env = dict(os.environ)
        # The child imports the same rollout_engine as this trainer, installed or from the clone.
        env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        argv = [sys.executable, "-m", "rollout_engine.policy.server", "--model", str(model_dir), "--host", "127.0.0.1", "--port", "0",
                "--device", device, "--weight-version", weight_version, "--seed", str(seed), "--served-model-name", MODEL_NAME]
        if threads > 0:
            argv += ["--threads", str(threads)]
        with open(log_path, "wb") as log:  # a fresh log: an earlier run's "listening" line must not be read
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        deadline = time.monotonic() + startup_timeout_s
        while True:
            match = _LISTENING.search(self.log())
            if match:
                self.url = match.group(1)
                break
            if self.process.poll() is not None:
                raise ServerError(f"the policy server exited with code {self.process.returncode} before it listened:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"the policy server did not listen within {startup_timeout_s:g} s:\n{self.log_tail()}")
            time.sleep(0.05)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.process.poll() is None

    def post(self, path: str, body: Dict[str, Any], timeout_s: float) -> Tuple[int, Dict[str, Any]]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST", headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as res:
                raw = res.read()
                return res.status, json.loads(raw) if raw else {}
        except urllib.error.HTTPError as err:  # SGLang answers a failed update with 400 and the same body
            raw = err.read()
            try:
                return err.code, json.loads(raw)
            except ValueError:
                return err.code, {"message": raw.decode(errors="replace")}

    def load_weights(self, model_dir: Path, version: str, timeout_s: float, *, keep_cache: bool) -> str:
        """SGLang's ``POST /update_weights_from_disk``: the server loads ``model_dir`` and reports ``version``.

        ``keep_cache`` (``flush_cache: false``) when generations are paused in place: their KV caches
        cannot be flushed (SGLang asserts; the reference server refuses the update). The price on a real
        SGLang is that its radix cache keeps prefixes computed with the old weights too, which later
        requests may reuse: stale-KV tokens no engine can see."""
        body: Dict[str, Any] = {"model_path": str(model_dir), "weight_version": version}
        if keep_cache:
            body["flush_cache"] = False
        status, reply = self.post("/update_weights_from_disk", body, timeout_s)
        if status != 200 or reply.get("success") is not True:
            raise ServerError(f"POST /update_weights_from_disk {model_dir} answered {status}: {reply.get('message', reply)}")
        return str(reply.get("message", ""))

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# --- the weights of every model step still referenced -------------------------------------------------


class WeightHistory:
    """A frozen copy of the policy per model step this trainer produced, dropped once no batch can hold
    tokens of it (older than the oldest step the engine may still serve: ``keep`` steps back)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.models: Dict[int, TinyLM] = {}
        self.produced: List[int] = []

    def add(self, step: int, model: TinyLM) -> None:
        frozen = copy.deepcopy(model).eval()
        for p in frozen.parameters():
            p.requires_grad_(False)
        self.models[step] = frozen
        self.produced.append(step)
        for old in [s for s in self.models if s < step - self.keep]:
            del self.models[old]

    def get(self, step: int, where: str) -> TinyLM:
        model = self.models.get(step)
        if model is None:
            if step not in self.produced:
                raise TokenCheckError(f"{where}: tagged with model step {step}, which this trainer never produced (it produced {self.produced[0]}..{self.produced[-1]})")
            raise TokenCheckError(f"{where}: tagged with model step {step}, older than the {self.keep} steps kept (a batch more stale than producer.maxStaleness allows)")
        return model


# --- the token check ----------------------------------------------------------------------------------


@dataclass
class Trained:
    """One rollout as the trainer trains on it, rebuilt from its turns (independently of ``Rollout.samples``)."""

    rollout: Rollout
    ids: np.ndarray  # int64 [T]
    action: np.ndarray  # bool [T]: response tokens
    logprobs: np.ndarray  # float32 [T]: recorded, on response tokens
    steps: np.ndarray  # int32 [T]: model step tag, -1 off the responses
    inexact: np.ndarray  # bool [T]: stale KV or a turn spanning versions
    turn_of: np.ndarray  # int32 [T]: index of the turn whose response holds the token, -1 elsewhere
    pos_in_turn: np.ndarray  # int32 [T]: the token's index within its turn's response
    advantage: np.ndarray  # float32 [T]
    temperature: float
    spans_turns: int = 0  # turns marked spans_versions (inexact whole: the per-token split is unknown)


@dataclass
class CheckStats:
    exact: int = 0
    max_abs: float = 0.0
    inexact: int = 0
    inexact_sum: float = 0.0
    inexact_max: float = 0.0
    multi_step_turns: int = 0
    multi_step_rollouts: int = 0
    spans_turns: int = 0
    step_tags: Counter = field(default_factory=Counter)

    def add(self, other: "CheckStats") -> None:
        self.exact += other.exact
        self.max_abs = max(self.max_abs, other.max_abs)
        self.inexact += other.inexact
        self.inexact_sum += other.inexact_sum
        self.inexact_max = max(self.inexact_max, other.inexact_max)
        self.multi_step_turns += other.multi_step_turns
        self.multi_step_rollouts += other.multi_step_rollouts
        self.spans_turns += other.spans_turns
        self.step_tags.update(other.step_tags)

    def drift(self) -> str:
        if self.inexact == 0:
            return "-"
        return f"mean {self.inexact_sum / self.inexact:.2e} max {self.inexact_max:.2e}"


def _where(r: Rollout, turn: int, token: Optional[int] = None) -> str:
    at = f"rollout {r.id} (group {r.group_id}, index {r.index}) turn {turn}"
    return at if token is None else f"{at} token {token}"


def build_sequence(r: Rollout, temperature: float) -> Trained:
    """The rollout's one token sequence, checked as it is built: each turn's prompt ids begin with the
    previous turn's prompt + response ids (the engine sent what the policy sampled, not a re-tokenisation)."""
    if not r.turns:
        raise TokenCheckError(f"rollout {r.id}: a completed rollout with no turn")
    ids: List[int] = []
    for i, t in enumerate(r.turns):
        if t.agent_id is not None:
            raise TokenCheckError(f"{_where(r, i)}: agent {t.agent_id!r} in a single-agent task")
        if t.prompt_ids is None or t.response_ids is None or t.logprobs is None:
            raise TokenCheckError(f"{_where(r, i)}: no token ids or logprobs (llm.api must be tokens)")
        if len(t.logprobs) != len(t.response_ids) or (t.model_steps is not None and len(t.model_steps) != len(t.response_ids)):
            raise TokenCheckError(f"{_where(r, i)}: {len(t.response_ids)} response ids but {len(t.logprobs)} logprobs / {None if t.model_steps is None else len(t.model_steps)} model steps")
        prompt = t.prompt_ids.tolist()
        if prompt[: len(ids)] != ids:
            at = next((p for p, (a, b) in enumerate(zip(prompt, ids)) if a != b), min(len(prompt), len(ids)))
            raise TokenCheckError(
                f"{_where(r, i)}: its prompt does not begin with turn {i - 1}'s prompt + response ids "
                f"(position {at}: {prompt[at] if at < len(prompt) else 'end'} where the sequence so far has {ids[at] if at < len(ids) else 'end'}): re-tokenised"
            )
        ids = prompt + t.response_ids.tolist()
    n = len(ids)
    action = np.zeros(n, dtype=bool)
    logprobs = np.zeros(n, dtype=np.float32)
    steps = np.full(n, -1, dtype=np.int32)
    inexact = np.zeros(n, dtype=bool)
    turn_of = np.full(n, -1, dtype=np.int32)
    pos_in_turn = np.full(n, -1, dtype=np.int32)
    for i, t in enumerate(r.turns):
        assert t.prompt_ids is not None and t.response_ids is not None and t.logprobs is not None
        a, m = len(t.prompt_ids), len(t.response_ids)
        action[a : a + m] = True
        logprobs[a : a + m] = t.logprobs
        steps[a : a + m] = t.model_steps if t.model_steps is not None else t.model_step
        stale = getattr(t, "stale_kv", None)
        if getattr(t, "spans_versions", False):
            inexact[a : a + m] = True
        elif stale is not None:
            if len(stale) != m:
                raise TokenCheckError(f"{_where(r, i)}: {len(stale)} stale_kv flags for {m} response tokens")
            inexact[a : a + m] = stale.astype(bool)
        turn_of[a : a + m] = i
        pos_in_turn[a : a + m] = np.arange(m)
        if np.isnan(t.logprobs).any():
            raise TokenCheckError(f"{_where(r, i, int(np.flatnonzero(np.isnan(t.logprobs))[0]))}: no logprob recorded (NaN)")
    spans = sum(1 for t in r.turns if getattr(t, "spans_versions", False))
    return Trained(r, np.asarray(ids, dtype=np.int64), action, logprobs, steps, inexact, turn_of, pos_in_turn,
                   np.zeros(n, dtype=np.float32), temperature, spans)


def check_sample_view(seq: Trained) -> None:
    """``Rollout.samples()`` — what a trainer built on the package trains on — is this very sequence,
    its action mask exactly the response tokens, with the same logprobs, tags and inexact flags."""
    r = seq.rollout
    samples = r.samples()
    if len(samples) != 1:
        raise TokenCheckError(f"rollout {r.id}: its turns make {len(samples)} samples, not one (the turns do not extend one another)")
    s = samples[0]
    if not np.array_equal(s.token_ids.astype(np.int64), seq.ids):
        raise TokenCheckError(f"rollout {r.id}: Rollout.samples() token ids differ from its last turn's prompt + response")
    bad = np.flatnonzero(s.action_mask != seq.action)
    if bad.size:
        p = int(bad[0])
        what = "a response token" if seq.action[p] else "a prompt or observation token"
        raise TokenCheckError(f"rollout {r.id} position {p}: the action mask is {bool(s.action_mask[p])} on {what}")
    for name, mine, theirs in (("logprobs", seq.logprobs, s.logprobs), ("model steps", seq.steps, s.model_steps)):
        bad = np.flatnonzero(seq.action & (mine != theirs))
        if bad.size:
            p = int(bad[0])
            raise TokenCheckError(f"{_where(r, int(seq.turn_of[p]), int(seq.pos_in_turn[p]))}: Rollout.samples() {name} {theirs[p]} where the turn has {mine[p]}")
    theirs_inexact = getattr(s, "inexact", None)
    if theirs_inexact is not None and not np.array_equal(np.asarray(theirs_inexact, dtype=bool) & seq.action, seq.inexact & seq.action):
        p = int(np.flatnonzero((np.asarray(theirs_inexact, dtype=bool) & seq.action) != (seq.inexact & seq.action))[0])
        raise TokenCheckError(f"{_where(r, int(seq.turn_of[p]), int(seq.pos_in_turn[p]))}: Sample.inexact {bool(theirs_inexact[p])} where the turn's flags say {bool(seq.inexact[p])}")


def pad(seqs: Sequence[Trained], device: torch.device) -> torch.Tensor:
    """Right-padded ids: causal attention keeps the padding out of every real position."""
    width = max(len(s.ids) for s in seqs)
    out = torch.full((len(seqs), width), vocab.PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s.ids)] = torch.from_numpy(s.ids)
    return out.to(device)


def token_check(seqs: List[Trained], history: WeightHistory, temperature: float, tolerance: float, device: torch.device) -> CheckStats:
    """Recompute every response token's logprob under the weights of its tagged model step; compare.

    Each tag's sequences get one forward (``token_logprobs``, the whole sequence) under that step's
    frozen weights at ``temperature`` (the one the batch was sampled at) — apart from the loss's own
    forward, so that nothing the loss does can make the check agree.
    """
    stats = CheckStats()
    recomputed = [np.full(len(s.ids), np.nan, dtype=np.float32) for s in seqs]
    tags = sorted({int(t) for s in seqs for t in s.steps[s.action]})
    for tag in tags:
        rows = [i for i, s in enumerate(seqs) if (s.steps[s.action] == tag).any()]
        first = seqs[rows[0]]
        p = int(np.flatnonzero(first.action & (first.steps == tag))[0])
        model = history.get(tag, _where(first.rollout, int(first.turn_of[p]), int(first.pos_in_turn[p])))
        with torch.no_grad():
            lp = token_logprobs(model, pad([seqs[i] for i in rows], device), temperature=temperature)
        lp_np = lp.float().cpu().numpy()
        for row, i in enumerate(rows):
            s = seqs[i]
            where = s.action & (s.steps == tag)
            positions = np.flatnonzero(where)
            # Position p is predicted from p - 1: the recomputation's column p - 1.
            recomputed[i][positions] = lp_np[row, positions - 1]
    for s, rec in zip(seqs, recomputed):
        r = s.rollout
        act = np.flatnonzero(s.action)
        delta = np.abs(rec[act] - s.logprobs[act]).astype(np.float64)
        inexact = s.inexact[act]
        exact_delta = delta[~inexact]
        if exact_delta.size:
            worst = int(np.argmax(exact_delta))
            if not exact_delta[worst] <= tolerance:  # NaN fails too
                p = int(act[~inexact][worst])
                raise TokenCheckError(
                    f"{_where(r, int(s.turn_of[p]), int(s.pos_in_turn[p]))} (sequence position {p}, token id {int(s.ids[p])} {vocab.decode([int(s.ids[p])])!r}): "
                    f"recorded logprob {s.logprobs[p]:.6f}, recomputed {rec[p]:.6f} under model step {int(s.steps[p])} (|Δ| {exact_delta[worst]:.2e} > tolerance {tolerance:g})"
                )
            stats.max_abs = max(stats.max_abs, float(exact_delta.max()))
        stats.exact += int(exact_delta.size)
        if inexact.any():
            d = delta[inexact]
            stats.inexact += int(d.size)
            stats.inexact_sum += float(d.sum())
            stats.inexact_max = max(stats.inexact_max, float(d.max()))
        stats.step_tags.update(int(t) for t in s.steps[act])
        per_turn = [set(s.steps[s.turn_of == i].tolist()) for i in range(len(r.turns))]
        stats.multi_step_turns += sum(1 for tags_i in per_turn if len(tags_i) > 1)
        stats.multi_step_rollouts += int(len(set(s.steps[act].tolist())) > 1)
        stats.spans_turns += s.spans_turns
    return stats


# --- GRPO ---------------------------------------------------------------------------------------------


def set_advantages(groups: Iterable[Tuple[List[Trained], List[Rollout]]], credit: str) -> None:
    """GRPO's advantage, normalised within each group. ``episode``: the rollout's reward, on all its
    tokens. ``turn``: each turn's tokens get the reward from that turn on (its own and the later turns'),
    normalised against the same turn of the group's other rollouts — the k rollouts of a group see the
    same digits, so turn t of each is the same question; a rollout that has no turn t (its episode ended
    sooner: a reply cut by max tokens ends it) is not in turn t's baseline."""
    for seqs, rollouts in groups:
        if credit == "episode":
            rewards = np.array([r.reward for r in rollouts], dtype=np.float64)
            adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
            for s, a in zip(seqs, adv):
                s.advantage[s.action] = a
            continue
        to_go = [np.cumsum([t.reward for t in r.turns][::-1])[::-1] for r in rollouts]
        for j in range(max(len(r.turns) for r in rollouts)):
            have = [i for i, r in enumerate(rollouts) if len(r.turns) > j]
            g = np.array([to_go[i][j] for i in have], dtype=np.float64)
            adv = (g - g.mean()) / (g.std() + 1e-6)
            for i, a in zip(have, adv):
                seqs[i].advantage[seqs[i].turn_of == j] = a


def grpo_loss(policy: TinyLM, ids: torch.Tensor, seqs: List[Trained], temperature: float, clip: float, entropy: float, device: torch.device) -> torch.Tensor:
    """The clipped surrogate, averaged over every trained token of the batch, less ``entropy`` × their
    mean entropy (a fresh policy settles on a few digits before it can copy without it). The ratio is
    the policy's logprob over the one the server recorded for the token."""
    logits = policy(ids)[:, :-1].float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    lp = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # column t: token t + 1
    width = ids.shape[1]
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    old = torch.zeros(len(seqs), width)
    adv = torch.zeros(len(seqs), width)
    for i, s in enumerate(seqs):
        n = len(s.ids)
        mask[i, :n] = torch.from_numpy(s.action)
        old[i, :n] = torch.from_numpy(s.logprobs)
        adv[i, :n] = torch.from_numpy(s.advantage)
    mask, old, adv = mask[:, 1:].to(device), old[:, 1:].to(device), adv[:, 1:].to(device)
    ratio = torch.exp(lp - old)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    n = mask.sum().clamp(min=1)
    loss = -(surrogate * mask).sum() / n
    if entropy > 0:
        ent = -(logp_all.exp() * logp_all).sum(-1)
        loss = loss - entropy * (ent * mask).sum() / n
    return loss


# --- chance level, curve, plot ---------------------------------------------------------------------------


def chance_level(max_tokens: int, turns: int, wrong_digit: float) -> float:
    """Expected episode reward of a policy uniform over the vocabulary. A turn scores only if its reply
    ends (the end token within ``max_tokens``: a reply cut by max tokens ends the episode, unscored), then
    1 if its first digit is the shown one, ``wrong_digit`` if it is another; turn t is reached only if
    every turn before it ended."""
    v = vocab.VOCAB_SIZE
    p_end, p_go = 1 / v, (v - 1) / v
    p_no_digit = (v - 1 - 10) / (v - 1)  # a token that is neither the end nor a digit
    turn = sum(p_go ** (j - 1) * p_end * (1 - p_no_digit ** (j - 1)) * (0.1 + 0.9 * wrong_digit) for j in range(1, max_tokens + 1))
    ends = 1 - p_go**max_tokens
    return sum(ends**t for t in range(turns)) * turn / turns


def write_curve(out: Path, meta: Dict[str, Any], rows: List[Dict[str, Any]]) -> None:
    (out / "curve.json").write_text(json.dumps({**meta, "steps": rows}, indent=1) + "\n")
    with open(out / "curve.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else ["step"])
        writer.writeheader()
        writer.writerows(rows)
    (out / "curve.svg").write_text(svg_plot([meta | {"steps": rows}], title=f"echo-digit, {meta['label']}"))


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def svg_plot(runs: List[Dict[str, Any]], title: str) -> str:
    """Mean reward per train step of each run, with its chance level and the learned threshold: an SVG
    written by hand (CI has no plotting library)."""
    w, h, left, right, top, bottom = 640, 360, 56, 96, 34, 44
    pw, ph = w - left - right, h - top - bottom
    max_step = max([len(r["steps"]) for r in runs] + [2])
    x = lambda s: left + pw * (s - 1) / (max_step - 1)  # noqa: E731
    y = lambda v: top + ph * (1 - v)  # noqa: E731
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">',
             f'<title>{_esc(title)}</title>',  # what a screen reader says of the image
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{left}" y="20" font-size="14">{_esc(title)}</text>']
    for v in (0, 0.2, 0.4, 0.6, 0.8, 1.0):
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
    every = 10 if max_step <= 100 else 50
    ticks = [1] + list(range(every, max_step, every))
    if x(max_step) - x(ticks[-1]) >= 24:  # the last step, unless it would sit on the tick before it
        ticks.append(max_step)
    for s in ticks:
        parts.append(f'<text x="{x(s):.1f}" y="{top + ph + 16}" text-anchor="middle">{s}</text>')
    parts.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" stroke="black"/>')
    parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" stroke="black"/>')
    parts.append(f'<text x="{left + pw / 2}" y="{h - 8}" text-anchor="middle">train step</text>')
    parts.append(f'<text x="14" y="{top + ph / 2}" transform="rotate(-90 14 {top + ph / 2})" text-anchor="middle">mean reward</text>')
    first = runs[0]
    for label, value, dash in (("learned", first.get("target", 0.8), "6 3"), ("chance", first.get("chance", 0.0), "2 3")):
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#555" stroke-dasharray="{dash}"/>')
        parts.append(f'<text x="{left + pw + 6}" y="{y(value) + 4:.1f}" fill="#555">{label} {value:.3g}</text>')
    for i, run in enumerate(runs):
        color = colors[i % len(colors)]
        points = " ".join(f"{x(row['step']):.1f},{y(min(max(row['reward'], 0.0), 1.0)):.1f}" for row in run["steps"])
        parts.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="1.8"/>')
        learned = run.get("learned_at")
        text = f"{run['label']}" + (f": learned at step {learned}" if learned else ": not learned")
        # The legend sits top left, where every curve is still near chance.
        parts.append(f'<text x="{left + 10}" y="{top + 18 + 16 * i}" fill="{color}">{_esc(text)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# --- the run ------------------------------------------------------------------------------------------


def engine_config(args: argparse.Namespace, server_url: str, tokenizer_dir: Path) -> Dict[str, Any]:
    producer: Dict[str, Any] = {"strategy": args.strategy}
    pause: Dict[str, Any] = {}
    if args.strategy == "async":
        # Over-sampling keeps groups in flight when a batch is complete, so every weight update finds
        # generations to pause (in place) or abort and continue: the partial rollouts the check covers.
        producer |= {"maxStaleness": args.max_staleness, "partialRollout": args.partial, "syncWeightsInterval": 1,
                     "overSampleThreshold": args.over_sample}
        pause["mode"] = args.pause_mode
    return {
        "seed": args.seed,
        "batchSize": args.groups,
        "tasks": [{
            "name": TASK,
            "env": {"module": f"builtin:{TASK}", "params": {"turns": args.turns, "repeat": args.repeat, "wrongDigit": args.wrong_digit, "alphabet": args.alphabet}},
            "groupSize": args.group_size,
            "maxSteps": args.turns,
            "messageCut": 0,
            "maxTokens": args.max_tokens,
            "temperature": args.temperature,
        }],
        "llm": {
            "url": server_url, "server": "sglang", "api": "tokens", "tokenizer": str(tokenizer_dir.resolve()), "model": MODEL_NAME,
            "stream": args.stream, "timeoutMs": int(args.http_timeout * 1000), "outageBudgetMs": int(args.http_timeout * 1000),
        },
        "workers": {"threads": 1},
        "producer": producer,
        "pause": pause,
    }


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    out = Path(args.out or tempfile.mkdtemp(prefix="grpo-learn-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    shape = LARGE if args.large else SMALL
    config = ModelConfig(**shape)
    policy = init_model(config, seed=args.seed).to(device)
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
    history = WeightHistory(keep=args.max_staleness + 2)
    history.add(0, policy)
    weights = out / "weights"
    # A fresh run each time: the engine refuses a run dir holding an earlier run's checkpoint.
    for stale in (weights, out / "engine"):
        if stale.exists():
            shutil.rmtree(stale)
    step0 = save_pretrained(policy, weights / "step-0")  # also the engine's llm.tokenizer: kept to the end
    label = args.strategy if args.strategy == "sync" else f"async{' + partial rollouts' if args.partial else ''}, {args.pause_mode} pause"
    n_params = sum(p.numel() for p in policy.parameters())
    print(f"policy: {n_params} parameters (d_model {config.d_model}, {config.n_layers} layers, {config.n_heads} heads) on {device}, seed {args.seed}; run dir {out}", flush=True)
    chance = chance_level(args.max_tokens, args.turns, args.wrong_digit)
    meta: Dict[str, Any] = {"label": label, "strategy": args.strategy, "partial": args.partial, "pause_mode": args.pause_mode if args.strategy == "async" else None,
                            "device": str(device), "model": config.to_dict(), "parameters": n_params, "seed": args.seed, "lr": args.lr,
                            "groups": args.groups, "group_size": args.group_size, "turns": args.turns, "repeat": args.repeat, "alphabet": args.alphabet, "wrong_digit": args.wrong_digit, "max_tokens": args.max_tokens,
                            "temperature": args.temperature, "entropy": args.entropy, "credit": args.credit, "tolerance": args.tolerance, "chance": chance, "target": args.target,
                            "window": args.window, "learned_at": None}
    rows: List[Dict[str, Any]] = []
    total = CheckStats()
    server: Optional[PolicyServer] = None
    engine = None
    in_repo = (REPO / "src" / "cli" / "main.ts").exists() and not os.environ.get("ROLLOUT_COMMAND")
    command = [os.environ.get("NODE", "node"), "--import", "tsx", str(REPO / "src" / "cli" / "main.ts")] if in_repo else None

    def record() -> None:
        """The run's figures into ``meta``, and the curve files."""
        meta.update({"seconds": round(time.monotonic() - started, 1), "steps_run": len(rows), "reward_step1": rows[0]["reward"] if rows else None,
                     "reward_last": round(float(np.mean([r["reward"] for r in rows[-args.window:]])), 4) if rows else None,
                     "tokens_checked": total.exact, "max_abs_delta": total.max_abs, "inexact_tokens": total.inexact,
                     "inexact_mean_abs_delta": total.inexact_sum / total.inexact if total.inexact else None,
                     "inexact_max_abs_delta": total.inexact_max if total.inexact else None, "multi_step_turns": total.multi_step_turns,
                     "multi_step_rollouts": total.multi_step_rollouts, "spans_versions_turns": total.spans_turns,
                     "model_steps_tagged": len(total.step_tags)})
        write_curve(out, meta, rows)

    try:
        server = PolicyServer(step0, out / "server.log", device=args.device, seed=args.seed, weight_version="0", threads=args.server_threads)
        print(f"policy server: {server.url}", flush=True)
        engine = rollout_engine.launch(engine_config(args, server.url, step0), run_dir=out / "engine", command=command, cwd=REPO if in_repo else None)
        with engine.client(timeout_s=args.http_timeout) as client:
            print(f"engine: {engine.url} ({label}); chance level {chance:.4f} (uniform policy), learned at mean reward >= {args.target} over {args.window} steps", flush=True)
            model_step = 0
            for outcome in client.batches(start_step=1):
                if time.monotonic() - started > args.max_seconds:
                    print(f"stopped: the wall-clock bound of {args.max_seconds:g} s", flush=True)
                    break
                if not server.alive():
                    raise ServerError(f"the policy server died (exit {server.process.returncode}):\n{server.log_tail()}")
                if isinstance(outcome, ExpiredBatch):  # cannot happen while every step syncs; said if it does
                    raise RuntimeError(f"step {outcome.train_step}: EXPIRED_BATCH although the weights were synced every step")
                if not isinstance(outcome, Batch):
                    client.resume(model_step, str(model_step))
                    continue
                t0 = time.monotonic()
                batch = outcome
                k = batch.train_step
                groups: List[Tuple[List[Trained], List[Rollout]]] = []
                seqs: List[Trained] = []
                for g in batch.groups:
                    g_seqs = []
                    for r in g.rollouts:
                        sampling = getattr(r, "sampling", None)
                        if sampling is not None and (sampling.truncated or sampling.penalised):
                            raise TokenCheckError(f"rollout {r.id}: sampled with truncation or penalties ({sampling}): its logprobs are not the policy's")
                        s = build_sequence(r, sampling.temperature if sampling is not None else args.temperature)
                        check_sample_view(s)
                        g_seqs.append(s)
                    groups.append((g_seqs, g.rollouts))
                    seqs.extend(g_seqs)
                set_advantages(groups, args.credit)
                ids = pad(seqs, device)
                temps = {s.temperature for s in seqs}
                if len(temps) != 1:
                    raise TokenCheckError(f"step {k}: rollouts sampled at several temperatures {sorted(temps)} in a one-task run")
                policy.train()
                temperature = temps.pop()
                stats = token_check(seqs, history, temperature, args.tolerance, device)
                loss = grpo_loss(policy, ids, seqs, temperature, args.clip, args.entropy, device)
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
                optimizer.step()
                history.add(k, policy)
                step_dir = save_pretrained(policy, weights / f"step-{k}")
                with client.weight_update(model_step=k, weight_version=str(k)) as report:
                    server.load_weights(step_dir, str(k), args.http_timeout, keep_cache=bool(report.get("inPlace")))
                if k >= 2:  # the server has read it; step 0 stays (the engine's tokenizer)
                    shutil.rmtree(weights / f"step-{k - 1}", ignore_errors=True)
                model_step = k
                total.add(stats)
                reward = float(np.mean([r.reward for g in batch.groups for r in g.rollouts]))
                tags = sorted(stats.step_tags)
                row = {"step": k, "reward": round(reward, 4), "loss": round(float(loss.item()), 5), "rollouts": len(seqs),
                       "tokens_checked": stats.exact, "max_abs_delta": float(f"{stats.max_abs:.3e}"), "inexact_tokens": stats.inexact,
                       "inexact_mean_abs_delta": float(f"{stats.inexact_sum / stats.inexact:.3e}") if stats.inexact else None,
                       "inexact_max_abs_delta": float(f"{stats.inexact_max:.3e}") if stats.inexact else None,
                       "model_steps": " ".join(map(str, tags)), "multi_step_turns": stats.multi_step_turns,
                       "pause_ms": round(float(report.get("allBackMs", 0.0)), 1), "seconds": round(time.monotonic() - t0, 3),
                       "elapsed": round(time.monotonic() - started, 2)}
                rows.append(row)
                print(f"step {k}: reward {reward:.3f}  checked {stats.exact} tokens (max |Δ| {stats.max_abs:.1e})  inexact {stats.inexact} (drift {stats.drift()})"
                      f"  tags {{{','.join(map(str, tags))}}}  multi-step turns {stats.multi_step_turns}  {row['seconds']:.2f} s", flush=True)
                recent = [r["reward"] for r in rows[-args.window:]]
                if meta["learned_at"] is None and len(recent) == args.window and sum(recent) / args.window >= args.target:
                    meta["learned_at"] = k
                    print(f"learned: mean reward {sum(recent) / args.window:.3f} >= {args.target} over steps {k - args.window + 1}..{k}", flush=True)
                    if not args.keep_going:
                        break
                if k >= args.max_steps:
                    break
        elapsed = time.monotonic() - started
        first = rows[0]["reward"] if rows else float("nan")
        last = float(np.mean([r["reward"] for r in rows[-args.window:]])) if rows else float("nan")
        record()
        learned = f"learned at step {meta['learned_at']}" if meta["learned_at"] else f"NOT learned within {len(rows)} steps"
        print(f"done: {label}, {len(rows)} steps in {elapsed:.1f} s; reward {first:.3f} at step 1 (chance {chance:.3f}) -> {last:.3f} over the last {min(args.window, len(rows))}; {learned}; "
              f"token check: {total.exact} tokens exact within {args.tolerance:g} (max |Δ| {total.max_abs:.1e}), 0 mismatches; "
              f"inexact {total.inexact} (drift {total.drift()}; {total.spans_turns} turns spanning versions unsplit); {total.multi_step_turns} turns and {total.multi_step_rollouts} rollouts with tokens of 2+ model steps; curve {out / 'curve.svg'}", flush=True)
        return 0 if meta["learned_at"] or not args.require_learned else 3
    except TokenCheckError as err:
        print(f"TOKEN CHECK FAILED: {err}", flush=True)
        return 2
    except (ServerError, rollout_engine.RolloutEngineError) as err:
        print(f"error: {err}", flush=True)
        return 1
    finally:
        if rows and "steps_run" not in meta:  # stopped early (a failed check, an error, a signal): the curve so far
            record()
        if engine is not None:
            engine.stop(timeout_s=30)
        if server is not None:
            server.stop()


def self_test() -> int:
    """The token check on hand-made rollouts, no engine: exact ones pass, and each kind of defect fails
    with its line (or, for a stale-KV token, is counted beside the check)."""
    device = torch.device("cpu")
    config = ModelConfig(**SMALL)
    models = {0: init_model(config, seed=0), 1: init_model(config, seed=1)}
    history = WeightHistory(keep=4)
    history.add(0, models[0])
    history.add(1, models[1])
    enc = vocab.encode
    prompt0 = enc("<|user|>33333333<|end|><|assistant|>")
    response0 = enc("3x") + [vocab.EOS_ID]
    prompt1 = prompt0 + response0 + enc("<|user|>44444444<|end|><|assistant|>")
    response1 = enc("4yz") + [vocab.EOS_ID]

    def rollout(name: str, steps1: List[int], *, off_by: float = 0.0, retokenise: bool = False, tag0: int = 0, stale_last: bool = False) -> Rollout:
        ids = torch.tensor([prompt1 + response1])
        lp = {k: token_logprobs(m, ids)[0].detach().numpy() for k, m in models.items()}
        turns = []
        for i, (prompt, response, steps) in enumerate(((prompt0, response0, [tag0] * len(response0)), (prompt1, response1, steps1))):
            a = len(prompt)
            logprobs = np.array([lp[0 if k == 7 else k][a + j - 1] for j, k in enumerate(steps)], dtype=np.float32)
            if i == 1 and off_by:
                logprobs[2] += off_by
            prompt_ids = np.array(prompt, dtype=np.int32)
            if i == 1 and retokenise:
                prompt_ids[3] = enc("a")[0]  # one character of the first observation, tokenised otherwise
            turn = Turn(step=i + 1, agent_id=None, messages=[], response="", finish_reason="stop", prompt_ids=prompt_ids,
                        response_ids=np.array(response, dtype=np.int32), logprobs=logprobs, model_steps=np.array(steps, dtype=np.int32),
                        loss_mask=None, model_step=steps[0], reward=0.0, terminated=i == 1, truncated=False, trainable=i == 1, seed=None, timings={})
            if i == 1 and stale_last:
                turn.logprobs = logprobs.copy()
                turn.logprobs[-1] -= 0.5  # as if sampled on a KV cache computed with step 0's weights
                flags = np.zeros(len(response), dtype=np.uint8)
                flags[-1] = 1
                setattr(turn, "stale_kv", flags)
            turns.append(turn)
        return Rollout(id=name, group_id="g", index=int(name[1:]), task_name=TASK, status="COMPLETED", reward=0.0, agent_rewards=None, turns=turns,
                       messages=[], terminated=True, truncated=False, finish_reason="stop", error=None, attempt=0, sample={}, timings={})

    def check(rollouts: List[Rollout]) -> CheckStats:
        seqs = []
        for r in rollouts:
            seq = build_sequence(r, 1.0)
            check_sample_view(seq)
            seqs.append(seq)
        return token_check(seqs, history, 1.0, 1e-4, device)

    # r1's second turn was continued after a weight update: its first tokens are step 0's, the rest step 1's.
    exact = check([rollout("r0", [0, 0, 0, 0]), rollout("r1", [0, 0, 1, 1])])
    print(f"self-test: exact rollouts pass: {exact.exact} tokens checked, max |Δ| {exact.max_abs:.1e}, {exact.inexact} inexact, {exact.multi_step_turns} turn of 2 model steps", flush=True)
    failures = (
        ("a logprob off by 0.001", [rollout("r0", [0, 0, 0, 0], off_by=1e-3)]),
        ("a re-tokenised prompt", [rollout("r0", [0, 0, 0, 0]), rollout("r1", [0, 0, 1, 1], retokenise=True)]),
        ("an unknown model step", [rollout("r0", [0, 0, 0, 0], tag0=7)]),
    )
    for what, rollouts in failures:
        try:
            check(rollouts)
        except TokenCheckError as err:
            print(f"self-test: {what} fails: {err}", flush=True)
            continue
        print(f"self-test: FAILED: {what} passed the check", flush=True)
        return 1
    stale = check([rollout("r1", [0, 0, 1, 1], stale_last=True)])
    if stale.inexact != 1 or not stale.inexact_max > 0.4:
        print(f"self-test: FAILED: the stale-KV token was not counted beside the check ({stale.inexact} inexact)", flush=True)
        return 1
    print(f"self-test: a stale-KV token is reported, not failed: {stale.inexact} inexact (drift {stale.drift()}), {stale.exact} exact", flush=True)
    print("self-test: passed", flush=True)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--strategy", choices=["sync", "async"], default="sync")
    ap.add_argument("--pause-mode", choices=["in-place", "abort", "drain"], default="in-place", help="async: pause.mode (default in-place)")
    ap.add_argument("--partial", action=argparse.BooleanOptionalAction, default=True, help="async: producer.partialRollout (default on)")
    ap.add_argument("--max-staleness", type=int, default=1, help="async: producer.maxStaleness")
    ap.add_argument("--over-sample", type=float, default=0.5, help="async: producer.overSampleThreshold")
    ap.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True, help="llm.stream: per-chunk weight versions across an in-place pause")
    ap.add_argument("--out", help="run dir (default: a new temporary directory)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--large", action="store_true", help=f"the larger model ({LARGE}) for a GPU")
    ap.add_argument("--lr", type=float, default=None, help="Adam's learning rate (default 5e-3; 1e-3 with --large)")
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--entropy", type=float, default=0.02, help="entropy bonus on the trained tokens")
    ap.add_argument("--credit", choices=["turn", "episode"], default="turn", help="advantage per turn (default) or per episode")
    ap.add_argument("--groups", type=int, default=32, help="groups per batch (batchSize)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=8, help="times the digit is written in each observation")
    ap.add_argument("--alphabet", default="012", help="the digits the task shows")
    ap.add_argument("--wrong-digit", type=float, default=0.0, help="what a reply with another digit first earns (of a turn's 1)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--tolerance", type=float, default=1e-4, help="largest |recorded - recomputed| logprob of an exact token")
    ap.add_argument("--target", type=float, default=0.8, help="the learned level: mean reward over --window steps")
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--max-steps", type=int, default=120)
    ap.add_argument("--max-seconds", type=float, default=600)
    ap.add_argument("--keep-going", action="store_true", help="train to --max-steps even once learned")
    ap.add_argument("--require-learned", action="store_true", help="exit 3 when the learned level is not reached")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the trainer (0 = torch's default)")
    ap.add_argument("--server-threads", type=int, default=1, help="torch threads of the policy server (0 = its default)")
    ap.add_argument("--http-timeout", type=float, default=120, help="bound on every HTTP call, seconds")
    ap.add_argument("--self-test", action="store_true", help="run the token check on hand-made rollouts (no engine) and exit")
    ap.add_argument("--plot", nargs="+", metavar="FILE", help="OUT.svg RUN/curve.json ...: draw runs into one SVG and exit")
    args = ap.parse_args(argv)
    if args.lr is None:
        args.lr = 1e-3 if args.large else 5e-3
    if args.self_test:
        return self_test()
    if args.plot:
        if len(args.plot) < 2:
            ap.error("--plot: OUT.svg and at least one curve.json")
        runs = [json.loads(Path(p).read_text()) for p in args.plot[1:]]
        Path(args.plot[0]).write_text(svg_plot(runs, title="echo-digit: mean reward per train step"))
        return 0
    for name in ("groups", "group_size", "turns", "repeat", "max_tokens", "max_steps", "window"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: must be at least 1 (got {getattr(args, name)})")
    if args.strategy == "sync" and "--pause-mode" in (argv if argv is not None else sys.argv):
        ap.error("--pause-mode: applies to --strategy async")
    # SIGTERM runs the finally blocks (both children stopped) like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
