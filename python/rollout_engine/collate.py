"""Samples as padded tensors for a causal LM (needs ``torch``: ``pip install './python[torch]'``).

Every tensor is ``[batch, length]``, right-padded; position ``t`` of every per-token tensor describes
the token ``input_ids[:, t]``. A causal LM predicts that token from position ``t - 1``, so the
policy's logprob of the sampled tokens is ``log_softmax(logits[:, :-1]).gather(-1, input_ids[:, 1:])``,
to be compared with ``old_logprobs[:, 1:]`` under ``loss_mask[:, 1:]`` (the example does this).

The padded arrays are filled once in numpy and handed to torch with ``torch.from_numpy``: one copy,
the padding's, and none after it (the tensors share the numpy arrays' memory).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Union

import numpy as np

from .batch import ROUTED_FILL, Batch, Sample

try:
    import torch
except ImportError as err:  # pragma: no cover - the message is the point
    raise ImportError("rollout_engine.collate needs torch: pip install './python[torch]' (Debian: python3-torch)") from err

#: The tensors :func:`collate` returns.
COLLATE_KEYS = ("input_ids", "attention_mask", "action_mask", "loss_mask", "old_logprobs", "advantages", "rewards", "model_steps", "inexact")


def collate(samples: Union[Batch, Sequence[Sample]], *, pad_id: int = 0, max_length: Optional[int] = None) -> Dict[str, "torch.Tensor"]:
    """Padded tensors for ``samples`` (a :class:`Batch`: its samples with GRPO advantages).

    - ``input_ids`` int64: the tokens, ``pad_id`` after each sample's end
    - ``attention_mask`` int64: 1 on real tokens
    - ``action_mask`` bool: tokens the policy generated
    - ``loss_mask`` bool: the action tokens that count in the loss (less those the engine masked as stale)
    - ``old_logprobs`` float32: the sampling policy's logprob of each action token, 0 elsewhere
    - ``advantages`` float32: the sample's advantage on its loss tokens, 0 elsewhere
    - ``model_steps`` int32: the model step of each action token, -1 elsewhere
    - ``inexact`` bool: action tokens no single set of weights reproduces (``Sample.inexact``: sampled on
      a KV cache from earlier weights, or in a turn whose weights are not known per token)
    - ``rewards`` float32 ``[batch]``: each sample's reward
    - ``routed_experts`` int16 ``[batch, length, layers, top_k]``, only when a sample has routed experts
      (``llm.routedExperts``): the experts each position was routed to, ``ROUTED_FILL`` (-1) where none
      is known and on padding — what a routing-replay forward pass takes

    ``max_length`` cuts longer samples (their end is lost: prefer a config whose episodes fit).
    """
    items = samples.samples() if isinstance(samples, Batch) else list(samples)
    n = len(items)
    lengths = [len(s.token_ids) if max_length is None else min(len(s.token_ids), max_length) for s in items]
    width = max(lengths, default=0)
    input_ids = np.full((n, width), pad_id, dtype=np.int64)
    attention = np.zeros((n, width), dtype=np.int64)
    action = np.zeros((n, width), dtype=np.bool_)
    loss = np.zeros((n, width), dtype=np.bool_)
    old = np.zeros((n, width), dtype=np.float32)
    adv = np.zeros((n, width), dtype=np.float32)
    steps = np.full((n, width), -1, dtype=np.int32)
    inexact = np.zeros((n, width), dtype=np.bool_)
    rewards = np.zeros(n, dtype=np.float32)
    for i, (s, m) in enumerate(zip(items, lengths)):
        input_ids[i, :m] = s.token_ids[:m]
        attention[i, :m] = 1
        action[i, :m] = s.action_mask[:m]
        loss[i, :m] = s.loss_mask[:m]
        old[i, :m] = np.where(s.action_mask[:m], s.logprobs[:m], 0)
        adv[i, :m] = np.where(s.loss_mask[:m], s.advantage, 0)
        steps[i, :m] = s.model_steps[:m]
        inexact[i, :m] = s.inexact[:m]
        rewards[i] = s.reward
    out: Dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "action_mask": action,
        "loss_mask": loss,
        "old_logprobs": old,
        "advantages": adv,
        "rewards": rewards,
        "model_steps": steps,
        "inexact": inexact,
    }
    routed = [s.routed_experts for s in items if s.routed_experts is not None]
    if routed:
        shape = routed[0].shape[1:]
        wide = any(r.dtype == np.int32 for r in routed)
        table = np.full((n, width, *shape), ROUTED_FILL, dtype=np.int32 if wide else np.int16)
        for i, (s, m) in enumerate(zip(items, lengths)):
            if s.routed_experts is not None and s.routed_experts.shape[1:] == shape:
                table[i, :m] = s.routed_experts[:m]
        out["routed_experts"] = table
    return {k: torch.from_numpy(v) for k, v in out.items()}


__all__ = ["collate", "COLLATE_KEYS"]
