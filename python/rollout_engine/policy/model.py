"""The reference policy: a small decoder-only transformer (pre-norm, causal, rotary positions) over
the character vocabulary of :mod:`.vocab`, fp32.

Two paths compute the same function:

- :meth:`TinyLM.forward` — the full sequence, no cache: what a trainer differentiates and what
  :func:`token_logprobs` reads;
- :meth:`TinyLM.prefill` / :meth:`TinyLM.decode` over a :class:`KVCache` — what the policy server
  samples with: a prompt's keys and values computed once, then one token per step attending over
  them. ``prefill`` *is* the full-sequence code (it also returns the keys and values); ``decode``
  computes one query against the cached keys, the same arithmetic up to summation order (fp32:
  logprobs agree to ~1e-5).

A sequence's cached keys and values depend on the weights they were computed with: after a weight
update a request that keeps its cache (SGLang's in-place pause) goes on attending over keys of the
old weights, and its next tokens' logprobs then match no single set of weights. Dropping the cache
and prefilling again (SGLang's retract) gives tokens that match the new weights exactly.

One directory is both SGLang's ``model_path`` and the engine's ``llm.tokenizer``:
:func:`save_pretrained` writes ``config.json`` + ``model.pt`` and the two tokenizer files.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import vocab

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as err:  # pragma: no cover - the message is the point
    raise ImportError("rollout_engine.policy needs torch: pip install './python[torch]' (Debian: python3-torch)") from err

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.pt"
#: ``config.json``'s architecture name: a directory of another model is refused by name, not by a shape error.
ARCHITECTURE = "TinyLM"

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a :class:`TinyLM`. ``max_len`` is the context: prompt + completion tokens."""

    vocab_size: int = vocab.VOCAB_SIZE
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    max_len: int = 512
    #: Hidden width of each block's MLP; 0 = 4 × d_model.
    d_ff: int = 0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    eos_token_id: int = vocab.EOS_ID
    pad_token_id: int = vocab.PAD_ID

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name}: {value!r} is not a positive integer")
        if not isinstance(self.d_ff, int) or self.d_ff < 0:
            raise ValueError(f"ModelConfig.d_ff: {self.d_ff!r} is not a non-negative integer")
        if self.d_model % self.n_heads != 0 or (self.d_model // self.n_heads) % 2 != 0:
            raise ValueError(
                f"ModelConfig.d_model: {self.d_model} must split into n_heads={self.n_heads} heads of an even width (rotary pairs)"
            )
        for name in ("eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value < self.vocab_size:
                raise ValueError(f"ModelConfig.{name}: {value!r} is not a token id below vocab_size={self.vocab_size}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_dim(self) -> int:
        return self.d_ff or 4 * self.d_model

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConfig":
        """The config in ``data`` (a ``config.json``); keys that are not fields (``architectures``, …) are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[..., T, head_dim]``: element i of the first half and element i of
    the second are one pair, rotated by angle i (``cos``/``sin`` ``[T, head_dim / 2]``, GPT-NeoX layout)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.out = nn.Linear(config.d_model, config.d_model, bias=False)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.up = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.down = nn.Linear(config.ffn_dim, config.d_model, bias=False)

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def _finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = attended.shape
        x = x + self.out(attended.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))
        out: torch.Tensor = x + self.down(F.gelu(self.up(self.mlp_norm(x))))
        return out

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Whole sequences ``x`` ``[B, T, D]`` under the additive causal ``mask`` ``[T, T]``; also returns k, v."""
        q, k, v = self._qkv(x, cos, sin)
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim)) + mask
        return self._finish(x, torch.softmax(scores, dim=-1) @ v), k, v

    def step(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        span: int,
    ) -> torch.Tensor:
        """One new token per sequence, ``x`` ``[B, 1, D]`` at ``positions`` ``[B]``: its key and value go
        into the cache (``keys``/``values`` ``[slots, H, max_len, hd]`` at rows ``slots``), its query
        attends over the cached positions ``0..position``."""
        q, k, v = self._qkv(x, cos, sin)
        keys[slots, :, positions] = k[:, :, 0]
        values[slots, :, positions] = v[:, :, 0]
        cached_k = keys[slots, :, :span]
        cached_v = values[slots, :, :span]
        scores = (q @ cached_k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        beyond = torch.arange(span, device=x.device)[None, :] > positions[:, None]
        scores = scores.masked_fill(beyond[:, None, None, :], float("-inf"))
        return self._finish(x, torch.softmax(scores, dim=-1) @ cached_v)


class KVCache:
    """Keys and values of up to ``slots`` sequences, each up to ``config.max_len`` positions: one
    preallocated tensor per layer, a sequence owns one row (slot) from prefill until it is freed."""

    def __init__(self, config: ModelConfig, slots: int, device: Union[str, torch.device] = "cpu") -> None:
        shape = (slots, config.n_heads, config.max_len, config.head_dim)
        self.config = config
        self.slots = slots
        self.keys = [torch.zeros(shape, device=device) for _ in range(config.n_layers)]
        self.values = [torch.zeros(shape, device=device) for _ in range(config.n_layers)]
        self._free = list(range(slots - 1, -1, -1))

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError(f"KVCache: all {self.slots} slots are in use")
        return self._free.pop()

    def release(self, slot: int) -> None:
        self._free.append(slot)

    @property
    def free(self) -> int:
        return len(self._free)


class TinyLM(nn.Module):
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layers)])
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        hd = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        angles = torch.arange(config.max_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
        # Not parameters and not in the state dict: derived from the config, the same on every load.
        self.register_buffer("rope_cos", angles.cos().float(), persistent=False)
        self.register_buffer("rope_sin", angles.sin().float(), persistent=False)

    def _check(self, ids: torch.Tensor) -> None:
        if ids.dim() != 2:
            raise ValueError(f"ids: expected [batch, length], got shape {tuple(ids.shape)}")
        if ids.shape[1] > self.config.max_len:
            raise ValueError(f"ids: {ids.shape[1]} positions exceed the model's max_len {self.config.max_len}")

    def _layers(self, ids: torch.Tensor) -> Tuple[torch.Tensor, List[Tuple[torch.Tensor, torch.Tensor]]]:
        self._check(ids)
        t = ids.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        mask = torch.full((t, t), float("-inf"), device=ids.device).triu(1)
        x = self.embed(ids)
        kv: List[Tuple[torch.Tensor, torch.Tensor]] = []
        for block in self.blocks:
            x, k, v = block(x, cos, sin, mask)
            kv.append((k, v))
        return self.lm_head(self.norm(x)), kv

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, V]`` of whole sequences ``ids`` ``[B, T]`` (no cache)."""
        return self._layers(ids)[0]

    @torch.no_grad()
    def prefill(self, cache: KVCache, slots: Sequence[int], sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        """Runs ``sequences`` (a batch of differing lengths, right-padded: causal attention keeps the
        padding out of every real position) through the full-sequence path, keeps each one's keys and
        values in its cache slot, and returns the logits ``[B, V]`` after each one's last token."""
        lengths = [len(s) for s in sequences]
        if min(lengths) == 0:
            raise ValueError("prefill: an empty sequence has no next-token distribution")
        device = self.embed.weight.device
        ids = torch.full((len(sequences), max(lengths)), self.config.pad_token_id, dtype=torch.long)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
        logits, kv = self._layers(ids.to(device))
        for layer, (k, v) in enumerate(kv):
            for row, slot in enumerate(slots):
                cache.keys[layer][slot, :, : lengths[row]] = k[row, :, : lengths[row]]
                cache.values[layer][slot, :, : lengths[row]] = v[row, :, : lengths[row]]
        last = torch.as_tensor([n - 1 for n in lengths], device=device)
        return logits[torch.arange(len(sequences), device=device), last]

    @torch.no_grad()
    def decode(self, cache: KVCache, slots: torch.Tensor, positions: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """One step for a batch of cached sequences: token ``ids[b]`` at ``positions[b]`` (the
        sequence's length so far) of slot ``slots[b]``; returns the next-token logits ``[B, V]``."""
        if int(positions.max()) >= self.config.max_len:
            raise ValueError(f"decode: position {int(positions.max())} is past the model's max_len {self.config.max_len}")
        span = int(positions.max()) + 1
        cos, sin = self.rope_cos[positions][:, None, None, :], self.rope_sin[positions][:, None, None, :]
        x = self.embed(ids)[:, None, :]
        for layer, block in enumerate(self.blocks):
            x = block.step(x, cos, sin, cache.keys[layer], cache.values[layer], slots, positions, span)
        logits: torch.Tensor = self.lm_head(self.norm(x))[:, 0]
        return logits


def init_model(config: Optional[ModelConfig] = None, seed: int = 0) -> TinyLM:
    """A freshly initialised model, the same for the same ``config`` and ``seed`` (the global RNG is
    left as it was)."""
    config = config or ModelConfig()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyLM(config)
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                continue
            std = 0.02
            if name.endswith("out.weight") or name.endswith("down.weight"):
                # Residual-branch outputs scaled by depth (GPT-2): the residual stream's variance stays put.
                std = 0.02 / math.sqrt(2 * config.n_layers)
            nn.init.normal_(param, mean=0.0, std=std)
    return model


def token_logprobs(model: TinyLM, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``[B, T-1]``: log p(ids[:, t+1] | ids[:, :t+1]) under softmax(logits / temperature), through
    the full-sequence path (differentiable: the trainer's loss and the token check both read it)."""
    if not temperature > 0:
        raise ValueError(f"temperature: {temperature!r} must be > 0 (a greedy choice has no logprob to recompute)")
    logits = model(ids)[:, :-1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def _atomic_write(path: Path, write: Any) -> None:
    """Writes through a temporary file in the same directory and renames it over ``path``: a reader
    (the server loading ``model_path``) never sees a half-written file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_pretrained(model: TinyLM, directory: PathLike) -> Path:
    """Writes ``config.json``, ``model.pt`` (the state dict, on CPU) and the tokenizer files into
    ``directory`` (made if missing): one directory is the server's ``model_path`` and the engine's
    ``llm.tokenizer``. The tokenizer config's ``model_max_length`` is set to the model's ``max_len``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    config = {"architectures": [ARCHITECTURE], "model_type": "tiny_lm", **model.config.to_dict()}
    state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    _atomic_write(out / WEIGHTS_FILE, lambda tmp: torch.save(state, tmp))
    shutil.copyfile(vocab.TOKENIZER_DIR / "tokenizer.json", out / "tokenizer.json")
    tok_config = json.loads((vocab.TOKENIZER_DIR / "tokenizer_config.json").read_text())
    tok_config["model_max_length"] = model.config.max_len

    def write_json(data: Dict[str, Any]) -> Any:
        return lambda tmp: Path(tmp).write_text(json.dumps(data, indent=2) + "\n")

    _atomic_write(out / "tokenizer_config.json", write_json(tok_config))
    # Last: a directory with a config.json is complete.
    _atomic_write(out / CONFIG_FILE, write_json(config))
    return out


def read_config(directory: PathLike) -> ModelConfig:
    """The :class:`ModelConfig` in ``directory/config.json``; errors name the file and what is wrong."""
    path = Path(directory) / CONFIG_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"model_path: {str(directory)!r} has no {CONFIG_FILE} (write it with save_pretrained)") from None
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"model_path: cannot read {path}: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"model_path: {path} is not a JSON object")
    architectures = data.get("architectures")
    if architectures is not None and ARCHITECTURE not in architectures:
        raise ValueError(f"model_path: {path} is a {architectures!r} model, not {ARCHITECTURE}")
    return ModelConfig.from_dict(data)


def load_state(directory: PathLike, config: ModelConfig) -> Dict[str, torch.Tensor]:
    """``model.pt`` of ``directory``, checked against the parameters a ``config`` model has."""
    path = Path(directory) / WEIGHTS_FILE
    try:
        # weights_only: the server loads a path posted over HTTP; a pickle there must not run code.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"model_path: {str(directory)!r} has no {WEIGHTS_FILE}") from None
    except Exception as err:  # torch raises many kinds for a corrupt file
        raise ValueError(f"model_path: cannot load {path}: {err}") from None
    if not isinstance(state, dict):
        raise ValueError(f"model_path: {path} holds a {type(state).__name__}, not a state dict")
    expected = {k: tuple(v.shape) for k, v in TinyLM(config).state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
    if got != expected:
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        wrong = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])
        what = "; ".join(
            part
            for part in (
                f"missing {missing[:3]}" if missing else "",
                f"unexpected {extra[:3]}" if extra else "",
                f"{wrong[0]} is {list(got[wrong[0]])}, the config makes {list(expected[wrong[0]])}" if wrong else "",
            )
            if part
        )
        raise ValueError(f"model_path: {path} does not fit its config.json: {what}")
    return state


def load_pretrained(directory: PathLike, device: Union[str, torch.device] = "cpu") -> TinyLM:
    """The model :func:`save_pretrained` wrote into ``directory``, on ``device``, in eval mode."""
    config = read_config(directory)
    state = load_state(directory, config)
    model = TinyLM(config)
    model.load_state_dict(state)
    return model.to(device).eval()
