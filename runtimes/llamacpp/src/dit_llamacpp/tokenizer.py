"""Tokenizers for the GGUF models, trained on the project's own corpus with the ``tokenizers`` package.

llama.cpp's converter needs a tokenizer next to the weights, and a downloaded one is out of the
question, so each decoder shape gets a byte-pair encoding trained here on ``data/corpus.txt`` (a
copy of HeadSplit's corpus, written by this project), deterministically: the trainer is given the
corpus's lines in file order, one thread's worth of work, no randomness, so the same corpus and
vocabulary size give the same ``tokenizer.json`` bytes (:func:`tokenizer_files` writes them with
sorted keys; the SHA-256 of each is recorded in ``data/gguf.json`` and checked).

Two kinds, one per family, each the kind llama.cpp's converter knows how to read:

``gpt2``
    GPT-2's byte-level BPE: the ``ByteLevel`` pre-tokenizer (GPT-2's split regex, bytes mapped to
    printable characters), ``<|endoftext|>`` at id 0 (BOS = EOS, as in GPT-2). The converter reads it
    through ``transformers.AutoTokenizer`` and identifies the pre-tokenizer by hashing the ids of a
    fixed check text; our vocabulary is not one it knows, so :mod:`dit_llamacpp.convert_shim`
    registers *our* hash (recorded in ``data/gguf.json``) as llama.cpp's ``gpt2`` pre-tokenizer,
    which is the same regex. The vendored source is not edited.

``llama``
    Llama-2/TinyLlama's SentencePiece-style BPE as Hugging Face stores it in ``tokenizer.json``:
    normaliser ``Prepend("▁") + Replace(" ", "▁")``, no pre-tokenizer, ``byte_fallback`` with the
    256 ``<0xNN>`` byte tokens at ids 3..258, ``<unk> <s> </s>`` at 0, 1, 2, and the decoder
    ``Replace, ByteFallback, Fuse, Strip``. The converter takes its ``LlamaHfVocab`` path (no
    ``sentencepiece`` package, no ``tokenizer.model``, no pre-tokenizer hash) and writes llama.cpp's
    ``llama`` (SPM) vocabulary. That path gives every token the same score, so llama.cpp may split a
    *text* differently from Hugging Face; the equivalence check therefore compares token ids, never
    text (see ``docs/llamacpp-models.md``).

Both are padded to the model's ``vocab_size`` with never-produced ``<unused{i}>`` tokens when the
corpus yields fewer merges (full-size TinyLlama / GPT-2 vocabularies), so the embedding and the
vocabulary always have the same number of rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

Kind = Literal["gpt2", "llama"]

DATA = Path(__file__).parent / "data"
CORPUS = DATA / "corpus.txt"

GPT2_EOT = "<|endoftext|>"
LLAMA_SPECIALS = ("<unk>", "<s>", "</s>")
BYTE_TOKENS = tuple(f"<0x{i:02X}>" for i in range(256))
MIN_FREQUENCY = 2


class TokenizerError(ValueError):
    """A tokenizer cannot be built as asked (named field in the message)."""


def corpus_lines(corpus: Path = CORPUS) -> list[str]:
    """The corpus's non-empty lines, in file order (the trainer's input)."""
    try:
        text = corpus.read_text(encoding="utf-8")
    except OSError as exc:
        raise TokenizerError(f"corpus: cannot read {corpus}: {exc}") from exc
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        raise TokenizerError(f"corpus: {corpus} has no text")
    return lines


def _pad(vocab: dict[str, int], size: int) -> None:
    i = 0
    while len(vocab) < size:
        name = f"<unused{i}>"
        if name not in vocab:
            vocab[name] = len(vocab)
        i += 1


def _merges(raw: Sequence[Any]) -> list[tuple[str, str]]:
    """A trained model's merges as pairs (``"a b"`` strings in older ``tokenizers``, pairs in newer)."""
    out: list[tuple[str, str]] = []
    for m in raw:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        out.append((str(a), str(b)))
    return out


def build_gpt2(vocab_size: int, lines: Sequence[str]) -> Any:
    """GPT-2-style byte-level BPE with ``<|endoftext|>`` at id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if vocab_size < 257:
        raise TokenizerError(
            f"vocab_size: {vocab_size} is below the 256 bytes + <|endoftext|> of byte-level BPE"
        )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=MIN_FREQUENCY,
        show_progress=False,
        special_tokens=[GPT2_EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained.train_from_iterator(list(lines), trainer)
    model = json.loads(trained.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    merges = _merges(model["merges"])
    _pad(vocab, vocab_size)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([GPT2_EOT])
    return tok


def build_llama(vocab_size: int, lines: Sequence[str]) -> Any:
    """Llama-2-style BPE with byte fallback (``<unk> <s> </s>``, 256 byte tokens, learned pieces)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    fixed = len(LLAMA_SPECIALS) + len(BYTE_TOKENS)
    if vocab_size <= fixed:
        raise TokenizerError(
            f"vocab_size: {vocab_size} leaves no room after the {fixed} special and byte tokens"
        )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(BYTE_TOKENS),
        min_frequency=MIN_FREQUENCY,
        show_progress=False,
        special_tokens=list(LLAMA_SPECIALS),
    )
    trained = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))  # noqa: S106
    # training splits at spaces (pieces start with ▁, as SentencePiece's); the final tokenizer does
    # not split, like Llama-2's, and produces the same pieces because no merge crosses a ▁
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    trained.train_from_iterator(list(lines), trainer)
    model = json.loads(trained.to_str())["model"]
    learned = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    vocab: dict[str, int] = {t: i for i, t in enumerate((*LLAMA_SPECIALS, *BYTE_TOKENS))}
    for piece, _ in learned:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = _merges(model["merges"])
    _pad(vocab, vocab_size)
    unk = LLAMA_SPECIALS[0]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    tok.add_special_tokens(list(LLAMA_SPECIALS))
    return tok


def build(kind: Kind, vocab_size: int, corpus: Path = CORPUS) -> Any:
    """A ``tokenizers.Tokenizer`` of ``kind`` with exactly ``vocab_size`` entries, trained on ``corpus``."""
    lines = corpus_lines(corpus)
    if kind == "gpt2":
        tok = build_gpt2(vocab_size, lines)
    elif kind == "llama":
        tok = build_llama(vocab_size, lines)
    else:
        raise TokenizerError(f"tokenizer.kind: {kind!r} is not gpt2 or llama")
    if tok.get_vocab_size() != vocab_size:
        raise TokenizerError(f"vocab_size: built {tok.get_vocab_size()} tokens, expected {vocab_size}")
    return tok


def special_ids(kind: Kind) -> dict[str, int]:
    """BOS/EOS (and UNK) ids the model config must carry for ``kind``."""
    if kind == "gpt2":
        return {"bos_token_id": 0, "eos_token_id": 0}
    return {"bos_token_id": 1, "eos_token_id": 2}


def tokenizer_config(kind: Kind, max_length: int) -> dict[str, Any]:
    """``tokenizer_config.json`` for ``transformers.AutoTokenizer`` (a fast tokenizer from the JSON)."""
    if kind == "gpt2":
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": GPT2_EOT,
            "eos_token": GPT2_EOT,
            "unk_token": GPT2_EOT,
            "add_bos_token": False,
            "add_eos_token": False,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": max_length,
        }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "add_prefix_space": True,
        "clean_up_tokenization_spaces": False,
        "legacy": False,
        "model_max_length": max_length,
    }


def _dump(doc: Any) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def tokenizer_files(kind: Kind, vocab_size: int, max_length: int, corpus: Path = CORPUS) -> dict[str, bytes]:
    """The files a Hugging Face model directory needs for this tokenizer, name -> exact bytes."""
    tok = build(kind, vocab_size, corpus)
    return {
        "tokenizer.json": _dump(json.loads(tok.to_str())),
        "tokenizer_config.json": _dump(tokenizer_config(kind, max_length)),
        "special_tokens_map.json": _dump(
            {
                k: v
                for k, v in tokenizer_config(kind, max_length).items()
                if k.endswith("_token") and "add" not in k
            }
        ),
    }
