"""The time-boxed training loop: AdamW on the fp32 masters, the router biases moved after each
step, a learning-rate schedule over *training seconds* (warm-up by steps, then cosine to
``min_lr_frac``), so the plan holds whatever the H200's real throughput turns out to be. The run
stops itself before ``deadline`` with its state saved (checkpoint.py), and saves every
``save_every_s`` on the way, so a machine lost mid-run costs at most that much.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from lab.train import balance, checkpoint
from lab.train.mix import KINDS, Mix, make_batch
from lab.train.trainable import TrainableK3, no_decay
from optimized_model.k3.config import get_config

LOG_NAME = "train-log.jsonl"


@dataclass
class TrainConfig:
    config: str = "trained"
    lr: float = 2e-3
    min_lr_frac: float = 0.1
    warmup_steps: int = 100
    total_train_s: float = 900.0  # the schedule's length, summed over every run
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float = 1.0
    bias_rate: float = 1e-3
    log_every: int = 10
    save_every_s: float = 150.0
    init_seed: int = 0
    mix: Mix = field(default_factory=Mix)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "TrainConfig":
        d = dict(d)
        mix = d.pop("mix")
        mix.setdefault("aime_style", "lines")  # a state saved before the styles trained on "lines"
        mix.setdefault("loss_shares", None)  # and one saved before the shares weighed each graded token 1
        mix.setdefault("copy_steps", 0)  # and one saved before the copy-first steps had none
        mix.setdefault("copy_ordinal", 0.0)  # and one saved before the ordinal copy tasks had none
        mix = Mix(**{k: tuple(tuple(x) for x in v) if isinstance(v, list) else v for k, v in mix.items()})
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}, mix=mix)


def lr_at(tc: TrainConfig, step: int, trained_s: float) -> float:
    warm = min(1.0, (step + 1) / max(1, tc.warmup_steps))
    progress = min(1.0, trained_s / max(1e-9, tc.total_train_s))
    cos = tc.min_lr_frac + (1 - tc.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress))
    return tc.lr * warm * cos


def make_optimizer(model: TrainableK3, tc: TrainConfig) -> torch.optim.AdamW:
    params = model.trainable_parameters()
    decay = [p for n, p in params.items() if not no_decay(n) and p.dim() >= 2]
    rest = [p for n, p in params.items() if no_decay(n) or p.dim() < 2]
    fused = model.device.type == "cuda"
    return torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=tc.lr, betas=tc.betas, fused=fused or None)


class _Batches:
    """Batches of the coming steps, made ahead by a pool of processes (or inline: workers=0).

    A batch is a pure function of (mix, step), so when the pool stops answering (run 3's pool lost
    its result thread near the end and then failed to terminate) the rest are made inline, the same
    batches, only slower."""

    def __init__(self, mix: Mix, start: int, workers: int, ahead: int = 8, wait_s: float = 120.0,
                 say: Callable[[str], None] = print):
        from optimized_model.k3.tokenizer import K3Tokenizer

        self.mix, self.next_step, self.tok = mix, start, K3Tokenizer()
        self.wait_s, self.say = wait_s, say
        self.pool = None
        self.queue: deque = deque()
        if workers > 0:
            import multiprocessing as mp

            self.pool = mp.get_context("spawn").Pool(workers)
            for _ in range(ahead):
                self._submit()

    def _submit(self) -> None:
        self.queue.append(self.pool.apply_async(make_batch, (self.mix, self.next_step + len(self.queue), None)))

    def next(self):
        step = self.next_step
        batch = None
        if self.pool is not None:
            try:
                batch = self.queue.popleft().get(timeout=self.wait_s)
                self._submit()
            except Exception as exc:  # a timeout or a worker's error: the pool is not trusted again
                self.say(f"data workers failed at step {step} ({type(exc).__name__}: {str(exc)[:200]}); "
                         "making the remaining batches inline")
                self.close()
        if batch is None:
            batch = make_batch(self.mix, step, self.tok)
        self.next_step += 1
        return batch

    def close(self) -> None:
        """Stop the workers; a pool that cannot stop cleanly is only reported (the state is saved first)."""
        pool, self.pool = self.pool, None
        self.queue.clear()
        if pool is not None:
            try:
                pool.terminate()
            except Exception as exc:
                self.say(f"note: the data workers did not stop cleanly ({type(exc).__name__}: {str(exc)[:200]})")


def train(tc: TrainConfig, *, device: str, out_dir: str | Path, deadline: float, resume: str | Path | None = None,
          workers: int = 0, compute_dtype=torch.bfloat16, kda_backend: str | None = None,
          moe_backend: str | None = None, say: Callable[[str], None] = print, max_steps: int | None = None,
          mix_changes: dict | None = None, init_from: str | Path | None = None,
          schedule_s: float | None = None) -> dict:
    """Train until ``deadline`` (time.monotonic()) or step ``max_steps``; returns the last log record.
    ``mix_changes`` (e.g. ``{"aime_style": "listed"}``) change a resumed run's data from its step on;
    the state and the run's record keep them. ``init_from`` starts a fresh run (step 0, a fresh
    optimizer) from the weights and router biases of a state folder or an exported weights file:
    a fine-tune. ``schedule_s`` gives a
    resumed run's schedule a new length (total_train_s), from its step on: a longer one raises the
    learning rate again (lr_at)."""
    out_dir = Path(out_dir)
    saved = checkpoint.load_state(resume) if resume else None
    if saved and saved[1]["train_config"] != json.loads(json.dumps(tc.to_json())):
        # before the model is built: a state of another config (e.g. trained_mla8) sizes its weights
        say("note: resuming with the training config the state was saved with")
        tc = TrainConfig.from_json(saved[1]["train_config"])
    cfg = get_config(tc.config)
    model = TrainableK3.create(cfg, device=device, compute_dtype=compute_dtype, seed=tc.init_seed,
                               kda_backend=kda_backend, moe_backend=moe_backend)
    opt = make_optimizer(model, tc)
    step, trained_s, history = 0, 0.0, []
    if init_from:
        weights, from_step = checkpoint.load_weights(init_from)
        missing = sorted(set(model.master) - set(weights))
        if missing:
            raise SystemExit(f"{init_from} lacks {len(missing)} of the {tc.config} config's weights "
                             f"({', '.join(missing[:3])}...): pass a state or weights file of that config")
        with torch.no_grad():
            for name, t in model.master.items():
                t.copy_(weights[name])
        say(f"weights from {init_from} (step {from_step}); a fresh optimizer, step 0")
    if saved:
        tensors, meta = saved
        step, trained_s, history = int(meta["step"]), float(meta["trained_s"]), list(meta.get("runs", []))
        checkpoint.restore(model, opt, tensors, step)
        prev_log = Path(resume) / LOG_NAME
        if prev_log.is_file() and prev_log.resolve() != (out_dir / LOG_NAME).resolve():
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / LOG_NAME).write_text(prev_log.read_text())
        say(f"resumed at step {step} after {trained_s:.0f} s of training")
    if mix_changes:
        tc = dataclasses.replace(tc, mix=dataclasses.replace(tc.mix, **mix_changes))
        say(f"note: the data changes from step {step} on: {json.dumps(mix_changes)}")
    if schedule_s is not None and schedule_s != tc.total_train_s:
        say(f"note: the schedule is {schedule_s:.0f} s of training from step {step} on, not {tc.total_train_s:.0f} s")
        tc = dataclasses.replace(tc, total_train_s=schedule_s)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = open(out_dir / LOG_NAME, "a")
    run = {"start_step": step, "device": device, "started": time.time()}
    if init_from:
        run["init_from"] = {"path": str(init_from), "step": from_step}
    if mix_changes:
        run["mix_changes"] = mix_changes
    if schedule_s is not None:
        run["total_train_s"] = tc.total_train_s
    batches = _Batches(tc.mix, step, workers, say=say)
    last_save = time.monotonic()
    step_s: deque = deque(maxlen=20)
    acc = {"loss": 0.0, "n": 0, "kinds": torch.zeros(len(KINDS), 2, dtype=torch.float64), "tokens": 0,
               "time": 0.0}
    record: dict = {}

    def save(final: bool) -> None:
        meta = {"step": step, "trained_s": trained_s, "train_config": tc.to_json(), "config": cfg.name,
                "runs": history + [{**run, "end_step": step, "final": final}]}
        checkpoint.save_state(out_dir, checkpoint.state_tensors(model, opt), meta)

    try:
        while True:
            per_step = (sorted(step_s)[len(step_s) // 2] if step_s else 0.0)
            if time.monotonic() + 2 * per_step + 10 > deadline or max_steps is not None and step >= max_steps:
                break
            t0 = time.monotonic()
            batch = batches.next()
            loss, ce = model.loss(batch.tokens, batch.lengths, batch.weights)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(list(model.trainable_parameters().values()), tc.clip)
            lr = lr_at(tc, step, trained_s)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.step()
            opt.zero_grad(set_to_none=True)
            imbalance = balance.update_router_biases(model, tc.bias_rate)
            # per kind: (sum of cross-entropy, count) over the graded tokens
            graded = batch.graded[:, 1:].to(ce.device)
            kid = batch.kind_ids[:, 1:].to(ce.device).long()
            for k in range(len(KINDS)):
                m = graded & (kid == k)
                acc["kinds"][k, 0] += float(ce[m].sum())
                acc["kinds"][k, 1] += float(m.sum())
            acc["loss"] += float(loss.detach())
            acc["n"] += 1
            acc["tokens"] += int(batch.lengths.sum())
            dt = time.monotonic() - t0
            acc["time"] += dt
            step_s.append(dt)
            step += 1
            trained_s += dt
            if step % tc.log_every == 0 or step == 1:
                kinds = {f"loss_{KINDS[k]}": round(acc["kinds"][k, 0].item() / acc["kinds"][k, 1].item(), 4)
                         for k in range(len(KINDS)) if acc["kinds"][k, 1] > 0}
                record = {"step": step, "loss": round(acc["loss"] / acc["n"], 4), **kinds, "lr": lr,
                          "grad_norm": round(float(gnorm), 3), "T": int(batch.tokens.shape[1]),
                          "tokens_per_s": round(acc["tokens"] / max(1e-9, acc["time"]), 1),
                          "trained_s": round(trained_s, 1), "max_imbalance": round(max(imbalance.values(), default=1.0), 3)}
                log.write(json.dumps(record) + "\n")
                log.flush()
                say(json.dumps(record))
                acc = {"loss": 0.0, "n": 0, "kinds": torch.zeros(len(KINDS), 2, dtype=torch.float64), "tokens": 0,
               "time": 0.0}
            if time.monotonic() - last_save > tc.save_every_s:
                save(final=False)
                last_save = time.monotonic()
        # saved before the workers stop: run 3's pool failed to terminate after its last step and,
        # the final save then coming after it, the run kept only its last periodic save (527 steps)
        save(final=True)
    finally:
        batches.close()
        log.close()
    say(f"saved state at step {step} ({trained_s:.0f} s trained) to {out_dir}")
    return {**record, "step": step, "trained_s": trained_s}
