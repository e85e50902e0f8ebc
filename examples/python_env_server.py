#!/usr/bin/env python3
"""
An env server in Python, standard library only: the env-server protocol that rollout-engine speaks
(docs/ENV-SERVER.md; tasks[].env.http in a config), serving one small game.

    POST   /{env}/{id}/reset            {"env_param": {...}, "seed": n}  -> {observation, info}
    GET    /{env}/{id}/get_task_prompt                                   -> [chat message, ...]
    POST   /{env}/{id}/step             {"action": "...", "step": n}     -> {observation, reward, terminated, truncated, info}
    GET    /{env}/{id}/health | is_done | describe | render
    DELETE /{env}/{id}                                                   -> 200, even for an unknown id
    GET    /envs                                                         -> {"envs": [name, ...], "dedupes_steps": true}

Unknown env or id -> 404 {"error": ...}; bad request -> 400; an error inside the game -> bare 500.
Calls for one id are serialized by a per-id lock. A step whose "step" index repeats the last applied
one gets the cached reply instead of being applied again, so the engine may retry steps safely
(dedupeSteps: true).

Run:  python3 examples/python_env_server.py --port 8300     (--port 0 picks a free port)
"""

import argparse
import json
import random
import re
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

ENV_NAME = "guess-number-py"
MAX_BODY_BYTES = 1024 * 1024
INTEGER = re.compile(r"(?<!\d)-?\d+")


class BadRequest(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class GuessNumber:
    """Guess an integer in [lo, hi]; "Too low." / "Too high." after each guess.

    Deterministic: the target comes from the reset seed only (or env_param["target"]).
    Reward: 1.0 for a first-turn win, 0.05 less per extra turn (never below 0.5); 0 for a loss.
    """

    def __init__(self):
        self.messages = []
        self.target = 0
        self.turns = 0
        self.max_turns = 8
        self.lo, self.hi = 1, 100
        self.done = False
        self.last_observation = None

    def reset(self, seed, params):
        self.lo = int(params.get("min", 1))
        self.hi = int(params.get("max", 100))
        self.max_turns = int(params.get("max_turns", 8))
        if self.lo > self.hi:
            raise ValueError(f"min must be <= max (got min={self.lo}, max={self.hi})")
        self.target = int(params["target"]) if "target" in params else random.Random(seed).randint(self.lo, self.hi)
        self.turns = 0
        self.done = False
        task = (
            f"Let's play a number guessing game. I have picked an integer between {self.lo} and {self.hi} "
            f"(inclusive). You have {self.max_turns} guesses; after each one I will tell you whether it is "
            "too low or too high. Reply with a single integer."
        )
        self.messages = [
            {"role": "system", "content": "You are playing a number guessing game. " + task},
            {"role": "user", "content": "Make your first guess."},
        ]
        self.last_observation = task
        return {"observation": task, "info": {"min": self.lo, "max": self.hi, "max_turns": self.max_turns}}

    def get_task_prompt(self):
        return [] if self.done else list(self.messages)

    def step(self, action):
        if self.done:
            raise RuntimeError("step called after the episode ended")
        if not isinstance(action, str):
            raise BadRequest(400, f"action must be a string (got {json.dumps(action)[:80]})")
        self.turns += 1
        found = INTEGER.findall(action)
        guess = int(found[-1]) if found else None
        reward, terminated = 0.0, False
        if guess is None:
            reward, feedback = -0.1, "I could not find an integer in your reply. Reply with a single integer."
        elif guess < self.target:
            feedback = "Too low."
        elif guess > self.target:
            feedback = "Too high."
        else:
            terminated = True
            reward = max(0.5, round(1 - 0.05 * (self.turns - 1), 3))
            feedback = f"Correct! The number was {self.target}; you found it in {self.turns} guesses."
        truncated = not terminated and self.turns >= self.max_turns
        if truncated:
            feedback += f" Out of guesses: the number was {self.target}."
        self.messages += [{"role": "assistant", "content": action}, {"role": "user", "content": feedback}]
        self.done = terminated or truncated
        self.last_observation = feedback
        return {
            "observation": feedback,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "info": {"target": self.target, "turns": self.turns, "guess": guess},
        }


class Instance:
    """One env id: its game, a lock that serializes its calls, and the last step's cached reply."""

    def __init__(self):
        self.lock = threading.Lock()
        self.game = None
        self.steps = 0
        self.last_step = None  # (index, reply bytes)


class Registry:
    def __init__(self):
        self.lock = threading.Lock()
        self.instances = {}

    def get(self, env_id, create=False):
        with self.lock:
            inst = self.instances.get(env_id)
            if inst is None and create:
                inst = self.instances[env_id] = Instance()
            return inst

    def remove(self, env_id):
        with self.lock:
            return self.instances.pop(env_id, None)

    def is_current(self, env_id, inst):
        with self.lock:
            return self.instances.get(env_id) is inst


REGISTRY = Registry()


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps connections alive between calls (every reply carries a Content-Length).
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle's algorithm the second waits for the client's
    # delayed ACK (~40 ms a call on Linux). TCP_NODELAY sends both at once.
    disable_nagle_algorithm = True

    def log_message(self, *args):  # quiet: one line per request is too much at rollout rates
        pass

    def _send(self, status, payload, content_type="application/json"):
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            raise BadRequest(413, f"request body is {length} bytes, over the limit of {MAX_BODY_BYTES}")
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"null")
        except ValueError:
            raise BadRequest(400, f"request body is not JSON (got {raw[:80]!r})")

    def _dispatch(self, method):
        if method != "POST" and int(self.headers.get("Content-Length") or 0) > 0:
            # Not used, but read: on a kept-alive connection, unread bytes would be taken for the next request.
            self.rfile.read(int(self.headers["Content-Length"]))
        try:
            status, payload = self._route(method)
            self._send(status, payload)
        except BadRequest as err:
            self._send(err.status, {"error": str(err)})
        except Exception as err:  # an error inside the game: the protocol's bare 500
            self._send(500, f"environment error: {err}".encode("utf-8"), "text/plain; charset=utf-8")

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _route(self, method):
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/") if p]
        if parts == ["envs"] and method == "GET":
            # dedupes_steps: a repeated step index gets the cached reply, so engines may retry steps.
            return 200, {"envs": [ENV_NAME], "dedupes_steps": True}
        if len(parts) not in (2, 3):
            raise BadRequest(404, f"no route for {method} {self.path}")
        if parts[0] != ENV_NAME:
            raise BadRequest(404, f"unknown environment {json.dumps(parts[0])} (serving: {ENV_NAME})")
        env_id = parts[1]
        if len(parts) == 2:
            if method != "DELETE":
                raise BadRequest(405, f"{method} not allowed on {self.path} (use DELETE)")
            REGISTRY.remove(env_id)  # 200 even for an unknown id
            return 200, {"deleted": True}
        op = parts[2]
        expected = "POST" if op in ("reset", "step") else "GET"
        if method != expected:
            raise BadRequest(405, f"{method} not allowed on {self.path} (use {expected})")
        body = self._body() if method == "POST" else None
        inst = REGISTRY.get(env_id, create=(op == "reset"))
        if inst is None:
            raise BadRequest(404, f"unknown env id {json.dumps(env_id)} (reset it first)")
        with inst.lock:
            if op == "reset":
                return 200, self._reset(env_id, inst, body)
            if inst.game is None or not REGISTRY.is_current(env_id, inst):
                raise BadRequest(404, f"unknown env id {json.dumps(env_id)} (reset it first)")
            if op == "get_task_prompt":
                return 200, inst.game.get_task_prompt()
            if op == "step":
                return 200, self._step(inst, body)
            if op == "health":
                return 200, {"ok": True}
            if op == "is_done":
                return 200, {"done": inst.game.done}
            if op == "describe":
                return 200, {"env": ENV_NAME, "id": env_id, "steps": inst.steps, "done": inst.game.done}
            if op == "render":
                return 200, {"render": inst.game.last_observation}
        raise BadRequest(404, f"unknown route {json.dumps(op)}")

    def _reset(self, env_id, inst, body):
        if not isinstance(body, dict) or "env_param" not in body:
            if inst.game is None:  # the id was created by this very call: leave nothing behind
                REGISTRY.remove(env_id)
            raise BadRequest(400, 'reset body needs the "env_param" key (the reset params; {} for none)')
        params = body.get("env_param") or {}
        if not isinstance(params, dict):
            raise BadRequest(400, f"env_param must be an object (got {json.dumps(params)[:80]})")
        game = GuessNumber()
        try:
            reply = game.reset(body.get("seed") or 0, params)
        except Exception:
            if inst.game is None:
                REGISTRY.remove(env_id)
            raise
        inst.game, inst.steps, inst.last_step = game, 0, None
        return reply

    def _step(self, inst, body):
        if not isinstance(body, dict) or "action" not in body:
            raise BadRequest(400, 'step body needs the "action" key')
        index = body.get("step")
        if index is not None:
            if not isinstance(index, int) or isinstance(index, bool) or index < 1:
                raise BadRequest(400, f"step index must be a positive integer (got {json.dumps(index)})")
            if inst.last_step is not None and index == inst.last_step[0]:
                return inst.last_step[1]  # a repeat whose first reply was lost: answer it again
            if index != inst.steps + 1:
                raise BadRequest(409, f"step index {index} out of order: {inst.steps} applied since reset")
        reply = json.dumps(inst.game.step(body["action"])).encode("utf-8")
        inst.steps += 1
        inst.last_step = (index if index is not None else inst.steps, reply)
        return reply


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog is 5: a worker opening dozens of connections at once would
    # see SYNs dropped and retried a second or more later.
    request_queue_size = 128


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8300, help="port to listen on (0 = any free port)")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    server = Server((args.host, args.port), Handler)
    host, port = server.server_address[:2]

    def stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)  # SIGTERM stops as cleanly as Ctrl-C (exit status 0)
    print(f"listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
