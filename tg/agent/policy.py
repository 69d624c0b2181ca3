"""The policy: the paper's model class (`Qwen2ForCausalLM`) at toy size, or any hub/local checkpoint.

The cpu preset builds a randomly initialised Qwen2 with `ModelConfig`'s sizes and tied embeddings,
and a word-level tokenizer made locally from the world's words. Both are saved with
`save_pretrained` and read back by `load_policy`, the same function that loads Qwen2.5 on a GPU.

Departures from the paper's model (Qwen2.5 with its 151k-token BPE tokenizer):
1. Word-level vocabulary: every word of the world's documents and questions, the prompt template,
   the invalid-action message and the observation format, the digits 0-9 (numbers are split into
   digits) and punctuation. Whitespace is dropped except newlines, so `decode` puts one space
   between tokens ('Doc 1 ( Title : Borv )'); decode -> encode still gives the same ids.
2. The protocol tags (`PROTOCOL_TAGS`) are single added tokens that are not 'special' (decoding
   with skip_special_tokens keeps them), as `<think>` is in Qwen3's tokenizer; the chat markers
   `<|im_start|>`, `<|im_end|>`, `<|endoftext|>` are special, as in Qwen2.5.
3. The chat template is Qwen's without the default system message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch
from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from tg.agent.protocol import INVALID_ACTION, PROMPT_TEMPLATE, PROTOCOL_TAGS, format_observation
from tg.agent.world import RELATIONS, World
from tg.config import ModelConfig

PAD, UNK = "[PAD]", "[UNK]"
CHAT_MARKERS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""Qwen2.5's ChatML layout (no default system message)."""
SCRIPT_WORDS = "I need The the of is . , ? ! ' \" - ( ) : ; user assistant system 0 1 2 3 4 5 6 7 8 9"
"""Words every tiny vocabulary has beyond the world's texts: scripted thoughts, chat roles, digits, punctuation."""
MAX_POSITIONS = 4096
AUTO_MAP = {"AutoTokenizer": [None, "PreTrainedTokenizerFast"]}
"""transformers 5 rebuilds any qwen2 checkpoint's tokenizer as a byte-level BPE `Qwen2Tokenizer` from
the vocabulary alone (qwen2 is in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS), silently changing a
word-level tokenizer's ids. An `auto_map` entry makes `AutoTokenizer.from_pretrained` skip that
override and load tokenizer.json verbatim (with trust_remote_code left off, its default)."""


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Newlines are tokens, spaces are separators, each punctuation mark and digit is its own token."""
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\n"), "isolated"),
        pre_tokenizers.Split(Regex(r"[^\S\n]+"), "removed"),
        pre_tokenizers.Punctuation("isolated"),
        pre_tokenizers.Digits(individual_digits=True),
    ])


def vocabulary_texts(world: World) -> list[str]:
    """Every text the tiny policy must read or write without unknown tokens."""
    fixed = [PROMPT_TEMPLATE, INVALID_ACTION, SCRIPT_WORDS, format_observation([{"title": "x", "contents": "y"}])]
    phrases = [r.phrase.format(s="") for r in RELATIONS.values()]  # used by scripted thoughts
    return fixed + phrases + world.texts()


def build_tokenizer(texts: Iterable[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the words of `texts`, with protocol tags and chat markers as added tokens.

    Ids: [PAD]=0, [UNK]=1, then the words in sorted order, then the chat markers and the tags.
    """
    split = _pre_tokenizer()
    words = sorted({w for t in texts for w, _ in split.pre_tokenize_str(t)} - set(PROTOCOL_TAGS))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate([PAD, UNK, *words])}, unk_token=UNK))
    tok.pre_tokenizer = split
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (PAD, UNK, *CHAT_MARKERS)])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in PROTOCOL_TAGS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, unk_token=UNK, eos_token="<|im_end|>", bos_token=None,
        chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False, model_max_length=MAX_POSITIONS,
    )
    tokenizer.init_kwargs["auto_map"] = AUTO_MAP  # saved into tokenizer_config.json; see AUTO_MAP
    return tokenizer


def tiny_qwen2_config(cfg: ModelConfig, tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    """Qwen2Config with the toy sizes of `cfg` and the tokenizer's vocabulary and special ids."""
    return Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size, max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"), eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny_policy(cfg: ModelConfig, world: World, seed: int = 0) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """A randomly initialised toy Qwen2ForCausalLM (float32) and its word-level tokenizer for `world`."""
    tokenizer = build_tokenizer(vocabulary_texts(world))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(tiny_qwen2_config(cfg, tokenizer))
    stop = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    model.generation_config.eos_token_id = stop
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def resolve_dtype(name: str, device: str | torch.device) -> torch.dtype:
    """ModelConfig.dtype -> torch dtype: 'auto' is float32 on CPU (bf16 is slower there), bfloat16 on CUDA."""
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def load_policy(path_or_id: str | Path, dtype: str = "auto",
                device: str | torch.device = "cpu") -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """Model and tokenizer from a local `save_pretrained` directory or a hub id (eval mode).

    The same call loads the tiny warmed-up policy and Qwen/Qwen2.5-*; it never builds anything.
    """
    tokenizer = AutoTokenizer.from_pretrained(str(path_or_id))
    model = AutoModelForCausalLM.from_pretrained(str(path_or_id), dtype=resolve_dtype(dtype, device))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer


def save_policy(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, directory: str | Path) -> Path:
    """`save_pretrained` of both into one directory, as a hub checkpoint is laid out."""
    d = Path(directory)
    model.save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d
