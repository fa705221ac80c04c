"""The evals run offline: lm-eval loads the tasks and their local documents and evaluates them
with the network unreachable (a fresh network namespace: no interface at all), an empty Hugging
Face cache and none of its offline switches set."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("lm_eval")

SCRIPT = textwrap.dedent("""
    import json, socket, sys, tempfile
    from pathlib import Path
    try:
        socket.create_connection(("1.1.1.1", 443), timeout=2)
        sys.exit("the network is reachable: this test proves nothing here")
    except OSError:
        pass
    from fastpath.engine import create_engine
    from fastpath.evals import aime, data, mrcr, run, taskdir
    model = create_engine("embedded", config="tiny", device="cpu", dtype="float32", threads=1).load("standard")
    count = lambda m: len(model.tokenizer.apply_chat_template(m))
    work = Path(tempfile.mkdtemp())
    files = {"mrcr": data.write_jsonl(work / "m.jsonl", mrcr.generate(0, [512], 2, count, max_gen_toks=2)),
             "aime25": data.write_jsonl(work / "a.jsonl", aime.generate(0, 2, 3))}
    settings = {"mrcr": {"repeats": 1, "max_gen_toks": 2}, "aime25": {"repeats": 1, "max_gen_toks": 2}}
    r = run.evaluate_path("standard", model, taskdir.lay_out(work), files, settings, max_batch=4,
                          max_prefill_tokens=None, seed=0)
    print(json.dumps({n: len(t.samples) for n, t in r.tasks.items()}))
""")


def _unshare() -> list[str] | None:
    if shutil.which("unshare") is None:
        return None
    flags = ["-n"] if os.geteuid() == 0 else ["-r", "-n"]
    ok = subprocess.run(["unshare", *flags, "true"], capture_output=True).returncode == 0
    return ["unshare", *flags] if ok else None


def test_lm_eval_runs_both_tasks_with_the_network_unreachable(tmp_path):
    prefix = _unshare()
    if prefix is None:
        pytest.skip("needs `unshare -n` (root or unprivileged user namespaces) to cut the network off")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_", "HUGGINGFACE"))}
    env["HF_HOME"] = str(tmp_path / "hf-home")  # empty: nothing cached to fall back on
    proc = subprocess.run([*prefix, sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"fastpath_mrcr": 2, "fastpath_aime25": 2}
