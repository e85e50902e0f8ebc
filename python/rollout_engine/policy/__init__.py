"""The reference policy (needs torch): a small transformer over a character vocabulary
(:mod:`.model`, :mod:`.vocab`) and the policy server that samples from it speaking SGLang's native
API (``python3 -m rollout_engine.policy.server``). See python/README.md, "Reference policy server".
"""
from .model import KVCache, ModelConfig, TinyLM, init_model, load_pretrained, save_pretrained, token_logprobs
from .vocab import EOS_ID, PAD_ID, TOKENIZER_DIR, VOCAB_SIZE, decode, encode, render

__all__ = [
    "EOS_ID",
    "KVCache",
    "ModelConfig",
    "PAD_ID",
    "TOKENIZER_DIR",
    "TinyLM",
    "VOCAB_SIZE",
    "decode",
    "encode",
    "init_model",
    "load_pretrained",
    "render",
    "save_pretrained",
    "token_logprobs",
]
