"""The client against a real ``rollout serve`` (launched from this repository by ``rollout_engine.launch``)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

import rollout_engine
from rollout_engine import Batch, ControlApiError, ControlClient, ExpiredBatch, LaunchError, RetryPolicy, WeightUpdateInProgress

from .support import ReplyCuttingProxy, engine_command, launch, REPO

# Without torch the collate test is skipped, except under CI=true, where torch is installed.
HAVE_TORCH = importlib.util.find_spec("torch") is not None

# Multi-turn episodes with the whole conversation sent (messageCut 0: a rollout is one sample) beside
# single-turn ones, on the embedded mock; 4 groups a batch.
CONFIG: Dict[str, Any] = {
    "seed": 3,
    "batchSize": 4,
    "tasks": [
        {"name": "guess", "env": {"module": "builtin:guess-number", "params": {"min": 1, "max": 64}}, "groupSize": 4, "maxSteps": 6, "messageCut": 0},
        {"name": "sum", "env": {"module": "builtin:arithmetic"}, "groupSize": 4, "maxSteps": 1},
    ],
    "workers": {"threads": 1},
}


def group_ids(batch: Batch) -> List[str]:
    return [g.id for g in batch.groups]


def assert_same_arrays(test: unittest.TestCase, a: Batch, b: Batch) -> None:
    test.assertEqual(group_ids(a), group_ids(b))
    for ra, rb in zip(a.rollouts(), b.rollouts()):
        test.assertEqual(ra.id, rb.id)
        test.assertEqual(len(ra.turns), len(rb.turns))
        for ta, tb in zip(ra.turns, rb.turns):
            test.assertEqual(ta.messages, tb.messages)
            for name in ("prompt_ids", "response_ids", "logprobs", "model_steps", "loss_mask"):
                x, y = getattr(ta, name), getattr(tb, name)
                test.assertEqual(x is None, y is None, f"{ra.id} {name}")
                if x is not None:
                    test.assertEqual(x.dtype, y.dtype, name)
                    np.testing.assert_array_equal(x, y, err_msg=f"{ra.id} turn {ta.step} {name}")


class TestAgainstServe(unittest.TestCase):
    """One engine for the routes, the batch contract and the decoders (steps taken in test order)."""

    engine: rollout_engine.LaunchedEngine
    client: ControlClient

    @classmethod
    def setUpClass(cls) -> None:
        cls.engine = launch(CONFIG)
        cls.client = cls.engine.client()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.client.close()
        code = cls.engine.stop()
        shutil.rmtree(cls.engine.run_dir, ignore_errors=True)
        assert code == 0, f"rollout serve exited {code}\n{cls.engine.log_tail()}"

    def next_step(self) -> int:
        return self.client.status()["nextTrainStep"]

    def test_every_route_answers_with_its_typed_reply(self) -> None:
        self.assertEqual(self.client.health(), {"status": "ok"})
        status = self.client.status()
        self.assertIsInstance(status["modelStep"], int)
        self.assertEqual(status["paused"], False)
        self.assertIn("scheduled", status["groups"])
        step = status["nextTrainStep"]
        batch = self.client.batch(step)
        self.assertEqual((batch.train_step, batch.status, len(batch.groups)), (step, "NORMAL", 4))
        assert batch.stats is not None
        self.assertEqual(batch.stats["groups"], 4)
        report = self.client.pause()
        self.assertGreaterEqual(report["allBackMs"], 0)
        self.assertTrue(self.client.status()["paused"])
        resumed = self.client.resume(status["modelStep"] + 1, weight_version="v1")
        self.assertEqual(resumed, {"resumed": True, "modelStep": status["modelStep"] + 1, "weightVersion": "v1"})
        self.assertEqual(self.client.status()["modelStep"], status["modelStep"] + 1)
        ckpt = self.client.checkpoint("trainer.ckpt")
        self.assertTrue(ckpt["path"].endswith("trainer.ckpt"))
        self.assertGreater(ckpt["bytes"], 0)
        self.assertTrue(os.path.exists(self.engine.run_dir / "trainer.ckpt"))
        self.assertIn("rollout_engine_", self.client.metrics())

    def test_a_refused_request_is_raised_with_its_code_and_not_sent_again(self) -> None:
        step = self.next_step() + 1
        self.client.batch(step)  # skipping one: a step is at most producer.maxSkippedSteps ahead
        proxy = ReplyCuttingProxy(self.engine.port)
        try:
            through = ControlClient(proxy.url, self.engine.token)
            with self.assertRaises(ControlApiError) as caught:
                through.batch(step - 1)  # a step behind the one handed out
            self.assertEqual((caught.exception.status, caught.exception.code), (409, "ERR_TRAIN_STEP"))
            with self.assertRaises(ControlApiError) as bad:
                through.checkpoint("/etc/passwd.ckpt")
            self.assertEqual((bad.exception.status, bad.exception.code), (400, "ERR_BAD_BODY"))
            self.assertEqual(len(proxy.requests), 2, proxy.requests)
            with self.assertRaises(ControlApiError) as unauthorized, ControlClient(proxy.url, "wrong-token") as stranger:
                stranger.status()
            self.assertEqual((unauthorized.exception.status, unauthorized.exception.code), (401, "ERR_UNAUTHORIZED"))
            through.close()
        finally:
            proxy.close()

    def test_a_reply_lost_mid_batch_is_asked_again_and_the_same_batch_comes_back(self) -> None:
        proxy = ReplyCuttingProxy(self.engine.port)
        try:
            through = ControlClient(proxy.url, self.engine.token, retry=RetryPolicy(attempts=3, backoff_s=0.01))
            step = self.next_step()
            proxy.cut_next_reply(after_bytes=64)  # the status line and a few headers, no body
            batch = through.batch(step)
            proxy.cut_next_reply(after_bytes=4096)  # the headers and part of the body
            self.assertEqual(group_ids(through.batch(step)), group_ids(batch))
            self.assertEqual(proxy.cuts, 2)
            self.assertEqual([r for r in proxy.requests if r.startswith(b"POST /batch")], [b"POST /batch HTTP/1.1"] * 4, "each sent twice: once lost, once answered")
            self.assertEqual(batch.status, "NORMAL")
            # The engine handed out this step once: asked directly, the same batch; the next step is new groups.
            assert_same_arrays(self, batch, self.client.batch(step))
            after = self.client.batch(step + 1)
            self.assertFalse(set(group_ids(after)) & set(group_ids(batch)))
            through.close()
        finally:
            proxy.close()

    def test_compact_and_full_forms_decode_to_the_same_arrays(self) -> None:
        step = self.next_step()
        compact = self.client.batch(step, compact=True)
        self.assertTrue(compact.compact, "multi-turn rollouts with the whole conversation come with prefix references")
        full = self.client.batch(step)
        self.assertFalse(full.compact)
        assert_same_arrays(self, compact, full)
        # JSON (number lists) and msgpack (raw little-endian bytes) too.
        as_json = ControlClient(self.engine.url, self.engine.token, use_msgpack=False)
        assert_same_arrays(self, as_json.batch(step, compact=True), full)
        as_json.close()
        for turn in full.rollouts()[0].turns:
            assert turn.prompt_ids is not None and turn.logprobs is not None
            self.assertEqual((turn.prompt_ids.dtype, turn.logprobs.dtype), (np.dtype("<i4"), np.dtype("<f4")))
            self.assertFalse(turn.prompt_ids.flags.writeable, "a view of the reply's bytes, not a copy")

    def test_a_rollout_with_the_whole_conversation_is_one_sample_with_every_response_in_its_action_mask(self) -> None:
        batch = self.client.batch(self.next_step())
        multi = [r for r in batch.rollouts() if r.task_name == "guess" and len(r.turns) > 1]
        self.assertTrue(multi, "some guess-number episodes take several turns")
        for rollout in multi:
            # An episode cut by maxSteps has no trainable turn (messageCut 0: only an ending turn is).
            self.assertEqual(len(rollout.samples()), 1 if rollout.turns[-1].trainable else 0)
            sample = rollout.sequence(trainable_only=False)
            last = rollout.turns[-1]
            assert last.prompt_ids is not None and last.response_ids is not None
            np.testing.assert_array_equal(sample.token_ids, np.concatenate([last.prompt_ids, last.response_ids]))
            responses = [t.response_ids for t in rollout.turns]
            np.testing.assert_array_equal(sample.token_ids[sample.action_mask], np.concatenate(responses))  # type: ignore[arg-type]
            np.testing.assert_array_equal(sample.logprobs[sample.action_mask], np.concatenate([t.logprobs for t in rollout.turns]))  # type: ignore[misc]
            self.assertEqual(sample.turns, list(range(len(rollout.turns))))
        for group in batch.groups:
            adv = group.advantages()
            rewards = group.rewards()
            np.testing.assert_allclose(adv, (rewards - rewards.mean()) / (rewards.std() + 1e-6), rtol=1e-5)
            self.assertAlmostEqual(float(adv.sum()), 0.0, places=4)

    @unittest.skipUnless(HAVE_TORCH or os.environ.get("CI") == "true", "torch is not installed")
    def test_collate_pads_each_sample_and_its_masks_match_the_turns(self) -> None:
        import torch

        from rollout_engine.collate import collate

        batch = self.client.batch(self.next_step())
        samples = batch.samples()
        t = collate(batch, pad_id=-7)
        n, width = t["input_ids"].shape
        self.assertEqual(n, len(samples))
        self.assertEqual(width, max(len(s.token_ids) for s in samples))
        by_id = {r.id: r for r in batch.rollouts()}
        advantages = {r.id: a for g in batch.groups for r, a in zip(g.rollouts, g.advantages())}
        for i, s in enumerate(samples):
            rollout = by_id[s.rollout_id]
            turns = [rollout.turns[k] for k in s.turns]
            length = len(s.token_ids)
            self.assertEqual(int(t["attention_mask"][i].sum()), length)
            self.assertTrue(bool((t["input_ids"][i, length:] == -7).all()), "padded with pad_id")
            action = t["action_mask"][i].numpy()
            np.testing.assert_array_equal(t["input_ids"][i].numpy()[action], np.concatenate([tr.response_ids for tr in turns]))  # type: ignore[misc]
            np.testing.assert_array_equal(t["old_logprobs"][i].numpy()[action], np.concatenate([tr.logprobs for tr in turns]))  # type: ignore[misc]
            self.assertTrue(bool((t["old_logprobs"][i].numpy()[~action] == 0).all()))
            loss = t["loss_mask"][i].numpy()
            self.assertFalse(bool((loss & ~action).any()), "the loss mask is inside the action mask")
            np.testing.assert_allclose(t["advantages"][i].numpy()[loss], advantages[s.rollout_id])
            self.assertTrue(bool((t["advantages"][i].numpy()[~loss] == 0).all()))
            self.assertAlmostEqual(float(t["rewards"][i]), rollout.reward, places=5)
        self.assertEqual(t["input_ids"].dtype, torch.int64)
        self.assertEqual(t["action_mask"].dtype, torch.bool)

    def test_weight_update_pauses_yields_the_report_and_resumes_and_resumes_nothing_when_the_body_raises(self) -> None:
        model_step = self.client.status()["modelStep"]
        with self.client.weight_update(model_step=model_step + 1) as report:
            self.assertIn("groupsBack", report)
            self.assertTrue(self.client.status()["paused"])
            # Asked while paused: the outcome, not an error.
            outcomes = self.client.batches(start_step=self.next_step(), steps=1)
            self.assertIsInstance(next(outcomes), WeightUpdateInProgress)
        status = self.client.status()
        self.assertEqual((status["paused"], status["modelStep"]), (False, model_step + 1))
        with self.assertRaises(RuntimeError):
            with self.client.weight_update(model_step=model_step + 2):
                raise RuntimeError("the weights did not load")
        status = self.client.status()
        self.assertEqual((status["paused"], status["modelStep"]), (True, model_step + 1), "still paused, on the old weights")
        self.client.resume(model_step + 2)
        self.assertIsInstance(next(outcomes), Batch, "the same step asked again once resumed")


class TestRestart(unittest.TestCase):
    def test_the_engine_killed_and_restarted_with_resume_while_the_client_iterates_hands_out_every_step_once(self) -> None:
        run_dir = tempfile.mkdtemp(prefix="rollout-restart-")
        engine = launch(CONFIG, run_dir=run_dir)
        restarted = threading.Event()
        failure: List[BaseException] = []

        def restart() -> None:
            try:
                engine.start(resume=True)
            except BaseException as err:  # reported by the test, not lost in the thread
                failure.append(err)
            finally:
                restarted.set()

        try:
            # Retries that outlast a restart of the engine from source on a busy machine.
            client = engine.client(retry=RetryPolicy(attempts=120, backoff_s=0.1, max_backoff_s=1.0))
            seen: List[Batch] = []
            for outcome in client.batches(start_step=1, steps=6):
                assert isinstance(outcome, Batch), outcome
                seen.append(outcome)
                if outcome.train_step in (2, 4):
                    engine.kill()  # SIGKILL: only the checkpoint written before this batch left survives
                    restarted.clear()
                    threading.Thread(target=restart, daemon=True).start()
            self.assertTrue(restarted.wait(120))
            self.assertEqual(failure, [])
            self.assertEqual([b.train_step for b in seen], [1, 2, 3, 4, 5, 6])
            ids = [gid for b in seen for gid in group_ids(b)]
            self.assertEqual(len(ids), len(set(ids)), "no group handed out twice")
            self.assertEqual(client.status()["nextTrainStep"], 7)
            client.close()
        finally:
            code = engine.stop()
            shutil.rmtree(run_dir, ignore_errors=True)
        self.assertEqual(code, 0, engine.log_tail())


class TestExpiredBatch(unittest.TestCase):
    def test_an_expired_batch_is_an_outcome_the_loop_syncs_weights_on_and_the_step_is_asked_again(self) -> None:
        config = {**CONFIG, "producer": {"strategy": "async", "maxStaleness": 0, "syncWeightsInterval": 1}}
        with launch(config) as engine, engine.client() as client:
            outcomes: List[str] = []
            for outcome in client.batches(start_step=1, steps=3):
                if isinstance(outcome, ExpiredBatch):
                    outcomes.append(f"expired {outcome.train_step}")
                    with client.weight_update(model_step=outcome.train_step - 1):
                        pass  # the embedded mock takes the model step as its weight version on resume
                    continue
                assert isinstance(outcome, Batch)
                outcomes.append(f"batch {outcome.train_step}")
            self.assertEqual(outcomes, ["batch 1", "expired 2", "batch 2", "expired 3", "batch 3"])
        shutil.rmtree(engine.run_dir, ignore_errors=True)


class TestLaunch(unittest.TestCase):
    def test_a_launch_that_fails_raises_with_the_engines_own_error_from_its_log(self) -> None:
        run_dir = tempfile.mkdtemp(prefix="rollout-bad-config-")
        try:
            with self.assertRaises(LaunchError) as caught:
                launch({"batchSize": -1}, run_dir=run_dir)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
        self.assertEqual(caught.exception.exit_code, 1)
        self.assertIn("batchSize", str(caught.exception))

    def test_an_engine_the_trainer_never_stopped_is_stopped_when_python_exits(self) -> None:
        script = (
            "import sys; sys.path[:0] = sys.argv[1:3]\n"
            "from tests.support import launch\n"
            "engine = launch()\n"
            "print(engine.pid, engine.run_dir, flush=True)\n"
            "del engine\n"
        )
        import rollout_engine as package

        here = str(Path(__file__).resolve().parents[1])
        out = subprocess.run([sys.executable, "-c", script, str(Path(package.__file__).parents[1]), here], capture_output=True, text=True, timeout=180)
        self.assertEqual(out.returncode, 0, out.stderr)
        pid, run_dir = out.stdout.split()
        with self.assertRaises(ProcessLookupError, msg="rollout serve outlived the trainer"):
            os.kill(int(pid), 0)
        self.assertTrue(os.path.exists(os.path.join(run_dir, "engine.ckpt")), "stopped with SIGTERM: it checkpointed")
        shutil.rmtree(run_dir, ignore_errors=True)

    def test_an_engine_whose_trainer_was_sigkilled_stops_too(self) -> None:
        # Regression: atexit does not run on SIGKILL, and the engine outlived its trainer.
        script = (
            "import os, signal, sys; sys.path[:0] = sys.argv[1:3]\n"
            "from tests.support import launch\n"
            "engine = launch()\n"
            "print(engine.pid, engine.run_dir, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n"
        )
        import rollout_engine as package

        here = str(Path(__file__).resolve().parents[1])
        out = subprocess.run([sys.executable, "-c", script, str(Path(package.__file__).parents[1]), here], capture_output=True, text=True, timeout=180)
        self.assertEqual(out.returncode, -signal.SIGKILL, out.stderr)
        pid, run_dir = out.stdout.split()
        # Another process's exit can only be polled; bounded by its SIGTERM drain (pause, checkpoint).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        with self.assertRaises(ProcessLookupError, msg="rollout serve outlived its SIGKILLed trainer"):
            os.kill(int(pid), 0)
        shutil.rmtree(run_dir, ignore_errors=True)

    def test_the_default_command_is_rollout_command_from_the_environment(self) -> None:
        old = os.environ.get("ROLLOUT_COMMAND")
        os.environ["ROLLOUT_COMMAND"] = "node --import tsx 'src/cli/main.ts'"
        try:
            self.assertEqual(rollout_engine.default_command(), ["node", "--import", "tsx", "src/cli/main.ts"])
        finally:
            if old is None:
                del os.environ["ROLLOUT_COMMAND"]
            else:
                os.environ["ROLLOUT_COMMAND"] = old
        self.assertTrue((REPO / "src" / "cli" / "main.ts").exists() or engine_command() is None)


if __name__ == "__main__":
    unittest.main()
