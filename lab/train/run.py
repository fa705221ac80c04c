"""One training run, time-boxed: ``python3 -m lab.train.run --budget 560 --out $OUT [--resume DIR]``.

The whole command (imports, the self-check, the data workers, training, the final save) ends
inside ``--budget`` seconds; the state shards (checkpoint.py) and ``train-log.jsonl`` are in
``--out`` at the end (and every ``--save-every`` seconds on the way). ``--resume DIR`` continues
from the files a previous run returned; ``--init-from`` fine-tunes weights whose state is gone
(the committed checkpoint). The first run sets the schedule (``--total-train-s``:
the training seconds every run together will have) and the data mix; a resumed run keeps them,
except what ``--aime-style``, ``--copy-ordinal``, ``--loss-shares``, ``--mrcr-needles``,
``--lengths``, ``--short-steps`` and ``--total-train-s`` change from its step on.
On the GPU, Triton's autotuning results travel too (``autotune.tar.gz``, autotune_cache.py).
lab/train/h200.sh runs this on the H200.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

from lab.train import autotune_cache, eval_tasks

START = time.monotonic()


def _moe_backend_probe(device: str) -> str:
    """The grouped-matmul MoE where its backward runs here, else the per-expert loop."""
    import torch

    from lab.train.trainable import TrainableK3
    from optimized_model.k3.config import get_config

    if device != "cuda":
        return "loop"
    try:
        m = TrainableK3.create(get_config("trained"), device=device, moe_backend="grouped")
        tokens = torch.randint(0, 256, (2, 64), device=device)
        loss, _ = m.loss(tokens, torch.full((2,), 64), torch.ones(2, 64))
        loss.backward()
        return "grouped"
    except Exception as exc:  # e.g. no backward for torch._grouped_mm in this build
        print(f"grouped MoE backward unavailable here ({type(exc).__name__}: {str(exc)[:200]}); using the loop")
        return "loop"


def _fit_tokens_per_step(mix, config: str, device: str, moe: str):
    """A fresh run's tokens per step, halved until a step at the longest rows fits the GPU."""
    import torch

    from lab.train.mix import make_batch
    from lab.train.trainable import TrainableK3
    from optimized_model.k3.config import get_config

    if device != "cuda":
        return mix
    longest = max(T for T, _ in mix.lengths)
    while mix.tokens_per_step > longest:
        m = TrainableK3.create(get_config(config), device=device, moe_backend=moe)
        b = make_batch(dataclasses.replace(mix, lengths=((longest, 1.0),), short_steps=0, copy_steps=0), 0)
        try:
            loss, _ = m.loss(b.tokens, b.lengths, b.weights)
            loss.backward()
            print(f"memory probe: {mix.tokens_per_step} tokens per step peak "
                  f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
            return mix
        except torch.cuda.OutOfMemoryError:
            mix = dataclasses.replace(mix, tokens_per_step=mix.tokens_per_step // 2)
            print(f"memory probe: out of memory; {mix.tokens_per_step} tokens per step", flush=True)
        finally:
            del m
            torch.cuda.empty_cache()
    return mix


def _carry_autotuning(action, verb: str) -> None:
    """Autotuning results are a time saving only: a failure to carry them never stops training."""
    try:
        print(f"autotune cache: {verb} {action()} results", flush=True)
    except Exception as exc:
        print(f"autotune cache: not {verb} ({type(exc).__name__}: {str(exc)[:200]}); Triton autotunes afresh",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=560.0, help="seconds for the whole command")
    ap.add_argument("--out", default=os.environ.get("OUT", "out/train"))
    ap.add_argument("--resume", default=None, help="folder holding a previous run's state-*.safetensors")
    ap.add_argument("--init-from", default=None,
                    help="a fine-tune: a fresh run (step 0, a fresh optimizer, no curriculum) from the weights "
                         "of a state folder or of the engine's weights file (the committed checkpoint)")
    ap.add_argument("--config", default="trained")
    ap.add_argument("--device", default=None, help="cuda (default where there is one) or cpu")
    ap.add_argument("--total-train-s", type=float, default=None,
                    help="the schedule's training seconds over every run (default 900 for a fresh run); on "
                         "--resume a new length from the state's step on")
    ap.add_argument("--tokens-per-step", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--workers", type=int, default=None, help="data processes (default: cores - 2)")
    ap.add_argument("--save-every", type=float, default=150.0)
    ap.add_argument("--aime-style", default=None, choices=eval_tasks.STYLES,
                    help="the AIME solutions' style (default: Mix's for a fresh run, the state's for a resumed "
                         "one); on --resume it changes the data from the state's step on")
    ap.add_argument("--copy-ordinal", type=float, default=None,
                    help="the share of copy tasks that ask for a text by its place (Mix.copy_ordinal); on "
                         "--resume it changes the data from the state's step on")
    ap.add_argument("--mrcr-choice-weight", type=float, default=None,
                    help="the weight of an MRCR answer's first tokens after its random string (which message it "
                         "copies) relative to its others (Mix.mrcr_choice_weight); on --resume from the state's step on")
    ap.add_argument("--mrcr-needles", default=None,
                    help="NEEDLES=WEIGHT,... the needle counts of MRCR rows and their probabilities (Mix.mrcr_needles; "
                         "default: the spec's counts alike); on --resume from the state's step on")
    ap.add_argument("--lengths", default=None,
                    help="TOKENS=SHARE,... the row lengths after the curriculum and their shares of the tokens "
                         "(Mix.lengths); on --resume from the state's step on")
    ap.add_argument("--short-steps", type=int, default=None,
                    help="the curriculum's steps of short rows (Mix.short_steps, default 1500); on --resume "
                         "from the state's step on")
    ap.add_argument("--loss-shares", default=None,
                    help="KIND=SHARE,... of the graded loss (Mix.loss_shares); on --resume from the state's step on")
    ap.add_argument("--moe-backend", choices=("grouped", "loop", "auto"), default="auto")
    ap.add_argument("--autotune", default=None,
                    help="an autotune.tar.gz to restore before the first step (default: the --resume folder's, "
                         "else the committed lab/train/autotune-sm90.tar.gz); results whose key does not "
                         "match (another Triton, GPU or kernel) are ignored and autotuned afresh")
    args = ap.parse_args(argv)
    if args.resume and args.init_from:
        raise SystemExit("--resume and --init-from exclude each other: --resume continues a state (its optimizer, "
                         "step and schedule), --init-from starts a fine-tune from weights")
    autotune_cache.enable()  # before torch/triton are imported

    import torch

    from lab.train.loop import TrainConfig, train
    from lab.train.mix import Mix, parse_kinds, parse_lengths, parse_needles

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    mix = Mix() if args.tokens_per_step is None else Mix(tokens_per_step=args.tokens_per_step)
    changes = {k: v for k, v in (("aime_style", args.aime_style), ("copy_ordinal", args.copy_ordinal),
                                 ("mrcr_choice_weight", args.mrcr_choice_weight),
                                 ("mrcr_needles", None if args.mrcr_needles is None else parse_needles(args.mrcr_needles)),
                                 ("lengths", None if args.lengths is None else parse_lengths(args.lengths)),
                                 ("short_steps", args.short_steps),
                                 ("loss_shares", None if args.loss_shares is None
                                                 else parse_kinds(args.loss_shares, "--loss-shares")))
               if v is not None}
    if not args.resume:  # a fresh run's mix is its own; a resumed one keeps the state's but these
        mix, changes = dataclasses.replace(mix, **changes), {}
    if args.init_from:  # trained weights skip the curriculum that forms copying and retrieval (unless asked)
        mix = dataclasses.replace(mix, short_steps=args.short_steps or 0, copy_steps=0)
    tc = TrainConfig(config=args.config, total_train_s=args.total_train_s or TrainConfig.total_train_s,
                     save_every_s=args.save_every, mix=mix)
    if args.lr is not None:
        tc.lr = args.lr
    archive = autotune_cache.archive_to_restore(args.autotune, args.resume)
    if device == "cuda":
        _carry_autotuning(lambda: autotune_cache.unpack(archive, autotune_cache.cache_dir()), "restored")
    # each set-up piece is timed: on a fresh machine they compile fla's kernels, and a fresh run
    # on the H100 spent 284 s of its 300 before the first step (docs/k3-mini.md)
    t = time.monotonic()
    moe = _moe_backend_probe(device) if args.moe_backend == "auto" else args.moe_backend
    print(f"set-up: moe backend {moe} ({time.monotonic() - t:.0f} s)", flush=True)
    if not args.resume:
        t = time.monotonic()
        tc.mix = _fit_tokens_per_step(tc.mix, tc.config, device, moe)
        print(f"set-up: memory probe {time.monotonic() - t:.0f} s", flush=True)
    workers = args.workers if args.workers is not None else max(1, (os.cpu_count() or 4) - 2)
    deadline = START + args.budget
    print(f"train: device {device}, moe {moe}, workers {workers}, {deadline - time.monotonic():.0f} s left, "
          f"out {args.out}, resume {args.resume}", flush=True)
    last = train(tc, device=device, out_dir=args.out, deadline=deadline, resume=args.resume, workers=workers,
                 compute_dtype=torch.bfloat16 if device == "cuda" else torch.float32,
                 moe_backend=moe, say=lambda s: print(s, flush=True),
                 mix_changes=changes or None, schedule_s=args.total_train_s if args.resume else None,
                 init_from=args.init_from)
    if device == "cuda":
        _carry_autotuning(lambda: autotune_cache.pack(autotune_cache.cache_dir(),
                                                      Path(args.out) / autotune_cache.ARCHIVE), "packed")
    print(f"train: done at step {last['step']}, {time.monotonic() - START:.0f} s after start", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
