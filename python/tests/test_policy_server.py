"""The reference policy (rollout_engine.policy): its tokenizer files, the model's two paths, the sampler,
and the server's routes against SGLang's shapes — sampling from the model, pause modes across a weight
update, aborts, streaming. Servers run in this process on 127.0.0.1 port 0 (one test launches the
module as a user does). Needs torch; skipped without it (test/python/python-client.test.ts fails a CI
run that skips).

SGLang sources each shape is read from are cited in rollout_engine/policy/server.py and scheduler.py.
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

try:
    import torch

    from rollout_engine.policy import (
        ModelConfig,
        TinyLM,
        init_model,
        load_pretrained,
        save_pretrained,
        token_logprobs,
        vocab,
    )
    from rollout_engine.policy.model import KVCache
    from rollout_engine.policy.sampling import (
        SamplingError,
        SamplingParams,
        parse_sampling_params,
        sample,
        truncated_logprobs,
        uniform_noise,
    )
    from rollout_engine.policy.server import RunningServer, start_server

    HAVE_TORCH = True
except ImportError:  # pragma: no cover - the skip says why
    HAVE_TORCH = False

CONFIG: Dict[str, Any] = {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_len": 192}
PROMPT = [2, 45, 76, 83, 83, 86, 5, 3]  # <|user|>hello<|end|><|assistant|>, by id


def sharp_model(seed: int) -> "TinyLM":
    """A small model whose next-token distributions are far from uniform (random init is nearly
    flat, which would hide a wrong logprob)."""
    model = init_model(ModelConfig(**CONFIG), seed=seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.4)
    return model


_DIRS: Dict[str, str] = {}
_TMP: Optional[tempfile.TemporaryDirectory] = None  # type: ignore[type-arg]


def setUpModule() -> None:
    global _TMP
    if not HAVE_TORCH:
        return
    _TMP = tempfile.TemporaryDirectory(prefix="policy-test-")
    for name, seed in (("m0", 1), ("m1", 2)):
        _DIRS[name] = str(save_pretrained(sharp_model(seed), Path(_TMP.name) / name))


def tearDownModule() -> None:
    if _TMP is not None:
        _TMP.cleanup()


# ------------------------------------------------------------------------------------------------
# HTTP helpers
# ------------------------------------------------------------------------------------------------


def call(url: str, path: str, body: Any = None, method: Optional[str] = None, raw: Optional[bytes] = None) -> Tuple[int, Any]:
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    conn.request(method or ("GET" if data is None else "POST"), path, body=data, headers={"content-type": "application/json"})
    res = conn.getresponse()
    text = res.read().decode()
    conn.close()
    try:
        return res.status, json.loads(text)
    except ValueError:
        return res.status, text


def stream(url: str, body: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    """The chunks of a streamed /generate, up to ``data: [DONE]`` (which must come)."""
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/generate", body=json.dumps({**body, "stream": True}).encode())
    res = conn.getresponse()
    assert res.status == 200, res.read()
    assert res.getheader("content-type") == "text/event-stream"
    try:
        while True:
            line = res.readline()
            assert line, "the stream ended before data: [DONE]"
            line = line.strip()
            if not line:
                continue
            assert line.startswith(b"data: "), line
            if line == b"data: [DONE]":
                return
            yield json.loads(line[6:])
    finally:
        conn.close()


def until(predicate: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.005)


def internal(url: str) -> Dict[str, Any]:
    status, info = call(url, "/get_server_info")
    assert status == 200
    return dict(info["internal_states"][0])


def recomputed(model_dir: str, prompt: List[int], output: List[int], temperature: float = 1.0) -> List[float]:
    """The logprob of each output token under the weights in ``model_dir``, by the full-sequence path."""
    model = load_pretrained(model_dir)
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        lps = token_logprobs(model, ids, temperature)[0]
    return lps[len(prompt) - 1 :].tolist()


def logprobs_of(reply: Dict[str, Any]) -> List[float]:
    return [e[0] for e in reply["meta_info"]["output_token_logprobs"]]


def generate(url: str, prompt: List[int], **sampling: Any) -> Dict[str, Any]:
    status, reply = call(url, "/generate", {"input_ids": prompt, "sampling_params": sampling, "return_logprob": True})
    assert status == 200, reply
    return dict(reply)


@unittest.skipUnless(HAVE_TORCH, "torch is not installed (Debian: python3-torch)")
class VocabularyTest(unittest.TestCase):
    def test_the_shipped_tokenizer_files_are_what_vocab_builds(self) -> None:
        shipped = json.loads((vocab.TOKENIZER_DIR / "tokenizer.json").read_text())
        self.assertEqual(shipped, vocab.tokenizer_json())
        config = json.loads((vocab.TOKENIZER_DIR / "tokenizer_config.json").read_text())
        self.assertEqual(config, vocab.tokenizer_config())
        self.assertEqual(vocab.VOCAB_SIZE, 102)
        self.assertEqual([vocab.TOKENS[i] for i in (0, 5, 6, 7, 101)], ["<|endoftext|>", "<|end|>", "\n", " ", "~"])

    def test_encode_and_decode_round_trip_text_with_the_special_strings(self) -> None:
        text = "<|system|>be brief<|end|><|user|>2 + 2 =\n  ?<|end|><|assistant|><|us <<|end|>>"
        ids = vocab.encode(text)
        self.assertEqual(vocab.decode(ids), text)
        self.assertEqual(ids[:2], [1, vocab.TOKENS.index("b")])
        self.assertEqual(vocab.render([{"role": "user", "content": "hi"}]), "<|user|>hi<|end|><|assistant|>")

    def test_a_character_outside_the_vocabulary_is_an_error_naming_it(self) -> None:
        with self.assertRaisesRegex(ValueError, r"text: character 'é' at 2 is not in the vocabulary"):
            vocab.encode("caé")


@unittest.skipUnless(HAVE_TORCH, "torch is not installed (Debian: python3-torch)")
class ModelTest(unittest.TestCase):
    def test_init_model_is_deterministic_under_its_seed_and_leaves_the_global_rng_alone(self) -> None:
        torch.manual_seed(5)
        before = torch.rand(1).item()
        torch.manual_seed(5)
        a = init_model(ModelConfig(**CONFIG), seed=3)
        after = torch.rand(1).item()
        b = init_model(ModelConfig(**CONFIG), seed=3)
        c = init_model(ModelConfig(**CONFIG), seed=4)
        self.assertEqual(before, after)
        for (name, x), y, z in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
            self.assertTrue(torch.equal(x, y), name)
        self.assertFalse(all(torch.equal(x, z) for x, z in zip(a.state_dict().values(), c.state_dict().values())))

    def test_prefill_and_batched_decode_over_the_kv_cache_give_the_full_sequence_logprobs(self) -> None:
        model = sharp_model(7).eval()
        seqs = [PROMPT + [70, 71, 72, 73, 74, 75], [2, 50, 5, 3, 60, 61, 62, 63, 64, 65, 66], [3, 40, 41, 42, 43, 44, 45]]
        starts = [len(PROMPT), 4, 1]
        full = [token_logprobs(model, torch.tensor([s]))[0] for s in seqs]
        cache = KVCache(model.config, 6)
        slots = [4, 0, 2]
        logits = model.prefill(cache, slots, [s[:n] for s, n in zip(seqs, starts)])
        err = max(
            abs(torch.log_softmax(logits[b], -1)[seqs[b][starts[b]]].item() - full[b][starts[b] - 1].item()) for b in range(3)
        )
        pos = list(starts)
        for _ in range(5):
            step = [b for b in range(3) if pos[b] + 1 < len(seqs[b])]
            out = model.decode(
                cache,
                torch.tensor([slots[b] for b in step]),
                torch.tensor([pos[b] for b in step]),
                torch.tensor([seqs[b][pos[b]] for b in step]),
            )
            for row, b in enumerate(step):
                err = max(err, abs(torch.log_softmax(out[row], -1)[seqs[b][pos[b] + 1]].item() - full[b][pos[b]].item()))
                pos[b] += 1
        self.assertLess(err, 1e-5)

    def test_save_pretrained_writes_one_directory_that_loads_back_the_same_function(self) -> None:
        model = sharp_model(9)
        with tempfile.TemporaryDirectory() as d:
            save_pretrained(model, d)
            self.assertEqual(sorted(os.listdir(d)), ["config.json", "model.pt", "tokenizer.json", "tokenizer_config.json"])
            self.assertEqual(json.loads((Path(d) / "tokenizer_config.json").read_text())["model_max_length"], CONFIG["max_len"])
            loaded = load_pretrained(d)
            ids = torch.tensor([PROMPT + [60, 61]])
            self.assertTrue(torch.equal(token_logprobs(loaded, ids), token_logprobs(model, ids)))

    def test_load_pretrained_refuses_weights_that_do_not_fit_their_config(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            save_pretrained(sharp_model(1), d)
            config = json.loads((Path(d) / "config.json").read_text())
            (Path(d) / "config.json").write_text(json.dumps({**config, "d_model": 64}))
            with self.assertRaisesRegex(ValueError, r"^model_path: .*model\.pt does not fit its config\.json: \S+ is \[32\], the config makes \[64\]$"):
                load_pretrained(d)
            with self.assertRaisesRegex(ValueError, r"has no config\.json"):
                load_pretrained(Path(d) / "missing")


@unittest.skipUnless(HAVE_TORCH, "torch is not installed (Debian: python3-torch)")
class SamplerTest(unittest.TestCase):
    def test_sampling_params_keep_sglangs_defaults_and_its_greedy_rule(self) -> None:
        p = parse_sampling_params({}, 102)
        self.assertEqual((p.max_new_tokens, p.temperature, p.top_p, p.min_p, p.skip_special_tokens, p.no_stop_trim), (128, 1.0, 1.0, 0.0, True, False))
        self.assertFalse(p.truncates)
        greedy = parse_sampling_params({"temperature": 0}, 102)
        self.assertEqual((greedy.temperature, greedy.top_k), (1.0, 1))
        self.assertIsNone(parse_sampling_params({"max_new_tokens": None}, 102).max_new_tokens)

    def test_bad_sampling_params_are_refused_with_a_sentence_naming_the_value(self) -> None:
        cases = {
            "top_p": (1.5, r"^top_p must be in \(0, 1\], got 1\.5\.$"),
            "top_k": (0, r"^top_k must be -1 \(disable\) or at least 1, got 0\.$"),
            "min_p": (-0.1, r"^min_p must be in \[0, 1\], got -0\.1\.$"),
            "temperature": ("hot", r"^sampling_params\.temperature must be a number, got 'hot'\.$"),
            "max_new_tokens": (-1, r"^max_new_tokens must be at least 0, got -1\.$"),
            "stop_token_ids": ([5, 300], r"^sampling_params\.stop_token_ids: 300 is not a token id"),
            "frequency_penalty": (0.5, r"^sampling_params\.frequency_penalty=0\.5 is not supported"),
            "tempurature": (1, r"^sampling_params\.tempurature: unknown sampling parameter \(value 1\)\.$"),
        }
        for name, (value, message) in cases.items():
            with self.subTest(name):
                with self.assertRaisesRegex(SamplingError, message):
                    parse_sampling_params({name: value}, 102)

    def test_seeded_draws_follow_the_distribution_they_report(self) -> None:
        logits = torch.randn(1, 102, generator=torch.Generator().manual_seed(0)) * 2
        n = 20000
        for params in (SamplingParams(temperature=0.7), SamplingParams(top_k=8, top_p=0.9, min_p=0.02)):
            draw = sample(logits.repeat(n, 1), [params] * n, list(range(n)), [11] * n)
            expected = truncated_logprobs(
                logits,
                torch.tensor([params.temperature]),
                torch.tensor([min(params.top_k, 102)]),
                torch.tensor([params.top_p]),
                torch.tensor([params.min_p]),
            )[0]
            freq = torch.bincount(torch.tensor(draw.tokens), minlength=102).double() / n
            self.assertLess(0.5 * (freq - expected.exp().double()).abs().sum().item(), 0.03, params)
            self.assertTrue(all(expected[t].item() > -float("inf") for t in draw.tokens), "only kept tokens are drawn")
            self.assertTrue(all(abs(lp - expected[t].item()) < 1e-6 for t, lp in zip(draw.tokens[:50], draw.logprobs[:50])))

    def test_the_noise_is_a_pure_function_of_seed_position_and_token(self) -> None:
        a = uniform_noise(torch.tensor([7, 7, 8]), torch.tensor([3, 4, 3]), 102)
        b = uniform_noise(torch.tensor([7]), torch.tensor([3]), 102)
        self.assertTrue(torch.equal(a[0], b[0]))
        self.assertFalse(torch.equal(a[0], a[1]))
        self.assertFalse(torch.equal(a[0], a[2]))
        self.assertTrue(bool(((a > 0) & (a < 1)).all()))


class _ServerCase(unittest.TestCase):
    decode_delay_ms = 0.0
    server: "RunningServer"

    def setUp(self) -> None:
        self.server = start_server(_DIRS["m0"], decode_delay_ms=self.decode_delay_ms, seed=3)
        self.url = self.server.url

    def tearDown(self) -> None:
        self.server.close()


@unittest.skipUnless(HAVE_TORCH, "torch is not installed (Debian: python3-torch)")
class RoutesTest(_ServerCase):
    def test_info_routes_answer_in_sglangs_shapes(self) -> None:
        status, models = call(self.url, "/v1/models")
        self.assertEqual(status, 200)
        card = models["data"][0]
        self.assertEqual((models["object"], card["owned_by"], card["max_model_len"], card["id"]), ("list", "sglang", 192, _DIRS["m0"]))
        status, info = call(self.url, "/get_model_info")
        self.assertEqual(
            info,
            {"model_path": _DIRS["m0"], "tokenizer_path": _DIRS["m0"], "is_generation": True, "preferred_sampling_params": None, "weight_version": "default"},
        )
        self.assertEqual(call(self.url, "/get_weight_version"), (200, {"weight_version": "default"}))
        self.assertEqual(call(self.url, "/health"), (200, ""))
        self.assertEqual(call(self.url, "/nope"), (404, {"detail": "Not Found"}))
        # The engine probes POST-only routes with GET: anything but 404 says the route exists.
        for route in ("/abort_request", "/pause_generation", "/continue_generation", "/update_weights_from_disk"):
            self.assertEqual(call(self.url, route), (405, {"detail": "Method Not Allowed"}), route)

    def test_generate_answers_text_output_ids_and_meta_info_with_a_logprob_per_token(self) -> None:
        reply = generate(self.url, PROMPT, max_new_tokens=6, ignore_eos=True, sampling_seed=4)
        self.assertEqual(set(reply), {"text", "output_ids", "meta_info"})
        meta = reply["meta_info"]
        self.assertEqual(meta["finish_reason"], {"type": "length", "length": 6})
        self.assertEqual((meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"], meta["num_retractions"]), (8, 6, 0, 0))
        self.assertEqual(meta["weight_version"], "default")
        self.assertEqual(meta["weight_versions"], [{"version": "default", "start": 0, "end": 6}])
        self.assertEqual([e[1:] for e in meta["output_token_logprobs"]], [[t, None] for t in reply["output_ids"]])
        self.assertEqual(meta["output_token_logprobs_length"], 6)
        self.assertEqual(reply["text"], vocab.decode([t for t in reply["output_ids"] if t >= 6]))
        self.assertIsInstance(meta["e2e_latency"], float)

    def test_each_reported_logprob_is_the_models_through_prefill_and_batched_decode(self) -> None:
        prompts = [PROMPT, PROMPT[:3], [2, 40, 41, 42, 43, 44, 45, 46, 47, 48, 5, 3], [3]]
        replies: List[Dict[str, Any]] = [{} for _ in prompts]

        def run(i: int) -> None:
            replies[i] = generate(self.url, prompts[i], max_new_tokens=12, temperature=0.7, ignore_eos=True, sampling_seed=i)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for prompt, reply in zip(prompts, replies):
            expected = recomputed(_DIRS["m0"], prompt, reply["output_ids"], temperature=0.7)
            worst = max(abs(a - b) for a, b in zip(logprobs_of(reply), expected))
            self.assertLess(worst, 1e-4, prompt)

    def test_top_k_1_is_greedy_and_its_logprob_is_zero(self) -> None:
        reply = generate(self.url, PROMPT, max_new_tokens=8, top_k=1, ignore_eos=True)
        model = load_pretrained(_DIRS["m0"])
        ids = list(PROMPT)
        for _ in range(8):
            with torch.no_grad():
                ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
        self.assertEqual(reply["output_ids"], ids[len(PROMPT) :])
        self.assertEqual(logprobs_of(reply), [0.0] * 8)
        self.assertEqual(generate(self.url, PROMPT, max_new_tokens=8, temperature=0, ignore_eos=True)["output_ids"], reply["output_ids"])

    def test_a_seed_repeats_its_tokens_and_a_continuation_from_its_own_prefix_draws_the_same_rest(self) -> None:
        first = generate(self.url, PROMPT, max_new_tokens=16, ignore_eos=True, sampling_seed=77)
        again = generate(self.url, PROMPT, max_new_tokens=16, ignore_eos=True, sampling_seed=77)
        other = generate(self.url, PROMPT, max_new_tokens=16, ignore_eos=True, sampling_seed=78)
        self.assertEqual(first["output_ids"], again["output_ids"])
        self.assertNotEqual(first["output_ids"], other["output_ids"])
        head = first["output_ids"][:5]
        rest = generate(self.url, PROMPT + head, max_new_tokens=11, ignore_eos=True, sampling_seed=77)
        self.assertEqual(head + rest["output_ids"], first["output_ids"])
        self.assertLess(max(abs(a - b) for a, b in zip(logprobs_of(first)[5:], logprobs_of(rest))), 1e-4)

    def test_truncated_sampling_reports_the_logprob_renormalised_over_the_kept_tokens(self) -> None:
        reply = generate(self.url, PROMPT, max_new_tokens=10, top_k=5, top_p=0.8, ignore_eos=True, sampling_seed=1)
        model = load_pretrained(_DIRS["m0"])
        ids = PROMPT + reply["output_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids]))[0, len(PROMPT) - 1 : -1]
        n = logits.shape[0]
        kept = truncated_logprobs(logits, torch.ones(n), torch.full((n,), 5), torch.full((n,), 0.8), torch.zeros(n))
        for i, (token, lp) in enumerate(zip(reply["output_ids"], logprobs_of(reply))):
            self.assertTrue(torch.topk(logits[i], 5).indices.eq(token).any(), "a token outside the top 5")
            self.assertAlmostEqual(lp, kept[i, token].item(), places=4)

    def test_generation_stops_on_eos_stop_token_ids_and_stop_strings_in_sglangs_finish_reasons(self) -> None:
        stopped = generate(self.url, PROMPT, max_new_tokens=150, stop_token_ids=list(range(7, 102)), sampling_seed=2)
        matched = stopped["meta_info"]["finish_reason"]
        self.assertEqual(matched, {"type": "stop", "matched": stopped["output_ids"][-1]})
        self.assertEqual(stopped["text"], "")  # the matched token is trimmed from the text (no_stop_trim false)
        kept = generate(self.url, PROMPT, max_new_tokens=150, stop_token_ids=list(range(7, 102)), sampling_seed=2, no_stop_trim=True)
        self.assertEqual(kept["output_ids"], stopped["output_ids"])
        first = generate(self.url, PROMPT, max_new_tokens=30, ignore_eos=True, sampling_seed=5)["output_ids"]
        # The first character that has not appeared before it: as a stop string it ends the reply there.
        at = next(i for i, t in enumerate(first) if i > 0 and t >= 7 and vocab.TOKENS[t] not in vocab.decode(first[:i]))
        by_str = generate(self.url, PROMPT, max_new_tokens=30, ignore_eos=True, sampling_seed=5, stop=[vocab.TOKENS[first[at]]])
        self.assertEqual(by_str["meta_info"]["finish_reason"], {"type": "stop", "matched": vocab.TOKENS[first[at]]})
        self.assertEqual(by_str["output_ids"], first[: at + 1])
        self.assertEqual(by_str["text"], vocab.decode([t for t in first[:at] if t >= 6]))
        zero = generate(self.url, PROMPT, max_new_tokens=0)
        self.assertEqual((zero["output_ids"], zero["meta_info"]["finish_reason"]), ([], {"type": "length", "length": 0}))

    def test_scores_a_prompt_with_max_new_tokens_0_and_logprob_start_len_as_sglang_answers_it(self) -> None:
        sampled = generate(self.url, PROMPT, max_new_tokens=6, ignore_eos=True, sampling_seed=4, temperature=0.7)
        ids = PROMPT + sampled["output_ids"]
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0.7},
            "return_logprob": True,
            "logprob_start_len": len(PROMPT) - 1,
        }
        status, reply = call(self.url, "/generate", body)
        self.assertEqual(status, 200, reply)
        self.assertEqual((reply["output_ids"], reply["meta_info"]["finish_reason"]), ([], {"type": "length", "length": 0}))
        entries = reply["meta_info"]["input_token_logprobs"]
        # One entry per id from logprob_start_len on, the first padded with a null logprob.
        self.assertEqual([e[1] for e in entries], ids[len(PROMPT) - 1 :])
        self.assertIsNone(entries[0][0])
        scored = [e[0] for e in entries[1:]]
        for got, want in zip(scored, logprobs_of(sampled)):
            self.assertAlmostEqual(got, want, delta=1e-4)
        for got, want in zip(scored, recomputed(_DIRS["m0"], PROMPT, sampled["output_ids"], 0.7)):
            self.assertAlmostEqual(got, want, delta=1e-5)

    def test_bad_input_answers_sglangs_error_shapes_naming_the_field_and_value(self) -> None:
        cases: List[Tuple[Dict[str, Any], str]] = [
            ({"input_ids": PROMPT + [250]}, r"^input_ids\[8\]: 250 is not a token id of this model \(0\.\.101\)\.$"),
            ({"input_ids": [3] * 192}, r"^The input \(192 tokens\) is longer than the model's context length \(192 tokens\)\.$"),
            ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 190}}, r"^Requested token count exceeds the model's maximum context length of 192 tokens"),
            ({"input_ids": PROMPT, "sampling_params": {"top_k": 0}}, r"^top_k must be -1 \(disable\) or at least 1, got 0\.$"),
            ({"input_ids": [PROMPT, PROMPT]}, r"^input_ids: a batch"),
            ({"sampling_params": {}}, r"^Either text, input_ids or input_embeds should be provided\.$"),
            ({"input_ids": PROMPT, "logprob_start_len": 0}, r"^logprob_start_len=0"),
        ]
        for body, message in cases:
            with self.subTest(message):
                status, reply = call(self.url, "/generate", body)
                self.assertEqual(status, 400)
                self.assertEqual(set(reply), {"error"})
                self.assertRegex(reply["error"]["message"], message)
        # Streamed, SGLang's refusal is an event of the stream (200), then [DONE].
        events = list(stream(self.url, {"input_ids": PROMPT, "sampling_params": {"top_p": 0}}))
        self.assertEqual(events, [{"error": {"message": "top_p must be in (0, 1], got 0.0."}}])
        status, reply = call(self.url, "/generate", raw=b"{not json")
        self.assertEqual(status, 400)
        self.assertEqual((reply["object"], reply["type"], reply["code"]), ("error", "Bad Request", 400))
        self.assertRegex(reply["message"], r"^request body is not valid JSON")
        status, reply = call(self.url, "/pause_generation", {"mode": "later"})
        self.assertEqual((status, reply["message"]), (400, "mode must be one of 'abort', 'retract', 'in_place', got 'later'"))
        # A text prompt is tokenized with the model's vocabulary.
        self.assertEqual(call(self.url, "/generate", {"text": "<|user|>hi", "sampling_params": {"max_new_tokens": 1}})[0], 200)

    def test_a_stream_sends_cumulative_chunks_then_done_and_ends_where_the_whole_reply_does(self) -> None:
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 10, "ignore_eos": True, "sampling_seed": 9}, "return_logprob": True}
        chunks = list(stream(self.url, body))
        whole = generate(self.url, PROMPT, max_new_tokens=10, ignore_eos=True, sampling_seed=9)
        self.assertGreaterEqual(len(chunks), 1)
        for a, b in zip(chunks, chunks[1:]):
            self.assertEqual(b["output_ids"][: len(a["output_ids"])], a["output_ids"], "cumulative output_ids")
            self.assertIsNone(a["meta_info"]["finish_reason"])
        self.assertEqual(chunks[-1]["output_ids"], whole["output_ids"])
        self.assertEqual(logprobs_of(chunks[-1]), logprobs_of(whole))
        self.assertEqual(chunks[-1]["meta_info"]["finish_reason"], {"type": "length", "length": 10})

    def test_abort_request_ends_the_request_by_rid_or_all_and_ignores_a_rid_not_in_flight(self) -> None:
        self.assertEqual(call(self.url, "/abort_request", {"rid": "nobody"}), (200, ""))
        self.server.scheduler.pause("in_place")  # holds the requests below where they are
        replies: Dict[str, Any] = {}

        def run(rid: str) -> None:
            replies[rid] = call(self.url, "/generate", {"input_ids": PROMPT, "rid": rid, "sampling_params": {"max_new_tokens": 20}})

        threads = [threading.Thread(target=run, args=(rid,)) for rid in ("job-1", "job-2", "other")]
        for t in threads:
            t.start()
        until(lambda: internal(self.url)["num_waiting_reqs"] == 3, "three requests queued")
        self.assertEqual(call(self.url, "/abort_request", {"rid": "job-1"}), (200, ""))
        threads[0].join()
        status, reply = replies["job-1"]
        self.assertEqual(status, 200)
        self.assertEqual(reply["meta_info"]["finish_reason"], {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None})
        self.assertEqual(reply["output_ids"], [])
        self.assertEqual(call(self.url, "/abort_request", {"abort_all": True}), (200, ""))
        for t in threads:
            t.join()
        self.assertEqual({rid: r[1]["meta_info"]["finish_reason"]["type"] for rid, r in replies.items()}, dict.fromkeys(replies, "abort"))
        self.assertEqual(internal(self.url)["requests_aborted"], 3)


@unittest.skipUnless(HAVE_TORCH, "torch is not installed (Debian: python3-torch)")
class PauseTest(_ServerCase):
    # Slow enough that a request is still generating when the test pauses, whatever the machine.
    decode_delay_ms = 10.0

    def _start_stream(self, max_new_tokens: int = 40) -> Tuple[List[Dict[str, Any]], threading.Thread]:
        chunks: List[Dict[str, Any]] = []
        body = {
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "sampling_seed": 21},
            "return_logprob": True,
        }
        thread = threading.Thread(target=lambda: chunks.extend(stream(self.url, body)))
        thread.start()
        until(lambda: bool(chunks) and len(chunks[-1]["output_ids"]) >= 4, "four tokens streamed")
        return chunks, thread

    def _check_chunk_versions(self, chunks: List[Dict[str, Any]]) -> None:
        """Every chunk's new tokens were sampled by the one version the chunk names."""
        seen = 0
        for chunk in chunks:
            spans = chunk["meta_info"]["weight_versions"]
            versions = [s["version"] for s in spans for _ in range(s["end"] - s["start"])]
            new = versions[seen:]
            self.assertEqual(set(new), {chunk["meta_info"]["weight_version"]}, chunk["meta_info"])
            seen = len(versions)

    def _update(self, flush_cache: bool) -> Tuple[int, Any]:
        return call(self.url, "/update_weights_from_disk", {"model_path": _DIRS["m1"], "weight_version": "1", "flush_cache": flush_cache})

    def test_in_place_keeps_requests_and_their_old_kv_so_tokens_after_an_update_match_no_single_weights(self) -> None:
        chunks, thread = self._start_stream()
        self.assertEqual(call(self.url, "/pause_generation", {"mode": "in_place"}), (200, {"message": "Generation paused successfully.", "status": "ok"}))
        status, refused = self._update(flush_cache=True)
        self.assertEqual((status, refused["success"]), (400, False))
        self.assertRegex(refused["message"], r"^flush_cache: true, but 1 request\(s\) paused in place hold a KV cache")
        self.assertEqual(call(self.url, "/get_weight_version")[1], {"weight_version": "default"})
        status, updated = self._update(flush_cache=False)
        self.assertEqual(status, 200)
        self.assertEqual(updated, {"success": True, "message": "Succeeded to update model weights. Weight version updated to 1.", "num_paused_requests": 0})
        self.assertEqual(call(self.url, "/continue_generation", {}), (200, {"message": "Generation continued successfully.", "status": "ok"}))
        thread.join()
        final = chunks[-1]
        meta = final["meta_info"]
        [old, new] = meta["weight_versions"]
        self.assertEqual((old["version"], new["version"], meta["weight_version"], meta["num_retractions"]), ("default", "1", "1", 0))
        split, ids, lps = old["end"], final["output_ids"], logprobs_of(final)
        self.assertGreaterEqual(split, 4)
        self.assertEqual(new["end"], 40)
        under_old = recomputed(_DIRS["m0"], PROMPT, ids)
        under_new = recomputed(_DIRS["m1"], PROMPT, ids)
        self.assertLess(max(abs(a - b) for a, b in zip(lps[:split], under_old[:split])), 1e-4)
        # After the update the request decodes over keys and values the old weights computed.
        self.assertGreater(max(abs(a - b) for a, b in zip(lps[split:], under_new[split:])), 1e-2)
        self.assertGreater(max(abs(a - b) for a, b in zip(lps[split:], under_old[split:])), 1e-2)
        self._check_chunk_versions(chunks)

    def test_retract_drops_the_kv_and_tokens_after_an_update_match_the_new_weights(self) -> None:
        chunks, thread = self._start_stream()
        self.assertEqual(call(self.url, "/pause_generation", {"mode": "retract"})[0], 200)
        status, updated = self._update(flush_cache=True)  # nothing holds a KV cache: it can be flushed
        self.assertEqual((status, updated["success"]), (200, True))
        self.assertEqual(call(self.url, "/continue_generation", {})[0], 200)
        thread.join()
        final = chunks[-1]
        meta = final["meta_info"]
        [old, new] = meta["weight_versions"]
        self.assertEqual(meta["num_retractions"], 1)
        split, ids, lps = old["end"], final["output_ids"], logprobs_of(final)
        under_old = recomputed(_DIRS["m0"], PROMPT, ids)
        under_new = recomputed(_DIRS["m1"], PROMPT, ids)
        self.assertLess(max(abs(a - b) for a, b in zip(lps[:split], under_old[:split])), 1e-4)
        self.assertLess(max(abs(a - b) for a, b in zip(lps[split:], under_new[split:])), 1e-4)
        self._check_chunk_versions(chunks)

    def test_abort_mode_ends_requests_with_their_tokens_and_holds_new_ones_until_continue(self) -> None:
        chunks, thread = self._start_stream()
        self.assertEqual(call(self.url, "/pause_generation", {"mode": "abort"})[0], 200)
        thread.join()
        meta = chunks[-1]["meta_info"]
        self.assertEqual(meta["finish_reason"]["type"], "abort")
        self.assertGreaterEqual(len(chunks[-1]["output_ids"]), 4)
        later: List[Any] = []
        waiter = threading.Thread(target=lambda: later.append(generate(self.url, PROMPT, max_new_tokens=3)))
        waiter.start()
        until(lambda: internal(self.url)["num_waiting_reqs"] == 1, "the new request queued while paused")
        self.assertEqual(internal(self.url)["generated_tokens_total"], len(chunks[-1]["output_ids"]))
        self.assertEqual(call(self.url, "/continue_generation", {})[0], 200)
        waiter.join()
        self.assertEqual(later[0]["meta_info"]["finish_reason"], {"type": "length", "length": 3})

    def test_an_update_without_a_pause_waits_for_the_requests_in_flight(self) -> None:
        chunks, thread = self._start_stream(max_new_tokens=12)
        status, updated = self._update(flush_cache=True)
        self.assertEqual(status, 200, updated)
        thread.join()
        self.assertEqual(chunks[-1]["meta_info"]["weight_versions"], [{"version": "default", "start": 0, "end": 12}])
        self.assertEqual(generate(self.url, PROMPT, max_new_tokens=2)["meta_info"]["weight_version"], "1")
        status, refused = call(self.url, "/update_weights_from_disk", {"model_path": str(Path(_DIRS["m0"]).parent / "none")})
        self.assertEqual(status, 400)
        self.assertRegex(refused["message"], r"^Failed to update weights: model_path: .* has no config\.json")

    def test_a_client_that_hangs_up_aborts_its_request_streamed_or_not(self) -> None:
        port = int(self.url.rsplit(":", 1)[1])
        for aborted, stream in ((1, True), (2, False)):
            sock = socket.create_connection(("127.0.0.1", port))
            body = json.dumps({"input_ids": PROMPT, "stream": stream, "sampling_params": {"max_new_tokens": 150, "ignore_eos": True}}).encode()
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            if stream:
                self.assertIn(b"data: ", sock.recv(4096) + sock.recv(4096))
            else:
                until(lambda: internal(self.url)["num_running_reqs"] == 1, "the request generating")
            sock.close()
            until(lambda: internal(self.url)["requests_aborted"] == aborted and internal(self.url)["num_running_reqs"] == 0, "the request aborted")
        self.assertLess(internal(self.url)["generated_tokens_total"], 300)


@unittest.skipUnless(HAVE_TORCH, "torch is not installed (Debian: python3-torch)")
class LaunchTest(unittest.TestCase):
    def test_the_module_prints_its_url_serves_and_exits_0_on_sigterm(self) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rollout_engine.policy.server", "--model", _DIRS["m0"], "--port", "0", "--weight-version", "7"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            self.assertRegex(line, r"^policy server listening on http://127\.0\.0\.1:\d+\n$")
            url = line.split()[-1]
            self.assertEqual(call(url, "/get_weight_version"), (200, {"weight_version": "7"}))
            self.assertEqual(generate(url, PROMPT, max_new_tokens=2)["meta_info"]["weight_version"], "7")
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 0, err)

    def test_a_missing_model_directory_is_one_line_naming_it(self) -> None:
        out = subprocess.run(
            [sys.executable, "-m", "rollout_engine.policy.server", "--model", "/nonexistent/model"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(out.returncode, 2)
        self.assertEqual(out.stderr.strip().splitlines(), ["policy server: --model: '/nonexistent/model' is not a directory (write one with rollout_engine.policy.save_pretrained)"])


if __name__ == "__main__":
    unittest.main()
