"""A short training trial on the CPU: does a config learn a skill from a data mix, and after how
many tokens, before an H200 run is spent on the full recipe?

    python3 -m lab.train.cpu_trial --config tiny --kinds copy=1 --row 512 --tokens-per-step 2048 \
        --steps 2500 --lr 3e-3 --out /tmp/trial

One row length (``--row``), the mix's kinds and loss shares (``--shares``: others than Mix's;
``--no-shares``: every graded token weighs 1, as runs 1 and 2 did), a constant learning rate
after 50 warm-up steps (no schedule: a trial asks when a skill appears, not where a run ends);
``--copy-steps N`` starts with N steps of copy tasks alone, as a run starts; ``--init-from DIR``
fine-tunes a state's weights (a GPU run's) instead of fresh ones, ``--aime-style`` picks the
AIME solutions' style. Prints loop.py's log line every 10 steps (per-kind loss of the graded
tokens) and writes ``train-log.jsonl`` and the state to ``--out``; ``python3 -m
lab.train.export OUT W.safetensors`` then ``lab.train.probe W.safetensors`` judges the trial's
generations. What the trials of sessions 23-25 showed is in docs/k3-mini.md ("Copying appears
after a few million tokens", "Run 3, first segment").
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> int:
    from lab.train.eval_tasks import STYLES
    from lab.train.mix import parse_kinds, parse_lengths, parse_needles

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tiny", help="tiny (~5k tokens/s on 2 cores) or trained (~1k tokens/s)")
    ap.add_argument("--kinds", default="copy=1", help="KIND=WEIGHT,... (row kinds and their probabilities)")
    ap.add_argument("--row", type=int, default=512, help="tokens a row")
    ap.add_argument("--lengths", default=None,
                    help="ROW=SHARE,... row lengths and their shares of the tokens (instead of --row); a row "
                         "longer than --tokens-per-step is one row a step")
    ap.add_argument("--tokens-per-step", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=2500)
    ap.add_argument("--copy-steps", type=int, default=0,
                    help="steps of copy tasks alone before --kinds (as Mix.copy_steps starts a run)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--shares", default=None, help="KIND=SHARE,... of the graded loss (default: Mix.loss_shares)")
    ap.add_argument("--no-shares", action="store_true", help="weigh every graded token 1 (no Mix.loss_shares)")
    ap.add_argument("--aime-style", default="numbered", choices=STYLES, help="the AIME solutions' style")
    ap.add_argument("--copy-ordinal", type=float, default=0.0,
                    help="the share of copy tasks that ask for a text by its place (Mix.copy_ordinal)")
    ap.add_argument("--mrcr-choice-weight", type=float, default=1.0,
                    help="the weight of an MRCR answer's first tokens after its random string (Mix.mrcr_choice_weight)")
    ap.add_argument("--mrcr-needles", default=None,
                    help="NEEDLES=WEIGHT,... the needle counts of MRCR rows and their probabilities (Mix.mrcr_needles)")
    ap.add_argument("--init-from", default=None,
                    help="a state folder whose weights the trial starts from (a fine-tune; its optimizer is fresh)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    kinds = parse_kinds(args.kinds)
    lengths = parse_lengths(args.lengths) if args.lengths else ((args.row, 1.0),)
    shares = {}
    if args.no_shares or args.shares:
        shares = {"loss_shares": None if args.no_shares else parse_kinds(args.shares, "--shares")}

    import torch

    from lab.train.loop import TrainConfig, train
    from lab.train.mix import Mix

    torch.set_num_threads(args.threads)
    mix = Mix(tokens_per_step=args.tokens_per_step, short_steps=0, copy_steps=args.copy_steps,
              lengths=lengths, kinds=kinds, aime_style=args.aime_style,
              copy_ordinal=args.copy_ordinal, mrcr_choice_weight=args.mrcr_choice_weight,
              mrcr_needles=None if args.mrcr_needles is None else parse_needles(args.mrcr_needles), **shares)
    tc = TrainConfig(config=args.config, lr=args.lr, warmup_steps=50, min_lr_frac=1.0, total_train_s=1.0,
                     save_every_s=600.0, mix=mix)
    t0 = time.monotonic()
    last = train(tc, device="cpu", out_dir=args.out, deadline=float("inf"), workers=1, compute_dtype=torch.float32,
                 max_steps=args.steps, say=lambda s: print(s, flush=True), init_from=args.init_from)
    print(f"cpu_trial: {last['step']} steps in {time.monotonic() - t0:.0f} s; state in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
