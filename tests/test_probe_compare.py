"""lab.train.probe keeps each MRCR document's seed and score; probe_compare pairs two summaries."""

from __future__ import annotations

import json

import pytest

from lab.train import probe, probe_compare
from optimized_model.k3.tokenizer import K3Tokenizer


def _summary(scores: dict[int, list[float]], tier: dict[int, list[tuple[int, int, float]]] | None = None) -> dict:
    out = {f"mrcr_{size}": {"score": sum(s) / len(s),
                            "documents": [{"seed": 1000 * size + i, "score": g} for i, g in enumerate(s)]}
           for size, s in scores.items()}
    if tier:
        out["eval_documents"] = {f"mrcr_{b}": {"docs": len(d), "documents": [
            {"needles": n, "asked": k, "chose": k, "score": g} for n, k, g in d]} for b, d in tier.items()}
    return out


def test_the_probe_keeps_each_mrcr_documents_seed_and_score(monkeypatch):
    """With generations that answer right (the targets decoded), every kept score is 1, by seed."""
    tok = K3Tokenizer()
    monkeypatch.setattr(probe, "_generate", lambda model, rendered, extra: [tok.decode(t) for _, t in rendered])
    out = probe.probe(None, tok, 2, "numbered", mrcr_tokens=(400,), say=lambda s: None)
    docs = out["mrcr_400"]["documents"]
    assert [d["seed"] for d in docs] == [probe.PROBE_SEED_BASE + 400_000 + i for i in range(2)]
    assert [d["score"] for d in docs] == [1.0, 1.0] and out["mrcr_400"]["score"] == 1.0


def test_two_probes_compare_paired_by_document_with_bootstrap_cis():
    a = _summary({4000: [0.5] * 8 + [1.0] * 8}, {8192: [(8, 3, 0.4), (2, 1, 1.0)]})
    b = _summary({4000: [1.0] * 16}, {8192: [(8, 3, 1.0), (2, 1, 1.0)]})
    rows = probe_compare.compare(a, b, 0.8)
    probe_row, tier_row = rows
    assert (probe_row["where"], probe_row["tokens"], probe_row["docs"]) == ("probe", 4000, 16)
    assert probe_row["a"][0] == pytest.approx(0.75) and probe_row["b"] == (1.0, 1.0, 1.0)
    assert probe_row["b_minus_a"][0] == pytest.approx(0.25) and probe_row["b_minus_a"][1] > 0
    assert probe_row["b_meets_target"] and not probe_row["a_meets_target"]  # A's CI reaches below 0.8
    assert (tier_row["where"], tier_row["tokens"], tier_row["b_minus_a"][0]) == ("tier", 8192, pytest.approx(0.3))


def test_probes_of_other_documents_or_without_per_document_scores_are_refused():
    a = _summary({4000: [1.0] * 4})
    with pytest.raises(SystemExit, match="different documents"):
        probe_compare.compare(a, _summary({4000: [1.0] * 5}), 0.8)
    with pytest.raises(SystemExit, match="different documents"):
        probe_compare.compare(_summary({}, {8192: [(8, 3, 1.0)]}), _summary({}, {8192: [(8, 2, 1.0)]}), 0.8)
    with pytest.raises(SystemExit, match="lacks per-document scores"):
        probe_compare.compare(a, {"mrcr_4000": {"score": 1.0}}, 0.8)


def test_the_command_prints_a_table_and_names_an_unreadable_file(tmp_path, capsys):
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(_summary({1000: [0.0, 1.0, 1.0, 1.0]})))
    pb.write_text(json.dumps(_summary({1000: [1.0, 1.0, 1.0, 1.0]})))
    assert probe_compare.main([str(pa), str(pb)]) == 0
    out = capsys.readouterr().out
    assert "| probe | 1000 | 4 | 0.750 [" in out and "| 1.000 [1.000, 1.000] ✓ |" in out
    with pytest.raises(SystemExit, match="not a readable probe summary"):
        probe_compare.main([str(pa), str(tmp_path / "missing.json")])
    with pytest.raises(SystemExit, match="share no MRCR size"):
        pb.write_text(json.dumps(_summary({2000: [1.0]})))
        probe_compare.main([str(pa), str(pb)])
