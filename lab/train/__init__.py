"""Training the ``trained`` K3 config on the repository's synthetic tasks (not product).

    python3 -m lab.train.run --budget 560 --out $OUT [--resume DIR]   # one GPU run (lab/train/h200.sh)

Modules, one job each: ``trainable`` (the standard path made differentiable, fp32 master
weights), ``balance`` (router bias updates), ``checkpoint`` (sharded safetensors state, resume,
the bf16 export), ``eval_tasks`` (the one place that knows how the eval tasks render their
documents and which are held out; MRCR and AIME documents come from the evals suite's generators
in ``fastpath/evals``), ``json_tasks`` (the JSON generator), ``mix`` (rows and batches from seeds), ``loop`` (the time-boxed training loop), ``run`` (the command line),
``throughput`` (the CPU micro-benchmark behind the H200 estimate in docs/k3-mini.md).
Nothing outside lab/ imports this package.
"""

from lab.train import configs as _configs

_configs.register()  # the lab's configs resolve by name in every lab.train process (configs.py says why)
