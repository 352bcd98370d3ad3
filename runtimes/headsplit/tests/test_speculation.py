"""The offline speculation profile."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from headsplit import model, speculation  # noqa: E402
from headsplit.config import preset  # noqa: E402

TEXT = "Heads expose the parallelism that layers hide inside them. " * 6


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def crafted() -> tuple[object, model.Weights]:
    cfg = preset("gpt2-tiny")
    w = model.seeded_weights(cfg)
    for layer in (0, 2):
        w[f"L{layer}.fc2.weight"] = torch.zeros_like(w[f"L{layer}.fc2.weight"])
        w[f"L{layer}.fc2.bias"] = torch.zeros_like(w[f"L{layer}.fc2.bias"])
    w["L1.fc2.weight"] = w["L1.fc2.weight"] * 1000.0
    return cfg, w


def test_crafted_model_profile() -> None:
    cfg, w = crafted()
    doc = speculation.profile(cfg, w, TEXT, 0.05, window=32)  # type: ignore[arg-type]
    acc = {t["layer"]: t["acceptance"] for t in doc["transitions"]}
    assert acc == {0: 1.0, 1: 0.0, 2: 1.0}
    assert doc["speculate_layers"] == [0, 2]
    assert doc["positions"] == len(TEXT.encode())
    t0 = doc["transitions"][0]
    assert t0["expected_saving_ns"] > 0 and t0["ratio_median"] == 0.0


def test_acceptance_follows_tau() -> None:
    cfg = preset("llama-tiny")
    w = model.seeded_weights(cfg)
    ref = speculation.profile(cfg, w, TEXT, 0.0, window=32)
    assert all(t["acceptance"] == 0.0 and not t["speculate"] for t in ref["transitions"])
    med = ref["transitions"][1]["ratio_median"]
    above = speculation.profile(cfg, w, TEXT, med * 1.0001, window=32)["transitions"][1]["acceptance"]
    assert abs(above - 0.5) < 0.01  # tau just above the median ratio accepts half the positions


def test_cli_writes_a_checked_profile(tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "p.json"
    assert (
        speculation.main(
            [
                "--model",
                "gpt2-tiny",
                "--tau",
                "0.05",
                "--out",
                str(out),
                "--corpus",
                str(corpus),
                "--window",
                "32",
            ]
        )
        == 0
    )
    doc = speculation.load_profile(out)
    assert doc["corpus"]["sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert doc["tau"] == 0.05 and len(doc["transitions"]) == 3
    tampered = dict(doc, speculate_layers=[0, 1, 2])
    out.write_text(json.dumps(tampered))
    with pytest.raises(speculation.ProfileError, match="sha256 mismatch"):
        speculation.load_profile(out)


def test_default_corpus_is_shipped_and_hashed() -> None:
    raw = speculation.DEFAULT_CORPUS.read_bytes()
    assert len(raw) > 3000
    cfg = preset("gpt2-tiny")
    doc = speculation.build(cfg, model.seeded_weights(cfg), 0.05, max_windows=2)
    assert doc["corpus"]["sha256"] == hashlib.sha256(raw).hexdigest()


def test_acceptance_table_per_tau_from_one_pass() -> None:
    """One pass gives every tau's acceptance (issue 32, item 5): the crafted layers accept everything
    (ratio 0) or nothing (ratio huge) at every tau, and the table agrees with each tau's profile."""
    cfg, w = crafted()
    m = speculation.measure(cfg, w, model.tokenize(TEXT, cfg), window=32)  # type: ignore[arg-type]
    table = speculation.acceptance(m, speculation.TAUS)
    assert [row["0.05"] for row in table] == [1.0, 0.0, 1.0]
    assert list(table[0]) == ["0.02", "0.05", "0.1", "0.2", "0.3"]
    for tau in speculation.TAUS:
        doc = speculation.summarise(cfg, m, tau)  # type: ignore[arg-type]
        assert [t["acceptance"] for t in doc["transitions"]] == [row[f"{tau:g}"] for row in table]
        assert doc["acceptance_by_tau"] == table


def test_profile_over_given_ids_not_bytes(tmp_path: Path) -> None:
    """A trained model's corpus arrives in its own tokens (--ids): those are profiled, not the bytes."""
    cfg = preset("llama-tiny")
    w = model.seeded_weights(cfg)
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]
    doc = speculation.profile(cfg, w, TEXT, 0.05, window=32, ids=ids)
    assert doc["positions"] == len(ids)
    f = tmp_path / "ids.json"
    f.write_text(json.dumps(ids))
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "p.json"
    argv = ["--model", "llama-tiny", "--out", str(out), "--corpus", str(corpus), "--ids", str(f)]
    assert speculation.main(argv) == 0
    got = speculation.load_profile(out)
    assert got["positions"] == len(ids) and got["corpus"]["tokens"] == len(ids)
    with pytest.raises(speculation.ProfileError, match="corpus ids: 99999 is outside the vocabulary"):
        speculation.profile(cfg, w, TEXT, 0.05, ids=[1, 99999])
    f.write_text('{"not": "a list"}')
    assert speculation.main(argv) == 2
