#!/usr/bin/env python3
"""Train a tiny PyTorch policy with a GRPO-style loss on batches from rollout-engine.

    pip install './python[torch]'                 # or Debian's python3-torch beside `pip install ./python`
    python examples/grpo_train.py --steps 20 --sync-every 4

It launches `rollout serve` on the built-in mock inference server and the synthetic environments
(multi-turn guess-number, single-turn arithmetic), then per train step: takes the batch, turns it into
padded tensors (rollout_engine.collate: token ids, action and loss masks, GRPO advantages normalised
within each group), and takes an Adam step on a clipped policy-gradient loss. Every --sync-every steps
it "loads the new weights into the inference server" inside `client.weight_update(...)`: the engine
is paused, the mock is told its new weight version (POST /admin/weight_version), and the engine resumes
with that model step, so the next rollouts' tokens carry it.

The policy is a toy: a GRU language model over the token ids folded into --vocab buckets (the mock
speaks cl100k ids, and a 100k-way softmax per token would dominate a CPU step). The mock does not
sample from it, so the reward does not climb: what the example shows is the loop a real trainer runs,
with the engine's data, end to end. With a real policy, the engine's `old_logprobs` (the sampling
server's logprob of each token) are what the ratio is taken against; here the policy's own logprobs
before the update stand in for them, since the mock's are not this policy's.

--url drives an engine that is already running instead (its token from --token or $ROLLOUT_TOKEN).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

import rollout_engine
from rollout_engine import Batch, ControlClient, ExpiredBatch
from rollout_engine.collate import collate

REPO = Path(__file__).resolve().parents[1]

CONFIG = {
    "seed": 1,
    "batchSize": 4,
    "tasks": [
        {"name": "guess-number", "env": {"module": "builtin:guess-number", "params": {"min": 1, "max": 32}}, "groupSize": 4, "maxSteps": 5, "messageCut": 0, "maxTokens": 48},
        {"name": "arithmetic", "env": {"module": "builtin:arithmetic"}, "groupSize": 4, "maxSteps": 1, "maxTokens": 48},
    ],
    "workers": {"threads": 1},
}


class TinyPolicy(torch.nn.Module):
    """Embedding → GRU → logits over ``vocab`` buckets of token ids."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.embed = torch.nn.Embedding(vocab, dim)
        self.rnn = torch.nn.GRU(dim, dim, batch_first=True)
        self.head = torch.nn.Linear(dim, vocab)

    def token_logprobs(self, input_ids: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        """Log-probability of each token at ``where`` (a mask over ``input_ids[:, 1:]``) given the ones before it.

        The head runs only where the loss is taken: prompts are most of the tokens, actions few.
        """
        ids = input_ids.remainder(self.vocab)
        hidden, _ = self.rnn(self.embed(ids[:, :-1]))
        logits = self.head(hidden[where])
        return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:][where].unsqueeze(-1)).squeeze(-1)


def grpo_loss(policy: TinyPolicy, t: Dict[str, torch.Tensor], old: torch.Tensor, clip: float) -> torch.Tensor:
    """The clipped surrogate over the loss tokens, averaged per token (GRPO's per-group advantages)."""
    where = t["loss_mask"][:, 1:]  # token t is predicted at position t - 1
    logp = policy.token_logprobs(t["input_ids"], where)
    adv = t["advantages"][:, 1:][where]
    ratio = torch.exp(logp - old)
    surrogate = torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    return -surrogate.mean()


def set_mock_weight_version(llm_url: Optional[str], version: int) -> Optional[int]:
    """Stands in for loading weights into vLLM / SGLang: the mock serves `version` from now on."""
    if not llm_url:
        return None
    base = llm_url.rstrip("/")
    base = base[:-3] if base.endswith("/v1") else base
    req = urllib.request.Request(f"{base}/admin/weight_version", data=json.dumps({"weight_version": version}).encode(), method="POST", headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as res:
        return int(json.loads(res.read())["weight_version"])


def train(client: ControlClient, args: argparse.Namespace) -> List[float]:
    torch.manual_seed(args.seed)
    policy = TinyPolicy(args.vocab, args.dim)
    opt = torch.optim.Adam(policy.parameters(), lr=args.lr)
    llm_url = client.status()["llmUrl"]
    rewards: List[float] = []
    started = time.monotonic()
    for outcome in client.batches(start_step=client.status()["nextTrainStep"], steps=args.steps):
        if isinstance(outcome, ExpiredBatch):  # the served weights are too old for this step: sync, ask again
            with client.weight_update(model_step=outcome.train_step - 1):
                set_mock_weight_version(llm_url, outcome.train_step - 1)
            print(f"step {outcome.train_step}: EXPIRED_BATCH -> weights synced to {outcome.train_step - 1}", flush=True)
            continue
        if not isinstance(outcome, Batch):  # paused by someone else: resume on the weights served now
            client.resume(client.status()["modelStep"])
            continue
        batch = outcome
        t = collate(batch)
        with torch.no_grad():
            old = policy.token_logprobs(t["input_ids"], t["loss_mask"][:, 1:])
        loss = torch.zeros(())
        for _ in range(args.epochs):
            loss = grpo_loss(policy, t, old, args.clip)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad.clip_grad_norm_(policy.parameters(), 1.0)
            opt.step()
        reward = float(t["rewards"].mean())
        rewards.append(reward)
        stats = batch.stats or {}
        staleness = stats.get("staleness", {}).get("max", 0)
        print(
            f"step {batch.train_step}: loss {loss.item():+.4f}  reward {reward:.3f}  "
            f"({len(t['rewards'])} samples, {int(t['loss_mask'].sum())} action tokens, max staleness {staleness:g})",
            flush=True,
        )
        if batch.train_step % args.sync_every == 0:
            with client.weight_update(model_step=batch.train_step) as report:
                # A real trainer broadcasts `policy.state_dict()` to its inference servers here.
                served = set_mock_weight_version(llm_url, batch.train_step)
            print(f"  weights -> step {batch.train_step}: the mock serves weight version {served} (pause {report['allBackMs']:.1f} ms, {report['groupsBack']} groups back)", flush=True)
    status = client.status()
    print(f"done: {len(rewards)} steps in {time.monotonic() - started:.1f} s, {status['groups']['taken']} groups taken, model step {status['modelStep']}", flush=True)
    return rewards


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sync-every", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2, help="optimiser steps per batch (the clip matters from the second)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--url", help="an engine already running (else one is launched on the mock)")
    ap.add_argument("--token", default=os.environ.get("ROLLOUT_TOKEN"))
    args = ap.parse_args()

    if args.url:
        with ControlClient(args.url, args.token) as client:
            train(client, args)
        return 0
    # In a clone of the repository: its CLI from source; elsewhere `rollout` on PATH or $ROLLOUT_COMMAND.
    in_repo = (REPO / "src" / "cli" / "main.ts").exists() and not os.environ.get("ROLLOUT_COMMAND")
    command = [os.environ.get("NODE", "node"), "--import", "tsx", str(REPO / "src" / "cli" / "main.ts")] if in_repo else None
    config = {**CONFIG, "producer": {"strategy": "async", "maxStaleness": 1, "syncWeightsInterval": args.sync_every}}
    with rollout_engine.launch(config, command=command, cwd=REPO if in_repo else None) as engine, engine.client() as client:
        print(f"engine: {engine.url} (inference: {client.status()['llmUrl']}, run dir {engine.run_dir})", flush=True)
        train(client, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
