"""Routed experts and sampling masks decoded from a batch and laid out on each sample's tokens."""
from __future__ import annotations

import unittest
from typing import Any, Dict, List, Optional

import numpy as np

from rollout_engine import ROUTED_FILL, decode_batch

LAYERS, TOP_K = 2, 2


def expert(token: int, position: int, layer: int, k: int) -> int:
    """A row as a function of its token and position: a row moved elsewhere no longer matches."""
    return (token * 31 + position * 7 + layer * 3 + k) % 250


def rows(sequence: List[int], start: int) -> List[int]:
    return [expert(sequence[p], p, l, k) for p in range(start, len(sequence) - 1) for l in range(LAYERS) for k in range(TOP_K)]


def turn(prompt: List[int], response: List[int], start: int, as_bytes: bool, mask: Optional[List[List[int]]] = None) -> Dict[str, Any]:
    ids = rows(prompt + response, start)
    out: Dict[str, Any] = {
        "step": 1, "agentId": None, "messages": [], "response": "", "finishReason": "stop",
        "promptIds": prompt, "responseIds": response, "logprobs": [-0.5] * len(response),
        "modelSteps": [0] * len(response), "modelStep": 0, "reward": 0, "terminated": True,
        "truncated": False, "trainable": True, "seed": None, "timings": {},
        "routedExperts": {
            "start": start, "rows": len(ids) // (LAYERS * TOP_K), "layers": LAYERS, "topK": TOP_K,
            "ids": np.asarray(ids, dtype=np.uint8).tobytes() if as_bytes else ids,
        },
    }
    if mask is not None:
        offsets = np.cumsum([0] + [len(s) for s in mask]).tolist()
        out["samplingMask"] = {"offsets": offsets, "ids": [i for s in mask for i in s]}
    return out


def batch(turns: List[Dict[str, Any]]) -> Dict[str, Any]:
    rollout = {"id": "t/0/0", "groupId": "t/0", "index": 0, "taskName": "t", "status": "COMPLETED", "reward": 1.0, "turns": turns}
    return {"trainStep": 1, "status": "NORMAL", "groups": [{"id": "t/0", "taskName": "t", "status": "COMPLETED", "rollouts": [rollout]}]}


class RoutedExpertsTest(unittest.TestCase):
    def check(self, as_bytes: bool) -> None:
        p1, r1 = [1, 2, 3], [4, 5]
        p2, r2 = p1 + r1 + [6], [7, 8, 9]
        # The second turn extends the first: it holds only the rows from where the first's end (position 4).
        decoded = decode_batch(batch([turn(p1, r1, 0, as_bytes, [[4, 9], [5]]), turn(p2, r2, 4, as_bytes, [[7], [8, 1], [9]])]))
        (sample,) = decoded.samples()
        seq = p2 + r2
        assert sample.routed_experts is not None
        self.assertEqual(sample.routed_experts.shape, (len(seq), LAYERS, TOP_K))
        for p in range(len(seq) - 1):
            for l in range(LAYERS):
                for k in range(TOP_K):
                    self.assertEqual(int(sample.routed_experts[p, l, k]), expert(seq[p], p, l, k), (p, l, k))
        self.assertTrue((sample.routed_experts[-1] == ROUTED_FILL).all(), "the last token is never forwarded")
        offsets, ids = sample.sampling_mask_offsets, sample.sampling_mask_ids
        assert offsets is not None and ids is not None
        support = {t: ids[offsets[t] : offsets[t + 1]].tolist() for t in range(len(seq)) if offsets[t + 1] > offsets[t]}
        self.assertEqual(support, {3: [4, 9], 4: [5], 6: [7], 7: [8, 1], 8: [9]})

    def test_rows_of_an_extending_turn_land_on_their_positions_from_msgpack_bytes(self) -> None:
        self.check(as_bytes=True)

    def test_rows_of_an_extending_turn_land_on_their_positions_from_json_lists(self) -> None:
        self.check(as_bytes=False)

    def test_ids_above_255_arrive_in_two_bytes(self) -> None:
        raw = turn([1, 2], [3], 0, True)
        raw["routedExperts"]["ids"] = np.asarray([300, 1, 2, 3, 4, 5, 6, 7], dtype="<u2").tobytes()
        (t,) = decode_batch(batch([raw])).groups[0].rollouts[0].turns
        assert t.routed_experts is not None
        self.assertEqual(t.routed_experts.ids.shape, (2, LAYERS, TOP_K))
        self.assertEqual(int(t.routed_experts.ids[0, 0, 0]), 300)


def stitched_rollout(observation: List[int], wide: bool, as_bytes: bool) -> Dict[str, Any]:
    """A black-box rollout whose stitched sample has a row per observation position, the fill on the last."""
    fill = 65535 if wide else 255
    shift = 300 if wide else 0
    ids = rows(observation, 0)
    dense = [i + shift for i in ids] + [fill] * (LAYERS * TOP_K)
    dtype = "<u2" if wide else "u1"
    side_prompt, side_completion = [40, 41], [42]
    side_ids = rows(side_prompt + side_completion, 1)
    stitched = {
        "observationTokens": observation,
        "actionRanges": [[2, 4], [5, 7]],
        "rolloutLogprobs": [0.0] * len(observation),
        "modelSteps": [0] * len(observation),
        "truncated": False,
        "routedExperts": {
            "start": 0, "rows": len(observation), "layers": LAYERS, "topK": TOP_K, "fill": fill,
            "ids": np.asarray(dense, dtype=dtype).tobytes() if as_bytes else dense,
        },
        # Supports of the action tokens (2, 3, 5, 6), none elsewhere.
        "samplingMask": {"offsets": [0, 0, 0, 2, 3, 3, 4, 6, 6], "ids": [3, 1, 4, 6, 7, 2]},
        "sideCalls": [{
            "index": 1, "promptIds": side_prompt, "completionIds": side_completion, "logprobs": [-1.0],
            "finishReason": "stop", "modelStep": 0,
            "routedExperts": {"start": 1, "rows": 1, "layers": LAYERS, "topK": TOP_K, "ids": side_ids},
        }],
    }
    return {"id": "b/0/0", "groupId": "b/0", "index": 0, "taskName": "b", "status": "COMPLETED", "reward": 1.0,
            "turns": [], "stitched": stitched}


class StitchedRoutingTest(unittest.TestCase):
    """A black-box agent's stitched session (the token-trace gateway) hands its routing to the trainer too."""

    def check(self, wide: bool, as_bytes: bool) -> None:
        observation = [1, 2, 3, 4, 5, 6, 7, 8]
        raw = batch([])
        raw["groups"][0]["rollouts"] = [stitched_rollout(observation, wide, as_bytes)]
        rollout = decode_batch(raw).groups[0].rollouts[0]
        (sample,) = rollout.samples()
        assert sample.routed_experts is not None
        self.assertEqual(sample.routed_experts.shape, (len(observation), LAYERS, TOP_K))
        self.assertEqual(sample.routed_experts.dtype, np.int16)
        shift = 300 if wide else 0
        for p in range(len(observation) - 1):
            for l in range(LAYERS):
                for k in range(TOP_K):
                    self.assertEqual(int(sample.routed_experts[p, l, k]), expert(observation[p], p, l, k) + shift)
        self.assertTrue((sample.routed_experts[-1] == ROUTED_FILL).all(), "the fill reads as ROUTED_FILL")
        offsets, ids = sample.sampling_mask_offsets, sample.sampling_mask_ids
        assert offsets is not None and ids is not None
        self.assertEqual(offsets.tolist(), [0, 0, 0, 2, 3, 3, 4, 6, 6])
        self.assertEqual(ids[offsets[5] : offsets[7]].tolist(), [6, 7, 2])
        (side,) = rollout.stitched.side_calls if rollout.stitched is not None else []
        assert side.routed_experts is not None
        self.assertEqual(side.routed_experts.shape, (3, LAYERS, TOP_K))
        self.assertTrue((side.routed_experts[0] == ROUTED_FILL).all(), "before the side call's first row")
        self.assertEqual(int(side.routed_experts[1, 1, 0]), expert(41, 1, 1, 0))
        self.assertTrue((side.routed_experts[2] == ROUTED_FILL).all(), "its last token, never forwarded")

    def test_one_byte_rows_from_msgpack_bytes(self) -> None:
        self.check(wide=False, as_bytes=True)

    def test_two_byte_rows_from_json_lists(self) -> None:
        self.check(wide=True, as_bytes=False)

    def test_two_byte_rows_from_msgpack_bytes(self) -> None:
        self.check(wide=True, as_bytes=True)


if __name__ == "__main__":
    unittest.main()
