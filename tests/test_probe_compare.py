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
    from lab.train import eval_tasks

    assert [d["needles"] for d in docs] == [len(eval_tasks.mrcr_needles(eval_tasks.mrcr_row(d["seed"], 400, tok))[0])
                                            for d in docs]


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


def test_the_probe_generates_at_most_generate_batch_documents_at_once(monkeypatch):
    """48 documents of ~16k tokens in one batch ran the CPU out of memory: the probe generates in
    batches of GENERATE_BATCH, the texts in the prompts' order."""
    from types import SimpleNamespace

    batches = []

    class Echo:
        def generate(self, requests):
            batches.append(len(requests))
            return [SimpleNamespace(text=str(r.prompt_ids[0])) for r in requests]

    monkeypatch.setattr(probe, "GENERATE_BATCH", 2)
    texts = probe._generate(Echo(), [([i], [0]) for i in range(5)], 8)
    assert batches == [2, 2, 1] and texts == ["0", "1", "2", "3", "4"]


def test_a_probe_cut_short_keeps_the_sizes_it_finished(tmp_path, monkeypatch, capsys):
    """Killed (here: out of memory) at its second MRCR size, the probe's --out file still holds the
    first size's scores, marked incomplete; probe_compare compares what both files hold and says so."""
    from types import SimpleNamespace

    tok = K3Tokenizer()

    def answer_then_fail(model, rendered, extra):
        if len(rendered[0][0]) > 1000:
            raise MemoryError("the second size")
        return [tok.decode(t) for _, t in rendered]

    monkeypatch.setattr(probe, "_generate", answer_then_fail)
    monkeypatch.setattr(probe, "load_standard", lambda w, d: (SimpleNamespace(tokenizer=tok), {}, "ab" * 32))
    out = tmp_path / "p.json"
    with pytest.raises(MemoryError):
        probe.main(["w.safetensors", "--n", "2", "--mrcr-tokens", "400,2000", "--out", str(out)])
    kept = json.loads(out.read_text())
    assert kept["complete"] is False and kept["mrcr_400"]["score"] == 1.0 and "mrcr_2000" not in kept
    full = tmp_path / "full.json"
    seeds = [d["seed"] for d in kept["mrcr_400"]["documents"]]
    full.write_text(json.dumps({"mrcr_400": {"documents": [{"seed": s, "score": 0.5} for s in seeds]},
                                "mrcr_2000": {"documents": [{"seed": 1, "score": 1.0}]}}))
    assert probe_compare.main([str(full), str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"note: {out} holds an unfinished probe" in printed and "| probe | 400 | 2 |" in printed
    assert "| probe | 2000 |" not in printed


def test_by_needles_splits_each_size_by_the_documents_needle_count():
    """Kept counts split the rows; a probe from before they were kept gets them from its seeds."""
    from lab.train import eval_tasks

    tok = K3Tokenizer()
    a = _summary({4000: [0.5, 0.5, 1.0, 1.0]}, {8192: [(8, 3, 0.4), (2, 1, 1.0), (8, 1, 0.0)]})
    b = _summary({4000: [1.0, 1.0, 1.0, 1.0]}, {8192: [(8, 3, 1.0), (2, 1, 1.0), (8, 1, 0.5)]})
    rows = probe_compare.compare(a, b, 0.8, by_needles=True)
    tier = {r["needles"]: r for r in rows if r["where"] == "tier"}
    assert sorted(tier) == [2, 8] and tier[8]["docs"] == 2 and tier[8]["b_minus_a"][0] == pytest.approx(0.55)
    want = [len(eval_tasks.mrcr_needles(eval_tasks.mrcr_row(4000_000 + i, 4000, tok))[0]) for i in range(4)]
    probe_rows = [r for r in rows if r["where"] == "probe"]
    assert {r["needles"]: r["docs"] for r in probe_rows} == {n: want.count(n) for n in set(want)}
    assert [d["needles"] for d in a["mrcr_4000"]["documents"]] == want  # filled in from the seeds
    assert all(r["needles"] is None for r in probe_compare.compare(a, b, 0.8))  # one row a size without it
