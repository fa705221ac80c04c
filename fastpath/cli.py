"""The ``fastpath`` command line: plan, verify, keygen, sign, check, digest.

User errors (bad spec, bad arguments, refused signing...) print their cause and fix and exit
2; they never show a Python traceback. Evidence modules are imported lazily so ``fastpath
plan`` works on a machine with only the spec and plan modules.
"""

from __future__ import annotations

import functools
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fastpath.errors import FastpathError

# rich_markup_mode=None: help texts name "[tool.fastpath]", which rich markup would swallow as a tag.
app = typer.Typer(name="fastpath", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Validate a model fast path and produce signed evidence bundles.")


class Tier(str, Enum):
    smoke = "smoke"
    full = "full"


class VerifyTier(str, Enum):
    auto = "auto"
    smoke = "smoke"
    full = "full"


class Format(str, Enum):
    text = "text"
    markdown = "markdown"
    json = "json"


class Freshness(str, Enum):
    enforce = "enforce"
    warn = "warn"


def _version(value: bool) -> None:
    if value:
        from fastpath import __version__

        typer.echo(f"fastpath {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """Validate a model fast path and produce signed evidence bundles."""


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that are the user's to fix (part B's, when importable)."""
    types: list[type[BaseException]] = [FastpathError]
    for module, names in (("fastpath.signing", ("SigningError",)), ("fastpath.digest", ("SourceDigestError",))):
        try:
            mod = __import__(module, fromlist=list(names))
            types += [getattr(mod, n) for n in names if hasattr(mod, n)]
        except ImportError:
            pass
    return tuple(types)


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn user errors into 'error: cause / fix:' and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        err = Console(stderr=True, soft_wrap=True)
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except KeyboardInterrupt:
            err.print("[yellow]interrupted[/]")
            raise typer.Exit(3) from None
        except _user_errors() as exc:
            cause = getattr(exc, "cause", str(exc))
            err.print(f"[bold red]error:[/] {escape(str(cause))}", highlight=False)
            if getattr(exc, "fix", ""):
                err.print(f"  [bold]fix:[/] {escape(exc.fix)}", highlight=False)
            raise typer.Exit(getattr(exc, "exit_code", 2)) from None

    return wrapper


# --------------------------------------------------------------------------- plan

@app.command()
@friendly
def plan(
    spec: Optional[Path] = typer.Argument(None, help="the fastpath.toml (default: [tool.fastpath] default_spec)"),
    tier: Tier = typer.Option(Tier.smoke, "--tier", help="the tier whose matrix to print"),
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON"),
) -> None:
    """Print the case matrix of each suite (and the waivers with their reasons)."""
    from fastpath.plan import build_plan
    from fastpath.spec import load_spec
    from fastpath.verify import default_spec

    tier = tier.value
    the_plan = build_plan(load_spec(spec or default_spec(Path.cwd())), tier)
    if as_json:
        sys.stdout.write(json.dumps(the_plan.to_json(), indent=2) + "\n")
        return
    console = Console()
    for suite in the_plan.suites:
        cases, waivers = the_plan.for_suite(suite)
        table = Table(title=f"{suite}: {len(cases)} cases, {len(waivers)} waived ({tier} tier)", title_justify="left")
        table.add_column("case", no_wrap=True)
        table.add_column("config", overflow="fold")
        table.add_column("waived because", overflow="fold", style="yellow")
        for c in cases:
            table.add_row(c.case_id, escape(_config_text(c.config)), "")
        for w in waivers:
            table.add_row(w.case.case_id, escape(_config_text(w.case.config)), escape(w.reason))
        console.print(table)
    console.print(f"{len(the_plan.cases)} cases, {len(the_plan.waivers)} waivers, spec digest {the_plan.spec_digest[:12]}")


def _config_text(config: dict) -> str:
    """The parameters that apply to a case: no unset ones, and an out-of-scope value only on the
    fallback case that uses it (out_of_scope_batch on batch_out_of_scope, not on prefill)."""
    fallback = str(config.get("fallback") or "")
    shown = {k: v for k, v in config.items() if v is not None
             and not (k.startswith("out_of_scope_") and k.removeprefix("out_of_scope_") not in fallback)}
    return " ".join(f"{k}={v}" for k, v in shown.items())


# --------------------------------------------------------------------------- verify

@app.command()
@friendly
def verify(
    spec: Optional[Path] = typer.Argument(None, help="the fastpath.toml (default: [tool.fastpath] default_spec)"),
    tier: VerifyTier = typer.Option(VerifyTier.auto, "--tier", help="auto: full on a GPU in scope, else smoke"),
    out: Optional[Path] = typer.Option(None, "--out", help="run directory (default: out/NAME-TIER-TIME)"),
    only: Optional[str] = typer.Option(None, "--only", help="run only these suites: SUITE[,SUITE]"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="continue the run in this directory"),
    key: Optional[Path] = typer.Option(None, "--key", help="sign the bundle with this private key"),
    jobs: Optional[int] = typer.Option(None, "--jobs", min=1,
                                       help="suites at once, each in its own process (default: 2 on the "
                                            "CPU tier where there are 2 cores, 1 on the full tier)"),
    suites_dir: Optional[Path] = typer.Option(None, "--suites-dir", hidden=True, help="suites directory (tests)"),
) -> None:
    """Run the suites, evaluate the gates, write the bundle (signed with --key).

    Exit code: 0 pass, 1 fail (also a partial run whose suites so far failed a gate), 2 usage or
    spec error, 3 incomplete (interrupted, or partial and passing so far).
    """
    from fastpath.errors import UsageError
    from fastpath.verify import VerifyOptions, verify as run_verify

    tier = tier.value
    if resume is not None and out is not None and Path(out) != Path(resume):
        raise UsageError("--out and --resume name different directories", "pass only --resume DIR")
    opts = VerifyOptions(spec=spec, tier=tier, out=out, resume=resume, key=key, suites_dir=suites_dir, jobs=jobs,
                         only=[s.strip() for s in only.split(",") if s.strip()] if only else None)
    console = Console()
    result = run_verify(opts, console)
    style = "yellow" if result.exit_code == 3 else ("green" if result.exit_code == 0 else "red")
    console.print(f"[{style}]{result.message}[/]", highlight=False)
    raise typer.Exit(result.exit_code)


# --------------------------------------------------------------------------- keys, signing, check

@app.command()
@friendly
def keygen(
    out: Optional[Path] = typer.Option(None, "--out", help="private key path (default: ~/.config/fastpath/keys/)"),
    pub: Optional[Path] = typer.Option(None, "--pub", help="public key path (default: beside the private key)"),
) -> None:
    """Create an Ed25519 signing key pair (private key 0600, outside the repository by default)."""
    from fastpath.signing import generate_keypair

    from fastpath.signing import load_public_key, public_key_hex

    private, public, kid = generate_keypair(out, pub)
    typer.echo(f"private key: {private}\npublic key:  {public}\nkeyid:       {kid}\n")
    typer.echo("To let CI trust your bundles, add this to bundles/trusted_keys.toml in a change of its own\n"
               "(narrow tiers to [\"smoke\"] for a machine without a GPU in scope):\n")
    typer.echo(f'[[keys]]\nkeyid = "{kid}"\npublic_key = "{public_key_hex(load_public_key(public))}"\n'
               f'owner = "YOUR NAME (machine)"\ntiers = ["smoke", "full"]')


@app.command()
@friendly
def sign(
    bundle: Path = typer.Argument(..., help="the NAME.fastpath directory"),
    key: Path = typer.Option(..., "--key", help="private key from `fastpath keygen`"),
) -> None:
    """Sign a complete bundle (statement.json + DSSE envelope) and re-pack its archive."""
    from fastpath.bundle import ENVELOPE, reseal
    from fastpath.errors import UsageError
    from fastpath.signing import sign_bundle

    if not Path(bundle).is_dir():
        raise UsageError(f"{bundle} is not a bundle directory",
                         "pass the NAME.fastpath/ directory that `fastpath verify` wrote (not the .tar.gz)")
    if not (Path(bundle) / "summary.json").is_file():
        raise UsageError(f"{bundle} has no summary.json: it is not a bundle directory",
                         "pass the NAME.fastpath/ directory inside the --out of a finished `fastpath verify`")
    # Signed and packed in a staged copy: an interrupt leaves the old directory and archive intact.
    archive = reseal(Path(bundle), lambda staged: sign_bundle(staged, Path(key)))
    typer.echo(f"signed: {Path(bundle) / ENVELOPE}\narchive: {archive}")


@app.command()
@friendly
def check(
    bundle: Path = typer.Argument(..., help="NAME.TIER.fastpath.tar.gz or NAME.TIER.fastpath/"),
    source: Path = typer.Option(Path("."), "--source", help="checked-out tree to compare with"),
    spec: Optional[Path] = typer.Option(None, "--spec", help="the tree's spec, relative to --source "
                                        "(default: [tool.fastpath] default_spec of --source's pyproject.toml)"),
    trust: Path = typer.Option(Path("bundles/trusted_keys.toml"), "--trust", help="trust policy"),
    require_tier: Optional[Tier] = typer.Option(None, "--require-tier", help="the least tier the bundle must attest"),
    freshness: Freshness = typer.Option(Freshness.enforce, "--freshness", help="enforce: a stale attested part fails; "
                                        "warn: staleness only warns, plan/gates judged by the bundle's own spec"),
    fmt: Format = typer.Option(Format.text, "--format", help="text for a terminal, markdown for a CI step summary"),
    report_out: Optional[Path] = typer.Option(None, "--report", help="also write the report page re-rendered from "
                                              "the checked bundle, with the check's outcome on top, to this file"),
) -> None:
    """Check a bundle as CI does (hostile input). Exit: 0 pass, 1 fail, 2 usage or unreadable input."""
    from fastpath.check import main_check

    raise typer.Exit(main_check(bundle, trust=trust, source=source, require_tier=require_tier.value if require_tier else None,
                                fmt=fmt.value, spec=spec, freshness=freshness.value, report_out=report_out))


@app.command()
@friendly
def report(
    bundle: Path = typer.Argument(..., help="NAME.TIER.fastpath.tar.gz or NAME.TIER.fastpath/"),
    out: Optional[Path] = typer.Option(None, "--out", help="the page to write (default: ./NAME.TIER.fastpath.report.html)"),
) -> None:
    """Re-render a bundle's report.html from its own files (opened as `check` opens it)."""
    from fastpath.errors import UsageError
    from fastpath.report.rerender import rerender
    from fastpath.safe_tar import UnsafeBundle

    if not Path(bundle).exists():
        raise UsageError(f"no such bundle: {bundle}", "pass a NAME.fastpath.tar.gz or NAME.fastpath/ directory")
    try:
        done = rerender(Path(bundle), out)
    except UnsafeBundle as exc:
        raise UsageError(f"{bundle} cannot be opened safely: {exc}",
                         "pass a bundle that `fastpath verify` wrote; `fastpath check` says what is wrong with it") from None
    typer.echo(f"report: {done.out}\n  {done.message()}")


@app.command()
@friendly
def digest(
    spec: Optional[Path] = typer.Argument(None, help="the spec, relative to --source "
                                          "(default: [tool.fastpath] default_spec of --source's pyproject.toml)"),
    source: Path = typer.Option(Path("."), "--source", help="the tree to digest"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Print the attested digests of the tree for a spec (what a bundle of it must attest)."""
    from fastpath.check import BadInput, declared_spec
    from fastpath.digest import attested_parts
    from fastpath.errors import UsageError
    from fastpath.spec import load_spec

    try:
        spec_path = declared_spec(Path(source), spec)
    except BadInput as exc:
        raise UsageError(str(exc), "pass the spec: fastpath digest path/to/fastpath.toml --source DIR") from None
    the_spec = load_spec(spec_path)
    parts = attested_parts(Path(source), the_spec)
    out = {"spec": parts["spec_path"], "name": the_spec.name,
           "parts": {p: v["digest"] for p, v in parts["parts"].items()}}
    if as_json:
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return
    typer.echo(f"spec {out['spec']} ({out['name']})")
    for part, value in out["parts"].items():
        typer.echo(f"  {part:<11} {value}")


def main() -> None:  # pragma: no cover - console entry point alias
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
