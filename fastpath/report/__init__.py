"""The reviewer's report: one self-contained, deterministic ``report.html`` per bundle.

``render(bundle_dir)`` draws the page from the bundle's own files only, so the same bundle and
fastpath version always give the same bytes: `verify` writes it into the bundle (listed in the
manifest, so the signature covers it), and `fastpath report` / `fastpath check --report`
re-render it from a bundle. The page makes no network request: inline CSS, inline SVG charts,
one inline script allowed by its hash, and a Content-Security-Policy whose default is 'none'.
Bundle content is hostile input: the template autoescapes every value.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import jinja2

from fastpath.report import sections
from fastpath.report.view import BundleView, cap

REPORT = "report.html"
TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
SCRIPT = (TEMPLATES / "sort.js").read_text(encoding="utf-8")


def _hash(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode("utf-8")).digest()).decode("ascii") + "'"


# No source may be fetched: default 'none' covers images, fonts, frames, connections, media,
# workers and manifests; styles are inline (matplotlib's SVG carries style attributes), the one
# script is allowed by its hash, and forms and <base> can point nowhere.
CSP = (f"default-src 'none'; script-src {_hash(SCRIPT)}; style-src 'unsafe-inline'; "
       "base-uri 'none'; form-action 'none'")

NAV = (("gates", "verdict & gates"), ("scope", "scope & coverage"), ("kernels", "kernels"), ("parity", "parity"),
       ("evals", "evals"), ("features", "features"), ("perf", "perf"), ("environment", "environment"),
       ("reproduce", "reproduce"), ("rows", "all rows"))


def environment(autoescape: bool = True) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=autoescape,
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def context(bundle_dir: Path, checked: dict | None = None, name: str | None = None) -> dict[str, Any]:
    """Everything the template shows, computed from the bundle directory."""
    from fastpath import __version__

    view = BundleView(Path(bundle_dir))
    name = name or Path(bundle_dir).name
    states = sections.suite_states(view)
    ran = {s["name"]: s["ran"] for s in states}
    suites_with_rows = sorted({str(r.get("suite")) for r in view.records()})
    others = [n for n in suites_with_rows if n not in sections.KNOWN_SUITES]
    ctx = {
        "v": sections.verdict(view), "suites": states, "suite_ran": ran, "scope": sections.scope(view),
        "coverage": sections.coverage(view), "kernels": sections.kernels(view), "parity": sections.parity(view),
        "evals": sections.evals(view), "features": sections.suite_rows(view, "features"),
        "perf": sections.perf_section(view), "env": sections.environment(view),
        "other_suites": [(cap(n, 100), sections.suite_rows(view, n)) for n in others],
        "all_rows": [(cap(n, 100), sections.suite_rows(view, n)) for n in suites_with_rows],
        "commands": sections.reproduce(view, name), "bundle_name": cap(name, 300),
        "checked": checked, "nav": NAV, "version": __version__,
    }
    ctx["problems"] = sorted(set(view.problems))
    return ctx


def render(bundle_dir: Path, checked: dict | None = None, name: str | None = None) -> str:
    """The report page of a bundle directory. ``checked``: `fastpath check`'s outcome to show
    on top ({"passed", "line", "failures": [{"rule", "reason"}]}), when the page is re-rendered
    by the checker. ``name``: the bundle's name (default: the directory's; a staged bundle's
    temp directory passes its final name)."""
    ctx = context(bundle_dir, checked, name)
    page = environment().get_template("report.html.j2")
    return page.render(**_mark_safe(ctx), csp=CSP, script=jinja2.utils.markupsafe.Markup(SCRIPT))


def _mark_safe(ctx: dict) -> dict:
    """Chart SVGs are produced by matplotlib here (labels sanitised), not taken from the bundle:
    they alone go into the page unescaped."""
    from markupsafe import Markup

    kernels = dict(ctx["kernels"], chart=Markup(ctx["kernels"]["chart"]))
    perf = dict(ctx["perf"])
    if perf.get("present"):
        perf["heatmaps"] = [Markup(h) for h in perf["heatmaps"]]
        perf["roofline"] = Markup(perf["roofline"])
    return {**ctx, "kernels": kernels, "perf": perf}


def unavailable_page(reason: str) -> str:
    """The page a bundle carries when its report could not be drawn (a renderer fault)."""
    from markupsafe import escape

    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}"><title>fastpath report unavailable</title>'
            f"</head><body><p>The report could not be rendered: {escape(cap(reason, 2000))}.</p>"
            "<p>Re-render it with <code>fastpath report BUNDLE</code>.</p></body></html>\n")
