"""`fastpath report BUNDLE`: re-render the report of a bundle (archive or directory).

The bundle is opened as `check` opens it (fastpath.safe_tar: hostile input), the page is drawn
from its files, written to ``out`` (never into the bundle: that would change signed content),
and compared with the report.html the bundle carries.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fastpath.report import REPORT, render

SAME, DIFFERENT, ABSENT = "same", "different", "absent"


@dataclass
class Rerendered:
    out: Path
    bundled: str  # SAME | DIFFERENT | ABSENT: the bundle's own report.html vs this page

    def message(self) -> str:
        return {SAME: "identical to the report.html inside the bundle",
                DIFFERENT: "differs from the report.html inside the bundle (another fastpath version drew that "
                           "one, or it was edited): read this one, drawn from the bundle's rows",
                ABSENT: "the bundle carries no report.html (made before reports existed)"}[self.bundled]


def default_out(bundle: Path) -> Path:
    name = Path(bundle).name.removesuffix(".tar.gz")
    return Path.cwd() / f"{name}.report.html"


def compare(bundle_dir: Path, page: str) -> str:
    own = Path(bundle_dir) / REPORT
    if not own.is_file() or own.is_symlink():
        return ABSENT
    return SAME if own.read_bytes() == page.encode("utf-8") else DIFFERENT


def write_page(page: str, out: Path) -> None:
    """Atomic write: a reader never sees half a page."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def rerender(bundle: Path, out: Path | None = None) -> Rerendered:
    """Open ``bundle`` safely, draw its report, write it to ``out``. Raises UnsafeBundle."""
    from fastpath.safe_tar import open_bundle

    out = Path(out) if out else default_out(bundle)
    with open_bundle(Path(bundle)) as d:
        page = render(d)
        state = compare(d, page)
    write_page(page, out)
    return Rerendered(out, state)
