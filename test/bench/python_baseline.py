#!/usr/bin/env python3
"""
The Python baseline of issue 7: an asyncio rollout loop built like the reference Interactor
(its interactor.py), playing guess-number against an OpenAI-compatible server.

  * one asyncio worker task per rollout in flight, each driving episodes back to back
    (reset -> get_task_prompt -> trim -> LLM -> step -> record ... until terminated/truncated);
  * one aiohttp ClientSession with no connection cap (TCPConnector(limit=0));
  * the chat body the engine sends (model, trimmed messages, max_tokens, temperature, logprobs,
    return_token_ids, a per-rollout per-turn seed); the reply parsed into content, finish_reason,
    token ids and logprobs (lists), recorded as per-step dicts by an in-memory data manager;
  * guess-number reimplemented in Python with the same logic and prompts as
    src/env/synthetic/guess-number.ts (so the mock's policy recognises it and plays multi-turn);
  * --mode executor: every environment call goes through loop.run_in_executor on a
    ThreadPoolExecutor sized to the worker count, under asyncio.wait_for, as in the reference;
    --mode direct: the environment is called inline (the loop's fastest form).

  python3 test/bench/python_baseline.py --url http://127.0.0.1:8000 --concurrency 64 \
      --seconds 5 --mode executor --max-tokens 64

Prints one JSON line at the end: steps, seconds, stepsPerSecond, cpuSeconds (getrusage of this
process, every thread, user + system, over the measured window), cpuUsPerStep, episodes, meanReward
(plus a few descriptive fields). A "step" is one inference call recorded (as on the engine side).
Without aiohttp it prints {"error": ...} and exits 3.
"""
import argparse
import asyncio
import json
import logging
import math
import re
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

try:
    import aiohttp
except ImportError:
    print(json.dumps({"error": "aiohttp missing: apt-get install python3-aiohttp"}), flush=True)
    sys.exit(3)

log = logging.getLogger("python-baseline")

MASK32 = 0xFFFFFFFF


# --- seeded randomness: a port of src/env/synthetic/rng.ts (mixSeeds + mulberry32) -------------

def _fmix32(h):
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK32
    h ^= h >> 16
    return h


def mix_seeds(*parts):
    h = 0x9E3779B9
    for part in parts:
        whole = int(part)
        lo = whole & MASK32
        hi = (whole // 4294967296) & MASK32
        h = _fmix32(h ^ lo)
        h = _fmix32(((h + 0x9E3779B9) & MASK32) ^ hi)
    return h


class Rng:
    __slots__ = ("state",)

    def __init__(self, seed):
        self.state = mix_seeds(seed)

    def next(self):
        self.state = (self.state + 0x6D2B79F5) & MASK32
        t = self.state
        t = ((t ^ (t >> 15)) * (t | 1)) & MASK32
        t ^= (t + (((t ^ (t >> 7)) * (t | 61)) & MASK32)) & MASK32
        return (t ^ (t >> 14)) / 4294967296

    def int(self, lo, hi):
        return lo + math.floor(self.next() * (hi - lo + 1))


def turn_seed(sample_seed, rollout_index, step):
    """Same shape as agent-loop.ts turnSeed: a per-(prompt, rollout, step) sampling seed."""
    h = (((sample_seed ^ 0x9E3779B9) * 0x85EBCA6B) ^ ((rollout_index + 1) * 0xC2B2AE35) ^ (step * 0x27D4EB2F)) & MASK32
    h ^= h >> 15
    h = (h * 0x2C1B3C6D) & MASK32
    h ^= h >> 12
    return h >> 1


# --- guess-number: the same logic and prompts as src/env/synthetic/guess-number.ts ----------------

SYSTEM_PROMPT = (
    "You are playing a number guessing game. Think briefly if you like, then end your reply with your "
    "guess as a single integer."
)
FIRST_GUESS_PROMPT = "Make your first guess."
TOO_LOW = "Too low."
TOO_HIGH = "Too high."
NO_INTEGER = "I could not find an integer in your reply. Reply with a single integer."
NO_INTEGER_REWARD = -0.1
MAX_SAFE_INTEGER = 2**53 - 1
# An integer not glued to a preceding digit (params.ts INTEGER); ASCII digits like JS's \d.
INTEGER = re.compile(r"(?<!\d)-?\d+", re.ASCII)


def task_text(lo, hi, max_turns):
    return (
        f"Let's play a number guessing game. I have picked an integer between {lo} and {hi} (inclusive). "
        f"You have {max_turns} guesses; after each one I will tell you whether it is too low or too high. "
        "Reply with a single integer."
    )


def last_integer(text):
    last = None
    for match in INTEGER.finditer(text):
        last = match.group(0)
    if last is None:
        return None
    value = int(last)
    return value if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER else None


def win_reward(turns):
    # JS Math.round(x) == floor(x + 0.5)
    return max(0.5, math.floor((1 - 0.05 * (turns - 1)) * 1000 + 0.5) / 1000)


class GuessNumberEnv:
    def __init__(self, lo=1, hi=100, max_turns=8):
        self.base_min = lo
        self.base_max = hi
        self.max_turns = max_turns
        self.messages = []
        self.min = lo
        self.max = hi
        self.target = 0
        self.turns = 0
        self.phase = "idle"

    def reset(self, seed):
        self.min = self.base_min
        self.max = self.base_max
        self.target = Rng(seed).int(self.min, self.max)
        self.turns = 0
        self.phase = "running"
        task = task_text(self.min, self.max, self.max_turns)
        self.messages = [
            {"role": "system", "content": f"{SYSTEM_PROMPT} {task}"},
            {"role": "user", "content": FIRST_GUESS_PROMPT},
        ]
        return {"observation": task, "info": {"min": self.min, "max": self.max, "maxTurns": self.max_turns}}

    def get_task_prompt(self):
        return list(self.messages) if self.phase == "running" else []

    def step(self, action):
        if self.phase != "running":
            raise RuntimeError("guess-number: step called " + ("before reset" if self.phase == "idle" else "after the episode ended"))
        self.turns += 1
        guess = last_integer(action)
        reward = 0.0
        terminated = False
        if guess is None:
            reward = NO_INTEGER_REWARD
            feedback = NO_INTEGER
        elif guess < self.target:
            feedback = TOO_LOW
        elif guess > self.target:
            feedback = TOO_HIGH
        else:
            terminated = True
            reward = win_reward(self.turns)
            feedback = (
                f"Correct! The number was {self.target}; you found it in {self.turns} "
                f"{'guess' if self.turns == 1 else 'guesses'}."
            )
        truncated = not terminated and self.turns >= self.max_turns
        if truncated:
            feedback += f" Out of guesses: the number was {self.target}."
        self.messages.append({"role": "assistant", "content": action})
        self.messages.append({"role": "user", "content": feedback})
        if terminated or truncated:
            self.phase = "done"
        return {
            "observation": feedback,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "info": {"target": self.target, "turns": self.turns, "guess": guess, "min": self.min, "max": self.max},
        }


# --- data manager: per-step dicts in memory ------------------------------------------------------

class Session:
    __slots__ = ("env_id", "steps", "total_reward")

    def __init__(self, env_id):
        self.env_id = env_id
        self.steps = []
        self.total_reward = 0.0


class DataManager:
    """Keeps each session's step records in memory; finished sessions are handed off in batches
    (dropped here, as a writer would after storing them), so the heap does not grow with the run."""

    def __init__(self):
        self.steps_recorded = 0
        self.finished = []

    async def create_session(self, env_id):
        return Session(env_id)

    async def record_step(self, session, **record):
        session.steps.append(record)
        session.total_reward += record["step_reward"]
        self.steps_recorded += 1

    async def finish_session(self, session):
        self.finished.append(session)
        if len(self.finished) >= 256:
            self.finished = []


# --- the rollout loop ----------------------------------------------------------------------------

class Baseline:
    def __init__(self, url, concurrency, mode, max_tokens, model="mock-policy", temperature=1, max_steps=8,
                 message_cut=3, env_timeout_s=30.0, http_retries=2, http_retry_backoff_s=0.5):
        base = url.rstrip("/")
        self.chat_url = base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")
        self.concurrency = concurrency
        self.mode = mode
        self.max_tokens = max_tokens
        self.model = model
        self.temperature = temperature
        self.max_steps = max_steps
        self.message_cut = message_cut
        self.env_timeout_s = env_timeout_s
        self.http_retries = http_retries
        self.http_retry_backoff_s = http_retry_backoff_s
        self.data_manager = DataManager()
        # The reference sizes its in-process executor to the worker count.
        self.executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="env-inproc-fg") if mode == "executor" else None
        self.session = None
        self.episodes = 0
        self.reward_sum = 0.0
        self.failures = 0
        self.last_error = None
        self.next_episode = 0
        self.stopping = False

    async def start(self):
        connector = aiohttp.TCPConnector(limit=0)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=120),
            headers={"content-type": "application/json"},
        )

    async def close(self):
        if self.session is not None:
            await self.session.close()
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)

    # environment calls --------------------------------------------------------------------------

    @staticmethod
    def _normalize(result):
        if isinstance(result, (list, dict)):
            return result
        if isinstance(result, (bytes, bytearray)):
            return json.loads(result)
        raise TypeError(f"Unsupported inproc response type: {type(result).__name__}")

    async def _env_call(self, env, operation, arg=None):
        def _call():
            if operation == "get_task_prompt":
                return env.get_task_prompt()
            if operation == "step":
                return env.step(str(arg or ""))
            if operation == "reset":
                return env.reset(arg)
            raise ValueError(f"Unsupported inproc env operation: {operation}")

        if self.executor is None:  # direct
            return self._normalize(_call())
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.executor, partial(_call))
        result = await asyncio.wait_for(future, timeout=self.env_timeout_s)
        return self._normalize(result)

    # inference ----------------------------------------------------------------------------------

    def _trim_messages(self, prompt):
        if not isinstance(prompt, list) or not prompt:
            return []
        if self.message_cut <= 0:
            return prompt
        out = []
        start = 0
        if isinstance(prompt[0], dict) and prompt[0].get("role") == "system":
            out.append(prompt[0])
            start = 1
        out.extend(prompt[start:][-(self.message_cut * 2 - 1):])
        return out

    async def _llm_generate(self, messages, seed, chat_url=None):
        body = json.dumps({
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": seed,
            "logprobs": True,
            "return_token_ids": True,
        })
        attempts = 1 + self.http_retries
        for i in range(attempts):
            try:
                async with self.session.post(chat_url or self.chat_url, data=body) as response:
                    if response.status >= 400:
                        response.raise_for_status()
                    data = json.loads(await response.read())
                break
            except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
                status = getattr(exc, "status", None)
                if (status is not None and status < 500 and status != 429) or i + 1 >= attempts:
                    raise
                await asyncio.sleep(self.http_retry_backoff_s * (2 ** i))
        choice = data["choices"][0]
        lp = choice.get("logprobs")
        meta = data.get("metadata") or {}
        return {
            "content": choice["message"].get("content") or "",
            "finish_reason": choice.get("finish_reason", "stop"),
            "token_ids": list(choice.get("token_ids") or []),
            "prompt_token_ids": list(data.get("prompt_token_ids") or []),
            "logprobs": [entry["logprob"] for entry in lp["content"]] if lp else [],
            "weight_version": meta.get("weight_version"),
        }

    # episodes -----------------------------------------------------------------------------------

    async def _run_one_environment(self, env, worker_id, episode_index):
        sample_seed = mix_seeds(0, episode_index)
        session = await self.data_manager.create_session(env_id=f"{worker_id}")
        await self._env_call(env, "reset", sample_seed)
        for step_i in range(1, self.max_steps + 1):
            prompt_raw = await self._env_call(env, "get_task_prompt")
            prompt = self._trim_messages(prompt_raw)
            if not prompt:
                break
            llm_result = await self._llm_generate(prompt, turn_seed(sample_seed, worker_id, step_i))
            action = llm_result["content"]
            finish_reason = llm_result["finish_reason"]
            weight_version = llm_result["weight_version"]
            env_state = json.dumps({"weight_version": weight_version}) if weight_version is not None else None
            log.debug("worker=%d step=%d finish_reason=%s", worker_id, step_i, finish_reason)
            if finish_reason == "length":
                await self.data_manager.record_step(
                    session=session, step_id=step_i, messages=prompt, response=action,
                    response_ids=llm_result["token_ids"], prompt_ids=llm_result["prompt_token_ids"],
                    logprobs=llm_result["logprobs"], step_reward=0.0, env_state=env_state,
                    terminated=True, truncated=True, is_trainable=True,
                )
                break
            out = await self._env_call(env, "step", action)
            reward = float(out.get("reward", 0.0) or 0.0)
            terminated = bool(out.get("terminated", False))
            truncated = bool(out.get("truncated", False))
            is_trainable = self.message_cut > 0 or terminated or truncated
            await self.data_manager.record_step(
                session=session, step_id=step_i, messages=prompt, response=action,
                response_ids=llm_result["token_ids"], prompt_ids=llm_result["prompt_token_ids"],
                logprobs=llm_result["logprobs"], step_reward=reward, env_state=env_state,
                terminated=terminated, truncated=truncated, is_trainable=is_trainable,
            )
            if terminated or truncated:
                break
        await self.data_manager.finish_session(session)
        return session.total_reward

    async def worker(self, worker_id):
        env = GuessNumberEnv()  # this worker's actor, reused episode after episode like a pooled one
        while not self.stopping:
            episode_index = self.next_episode
            self.next_episode += 1
            log.info("worker=%d acquired env episode=%d", worker_id, episode_index)
            try:
                reward = await self._run_one_environment(env, worker_id, episode_index)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the reference logs, recycles the actor and continues
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("worker=%d FAILED: %s", worker_id, exc)
                await asyncio.sleep(0.05)
                continue
            self.episodes += 1
            self.reward_sum += reward
            log.info("worker=%d finished (reward=%s)", worker_id, reward)


# --- the sync trainer loop (issue 21): the same loop grown into a seed-style synchronous trainer --------

def prompt_range(i):
    """test/bench/training-loop.ts promptRange: the dataset's ranges, so the mock's per-prompt lengths differ."""
    return 20 + ((i * 7919) % 981)


class SyncTrainer(Baseline):
    """Take a batch (every rollout of G groups x k, all at once), wait for the last, "train" for a time
    proportional to its response tokens, then sync weights: load time, new version on every server."""

    def __init__(self, args):
        urls = args.urls.split(",")
        super().__init__(urls[0], args.groups * args.group_size, "direct", args.max_tokens, max_steps=args.turns,
                         message_cut=args.message_cut)
        self.urls = [u.rstrip("/") for u in urls]
        self.args = args

    async def _gpu(self):
        out = []
        for url in self.urls:
            async with self.session.get(url + "/admin/gpu") as response:
                out.append(json.loads(await response.read()))
        return out

    async def _rollout(self, prompt_index, rollout_index):
        env = GuessNumberEnv(1, prompt_range(prompt_index), self.args.turns)
        sample_seed = mix_seeds(0, prompt_index)
        url = self.urls[(prompt_index * self.args.group_size + rollout_index) % len(self.urls)]
        chat_url = url + "/v1/chat/completions"
        env.reset(sample_seed)
        tokens = 0
        for step_i in range(1, self.args.turns + 1):
            prompt = self._trim_messages(env.get_task_prompt())
            if not prompt:
                break
            result = await self._llm_generate(prompt, turn_seed(sample_seed, rollout_index, step_i), chat_url)
            tokens += len(result["token_ids"])
            if result["finish_reason"] == "length":
                break
            out = env.step(result["content"])
            if out["terminated"] or out["truncated"]:
                break
        return tokens

    async def run(self):
        a = self.args
        window = {"time": 0.0, "busy": 0.0, "prefill": 0.0, "slot": 0.0, "slots": 0.0, "tokens": 0}
        idle = []
        watchers = []
        first = last = None
        tokens_after_first = 0
        wait_total = 0.0

        def add_window(before, after):
            for x, y in zip(before, after):
                window["time"] += y["timeMs"] - x["timeMs"]
                window["busy"] += y["busyMs"] - x["busyMs"]
                window["prefill"] += y["prefillMs"] - x["prefillMs"]
                window["slot"] += y["slotMs"] - x["slotMs"]
                window["slots"] += (y["timeMs"] - x["timeMs"]) * y["slots"]
                window["tokens"] += y["generatedTokens"] - x["generatedTokens"]

        async def watch_restart(before):
            deadline = time.perf_counter() + 5.0
            while True:
                now = await self._gpu()
                if time.perf_counter() > deadline:
                    return
                if all(m["running"] > 0 for m in now):
                    per = [y["timeMs"] - x["timeMs"] - (y["busyMs"] - x["busyMs"]) for x, y in zip(before, now)]
                    idle.append(sum(per) / len(per))
                    return
                await asyncio.sleep(0.001)

        for step in range(1, a.steps + 1):
            before = await self._gpu()
            asked = time.perf_counter()
            base = (step - 1) * a.groups
            results = await asyncio.gather(*[self._rollout(base + g, r) for g in range(a.groups) for r in range(a.group_size)])
            taken_at = time.perf_counter()
            if first is not None:
                wait_total += taken_at - asked
            after = await self._gpu()
            add_window(before, after)
            tokens = sum(results)
            if first is None:
                first = (taken_at, after)
            else:
                tokens_after_first += tokens
            last = (taken_at, after)
            await asyncio.sleep(tokens * a.train_ms_per_token / a.speedup / 1000)
            if step == a.steps:
                break
            sync_start = await self._gpu()
            await asyncio.sleep(a.load_ms / a.speedup / 1000)
            for url in self.urls:
                async with self.session.post(url + "/admin/weight_version", data=json.dumps({"weight_version": step})) as response:
                    await response.read()
            watchers.append(asyncio.create_task(watch_restart(sync_start)))
        await asyncio.gather(*watchers)
        cycles = a.steps - 1
        cycle_seconds = (last[0] - first[0]) * a.speedup
        generated = sum(y["generatedTokens"] - x["generatedTokens"] for x, y in zip(first[1], last[1]))
        wasted = max(0, generated - tokens_after_first)
        final = await self._gpu()
        prompt = sum(m["promptTokens"] for m in final)
        cached = sum(m["cachedTokens"] for m in final)
        mean_idle = sum(idle) / len(idle) if idle else 0.0
        return {
            "strategy": "python sync",
            "steps": a.steps,
            "cycles": cycles,
            "cycleSeconds": cycle_seconds,
            "stepsPerHour": cycles / cycle_seconds * 3600 if cycle_seconds > 0 else 0,
            "stepSeconds": cycle_seconds / cycles if cycles > 0 else 0,
            "tokensTakenPerStep": tokens_after_first / cycles if cycles > 0 else 0,
            "wastedTokensPerStep": wasted / cycles if cycles > 0 else 0,
            "wastedFraction": wasted / generated if generated > 0 else 0,
            "waitSeconds": wait_total * a.speedup / cycles if cycles > 0 else 0,
            "production": {
                "seconds": window["time"] / 1000,
                "busyFraction": window["busy"] / window["time"] if window["time"] > 0 else 0,
                "slotFill": window["slot"] / window["slots"] if window["slots"] > 0 else 0,
                "meanRunning": window["slot"] / window["time"] if window["time"] > 0 else 0,
                "tokensPerSecond": window["tokens"] / window["time"] * 1000 * len(self.urls) if window["time"] > 0 else 0,
                "prefillFraction": window["prefill"] / window["busy"] if window["busy"] > 0 else 0,
            },
            "syncs": {
                "count": len(idle),
                "idleMs": mean_idle,
                "idleBeyondLoadMs": mean_idle - a.load_ms,
                "maxIdleBeyondLoadMs": (max(idle) - a.load_ms) if idle else 0,
                "pauseMsP50": 0,
            },
            "cacheHitFraction": cached / prompt if prompt > 0 else 0,
            # Every batch is generated by the weights it trains on: weights sync after each step.
            "staleness": {"mean": 0, "max": 0, "pastThresholdFraction": 0},
            "python": sys.version.split()[0],
            "aiohttp": aiohttp.__version__,
        }


async def trainer_async(args):
    trainer = SyncTrainer(args)
    await trainer.start()
    try:
        return await trainer.run()
    finally:
        await trainer.close()


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def main_async(args):
    baseline = Baseline(args.url, args.concurrency, args.mode, args.max_tokens)
    await baseline.start()
    tasks = [asyncio.create_task(baseline.worker(i), name=f"worker-{i}") for i in range(args.concurrency)]
    try:
        # Warm-up (as the engine's first batch): until every worker has completed a step or 5 s.
        warm_deadline = time.perf_counter() + 5.0
        while baseline.data_manager.steps_recorded < args.concurrency and time.perf_counter() < warm_deadline:
            await asyncio.sleep(0.01)
        steps0 = baseline.data_manager.steps_recorded
        episodes0, reward0 = baseline.episodes, baseline.reward_sum
        cpu0 = cpu_seconds()
        t0 = time.perf_counter()
        await asyncio.sleep(args.seconds)
        elapsed = time.perf_counter() - t0
        cpu = cpu_seconds() - cpu0
        steps = baseline.data_manager.steps_recorded - steps0
        episodes = baseline.episodes - episodes0
        reward = baseline.reward_sum - reward0
    finally:
        # Before Python 3.12, asyncio.wait_for can swallow a cancellation that races with its inner
        # future completing (gh-86296): the flag ends such a worker after its episode, and the
        # cancellation is repeated until every worker is gone.
        baseline.stopping = True
        pending = set(tasks)
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.5)
        await baseline.close()
    if steps == 0:
        return {"error": f"no steps completed ({baseline.failures} failed episodes; last: {baseline.last_error})"}
    return {
        "steps": steps,
        "seconds": round(elapsed, 4),
        "stepsPerSecond": steps / elapsed,
        "cpuSeconds": round(cpu, 4),
        "cpuUsPerStep": cpu * 1e6 / steps,
        "episodes": episodes,
        "meanReward": reward / episodes if episodes else None,
        "failures": baseline.failures,
        "mode": args.mode,
        "concurrency": args.concurrency,
        "python": sys.version.split()[0],
        "aiohttp": aiohttp.__version__,
    }


def main():
    parser = argparse.ArgumentParser(description="Python asyncio rollout baseline (reference Interactor design)")
    parser.add_argument("--url", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--concurrency", type=int, default=64, help="rollouts in flight (worker tasks)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured window after warm-up")
    parser.add_argument("--mode", choices=["executor", "direct", "sync-trainer"], default="executor")
    parser.add_argument("--max-tokens", type=int, default=64)
    # sync-trainer only (issue 21): GPU-like mocks (--capacity) and a simulated trainer, times in GPU ms
    parser.add_argument("--urls", help="sync-trainer: comma-separated base URLs of the GPU-like mocks")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--train-ms-per-token", type=float, default=0.1)
    parser.add_argument("--load-ms", type=float, default=2000)
    parser.add_argument("--speedup", type=float, default=1)
    parser.add_argument("--message-cut", type=int, default=3,
                        help="sync-trainer: keep the system message and the last 2 x this - 1 messages; 0 = all")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.mode != "sync-trainer" and not args.url:
        parser.error("--url is required")
    if args.mode == "sync-trainer":
        if not args.urls:
            args.urls = args.url
        result = asyncio.run(trainer_async(args))
        print(json.dumps(result), flush=True)
        return 0
    result = asyncio.run(main_async(args))
    print(json.dumps(result), flush=True)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
