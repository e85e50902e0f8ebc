"""The control API's JSON answers as TypedDicts (field names as the engine sends them).

Batches are not here: they are decoded into the dataclasses of :mod:`rollout_engine.batch`, with numpy
arrays for tokens. These are the small answers a trainer reads as they come.
"""
from __future__ import annotations

from typing import Dict, Literal, Optional, TypedDict

BatchStatus = Literal["NORMAL", "EXPIRED_BATCH", "UPDATE_WEIGHT_AND_ABORT"]
"""NORMAL: the batch. EXPIRED_BATCH: sync weights, then ask again. UPDATE_WEIGHT_AND_ABORT: paused, resume first."""

RolloutStatus = Literal["INIT", "COMPLETED", "ABORTED", "EXPIRED", "FAILED", "FILTERED"]


class Health(TypedDict):
    status: str


class DropCounts(TypedDict):
    FAILED: int
    FILTERED: int
    EXPIRED: int


class GroupCounts(TypedDict):
    """``scheduled = inFlight + in the buffer + taken + dropped`` (the engine's accounting identity)."""

    scheduled: int
    retried: int
    inFlight: int
    landed: Dict[str, int]
    taken: int
    dropped: DropCounts


class BufferCounts(TypedDict):
    completed: int
    aborted: int
    expired: int
    bytes: int
    dropped: DropCounts
    lastDropReason: Optional[str]


class EngineStatus(TypedDict):
    """``GET /status``."""

    modelStep: int
    nextTrainStep: int
    producerFutureStep: int
    paused: bool
    groups: GroupCounts
    buffer: BufferCounts
    llmUrl: Optional[str]


class PauseReport(TypedDict):
    """``POST /pause``: answered once every group in flight is back, or at once when the servers paused
    in place (``inPlace``; pause.mode in-place). Times in ms from the request."""

    workersStoppedMs: Optional[float]
    workersAckedMs: Optional[float]
    allBackMs: float
    groupsBack: int
    serverAbort: bool
    cancelled: bool
    stillInFlight: int
    inPlace: bool


class Staleness(TypedDict):
    min: float
    max: float
    mean: float
    # Rollouts at or past the stale threshold: only producer.staleRollouts "keep" hands them out.
    pastThreshold: int


class TaskStats(TypedDict):
    groups: int
    meanReward: float


class BatchStats(TypedDict):
    """A NORMAL batch's ``stats``."""

    groups: int
    rollouts: int
    meanReward: float
    turns: int
    responseTokens: int
    staleness: Staleness
    maskedTokens: int
    # Response tokens no single set of weights reproduces (Turn.stale_kv, Turn.spans_versions).
    inexactTokens: int
    # llm.api "tokens": turns whose chat template re-rendered the history otherwise than it was
    # sampled (Turn.history_rewrite), and those of them that began a new training segment.
    historyRewrites: int
    historySplits: int
    producedSamples: Dict[str, int]
    producedTokens: Dict[str, int]
    rawMeanReward: Dict[str, Optional[float]]
    # Episodes that failed since the previous batch, by kind: environment, infrastructure (run
    # again in their slot, never trained), inference, timeout, parse, policy.
    failures: Dict[str, int]
    produceMs: float
    byTask: Dict[str, TaskStats]


class ResumeReply(TypedDict, total=False):
    resumed: bool
    modelStep: int
    weightVersion: str


class CheckpointReply(TypedDict):
    path: str
    bytes: int


__all__ = [
    "BatchStatus",
    "RolloutStatus",
    "Health",
    "DropCounts",
    "GroupCounts",
    "BufferCounts",
    "EngineStatus",
    "PauseReport",
    "Staleness",
    "TaskStats",
    "BatchStats",
    "ResumeReply",
    "CheckpointReply",
]
