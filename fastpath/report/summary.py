"""`fastpath check --format markdown`: the check's outcome for ``$GITHUB_STEP_SUMMARY``.

Rendered from templates/summary.md.j2 by an environment whose ``finalize`` escapes every value
for markdown (HTML metacharacters, markdown punctuation, autolinks, newlines) and caps it, so
no string from the bundle can add markup, links, images or table cells. The page is kept well
under GitHub's 1 MiB step-summary limit by capping every list it prints.
"""

from __future__ import annotations

import re
from typing import Any

import jinja2
from markupsafe import Markup

from fastpath.report import environment as _html_environment
from fastpath.report.view import cap

MAX_CELL = 300
MAX_REASONS = 20      # reasons of one rule
MAX_PERF_ROWS = 64
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~<>])")


def md_escape(value: Any) -> str:
    """A value as inert markdown text on one line."""
    if isinstance(value, Markup):  # template-made markup (icons, code spans built here)
        return str(value)
    if value is None:
        return ""
    text = cap(value, MAX_CELL).replace("&", "&amp;").replace("\r", " ").replace("\n", " ")
    text = _MD_SPECIAL.sub(lambda m: {"<": "&lt;", ">": "&gt;"}.get(m.group(1), "\\" + m.group(1)), text)
    # Break GitHub's autolinks (scheme://, www., user@host) so no bundle text becomes a link.
    return text.replace("://", "\\://").replace("www.", "www\\.").replace("@", "\\@")


def code(value: Any) -> Markup:
    """A value for inside a `code span`: literal there, so only the span's own delimiters and
    the table's cell separator need care."""
    text = cap(value, MAX_CELL).replace("`", "'").replace("\r", " ").replace("\n", " ").replace("|", "\\|")
    return Markup(text)


def environment() -> jinja2.Environment:
    env = _html_environment(autoescape=False)
    env.finalize = md_escape
    env.trim_blocks = env.lstrip_blocks = True
    env.filters["code"] = code
    return env


def markdown(ctx: dict) -> str:
    text = environment().get_template("summary.md.j2").render(**ctx)
    return re.sub(r"\n{3,}", "\n\n", text)
