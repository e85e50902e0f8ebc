"""Batches from ``POST /batch`` as dataclasses with numpy arrays, and the views a trainer wants.

Decoding is from what the transport gives: msgpack (token ids, logprobs, model steps and loss masks
arrive as raw little-endian bytes: each array here is an ``np.frombuffer`` view of those bytes, not a
copy, so it is read-only) or JSON (number lists, converted once). The compact form is expanded while
decoding: a turn whose ``messages`` / ``promptIds`` name a later turn (``messagesPrefixOf``,
``promptIdsPrefixOf``) gets that turn's first ``length`` messages (the same dicts) and a view of its
prompt ids — so the compact and the full form of a batch decode to equal arrays.

What a trainer trains on is a :class:`Sample`: one token sequence with its action mask, the policy's
logprobs and model steps aligned to it, and a loss mask. :meth:`Rollout.samples` stitches a rollout's
turns into as few samples as the tokens allow: a turn whose prompt begins with everything before it
(the whole conversation sent: ``messageCut: 0``, exact with ``llm.api: "tokens"``) extends the sample,
its earlier responses keeping their action mask; a turn whose prompt does not (trimmed prompts,
retokenised text, a chat template that rewrote the history under ``llm.historyMode: "split"``:
``Turn.history_rewrite == "split"``) starts a new one. Each sample of a rollout carries the rollout's
reward and advantage (docs/TEMPLATES.md). :meth:`Group.samples` adds the GRPO advantage of each rollout,
its reward normalised within the group.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from .errors import BatchFormatError
from .types import BatchStats, BatchStatus

Int32Array = npt.NDArray[np.int32]
Float32Array = npt.NDArray[np.float32]
BoolArray = npt.NDArray[np.bool_]
UInt8Array = npt.NDArray[np.uint8]

Message = Dict[str, Any]

# Little-endian whatever the host: the engine writes its typed arrays' bytes as they are on x86 / ARM.
_I32 = np.dtype("<i4")
_F32 = np.dtype("<f4")
_U8: np.dtype[Any] = np.dtype("u1")
_U16: np.dtype[Any] = np.dtype("<u2")

#: What :attr:`Sample.routed_experts` holds where the server gave no routing.
ROUTED_FILL = -1


@dataclass
class Sampling:
    """What tokens were sampled with: the group's ``sampling`` (``tasks[].temperature``, ``topP``, …).

    A setting that is None was sent at the server's neutral value, so with none set the distribution
    sampled from is the model's whole one at ``temperature`` — what a trainer recomputes the logprobs
    with. A setting that is not None truncates or penalises that distribution; the logprobs the servers
    report are of the distribution before it (see docs/INFERENCE-SERVERS.md, "Sampling").
    """

    temperature: float
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    agents: Dict[str, "Sampling"] = field(default_factory=dict)
    """Agents whose policy (``llm.policies``) samples otherwise, with their settings whole."""

    @property
    def truncated(self) -> bool:
        """Whether top-p, top-k or min-p cut the distribution sampled from."""
        return self.top_p is not None or self.top_k is not None or self.min_p is not None

    @property
    def penalised(self) -> bool:
        """Whether a repetition, presence or frequency penalty reshaped it."""
        return self.repetition_penalty is not None or self.presence_penalty is not None or self.frequency_penalty is not None

    def for_agent(self, agent_id: Optional[str]) -> "Sampling":
        """The settings an agent's turns were sampled with (its policy's, else the task's)."""
        return self.agents.get(agent_id, self) if agent_id is not None else self


@dataclass
class RoutedExperts:
    """Experts each position of ``prompt_ids + response_ids`` was routed to, from ``start`` on (``llm.routedExperts``).

    ``ids`` is ``[rows, layers, top_k]`` (uint8, or uint16 where an id is above 255): row ``r`` is
    sequence position ``start + r``. A turn whose prompt extends the previous turn's holds only the rows
    after that turn's (docs/ROUTING-REPLAY.md); :meth:`Rollout.samples` lays them out per sample.
    """

    start: int
    ids: npt.NDArray[Any]

    @property
    def rows(self) -> int:
        return int(self.ids.shape[0])


@dataclass
class SamplingMask:
    """Each response token's sampling support (``llm.samplingMasks``) as CSR: token i's is ``ids[offsets[i]:offsets[i+1]]``."""

    offsets: Int32Array
    ids: Int32Array
    logprobs: Optional[Float32Array] = None
    """Each token's logprob renormalised over its support (SGLang's), when sent."""


@dataclass
class Turn:
    """One agent turn (an inference call and the environment's step after it)."""

    step: int
    agent_id: Optional[str]
    messages: List[Message]
    response: str
    finish_reason: str
    prompt_ids: Optional[Int32Array]
    response_ids: Optional[Int32Array]
    logprobs: Optional[Float32Array]
    """Logprob of each response token under the weights that sampled it; None when the server gives none."""
    model_steps: Optional[Int32Array]
    """Model step (weight version) of each response token; a continued partial turn mixes two."""
    loss_mask: Optional[UInt8Array]
    """1 = the token counts in the loss; only with ``producer.tokenStalenessThreshold`` (else None: all count)."""
    model_step: int
    reward: float
    terminated: bool
    truncated: bool
    trainable: bool
    seed: Optional[int]
    timings: Dict[str, float]
    stale_kv: Optional[UInt8Array] = None
    """Per response token, 1 where it was sampled on a KV cache computed with earlier weights than its
    model step (a generation kept across an in-place weight update): no single set of weights gives its
    logprob. None when no token was."""
    spans_versions: bool = False
    """The response came from several weight versions and the server did not say which token from which;
    ``model_steps`` then hold the oldest."""
    sampling: Optional[Sampling] = None
    """What its tokens were sampled with (its group's, for its agent); None for a batch that records none."""
    routed_experts: Optional[RoutedExperts] = None
    sampling_mask: Optional[SamplingMask] = None
    history_rewrite: Optional[str] = None
    """``llm.api: "tokens"``: the chat template re-rendered this turn's history otherwise than it was
    sampled. ``"kept"``: the prompt still extends the previous turn's prompt + response; ``"split"``: the
    prompt is the re-rendered history and begins a new sample. None otherwise (docs/TEMPLATES.md)."""


@dataclass
class SideCall:
    """A black-box agent's call that did not extend its conversation (a judge, a summariser)."""

    index: int
    prompt_ids: Int32Array
    completion_ids: Int32Array
    logprobs: Float32Array
    finish_reason: str
    model_step: int
    routed_experts: Optional[npt.NDArray[np.int16]] = None
    """``[len(prompt_ids) + len(completion_ids), layers, top_k]`` int16 (int32 past 32767), as
    :attr:`Sample.routed_experts`: its own rows, ``ROUTED_FILL`` where the server gave none. None when none."""
    sampling_mask: Optional[SamplingMask] = None
    """Each completion token's sampling support, when the server sent them."""


@dataclass
class Stitched:
    """A black-box agent's session as one sample (``rollout.stitched``)."""

    observation_tokens: Int32Array
    action_ranges: List[Tuple[int, int]]
    rollout_logprobs: Float32Array
    model_steps: Int32Array
    truncated: bool
    side_calls: List[SideCall]
    routed_experts: Optional[npt.NDArray[np.int16]] = None
    """``[len(observation_tokens), layers, top_k]`` int16 (int32 past 32767): the experts each position
    was routed to, ``ROUTED_FILL`` where the server gave none (the last token). None when none."""
    sampling_mask: Optional[SamplingMask] = None
    """Each observation token's sampling support as CSR over the observation (empty outside the
    actions and where the server gave none). None when none."""


@dataclass
class Sample:
    """One sequence to train on. Every array has one entry per token of ``token_ids``."""

    rollout_id: str
    agent_id: Optional[str]
    token_ids: Int32Array
    action_mask: BoolArray
    """True on tokens the policy generated (the responses), False on prompts and observations."""
    logprobs: Float32Array
    """The sampling policy's logprob of each generated token; 0 outside the action mask, NaN where the server gave none."""
    model_steps: Int32Array
    """Model step of each generated token; -1 outside the action mask."""
    loss_mask: BoolArray
    """``action_mask`` less the tokens the engine masked as too stale."""
    reward: float
    advantage: float
    turns: List[int]
    """Indexes into the rollout's ``turns`` of the responses in this sample, in order."""
    inexact: BoolArray
    """Generated tokens whose recorded logprob no single set of weights reproduces, or whose model step
    is not known exactly: sampled on a KV cache from earlier weights (``Turn.stale_kv``) or in a turn
    that spans several weight versions (``Turn.spans_versions``). False elsewhere."""
    routed_experts: Optional[npt.NDArray[np.int16]] = None
    """``[len(token_ids), layers, top_k]`` int16 (int32 past 32767): the experts position t was routed to
    (prompt and response tokens alike: a replayed forward routes them all), ``ROUTED_FILL`` (-1) where
    the server gave none — the last token (never forwarded), or rows dropped rather than misaligned.
    None when no turn of the sample has routed experts."""
    sampling_mask_offsets: Optional[npt.NDArray[np.int64]] = None
    """``[len(token_ids) + 1]`` offsets into ``sampling_mask_ids``: token t's support; empty outside the
    action tokens and where the server gave none. None when no turn has a mask."""
    sampling_mask_ids: Optional[Int32Array] = None


@dataclass
class Rollout:
    """One episode of one prompt (``status`` is COMPLETED in a NORMAL batch)."""

    id: str
    group_id: str
    index: int
    task_name: str
    status: str
    reward: float
    agent_rewards: Optional[Dict[str, float]]
    turns: List[Turn]
    messages: List[Message]
    terminated: bool
    truncated: bool
    finish_reason: Optional[str]
    error: Optional[str]
    attempt: int
    sample: Dict[str, Any]
    """The prompt it was reset with: ``taskName``, ``promptIndex``, ``drawIndex``, ``seed``, ``envParams``."""
    timings: Dict[str, float]
    stitched: Optional[Stitched] = None
    sampling: Optional[Sampling] = None
    masked_failures: int = 0
    """Episodes of this rollout that failed by infrastructure and ran again in its slot (none of them is in it)."""
    """Its group's ``sampling``; None for a black-box agent's rollout, whose agent chose its own."""

    def samples(self, advantage: float = 0.0, *, trainable_only: bool = True) -> List[Sample]:
        """The rollout as training sequences (see the module doc); each carries ``advantage``.

        A black-box agent's rollout is its stitched session. Otherwise, per agent, consecutive turns
        whose prompts extend one another are one sample; a rollout split by a chat template that
        rewrote its history (``Turn.history_rewrite == "split"``) gives one sample per segment, each
        with this rollout's reward and ``advantage`` (the engine makes the turn ending each segment
        trainable). With ``trainable_only`` a sample with no
        trainable turn is left out: with ``messageCut: 0`` the engine marks only a last turn that
        ended the episode trainable (it holds the whole conversation), so an episode cut by
        ``maxSteps`` gives none.
        """
        if self.stitched is not None:
            return [_stitched_sample(self, self.stitched, advantage)]
        out: List[Sample] = []
        agents: List[Optional[str]] = []
        for turn in self.turns:
            if turn.agent_id not in agents:
                agents.append(turn.agent_id)
        for agent in agents:
            reward = self.reward if agent is None or self.agent_rewards is None else float(self.agent_rewards.get(agent, 0.0))
            builder: Optional[_SampleBuilder] = None
            for i, turn in enumerate(self.turns):
                if turn.agent_id != agent:
                    continue
                if turn.prompt_ids is None or turn.response_ids is None:
                    # No ids from the server for this turn: nothing to train on, and nothing to extend.
                    _flush(builder, out, self.id, agent, reward, advantage, trainable_only)
                    builder = None
                    continue
                if builder is None or not builder.extended_by(turn.prompt_ids):
                    _flush(builder, out, self.id, agent, reward, advantage, trainable_only)
                    builder = _SampleBuilder()
                builder.add(i, turn)
            _flush(builder, out, self.id, agent, reward, advantage, trainable_only)
        return out

    def sequence(self, *, trainable_only: bool = True) -> Sample:
        """The rollout's one sample; a :class:`BatchFormatError` when its turns make more or none."""
        found = self.samples(trainable_only=trainable_only)
        if len(found) != 1:
            raise BatchFormatError(f"rollout {self.id}", f"its turns make {len(found)} samples, not one (trimmed prompts or several agents: use samples())")
        return found[0]


@dataclass
class Group:
    """The k rollouts of one prompt."""

    id: str
    task_name: str
    status: str
    rollouts: List[Rollout]
    sample: Dict[str, Any]
    error: Optional[str]
    sampling: Optional[Sampling] = None
    """What its turns were sampled with, recorded once per group; None for a black-box agent's group."""

    def rewards(self) -> Float32Array:
        return np.array([r.reward for r in self.rollouts], dtype=np.float32)

    def advantages(self, eps: float = 1e-6, scale: bool = True) -> Float32Array:
        """GRPO advantages: each reward minus the group's mean, over the group's std (population) when ``scale``.

        A group whose rewards are all equal has advantages 0: it carries no signal.
        """
        rewards = self.rewards()
        centred = rewards - rewards.mean() if rewards.size else rewards
        out: Float32Array = centred if not scale or rewards.size == 0 else centred / (rewards.std() + eps)
        return out.astype(np.float32, copy=False)

    def samples(self, eps: float = 1e-6, scale: bool = True) -> List[Sample]:
        """Every rollout's samples, each with its rollout's GRPO advantage."""
        adv = self.advantages(eps, scale)
        return [s for r, a in zip(self.rollouts, adv) for s in r.samples(float(a))]


@dataclass
class Batch:
    """The answer to ``POST /batch``: a NORMAL batch has groups and stats, the other statuses neither."""

    train_step: int
    status: BatchStatus
    groups: List[Group]
    stats: Optional[BatchStats]
    compact: bool = field(default=False)
    """The engine sent it in the compact form (already expanded here)."""

    def rollouts(self) -> List[Rollout]:
        return [r for g in self.groups for r in g.rollouts]

    def samples(self, eps: float = 1e-6, scale: bool = True) -> List[Sample]:
        """Every group's samples with GRPO advantages normalised within each group."""
        return [s for g in self.groups for s in g.samples(eps, scale)]


# --- decoding ---------------------------------------------------------------------------------------

ArrayField = Union[bytes, bytearray, memoryview, Sequence[float], None]


def decode_batch(raw: Mapping[str, Any]) -> Batch:
    """A :class:`Batch` from the decoded JSON or msgpack answer of ``POST /batch`` (compact or full)."""
    where = "batch"
    status = _get(raw, "status", str, where)
    if status not in ("NORMAL", "EXPIRED_BATCH", "UPDATE_WEIGHT_AND_ABORT"):
        raise BatchFormatError(f"{where}.status", f"unknown status {status!r}")
    groups_raw = _get(raw, "groups", list, where)
    groups: List[Group] = []
    compact = False
    for g, group in enumerate(groups_raw):
        decoded, was_compact = _group(group, f"{where}.groups[{g}]")
        groups.append(decoded)
        compact = compact or was_compact
    stats = raw.get("stats")
    return Batch(
        train_step=_get(raw, "trainStep", int, where),
        status=status,  # checked against the three statuses above
        groups=groups,
        stats=stats if isinstance(stats, dict) else None,  # type: ignore[arg-type]  # the engine's own stats, as sent
        compact=compact,
    )


def _group(raw: Any, where: str) -> Tuple[Group, bool]:
    if not isinstance(raw, dict):
        raise BatchFormatError(where, f"must be an object (got {type(raw).__name__})")
    rollouts: List[Rollout] = []
    compact = False
    for r, rollout in enumerate(_get(raw, "rollouts", list, where)):
        decoded, was_compact = _rollout(rollout, f"{where}.rollouts[{r}]")
        rollouts.append(decoded)
        compact = compact or was_compact
    sampling = None if raw.get("sampling") is None else _sampling(raw["sampling"], f"{where}.sampling", agents=True)
    if sampling is not None:
        for decoded in rollouts:
            decoded.sampling = sampling
            for turn in decoded.turns:
                turn.sampling = sampling.for_agent(turn.agent_id)
    return (
        Group(
            id=_get(raw, "id", str, where),
            task_name=_get(raw, "taskName", str, where),
            status=_get(raw, "status", str, where),
            rollouts=rollouts,
            sample=raw.get("sample") or {},
            error=raw.get("error"),
            sampling=sampling,
        ),
        compact,
    )


_SAMPLING_FIELDS = (
    ("topP", "top_p"),
    ("topK", "top_k"),
    ("minP", "min_p"),
    ("repetitionPenalty", "repetition_penalty"),
    ("presencePenalty", "presence_penalty"),
    ("frequencyPenalty", "frequency_penalty"),
)


def _sampling(raw: Any, where: str, *, agents: bool) -> Sampling:
    if not isinstance(raw, dict):
        raise BatchFormatError(where, f"must be an object (got {type(raw).__name__})")
    values: Dict[str, Any] = {}
    for key, name in _SAMPLING_FIELDS:
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BatchFormatError(f"{where}.{key}", f"must be a number (got {value!r:.60})")
        values[name] = int(value) if key == "topK" else float(value)
    per_agent: Dict[str, Sampling] = {}
    agents_raw = raw.get("agents")
    if agents and isinstance(agents_raw, dict):
        per_agent = {str(a): _sampling(s, f"{where}.agents.{a}", agents=False) for a, s in agents_raw.items()}
    return Sampling(temperature=float(_get(raw, "temperature", (int, float), where)), agents=per_agent, **values)


def _rollout(raw: Any, where: str) -> Tuple[Rollout, bool]:
    if not isinstance(raw, dict):
        raise BatchFormatError(where, f"must be an object (got {type(raw).__name__})")
    turns_raw = _get(raw, "turns", list, where)
    compact = _expand_compact(turns_raw, where)
    turns = [_turn(t, f"{where}.turns[{i}]") for i, t in enumerate(turns_raw)]
    stitched_raw = raw.get("stitched")
    agent_rewards = raw.get("agentRewards")
    return (
        Rollout(
            id=_get(raw, "id", str, where),
            group_id=_get(raw, "groupId", str, where),
            index=_get(raw, "index", int, where),
            task_name=_get(raw, "taskName", str, where),
            status=_get(raw, "status", str, where),
            reward=float(_get(raw, "reward", (int, float), where)),
            agent_rewards={str(k): float(v) for k, v in agent_rewards.items()} if isinstance(agent_rewards, dict) else None,
            turns=turns,
            messages=list(raw.get("messages") or []),
            terminated=bool(raw.get("terminated")),
            truncated=bool(raw.get("truncated")),
            finish_reason=raw.get("finishReason"),
            error=raw.get("error"),
            attempt=int(raw.get("attempt") or 0),
            masked_failures=int(raw.get("maskedFailures") or 0),
            sample=raw.get("sample") or {},
            timings=raw.get("timings") or {},
            stitched=None if stitched_raw is None else _stitched(stitched_raw, f"{where}.stitched"),
        ),
        compact,
    )


def _expand_compact(turns: List[Any], where: str) -> bool:
    """Resolve the compact form's prefix references in place, before any array is decoded.

    A carrier holds its field whole (never a reference itself), so one pass in any order resolves
    every reference; the raw prefix is taken from the carrier's raw field (bytes or list), so the
    decoded ids of the referring turn are a view of the same bytes.
    """
    compact = False
    for t, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise BatchFormatError(f"{where}.turns[{t}]", f"must be an object (got {type(turn).__name__})")
        for field_name, ref_name in (("messages", "messagesPrefixOf"), ("promptIds", "promptIdsPrefixOf")):
            ref = turn.get(ref_name)
            if ref is None:
                continue
            compact = True
            at = f"{where}.turns[{t}].{ref_name}"
            j, n = (ref.get("turn"), ref.get("length")) if isinstance(ref, dict) else (None, None)
            # bool is an int to isinstance: `true` is no turn index
            if not isinstance(j, int) or isinstance(j, bool) or not 0 <= j < len(turns) or not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise BatchFormatError(at, f"must name a turn of this rollout and a length (got {ref!r})")
            carrier = turns[j].get(field_name)
            if carrier is None or ref_name in turns[j]:
                raise BatchFormatError(at, f"must name a turn that carries {field_name} whole (got {ref!r})")
            width = 4 if isinstance(carrier, (bytes, bytearray, memoryview)) and field_name == "promptIds" else 1
            if n * width > len(carrier):
                raise BatchFormatError(at, f"asks for {n} of turn {j}'s {field_name}, which has {len(carrier) // width}")
            turn[field_name] = memoryview(carrier)[: n * 4] if width == 4 else carrier[:n]
            del turn[ref_name]
    return compact


def _turn(raw: Dict[str, Any], where: str) -> Turn:
    return Turn(
        step=_get(raw, "step", int, where),
        agent_id=raw.get("agentId"),
        messages=list(_get(raw, "messages", list, where)),
        response=_get(raw, "response", str, where),
        finish_reason=str(raw.get("finishReason")),
        prompt_ids=_array(raw.get("promptIds"), _I32, f"{where}.promptIds"),
        response_ids=_array(raw.get("responseIds"), _I32, f"{where}.responseIds"),
        logprobs=_array(raw.get("logprobs"), _F32, f"{where}.logprobs"),
        model_steps=_array(raw.get("modelSteps"), _I32, f"{where}.modelSteps"),
        loss_mask=_array(raw.get("lossMask"), _U8, f"{where}.lossMask"),
        model_step=_get(raw, "modelStep", int, where),
        reward=float(_get(raw, "reward", (int, float), where)),
        terminated=bool(raw.get("terminated")),
        truncated=bool(raw.get("truncated")),
        trainable=bool(raw.get("trainable")),
        seed=raw.get("seed"),
        timings=raw.get("timings") or {},
        stale_kv=_array(raw.get("staleKv"), _U8, f"{where}.staleKv"),
        spans_versions=raw.get("spansVersions") is True,
        routed_experts=_routed(raw.get("routedExperts"), f"{where}.routedExperts"),
        sampling_mask=_mask(raw.get("samplingMask"), f"{where}.samplingMask"),
        history_rewrite=_history_rewrite(raw.get("historyRewrite"), f"{where}.historyRewrite"),
    )


def _routed(raw: Any, where: str) -> Optional[RoutedExperts]:
    if raw is None:
        return None
    start, rows, layers, top_k = (_get(raw, key, int, where) for key in ("start", "rows", "layers", "topK"))
    count = rows * layers * top_k
    value = raw.get("ids")
    if isinstance(value, (bytes, bytearray, memoryview)):
        nbytes = memoryview(value).nbytes
        if nbytes not in (count, 2 * count):
            raise BatchFormatError(f"{where}.ids", f"{nbytes} bytes is not {rows}×{layers}×{top_k} ids of 1 or 2 bytes")
        dtype: np.dtype[Any] = _U8 if nbytes == count else _U16
        ids = _array(value, dtype, f"{where}.ids")
    else:
        ids = _required_array(value, _U16, f"{where}.ids")
        if len(ids) != count:
            raise BatchFormatError(f"{where}.ids", f"{len(ids)} ids is not {rows}×{layers}×{top_k}")
    return RoutedExperts(start=start, ids=ids.reshape(rows, layers, top_k))


def _mask(raw: Any, where: str) -> Optional[SamplingMask]:
    if raw is None:
        return None
    return SamplingMask(
        offsets=_required_array(raw.get("offsets"), _I32, f"{where}.offsets"),
        ids=_required_array(raw.get("ids"), _I32, f"{where}.ids"),
        logprobs=_array(raw.get("logprobs"), _F32, f"{where}.logprobs"),
    )


def _history_rewrite(value: Any, where: str) -> Optional[str]:
    if value is None or value in ("kept", "split"):
        return value  # type: ignore[no-any-return]  # one of the two, checked
    raise BatchFormatError(where, f'must be "kept" or "split" (got {value!r:.60})')


def _stitched(raw: Any, where: str) -> Stitched:
    if not isinstance(raw, dict):
        raise BatchFormatError(where, f"must be an object (got {type(raw).__name__})")
    side_calls = []
    for i, call in enumerate(raw.get("sideCalls") or []):
        at = f"{where}.sideCalls[{i}]"
        prompt_ids = _required_array(call.get("promptIds"), _I32, f"{at}.promptIds")
        completion_ids = _required_array(call.get("completionIds"), _I32, f"{at}.completionIds")
        side_calls.append(
            SideCall(
                index=_get(call, "index", int, at),
                prompt_ids=prompt_ids,
                completion_ids=completion_ids,
                logprobs=_required_array(call.get("logprobs"), _F32, f"{at}.logprobs"),
                finish_reason=str(call.get("finishReason")),
                model_step=_get(call, "modelStep", int, at),
                routed_experts=_routed_array(call.get("routedExperts"), len(prompt_ids) + len(completion_ids), f"{at}.routedExperts"),
                sampling_mask=_mask(call.get("samplingMask"), f"{at}.samplingMask"),
            )
        )
    observation = _required_array(raw.get("observationTokens"), _I32, f"{where}.observationTokens")
    return Stitched(
        observation_tokens=observation,
        action_ranges=[(int(a), int(b)) for a, b in _get(raw, "actionRanges", list, where)],
        rollout_logprobs=_required_array(raw.get("rolloutLogprobs"), _F32, f"{where}.rolloutLogprobs"),
        model_steps=_required_array(raw.get("modelSteps"), _I32, f"{where}.modelSteps"),
        truncated=bool(raw.get("truncated")),
        side_calls=side_calls,
        routed_experts=_routed_array(raw.get("routedExperts"), len(observation), f"{where}.routedExperts"),
        sampling_mask=_mask(raw.get("samplingMask"), f"{where}.samplingMask"),
    )


def _routed_array(raw: Any, length: int, where: str) -> Optional[npt.NDArray[Any]]:
    """Routed experts as the trainer's array over a sequence of ``length`` positions: the rows at their
    positions (a side call's from where the server began them; a stitched sample's, one per position,
    ``fill`` — 255 or 65535 — where the server gave none), ``ROUTED_FILL`` wherever no row is known."""
    r = _routed(raw, where)
    if r is None:
        return None
    fill = raw.get("fill")
    if fill is not None and (not isinstance(fill, int) or isinstance(fill, bool)):
        raise BatchFormatError(f"{where}.fill", f"must be an int (got {fill!r:.60})")
    if r.start + r.rows > length:
        raise BatchFormatError(where, f"rows {r.start}..{r.start + r.rows} go past the {length} tokens of the sequence")
    return _lay_routed(length, [(r.start, r.ids)], fill)


def _lay_routed(length: int, runs: Sequence[Tuple[int, npt.NDArray[Any]]], fill: Optional[int] = None) -> npt.NDArray[Any]:
    """Rows ``[rows, layers, top_k]`` laid at their absolute positions over ``length`` positions (a later
    run's report of a position wins) as int16 (int32 past 32767); ``ROUTED_FILL`` where no run has a
    row, and where a row holds ``fill`` (a stitched sample's mark for "none reported")."""
    _, first = runs[0]

    def top(ids: npt.NDArray[Any]) -> int:
        return int((ids if fill is None else ids[ids != fill]).max(initial=0))

    wide = any(top(ids) > 32767 for _, ids in runs)
    dtype = np.int32 if wide else np.int16
    out = np.full((length, first.shape[1], first.shape[2]), ROUTED_FILL, dtype=dtype)
    for start, ids in runs:
        end = min(start + ids.shape[0], length)
        if end > start and ids.shape[1:] == out.shape[1:]:
            rows = ids[: end - start]
            values = rows.astype(dtype)
            if fill is not None:
                values[rows == fill] = ROUTED_FILL
            out[start:end] = values
    return out


def _array(value: ArrayField, dtype: np.dtype[Any], where: str) -> Any:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        buffer = memoryview(value).cast("B")
        if buffer.nbytes % dtype.itemsize:
            raise BatchFormatError(where, f"{buffer.nbytes} bytes is not a whole number of {dtype.itemsize}-byte values")
        return np.frombuffer(buffer, dtype=dtype)
    if isinstance(value, list):
        try:
            return np.asarray(value, dtype=dtype)
        except (TypeError, ValueError, OverflowError) as err:
            raise BatchFormatError(where, f"must be a list of numbers ({err})") from None
    raise BatchFormatError(where, f"must be bytes or a list of numbers (got {type(value).__name__})")


def _required_array(value: ArrayField, dtype: np.dtype[Any], where: str) -> Any:
    out = _array(value, dtype, where)
    if out is None:
        raise BatchFormatError(where, "is missing")
    return out


def _get(raw: Mapping[str, Any], key: str, kind: Union[type, Tuple[type, ...]], where: str) -> Any:
    if not isinstance(raw, Mapping):
        raise BatchFormatError(where, f"must be an object (got {type(raw).__name__})")
    value = raw.get(key)
    # bool is an int to isinstance: a true/false where a number belongs is refused all the same.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise BatchFormatError(f"{where}.{key}", f"must be {_kind_name(kind)} (got {value!r:.60})")
    return value


def _kind_name(kind: Union[type, Tuple[type, ...]]) -> str:
    return " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__


# --- samples ----------------------------------------------------------------------------------------


class _SampleBuilder:
    """Pieces of one sample, concatenated once at the end."""

    def __init__(self) -> None:
        self.tokens: List[Int32Array] = []
        self.action: List[bool] = []
        self.logprobs: List[Float32Array] = []
        self.model_steps: List[Int32Array] = []
        self.loss: List[BoolArray] = []
        self.inexact: List[BoolArray] = []
        self.turns: List[int] = []
        self.trainable = False
        self.length = 0
        # Routed rows by absolute position (a later turn's report of a position wins), and masks per response.
        self.routed: List[Tuple[int, npt.NDArray[Any]]] = []
        self.masks: List[Tuple[int, Optional[SamplingMask], int]] = []

    def extended_by(self, prompt_ids: Int32Array) -> bool:
        """The next turn's prompt begins with every token of this sample (so it continues it)."""
        if len(prompt_ids) < self.length:
            return False
        return bool(np.array_equal(prompt_ids[: self.length], np.concatenate(self.tokens) if self.tokens else prompt_ids[:0]))

    def add(self, index: int, turn: Turn) -> None:
        assert turn.prompt_ids is not None and turn.response_ids is not None
        context = turn.prompt_ids[self.length :]
        n = len(context)
        self.tokens.append(context)
        self.logprobs.append(np.zeros(n, dtype=np.float32))
        self.model_steps.append(np.full(n, -1, dtype=np.int32))
        self.loss.append(np.zeros(n, dtype=np.bool_))
        self.inexact.append(np.zeros(n, dtype=np.bool_))
        self.action.append(False)
        r = turn.response_ids
        m = len(r)
        self.tokens.append(r)
        self.logprobs.append(turn.logprobs if turn.logprobs is not None and len(turn.logprobs) == m else np.full(m, np.nan, dtype=np.float32))
        self.model_steps.append(turn.model_steps if turn.model_steps is not None and len(turn.model_steps) == m else np.full(m, turn.model_step, dtype=np.int32))
        self.loss.append(turn.loss_mask.astype(np.bool_) if turn.loss_mask is not None and len(turn.loss_mask) == m else np.ones(m, dtype=np.bool_))
        if turn.spans_versions:
            self.inexact.append(np.ones(m, dtype=np.bool_))
        elif turn.stale_kv is not None and len(turn.stale_kv) == m:
            self.inexact.append(turn.stale_kv.astype(np.bool_))
        else:
            self.inexact.append(np.zeros(m, dtype=np.bool_))
        self.action.append(True)
        self.turns.append(index)
        self.trainable = self.trainable or turn.trainable
        if turn.routed_experts is not None:
            self.routed.append((turn.routed_experts.start, turn.routed_experts.ids))
        self.masks.append((self.length + n, turn.sampling_mask, m))
        self.length += n + m

    def build(self, rollout_id: str, agent_id: Optional[str], reward: float, advantage: float) -> Sample:
        action = np.concatenate([np.full(len(t), a, dtype=np.bool_) for t, a in zip(self.tokens, self.action)])
        return Sample(
            rollout_id=rollout_id,
            agent_id=agent_id,
            token_ids=np.concatenate(self.tokens).astype(np.int32, copy=False),
            action_mask=action,
            logprobs=np.concatenate(self.logprobs).astype(np.float32, copy=False),
            model_steps=np.concatenate(self.model_steps).astype(np.int32, copy=False),
            loss_mask=np.concatenate(self.loss) & action,
            reward=reward,
            advantage=advantage,
            turns=list(self.turns),
            inexact=np.concatenate(self.inexact) & action,
            routed_experts=self._routed(),
            **self._masks(),
        )

    def _routed(self) -> Optional[npt.NDArray[Any]]:
        return _lay_routed(self.length, self.routed) if self.routed else None

    def _masks(self) -> Dict[str, Any]:
        if all(mask is None for _, mask, _ in self.masks):
            return {}
        counts = np.zeros(self.length, dtype=np.int64)
        pieces: List[Int32Array] = []
        for at, mask, m in self.masks:
            if mask is None or len(mask.offsets) != m + 1:
                continue
            counts[at : at + m] = np.diff(mask.offsets.astype(np.int64))
            pieces.append(mask.ids[mask.offsets[0] : mask.offsets[-1]])
        offsets = np.zeros(self.length + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        ids = np.concatenate(pieces).astype(np.int32, copy=False) if pieces else np.zeros(0, dtype=np.int32)
        return {"sampling_mask_offsets": offsets, "sampling_mask_ids": ids}


def _flush(builder: Optional[_SampleBuilder], out: List[Sample], rollout_id: str, agent_id: Optional[str], reward: float, advantage: float, trainable_only: bool) -> None:
    if builder is not None and builder.turns and (builder.trainable or not trainable_only):
        out.append(builder.build(rollout_id, agent_id, reward, advantage))
    return None


def _stitched_sample(rollout: Rollout, s: Stitched, advantage: float) -> Sample:
    n = len(s.observation_tokens)
    action = np.zeros(n, dtype=np.bool_)
    for a, b in s.action_ranges:
        action[a:b] = True
    return Sample(
        rollout_id=rollout.id,
        agent_id=None,
        token_ids=s.observation_tokens,
        action_mask=action,
        logprobs=np.where(action, s.rollout_logprobs, np.float32(0)).astype(np.float32),
        model_steps=np.where(action, s.model_steps, np.int32(-1)).astype(np.int32),
        loss_mask=action.copy(),
        reward=rollout.reward,
        advantage=advantage,
        turns=list(range(len(rollout.turns))),
        inexact=np.zeros(n, dtype=np.bool_),
        routed_experts=s.routed_experts,
        **_stitched_masks(s.sampling_mask, n),
    )


def _stitched_masks(mask: Optional[SamplingMask], n: int) -> Dict[str, Any]:
    """A stitched sample's supports (CSR over its observation) as :attr:`Sample.sampling_mask_offsets` / ``ids``."""
    if mask is None or len(mask.offsets) != n + 1:
        return {}
    base = int(mask.offsets[0])
    return {
        "sampling_mask_offsets": mask.offsets.astype(np.int64) - base,
        "sampling_mask_ids": mask.ids[base : int(mask.offsets[-1])].astype(np.int32, copy=False),
    }


__all__ = [
    "Batch",
    "Group",
    "Rollout",
    "Sampling",
    "Turn",
    "Sample",
    "Stitched",
    "SideCall",
    "RoutedExperts",
    "SamplingMask",
    "ROUTED_FILL",
    "decode_batch",
]
