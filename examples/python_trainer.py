#!/usr/bin/env python3
"""A fake trainer driving rollout-engine over its control API, with the Python standard library only.

It does what a real GRPO/PPO trainer does around the engine: take the batch for each train step,
"train" on it, and every few steps pause the engine, load new weights into the inference servers
(here: tell the mock server its new weight version), and resume with the new model step.

    rollout serve --port 8100 --strategy async &
    python3 examples/python_trainer.py --url http://127.0.0.1:8100 --steps 6 --sync-every 2

The bearer token comes from --token or $ROLLOUT_TOKEN. A weight sync tells the mock server its new
weight version (POST /admin/weight_version): the one named by --mock-url, else the engine's own
inference server when it is the mock; a real vLLM / SGLang server is left alone (load weights there
your own way).

With the `msgpack` package installed, --msgpack asks for msgpack replies (token ids arrive as raw
little-endian int32 bytes: numpy.frombuffer(ids, '<i4')). --compact asks for compact batches, where a
turn whose messages or prompt ids begin those of a later turn of the same agent names that turn
instead of repeating them, and expands them (expand_compact below).
"""
import argparse
import json
import os
import sys
import urllib.error
import urllib.request


class Engine:
    def __init__(self, url, token=None, use_msgpack=False):
        self.url = url.rstrip("/")
        self.token = token
        self.msgpack = None
        if use_msgpack:
            import msgpack  # optional dependency

            self.msgpack = msgpack

    def call(self, method, path, body=None, base=None, missing_ok=False):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request((base or self.url) + path, data=data, method=method)
        req.add_header("content-type", "application/json")
        if self.token:
            req.add_header("authorization", "Bearer " + self.token)
        if self.msgpack and base is None:
            req.add_header("accept", "application/msgpack")
        try:
            with urllib.request.urlopen(req, timeout=600) as res:
                raw = res.read()
                if res.headers.get("content-type", "").startswith("application/msgpack"):
                    return self.msgpack.unpackb(raw, raw=False)
                return json.loads(raw) if raw else {}
        except urllib.error.HTTPError as err:
            if missing_ok and err.code == 404:
                return None
            detail = err.read().decode(errors="replace")
            raise SystemExit(f"{method} {path} failed with {err.code}: {detail}")

    def sync_weights(self, model_step, mock):
        report = self.call("POST", "/pause")
        if mock["url"]:  # stands in for loading new weights into vLLM / SGLang
            base = mock["url"].rstrip("/")
            base = base[:-3] if base.endswith("/v1") else base
            if self.call("POST", "/admin/weight_version", {"weight_version": model_step}, base=base, missing_ok=not mock["named"]) is None:
                print(f"  {base} has no /admin/weight_version (not the mock): load the weights there your own way", flush=True)
                mock["url"] = None
        self.call("POST", "/resume", {"modelStep": model_step})
        return report


def expand_compact(batch):
    """The full form of a compact batch, in place: each named prefix taken from the turn that carries it
    (the turn of the same agent that holds the field whole). The expanded turns share the carrier's
    message dicts; copy them before changing one."""
    for group in batch["groups"]:
        for rollout in group["rollouts"]:
            turns = rollout["turns"]
            for turn in turns:
                ref = turn.pop("messagesPrefixOf", None)
                if ref:
                    turn["messages"] = turns[ref["turn"]]["messages"][: ref["length"]]
                ref = turn.pop("promptIdsPrefixOf", None)
                if ref:
                    ids = turns[ref["turn"]]["promptIds"]
                    # msgpack: int32 bytes, 4 per id; JSON: a list of ids
                    turn["promptIds"] = ids[: 4 * ref["length"]] if isinstance(ids, (bytes, bytearray)) else ids[: ref["length"]]
    return batch


def prompt_sizes(rollouts):
    """Prompt tokens and messages sent over every turn (what a compact batch must expand back to)."""
    tokens = messages = 0
    for rollout in rollouts:
        for turn in rollout["turns"]:
            ids = turn.get("promptIds") or []
            tokens += len(ids) // 4 if isinstance(ids, (bytes, bytearray)) else len(ids)
            messages += len(turn["messages"])
    return tokens, messages


def staleness(rollout, train_step):
    steps = []
    for turn in rollout["turns"]:
        ms = turn.get("modelSteps")
        if isinstance(ms, (bytes, bytearray)):
            import array

            ms = array.array("i", ms).tolist()
        if ms:
            steps.extend(ms)
    return train_step - min(steps) - 1 if steps else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="control API base URL")
    ap.add_argument("--token", default=os.environ.get("ROLLOUT_TOKEN"), help="bearer token (default: $ROLLOUT_TOKEN)")
    ap.add_argument("--mock-url", default=None, help="mock inference server whose weight version to set on a sync (default: the engine's, when it is the mock)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--sync-every", type=int, default=2)
    ap.add_argument("--msgpack", action="store_true")
    ap.add_argument("--compact", action="store_true", help="take compact batches and expand them")
    args = ap.parse_args()

    engine = Engine(args.url, args.token, args.msgpack)
    status = engine.call("GET", "/status")
    mock = {"url": args.mock_url or status.get("llmUrl"), "named": args.mock_url is not None}
    print(f"engine: model step {status['modelStep']}, next train step {status['nextTrainStep']}", flush=True)
    step = status["nextTrainStep"]
    last = step + args.steps
    synced_for = None  # the step a sync was last made for: a second EXPIRED_BATCH after it means the weights did not load
    while step < last:
        batch = engine.call("POST", "/batch", {"trainStep": step, "compact": args.compact})
        if batch["status"] == "EXPIRED_BATCH" and synced_for == step:
            raise SystemExit(
                f"step {step}: EXPIRED_BATCH again after a weight sync: the inference server still reports an older"
                " weight version (did the new weights load? with the mock, pass --mock-url)"
            )
        if batch["status"] != "NORMAL":
            print(f"step {step}: {batch['status']} -> syncing weights to {step - 1}", flush=True)
            engine.sync_weights(step - 1, mock)
            synced_for = step
            continue
        if args.compact:
            expand_compact(batch)
        rollouts = [r for g in batch["groups"] for r in g["rollouts"]]
        rewards = [r["reward"] for r in rollouts]
        worst = max(staleness(r, step) for r in rollouts)
        print(
            f"step {step}: {len(batch['groups'])} groups, {len(rollouts)} rollouts, "
            f"mean reward {sum(rewards) / len(rewards):.3f}, max staleness {worst}, "
            "{} prompt tokens, {} messages".format(*prompt_sizes(rollouts)),
            flush=True,
        )
        if step % args.sync_every == 0:
            report = engine.sync_weights(step, mock)
            print(f"  weights -> {step}: pause took {report['allBackMs']:.1f} ms, {report['groupsBack']} groups back", flush=True)
        step += 1
    status = engine.call("GET", "/status")
    print(f"done: taken {status['groups']['taken']} groups, model step {status['modelStep']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
