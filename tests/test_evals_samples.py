"""lm-eval's sample logs in the bundle carry digests instead of prompts, and stay size-capped;
fastpath imports without lm-eval and the evals name the package and the fix when it is missing."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

from fastpath.evals import samples


def _sample(i: int, prompt: str) -> dict:
    return {"doc_id": i, "doc": {"prompt": prompt, "answer": "ab"}, "target": "ab",
            "arguments": [(prompt, {"max_gen_toks": 3, "until": []})], "resps": [["abc"]],
            "filtered_resps": ["abc"], "mrcr_score": 0.5, "prompt_hash": "x"}


def test_prompts_become_digests_and_other_fields_stay(tmp_path):
    secret = "SECRET-PROMPT-TEXT " * 50
    out = samples.write(tmp_path / "s.jsonl", [_sample(0, secret)])
    text = (tmp_path / "s.jsonl").read_text()
    assert "SECRET-PROMPT-TEXT" not in text and out == {"written": 1, "left_out": 0, "bytes": len(text.encode())}
    row = json.loads(text)
    assert row["arguments"] == [[hashlib.sha256(secret.encode()).hexdigest(), [{"max_gen_toks": 3, "until": []}]]]
    assert row["doc_sha256"] == hashlib.sha256(
        json.dumps({"prompt": secret, "answer": "ab"}, sort_keys=True).encode()).hexdigest()
    assert row["resps"] == [["abc"]] and row["mrcr_score"] == 0.5 and "doc" not in row


def test_files_are_capped_and_say_what_was_left_out(tmp_path):
    many = [_sample(i, "p") | {"resps": [["x" * 5000]]} for i in range(400)]
    out = samples.write(tmp_path / "s.jsonl", many)
    lines = (tmp_path / "s.jsonl").read_text().splitlines()
    assert out["bytes"] <= samples.MAX_FILE_BYTES + 200 and out["left_out"] == 400 - out["written"] > 0
    assert json.loads(lines[-1])["left_out"] == out["left_out"]
    assert all(len(json.loads(x)["resps"][0][0]) < 2100 for x in lines[:-1])  # long strings cut


def test_fastpath_imports_without_lm_eval_and_the_evals_name_the_fix():
    code = ("import sys; sys.modules['lm_eval'] = None\n"  # lm-eval not importable
            "import importlib.util as u; u.find_spec = (lambda f: (lambda n, *a: None if n == 'lm_eval' else f(n, *a)))(u.find_spec)\n"
            "import fastpath, fastpath.spec, fastpath.plan, fastpath.evals, fastpath.evals.mrcr, fastpath.evals.paired\n"
            "try:\n    import fastpath.evals.adapter\nexcept Exception as e:\n    print(type(e).__name__, '|', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    name, _, message = proc.stdout.strip().partition(" | ")
    assert name == "MissingPackage" and "lm-eval" in message and "pip install 'fastpath[evals]'" in message
    assert len(message.splitlines()) == 2  # cause, fix (FastpathError's two lines)
