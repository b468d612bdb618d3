"""Small causal LMs built from nothing: a byte-level BPE tokenizer trained on our own text and a randomly
initialised Llama-style model, saved in one directory that ``AutoTokenizer`` and
``AutoModelForCausalLM`` load (and TRL, PEFT and vLLM with them).

Nothing is downloaded. The demo's generator starts here (``resilibench robust demo``), and the tests' tiny
models are built the same way. The tokenizer carries a chat template whose assistant turns are wrapped
in ``{% generation %}`` markers, so TRL's assistant-only losses work.

    from resilibench.robust_train.scratch import build_causal_lm, generator_corpus
    path = build_causal_lm("runs/scratch", generator_corpus(tasks), hidden_size=128, num_layers=4)
"""

from __future__ import annotations

__all__ = ["SPECIAL_TOKENS", "ROLE_TOKENS", "CHATML_TOKENS", "CHAT_TEMPLATE", "build_tokenizer", "build_causal_lm"]

from collections.abc import Iterable, Sequence
from pathlib import Path

SPECIAL_TOKENS = ("<|pad|>", "<|begin|>", "<|end|>", "<|unk|>")
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")  # a ChatML model's turn markers; <|im_end|> ends its turns

# Roles, then the content; assistant turns wrapped in generation markers (TRL's assistant masks).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}"
    "{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 4096, extra_tokens: Sequence[str] = (),
                    chatml: bool = False):
    """A ``PreTrainedTokenizerFast``: byte-level BPE trained on ``corpus`` (so it encodes any string), with
    pad/bos/eos/unk, the role markers and ``extra_tokens`` (e.g. tool names) as single ordinary tokens, and
    ``CHAT_TEMPLATE``. ``chatml``: the ChatML turn markers as special tokens and ``<|im_end|>`` as the end
    token (what a tool-calling chat template such as TRL's Qwen2.5 one ends its turns with)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [*SPECIAL_TOKENS, *(CHATML_TOKENS if chatml else ())]
    backend = Tokenizer(models.BPE(unk_token="<|unk|>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(list(corpus), trainer=trainer)
    # Ordinary (non-special) tokens: decoding keeps them.
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in (*ROLE_TOKENS, *extra_tokens)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<|pad|>", bos_token="<|begin|>",
                                        eos_token=CHATML_TOKENS[1] if chatml else "<|end|>", unk_token="<|unk|>",
                                        padding_side="left")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_causal_lm(directory: str | Path, corpus: Iterable[str], *, seed: int = 0, hidden_size: int = 32,
                    num_layers: int = 2, num_heads: int = 4, vocab_size: int = 4096,
                    max_positions: int = 16384, initializer_range: float = 0.02,
                    extra_tokens: Sequence[str] = (), answer_texts: Sequence[str] | None = None,
                    chatml: bool = False) -> Path:
    """Build and save a random ``LlamaForCausalLM`` and its tokenizer (trained on ``corpus``) in
    ``directory``; returns it. Deterministic for a seed. The generation config stops at the end token;
    with ``answer_texts`` it also suppresses every token that none of those texts encodes to (constrained
    decoding: an answer is made of those tokens and the end token only, and is not empty). ``chatml``: see
    ``build_tokenizer``."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    tokenizer = build_tokenizer(corpus, vocab_size, extra_tokens, chatml)
    pad, bos, eos = tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id
    assert isinstance(pad, int) and isinstance(bos, int) and isinstance(eos, int)  # build_tokenizer sets them
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=max_positions, tie_word_embeddings=True, initializer_range=initializer_range,
        pad_token_id=pad, bos_token_id=bos, eos_token_id=eos,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    suppress = None
    if answer_texts is not None:
        allowed = {eos, *(i for text in answer_texts for i in tokenizer(text, add_special_tokens=False)["input_ids"])}
        suppress = [i for i in range(len(tokenizer)) if i not in allowed]
    model.generation_config = GenerationConfig(pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id, suppress_tokens=suppress,
                                               min_new_tokens=None if suppress is None else 1)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
