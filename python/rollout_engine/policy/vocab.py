"""The reference policy's character-level vocabulary, in pure Python (no torch), and the two Hugging
Face tokenizer files that describe it to the engine (``tokenizer.json`` + ``tokenizer_config.json``,
read by the engine's ``loadChatModel(dir)`` with @huggingface/tokenizers and @huggingface/jinja).

Ids, fixed (the trainer, the server and the shipped files agree on them): 0 ``<|endoftext|>`` (pad),
1 ``<|system|>``, 2 ``<|user|>``, 3 ``<|assistant|>``, 4 ``<|tool|>``, 5 ``<|end|>`` (eos: the end
of a turn, generation stops on it), 6 ``\\n``, then the 95 printable ASCII characters from space
(0x20) to ``~`` (0x7e) in code order: 102 tokens.

The tokenizer file is a BPE model with no merges and no pre-tokenizer: the text is one word split
into characters, every character is its own token, and a ``Fuse`` decoder joins them back without
the spaces a decoder-less tokenizer would put between tokens. So ``decode(encode(text)) == text``
for any text of these characters and special strings, here and in the engine.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

SPECIAL_TOKENS = ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>")
PAD_ID = 0
EOS_ID = 5
EOS_TOKEN = SPECIAL_TOKENS[EOS_ID]
PAD_TOKEN = SPECIAL_TOKENS[PAD_ID]
#: Every token's text, by id.
TOKENS: tuple[str, ...] = SPECIAL_TOKENS + ("\n",) + tuple(chr(c) for c in range(0x20, 0x7F))
VOCAB_SIZE = len(TOKENS)
assert VOCAB_SIZE == 102

#: The chat template: ``<|role|>content<|end|>`` per message, ``<|assistant|>`` to prompt a reply.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

#: The package's copy of the two files (``save_pretrained`` copies them beside the weights).
TOKENIZER_DIR = Path(__file__).resolve().parent / "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

_ID = {text: i for i, text in enumerate(TOKENS)}
_CHAR_ID = {text: i for i, text in enumerate(TOKENS) if len(text) == 1}


def encode(text: str) -> List[int]:
    """Ids of ``text`` exactly as written: the special strings become their tokens, every other
    character its own. A character outside the vocabulary is an error, not a silent drop (the engine's
    tokenizer would drop it)."""
    ids: List[int] = []
    i = 0
    n = len(text)
    while i < n:
        if text[i] == "<":
            for special_id, special in enumerate(SPECIAL_TOKENS):
                if text.startswith(special, i):
                    ids.append(special_id)
                    i += len(special)
                    break
            else:
                ids.append(_CHAR_ID["<"])
                i += 1
            continue
        token = _CHAR_ID.get(text[i])
        if token is None:
            raise ValueError(
                f"text: character {text[i]!r} at {i} is not in the vocabulary (printable ASCII, newline and {', '.join(SPECIAL_TOKENS)})"
            )
        ids.append(token)
        i += 1
    return ids


def decode(ids: Sequence[int]) -> str:
    """Text of ``ids``, special tokens as their strings (the inverse of :func:`encode`)."""
    out: List[str] = []
    for position, token in enumerate(ids):
        if not 0 <= int(token) < VOCAB_SIZE:
            raise ValueError(f"ids[{position}]: {token} is not a token id (0..{VOCAB_SIZE - 1})")
        out.append(TOKENS[int(token)])
    return "".join(out)


def render(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
    """What :data:`CHAT_TEMPLATE` renders for ``messages`` (each ``{"role", "content"}``), in Python."""
    text = "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)
    return text + "<|assistant|>" if add_generation_prompt else text


def tokenizer_json() -> Dict[str, Any]:
    """The ``tokenizer.json`` this vocabulary is (what the package ships in ``tokenizer/``)."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, **_special_token(text)} for i, text in enumerate(SPECIAL_TOKENS)],
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": dict(_ID),
            "merges": [],
        },
    }


def _special_token(text: str) -> Dict[str, Any]:
    """One special token as both tokenizer files describe it: matched whole, never split or normalised."""
    return {"content": text, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}


def tokenizer_config(model_max_length: int = 512) -> Dict[str, Any]:
    """The ``tokenizer_config.json``: special tokens, the chat template, the context length."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {str(i): _special_token(text) for i, text in enumerate(SPECIAL_TOKENS)},
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
