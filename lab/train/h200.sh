#!/usr/bin/env bash
# One training run of the `trained` config on the H200, inside one 10-minute command:
#   bash lab/train/h200.sh                 # the first run (fresh weights)
#   bash lab/train/h200.sh .train/run1     # a later run, from the state the previous one returned
#   bash lab/train/h200.sh .train/run3 --aime-style listed   # further arguments go to lab.train.run
#   bash lab/train/h200.sh .train/run3 --total-train-s 1380  # a longer schedule from the state's step on
#   bash lab/train/h200.sh --init-from optimized_model/k3/checkpoints/trained.safetensors --lr 2e-4
#                                      # a fine-tune of the committed weights (when their state is gone)
# Carry `.whl` (fla-core 0.6.0, for chunk_kda's forward and backward) and, for a later run, the
# folder holding the previous run's state-*.safetensors and train-log.jsonl (e.g. `.train`).
# $OUT gets state-00..03.safetensors (53 MiB), train-log.jsonl, autotune.tar.gz, probe.json and
# logs.tar.gz: 8 files, the most a command returns (a ninth would be left out).
# lab/train/run.py stops itself inside --budget, so the state is saved before the step's limit;
# then the probe (lab/train/probe.py) says what the weights can do on the tasks, not only the loss,
# and scores the full tier's eval documents (probe.json's "eval_documents": the figures a
# checkpoint is adopted by). The state stays on the machine as ~/last-run, so the next call,
# within the machine's idle release, resumes without carrying it: bash lab/train/h200.sh ~/last-run
# TRAIN_S (default 480) is the training step's budget: a call of less than 600 s (the session's
# device time running out) trains TRAIN_S = the call's limit - 120 s and still probes and keeps.
set -u
resume=
if [ -n "${1:-}" ] && [ "${1#--}" = "$1" ]; then resume=$1; shift; fi
train_s=${TRAIN_S:-480}
exec bash lab/gpu_steps.sh \
  "train:$((train_s + 15)):python3 -m lab.train.run --budget $train_s --out \$OUT${resume:+ --resume $resume}${*:+ $*}" \
  "probe:90:python3 -m lab.train.export \$OUT /tmp/probe.safetensors && python3 -m lab.train.probe /tmp/probe.safetensors --device cuda --mrcr-tokens 400,2000,8000 --with-eval-documents full --out \$OUT/probe.json" \
  "keep:10:rm -rf ~/last-run && mkdir -p ~/last-run && cp \$OUT/state-*.safetensors \$OUT/train-log.jsonl \$OUT/autotune.tar.gz ~/last-run/"
