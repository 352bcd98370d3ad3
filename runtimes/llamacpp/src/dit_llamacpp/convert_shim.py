"""Run llama.cpp's vendored ``convert_hf_to_gguf.py`` with our tokenizer's pre-tokenizer hash registered.

Usage (always a subprocess, see :func:`dit_llamacpp.models.converter_argv`)::

    python -m dit_llamacpp.convert_shim --source VENDOR/llama.cpp [--pre SHA256=NAME ...] -- CONVERTER-ARGS

The converter identifies a GPT-2-style BPE pre-tokenizer by hashing the token ids of a fixed check
text (``get_vocab_base_pre``) and refuses hashes it does not list. Our tokenizers are trained on the
project's own corpus, so their hash is new; rather than editing the vendored source, this shim wraps
that method: a hash given with ``--pre`` (recorded per model in ``data/gguf.json``) maps to the
named llama.cpp pre-tokenizer, any other hash goes to the converter's own table unchanged (and is
refused as before). A second wrapper lets a Llama model without ``tokenizer.model`` reach the
converter's ``tokenizer.json`` path (``LlamaHfVocab``) when the ``sentencepiece`` package is not
installed (the converter imports it before checking for the file). The check text is read from the
vendored source itself (the literal assigned to ``chktxt`` in that method), so the hash is computed
exactly as the converter computes it. ``--print-pre-hash`` prints the hash of a model directory's
tokenizer and exits.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import inspect
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def check_text(method: Any) -> str:
    """The ``chktxt`` literal of the converter's ``get_vocab_base_pre``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "chktxt" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            if isinstance(value, str):
                return value
    raise RuntimeError("convert_shim: no chktxt literal in the converter's get_vocab_base_pre")


def pre_hash(tokenizer: Any, text: str) -> str:
    """The converter's pre-tokenizer hash: SHA-256 of ``str(tokenizer.encode(text))``."""
    return hashlib.sha256(str(tokenizer.encode(text)).encode()).hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, rest = args[:cut], args[cut + 1 :]
    parser = argparse.ArgumentParser(prog="dit_llamacpp.convert_shim")
    parser.add_argument("--source", required=True, type=Path, help="vendored llama.cpp directory")
    parser.add_argument("--pre", action="append", default=[], metavar="SHA256=NAME")
    parser.add_argument("--print-pre-hash", type=Path, metavar="HF_DIR")
    opts = parser.parse_args(args)
    source: Path = opts.source
    if not (source / "convert_hf_to_gguf.py").is_file():
        parser.error(f"--source: {source} has no convert_hf_to_gguf.py")
    registered: dict[str, str] = {}
    for item in opts.pre:
        digest, sep, name = item.partition("=")
        if not sep or len(digest) != 64 or not name:
            parser.error(f"--pre: {item!r} is not SHA256=NAME")
        registered[digest] = name

    sys.path.insert(0, str(source / "gguf-py"))
    sys.path.insert(0, str(source))
    base: Any = importlib.import_module("conversion.base")  # the vendored package (found at run time)

    original = base.TextModel.get_vocab_base_pre
    text = check_text(original)

    if opts.print_pre_hash is not None:
        from transformers import AutoTokenizer

        print(pre_hash(AutoTokenizer.from_pretrained(opts.print_pre_hash), text))
        return 0

    def get_vocab_base_pre(self: Any, tokenizer: Any) -> str:
        digest = pre_hash(tokenizer, text)
        if digest in registered:
            base.logger.info(
                f"convert_shim: pre-tokenizer hash {digest} registered as {registered[digest]!r}"
            )
            return registered[digest]
        result: str = original(self, tokenizer)
        return result

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre

    sentencepiece = base.TextModel._create_vocab_sentencepiece

    def create_vocab_sentencepiece(self: Any) -> Any:
        # the converter imports sentencepiece *before* looking for tokenizer.model, so without the
        # package a model that has no tokenizer.model fails instead of falling through to its
        # tokenizer.json path; answer as the converter would with the package installed
        if not (Path(self.dir_model) / "tokenizer.model").is_file():
            raise FileNotFoundError(f"File not found: {Path(self.dir_model) / 'tokenizer.model'}")
        return sentencepiece(self)

    base.TextModel._create_vocab_sentencepiece = create_vocab_sentencepiece
    converter: Any = importlib.import_module("convert_hf_to_gguf")

    sys.argv = [str(source / "convert_hf_to_gguf.py"), *rest]
    converter.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
