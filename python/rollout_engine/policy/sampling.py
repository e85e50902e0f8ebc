"""Sampling for the reference policy server: SGLang's sampling parameters (names, defaults, checks)
and a batched sampler that draws from the model and reports each token's logprob under the
distribution it drew from.

Read from SGLang, python/sglang/srt/sampling/sampling_params.py @00c17cafcb9e289d5ca97c50e44ada54e4fd5b03
(SamplingParams): ``max_new_tokens`` 128, ``temperature`` 1.0, ``top_p`` 1.0, ``top_k`` -1 = the whole
vocabulary, ``min_p`` 0.0, ``min_new_tokens`` 0, ``stop``, ``stop_token_ids``, ``ignore_eos``,
``skip_special_tokens`` true, ``no_stop_trim`` false, ``n`` 1, ``sampling_seed``; a temperature below
1e-6 means greedy (it becomes top_k 1 at temperature 1); ``verify`` words the errors quoted here.

The order of the transforms is SGLang's (python/sglang/srt/layers/sampler.py
@584f55d1ce76e57478ef233d04f6afbfd585960f, top_k_top_p_min_p_sampling_from_probs_torch): logits divided
by the temperature, softmax, then over the probabilities sorted high to low top-k (rank >= top_k
dropped), top-p (dropped when the mass before a token already exceeds top_p) and min-p (dropped below
min_p × the largest probability).

**The reported logprob differs from SGLang's on purpose.** SGLang has reported several things:
``log`` of the temperature-scaled probabilities renormalised over top-p only (sampler.py @584f55d1,
top_p_normalize_probs_torch), and in later releases ``log softmax(logits / temperature)`` before any
truncation, or before the temperature too with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``; the logprob
renormalised over what was kept is a separate field there (``return_sampling_mask`` →
``output_token_sampling_logprobs``, io_struct.py @001067fffe33427bee0ed2f007fb7551a1d76b44). This
server reports, in ``output_token_logprobs``, the logprob under the distribution it actually sampled
from: after the temperature *and* the truncation, renormalised over the kept tokens. With no
truncation (top_k -1, top_p 1, min_p 0) every variant agrees, and equals
``token_logprobs(model, ids, temperature)``. Greedy sampling (temperature 0 or top_k 1) draws from a
single token: its logprob is 0 (SGLang reports the untruncated one).

Seeded sampling is deterministic per (seed, position): the noise of the Gumbel-max draw is a hash of
the request's seed, the position of the token in the whole sequence (prompt + output) and the
vocabulary index, so a generation continued from its own prefix (the same prompt + the tokens so far)
draws the same next token under the same weights. SGLang does the same only when launched with
``--enable-deterministic-inference`` (multinomial_with_seed in sampler.py, a murmur3 hash); here it
is always on, with a hash of its own. A request without a seed gets one from the server's seeded
generator, so a server started with the same ``--seed`` and given the same requests in the same
order samples the same tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, FrozenSet, List, Mapping, Optional, Sequence, Tuple

import torch

#: SGLang's stand-in for "the whole vocabulary" (sampling_params.py TOP_K_ALL).
TOP_K_ALL = 1 << 30
_SAMPLING_EPS = 1e-6
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


class SamplingError(ValueError):
    """A sampling parameter the server refuses; the message names the field and the value."""


#: SGLang sampling parameters this server accepts but does not implement, with the value that means
#: "off": any other value is refused rather than silently ignored.
_NEUTRAL = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "custom_params": None,
    "logit_bias": None,
    "stop_regex": None,
}
#: Accepted and without effect here: they shape text or batching, never the tokens.
_IGNORED = {"spaces_between_special_tokens", "stream_interval"}
_KNOWN = {
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "min_new_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "no_stop_trim",
    "n",
    "sampling_seed",
} | set(_NEUTRAL) | _IGNORED


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: Optional[int] = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    min_new_tokens: int = 0
    stop: Tuple[str, ...] = ()
    stop_token_ids: FrozenSet[int] = field(default_factory=frozenset)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: Optional[int] = None

    @property
    def truncates(self) -> bool:
        return self.top_k < TOP_K_ALL or self.top_p < 1.0 or self.min_p > 0.0


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _number(raw: Mapping[str, Any], name: str, default: float) -> float:
    value = raw.get(name)
    if value is None:  # SGLang: null means the default (SamplingParams.__post_init__)
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingError(f"sampling_params.{name} must be a number, got {_show(value)}.")
    return float(value)


def _integer(raw: Mapping[str, Any], name: str, default: Optional[int]) -> Optional[int]:
    value = raw.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SamplingError(f"sampling_params.{name} must be an integer, got {_show(value)}.")
    return value


def _flag(raw: Mapping[str, Any], name: str, default: bool) -> bool:
    value = raw.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise SamplingError(f"sampling_params.{name} must be true or false, got {_show(value)}.")
    return value


def parse_sampling_params(raw: Any, vocab_size: int) -> SamplingParams:
    """``sampling_params`` of a /generate body, checked as SGLang's ``SamplingParams.verify`` checks
    it (the same sentences where SGLang has one); raises :class:`SamplingError`."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SamplingError(f"sampling_params must be an object, got {_show(raw)}.")
    for name in raw:
        if name not in _KNOWN:
            raise SamplingError(f"sampling_params.{name}: unknown sampling parameter (value {_show(raw[name])}).")
    for name, neutral in _NEUTRAL.items():
        value = raw.get(name)
        if value is not None and value != neutral:
            raise SamplingError(
                f"sampling_params.{name}={_show(value)} is not supported by the reference policy server (leave it unset)."
            )
    n = _integer(raw, "n", 1)
    if n != 1:
        raise SamplingError(f"sampling_params.n={n}: the reference policy server samples one completion per request (n 1).")

    temperature = _number(raw, "temperature", 1.0)
    top_p = _number(raw, "top_p", 1.0)
    top_k = _integer(raw, "top_k", -1)
    assert top_k is not None
    min_p = _number(raw, "min_p", 0.0)
    # sampling_params.py __post_init__: temperature ~0 is greedy; top_k -1 is the whole vocabulary.
    if 0 <= temperature < _SAMPLING_EPS:
        temperature, top_k = 1.0, 1
    if top_k == -1:
        top_k = TOP_K_ALL
    if not math.isfinite(temperature) or temperature < 0.0:
        raise SamplingError(f"temperature must be a non-negative finite number, got {temperature}.")
    if not 0.0 < top_p <= 1.0:
        raise SamplingError(f"top_p must be in (0, 1], got {top_p}.")
    if not 0.0 <= min_p <= 1.0:
        raise SamplingError(f"min_p must be in [0, 1], got {min_p}.")
    if top_k < 1:
        raise SamplingError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    min_new_tokens = _integer(raw, "min_new_tokens", 0)
    assert min_new_tokens is not None
    if min_new_tokens < 0:
        raise SamplingError(f"min_new_tokens must be in [0, max_new_tokens], got {min_new_tokens}.")
    # An explicit null means no cap but the context (SGLang's Optional max_new_tokens); absent means 128.
    max_new_tokens = None if "max_new_tokens" in raw and raw["max_new_tokens"] is None else _integer(raw, "max_new_tokens", 128)
    if max_new_tokens is not None:
        if max_new_tokens < 0:
            raise SamplingError(f"max_new_tokens must be at least 0, got {max_new_tokens}.")
        if not min_new_tokens <= max_new_tokens:
            raise SamplingError(
                f"min_new_tokens must be in [0, max_new_tokens({max_new_tokens})], got {min_new_tokens}."
            )

    stop_raw = raw.get("stop")
    if stop_raw is None:
        stop: Tuple[str, ...] = ()
    elif isinstance(stop_raw, str):
        stop = (stop_raw,)
    elif isinstance(stop_raw, list) and all(isinstance(s, str) for s in stop_raw):
        stop = tuple(stop_raw)
    else:
        raise SamplingError(f"sampling_params.stop must be a string or a list of strings, got {_show(stop_raw)}.")
    if any(s == "" for s in stop):
        raise SamplingError("sampling_params.stop: an empty stop string would stop before the first token.")

    ids_raw = raw.get("stop_token_ids")
    stop_ids: FrozenSet[int] = frozenset()
    if ids_raw is not None:
        if not isinstance(ids_raw, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids_raw if t is not None
        ):
            raise SamplingError(f"sampling_params.stop_token_ids must be a list of token ids, got {_show(ids_raw)}.")
        for t in ids_raw:
            if t is not None and not 0 <= t < vocab_size:
                raise SamplingError(
                    f"sampling_params.stop_token_ids: {t} is not a token id of this model (0..{vocab_size - 1})."
                )
        stop_ids = frozenset(int(t) for t in ids_raw if t is not None)

    seed = _integer(raw, "sampling_seed", None)
    if seed is not None and not _INT64_MIN <= seed <= _INT64_MAX:
        raise SamplingError(f"sampling_params.sampling_seed must fit in 64 bits, got {seed}.")

    return SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        min_new_tokens=min_new_tokens,
        stop=stop,
        stop_token_ids=stop_ids,
        ignore_eos=_flag(raw, "ignore_eos", False),
        skip_special_tokens=_flag(raw, "skip_special_tokens", True),
        no_stop_trim=_flag(raw, "no_stop_trim", False),
        sampling_seed=seed,
    )


# --------------------------------------------------------------------------------------------------
# The sampler
# --------------------------------------------------------------------------------------------------


def _signed(value: int) -> int:
    """A 64-bit constant as the int64 with the same bits (torch has no uint64 arithmetic)."""
    return value - (1 << 64) if value >= 1 << 63 else value


_C1 = _signed(0xBF58476D1CE4E5B9)
_C2 = _signed(0x94D049BB133111EB)
_GOLDEN = _signed(0x9E3779B97F4A7C15)
_ODD = _signed(0xD6E8FEB86659FD93)


def _srl(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (``>>`` on int64 is arithmetic: mask the sign fill)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 bit patterns (multiplication wraps modulo 2^64)."""
    x = x ^ _srl(x, 30)
    x = x * _C1
    x = x ^ _srl(x, 27)
    x = x * _C2
    return x ^ _srl(x, 31)


def uniform_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[B, V]`` float64 uniforms in (0, 1), a pure function of (seed, position, vocabulary index)."""
    row = _mix(seeds * _GOLDEN + _mix(positions + _ODD))
    cols = torch.arange(1, vocab_size + 1, device=seeds.device, dtype=torch.long) * _ODD
    bits = _srl(_mix(row[:, None] ^ cols[None, :]), 11)  # 53 bits
    return (bits.double() + 0.5) / float(1 << 53)


def truncated_logprobs(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    banned: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``[B, V]`` log-probabilities of the distribution each row samples from: temperature, then
    top-k, top-p, min-p (SGLang's order), renormalised over the kept tokens; ``-inf`` elsewhere.
    ``banned`` (bool ``[B, V]``) removes tokens before anything else (stop tokens under min_new_tokens)."""
    scaled = logits.float() / temperatures[:, None]
    if banned is not None:
        scaled = scaled.masked_fill(banned, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    drop = ranks >= top_ks[:, None]
    kept = sorted_probs.masked_fill(drop, 0.0)
    drop |= (kept.cumsum(dim=-1) - kept) > top_ps[:, None]
    drop |= sorted_probs < (sorted_probs[:, :1] * min_ps[:, None])
    drop[:, 0] = False  # the most likely token always stays: a row never loses its whole support
    mask = torch.zeros_like(drop).scatter(1, order, drop)
    return torch.log_softmax(scaled.masked_fill(mask, float("-inf")), dim=-1)


@dataclass
class Draw:
    tokens: List[int]
    logprobs: List[float]
    #: Per row, the ``top`` most likely (logprob, token id) under the sampled distribution, when asked.
    top: List[List[Tuple[float, int]]]


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    seeds: Sequence[int],
    positions: Sequence[int],
    banned: Optional[torch.Tensor] = None,
    top_n: Sequence[int] = (),
) -> Draw:
    """One token per row of ``logits`` ``[B, V]``: row ``b`` samples with ``params[b]``, its noise
    from (``seeds[b]``, ``positions[b]``); returns each token and its logprob under the distribution
    sampled from (see the module docstring)."""
    device = logits.device
    temperatures = torch.tensor([p.temperature for p in params], device=device)
    top_ks = torch.tensor([min(p.top_k, logits.shape[-1]) for p in params], device=device)
    top_ps = torch.tensor([p.top_p for p in params], device=device)
    min_ps = torch.tensor([p.min_p for p in params], device=device)
    logprobs = truncated_logprobs(logits, temperatures, top_ks, top_ps, min_ps, banned)
    noise = uniform_noise(
        torch.tensor(list(seeds), dtype=torch.long, device=device),
        torch.tensor(list(positions), dtype=torch.long, device=device),
        logits.shape[-1],
    )
    gumbel = -torch.log(-torch.log(noise))
    tokens = torch.argmax(logprobs.double() + gumbel, dim=-1)
    chosen = logprobs.gather(1, tokens[:, None])[:, 0]
    top: List[List[Tuple[float, int]]] = []
    want = max(top_n, default=0)
    if want > 0:
        values, ids = logprobs.topk(min(want, logits.shape[-1]), dim=-1)
        for row, n in enumerate(top_n):
            top.append(
                [(float(v), int(i)) for v, i in zip(values[row, :n].tolist(), ids[row, :n].tolist()) if math.isfinite(v)]
            )
    return Draw(tokens=tokens.tolist(), logprobs=chosen.tolist(), top=top)
