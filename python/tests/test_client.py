"""The client's retries and the batch decoder, against a scripted HTTP server and hand-made batches."""
from __future__ import annotations

import http.server
import json
import socket
import threading
import unittest
from typing import Any, Dict, List, Optional, Tuple

import msgpack
import numpy as np

from rollout_engine import BatchFormatError, ControlApiError, ControlClient, EngineUnreachableError, RetryPolicy, decode_batch

FAST = RetryPolicy(attempts=4, backoff_s=0.001, max_backoff_s=0.002)


class ScriptedServer:
    """Answers each request with the next (status, body, headers) of ``script``; records the paths."""

    def __init__(self, script: List[Tuple[int, Dict[str, Any], Dict[str, str]]]) -> None:
        self.script = list(script)
        self.seen: List[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self._answer()

            def _answer(self) -> None:
                outer.seen.append(f"{self.command} {self.path}")
                status, body, headers = outer.script.pop(0)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def error(code: str) -> Dict[str, Any]:
    return {"error": {"code": code, "message": f"{code} happened"}}


class TestRetries(unittest.TestCase):
    def run_script(self, script: List[Tuple[int, Dict[str, Any], Dict[str, str]]]) -> Tuple[Any, Optional[BaseException], List[str]]:
        server = ScriptedServer(script)
        try:
            with ControlClient(server.url, use_msgpack=False, retry=FAST) as client:
                try:
                    return client.status(), None, server.seen
                except BaseException as err:  # the test looks at it
                    return None, err, server.seen
        finally:
            server.close()

    def test_a_5xx_is_retried_until_an_answer(self) -> None:
        value, err, seen = self.run_script([(503, error("ERR_INTERNAL"), {}), (500, error("ERR_INTERNAL"), {}), (200, {"modelStep": 3}, {})])
        self.assertIsNone(err)
        self.assertEqual(value, {"modelStep": 3})
        self.assertEqual(len(seen), 3)

    def test_a_429_is_retried_after_its_retry_after(self) -> None:
        value, err, seen = self.run_script([(429, error("ERR_RATE_LIMITED"), {"retry-after": "0"}), (200, {"ok": 1}, {})])
        self.assertEqual((value, err, len(seen)), ({"ok": 1}, None, 2))

    def test_a_4xx_is_raised_at_once_with_its_code_and_never_sent_again(self) -> None:
        for status, code in ((400, "ERR_BAD_BODY"), (401, "ERR_UNAUTHORIZED"), (409, "ERR_TRAIN_STEP")):
            _, err, seen = self.run_script([(status, error(code), {}), (200, {}, {})])
            assert isinstance(err, ControlApiError)
            self.assertEqual((err.status, err.code, len(seen)), (status, code, 1))

    def test_a_5xx_that_outlasts_the_retries_is_raised_with_its_code(self) -> None:
        _, err, seen = self.run_script([(503, error("ERR_INTERNAL"), {})] * 4)
        assert isinstance(err, ControlApiError)
        self.assertEqual((err.status, err.code, len(seen)), (503, "ERR_INTERNAL", 4))

    def test_an_engine_that_never_answers_is_unreachable_after_the_attempts(self) -> None:
        with socket.socket() as s:  # a port nobody listens on: bound, never listening
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            with ControlClient(f"http://127.0.0.1:{port}", retry=FAST) as client:
                with self.assertRaises(EngineUnreachableError) as caught:
                    client.health()
        self.assertEqual((caught.exception.code, caught.exception.attempts), ("ERR_UNREACHABLE", 4))

    def test_bad_arguments_are_refused_before_anything_is_sent(self) -> None:
        with self.assertRaises(ValueError):
            ControlClient("127.0.0.1:8100")
        with ControlClient("http://127.0.0.1:1") as client, self.assertRaises(ValueError):
            client.batch(0)


def turn(step: int, prompt: List[int], response: List[int], **extra: Any) -> Dict[str, Any]:
    return {
        "step": step,
        "agentId": None,
        "messages": [{"role": "user", "content": f"m{i}"} for i in range(step)],
        "response": "r",
        "finishReason": "stop",
        "promptIds": prompt,
        "responseIds": response,
        "logprobs": [-0.5] * len(response),
        "modelSteps": None,
        "modelStep": 2,
        "reward": 0,
        "terminated": False,
        "truncated": False,
        "trainable": True,
        "seed": None,
        "timings": {},
        **extra,
    }


def batch_of(turns: List[Dict[str, Any]], as_bytes: bool) -> Dict[str, Any]:
    if as_bytes:  # as msgpack carries them: raw little-endian bytes
        for t in turns:
            for key, dtype in (("promptIds", "<i4"), ("responseIds", "<i4"), ("logprobs", "<f4")):
                if isinstance(t.get(key), list):
                    t[key] = np.asarray(t[key], dtype=dtype).tobytes()
    rollout = {"id": "t/0/0", "groupId": "t/0", "index": 0, "taskName": "t", "status": "COMPLETED", "reward": 1.0, "turns": turns, "messages": []}
    return {"trainStep": 1, "status": "NORMAL", "groups": [{"id": "t/0", "taskName": "t", "status": "COMPLETED", "rollouts": [rollout], "error": None}], "stats": None}


class TestDecode(unittest.TestCase):
    def test_a_compact_turn_is_its_carriers_prefix_in_both_transports(self) -> None:
        for as_bytes in (False, True):
            compact = [
                turn(1, [], [7, 8], messages=None, messagesPrefixOf={"turn": 1, "length": 1}, promptIds=None, promptIdsPrefixOf={"turn": 1, "length": 3}),
                turn(2, [1, 2, 3, 7, 8, 4], [9]),
            ]
            raw = msgpack.unpackb(msgpack.packb(batch_of(compact, as_bytes)), raw=False)
            b = decode_batch(raw)
            self.assertTrue(b.compact)
            first, second = b.rollouts()[0].turns
            np.testing.assert_array_equal(first.prompt_ids, [1, 2, 3])  # type: ignore[arg-type]
            self.assertEqual(first.messages, second.messages[:1])
            sample = b.rollouts()[0].sequence()
            np.testing.assert_array_equal(sample.token_ids, [1, 2, 3, 7, 8, 4, 9])
            np.testing.assert_array_equal(sample.action_mask, [0, 0, 0, 1, 1, 0, 1])
            np.testing.assert_array_equal(sample.model_steps, [-1, -1, -1, 2, 2, -1, 2])
            self.assertEqual(sample.turns, [0, 1])

    def test_a_turn_whose_prompt_does_not_extend_the_last_starts_a_new_sample(self) -> None:
        b = decode_batch(batch_of([turn(1, [1, 2], [3]), turn(2, [5, 6], [7, 8])], as_bytes=True))
        samples = b.rollouts()[0].samples()
        self.assertEqual([s.turns for s in samples], [[0], [1]])
        np.testing.assert_array_equal(samples[1].loss_mask, [0, 0, 1, 1])

    def test_a_history_split_gives_one_sample_per_segment_each_with_the_rollouts_advantage(self) -> None:
        # As the engine sends an episode under llm.historyMode "split": the turn ending a segment is
        # trainable, the next begins with the re-rendered history; one kept turn extends its segment.
        turns = [
            turn(1, [1, 2], [3, 4], trainable=True),
            turn(2, [1, 9, 5], [6], trainable=False, historyRewrite="split"),
            turn(3, [1, 9, 5, 6, 7], [8], trainable=True, historyRewrite="kept"),
        ]
        b = decode_batch(batch_of(turns, as_bytes=True))
        rollout = b.rollouts()[0]
        self.assertEqual([t.history_rewrite for t in rollout.turns], [None, "split", "kept"])
        samples = rollout.samples(0.25)
        self.assertEqual([s.turns for s in samples], [[0], [1, 2]])
        self.assertEqual([(s.reward, s.advantage) for s in samples], [(1.0, 0.25), (1.0, 0.25)])
        np.testing.assert_array_equal(samples[1].token_ids, [1, 9, 5, 6, 7, 8])
        np.testing.assert_array_equal(samples[1].action_mask, [0, 0, 0, 1, 0, 1])
        with self.assertRaises(BatchFormatError):
            decode_batch(batch_of([turn(1, [1], [2], historyRewrite="maybe")], as_bytes=False))

    def test_the_engines_loss_mask_narrows_the_sample_loss_mask(self) -> None:
        b = decode_batch(batch_of([turn(1, [1], [2, 3, 4], lossMask=np.array([1, 0, 1], dtype="u1").tobytes())], as_bytes=True))
        np.testing.assert_array_equal(b.rollouts()[0].sequence().loss_mask, [0, 1, 0, 1])

    def test_the_groups_sampling_is_on_the_group_its_rollouts_and_each_turn_for_its_agent(self) -> None:
        raw = batch_of([turn(1, [1], [2]), turn(1, [1], [3], agentId="b")], as_bytes=True)
        raw["groups"][0]["sampling"] = {"temperature": 0.7, "topK": 40, "agents": {"b": {"temperature": 1, "topK": 40, "minP": 0.1}}}
        b = decode_batch(msgpack.unpackb(msgpack.packb(raw), raw=False))
        group = b.groups[0]
        assert group.sampling is not None
        self.assertEqual((group.sampling.temperature, group.sampling.top_k, group.sampling.top_p), (0.7, 40, None))
        self.assertTrue(group.sampling.truncated)
        self.assertFalse(group.sampling.penalised)
        self.assertIs(b.rollouts()[0].sampling, group.sampling)
        own, other = b.rollouts()[0].turns
        self.assertIs(own.sampling, group.sampling)
        assert other.sampling is not None
        self.assertEqual((other.sampling.temperature, other.sampling.min_p), (1.0, 0.1))

    def test_a_batch_without_a_sampling_record_decodes_with_none(self) -> None:
        b = decode_batch(batch_of([turn(1, [1], [2])], as_bytes=False))
        self.assertIsNone(b.groups[0].sampling)
        self.assertIsNone(b.rollouts()[0].turns[0].sampling)

    def test_a_bad_batch_is_refused_naming_the_field(self) -> None:
        cases: List[Tuple[Dict[str, Any], str]] = [
            ({"trainStep": 1, "status": "MAYBE", "groups": []}, "batch.status"),
            ({"trainStep": "1", "status": "NORMAL", "groups": []}, "batch.trainStep"),
            (batch_of([turn(1, [1], [2], promptIds=b"\x01\x02\x03")], as_bytes=False), "batch.groups[0].rollouts[0].turns[0].promptIds"),
            (batch_of([turn(1, [1], [2], promptIds=None, promptIdsPrefixOf={"turn": 5, "length": 1})], as_bytes=False), "batch.groups[0].rollouts[0].turns[0].promptIdsPrefixOf"),
        ]
        bad_sampling = batch_of([turn(1, [1], [2])], as_bytes=False)
        bad_sampling["groups"][0]["sampling"] = {"temperature": 1, "topP": "0.9"}
        cases.append((bad_sampling, "batch.groups[0].sampling.topP"))
        for raw, where in cases:
            with self.assertRaises(BatchFormatError) as caught:
                decode_batch(raw)
            self.assertEqual(caught.exception.where, where, str(caught.exception))


if __name__ == "__main__":
    unittest.main()
