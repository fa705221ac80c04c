"""lm-eval's sample logs as they go into the bundle: no prompt text, and a size cap.

A logged sample keeps lm-eval's fields except the prompt: ``doc`` becomes its sha256 (the
document holds the prompt), each request's context in ``arguments`` becomes its sha256 (the
generation kwargs stay), every other string is cut to ``MAX_FIELD_CHARS``. A file stops at
``MAX_FILE_BYTES``; its last line then says how many samples were left out. Digests, not text:
an MRCR document is up to 32k tokens per sample, and the bundle must stay small enough to attach
to a pull request; the documents are reproducible from the spec's seed (or the named data).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

MAX_FIELD_CHARS = 2000
MAX_FILE_BYTES = 256 << 10


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _cap(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= MAX_FIELD_CHARS else value[:MAX_FIELD_CHARS] + f"…[{len(value)} chars]"
    if isinstance(value, (list, tuple)):
        return [_cap(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _cap(v) for k, v in value.items()}
    return value if isinstance(value, (int, float, bool)) or value is None else str(value)


def redact(sample: dict) -> dict:
    """One logged sample without its prompt text (digests instead), strings capped."""
    out = {k: _cap(v) for k, v in sample.items() if k not in ("doc", "arguments")}
    out["doc_sha256"] = sha256_text(json.dumps(sample.get("doc"), sort_keys=True, ensure_ascii=False, default=str))
    out["arguments"] = [[sha256_text(str(args[0])), _cap(list(args[1:]))] for args in sample.get("arguments", [])]
    return out


def write(path: Path, samples: list[dict]) -> dict:
    """Write the redacted samples as JSONL, up to MAX_FILE_BYTES; returns {written, left_out, bytes}."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines, size = [], 0
    for sample in samples:
        line = json.dumps(redact(sample), sort_keys=True, ensure_ascii=False) + "\n"
        if size + len(line.encode("utf-8")) > MAX_FILE_BYTES:
            break
        lines.append(line)
        size += len(line.encode("utf-8"))
    left = len(samples) - len(lines)
    if left:
        lines.append(json.dumps({"left_out": left, "reason": f"file capped at {MAX_FILE_BYTES} bytes"}) + "\n")
    path.write_text("".join(lines), encoding="utf-8")
    return {"written": len(samples) - left, "left_out": left, "bytes": sum(len(x.encode("utf-8")) for x in lines)}
