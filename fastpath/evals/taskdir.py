"""Lay out the eval tasks for lm-eval's TaskManager, offline.

The task YAMLs ship inside fastpath (package data). fastpath_aime25.yaml ``include:``s
lm-eval's own aime25 YAML by a path relative to itself (``lm_eval_tasks/aime/aime25.yaml``),
and an include can only name a file, so the YAMLs are copied into a run directory beside a
link ``lm_eval_tasks`` to the installed lm-eval's task folder. TaskManager indexes that
directory alone (``include_defaults=False``: lm-eval's ~10k built-in YAMLs are never scanned),
and the tasks' ``custom_dataset`` loaders read the run's JSONL files named in its metadata.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from fastpath.evals import require_lm_eval

TASKS_DIR = Path(__file__).parent / "tasks"
TASK_NAMES = {"mrcr": "fastpath_mrcr", "aime25": "fastpath_aime25"}  # spec key -> lm-eval task


def lay_out(run_dir: Path) -> Path:
    """Copy the task YAMLs into ``run_dir/tasks`` beside the ``lm_eval_tasks`` link; returns it."""
    require_lm_eval()
    import lm_eval.tasks

    out = Path(run_dir) / "tasks"
    out.mkdir(parents=True, exist_ok=True)
    for yaml in sorted(TASKS_DIR.glob("*.yaml")):
        shutil.copyfile(yaml, out / yaml.name)
    link = out / "lm_eval_tasks"
    if not link.is_symlink():
        os.symlink(Path(lm_eval.tasks.__file__).parent, link, target_is_directory=True)
    return out


def task_manager(tasks_dir: Path, data_files: dict[str, Path]) -> Any:
    """lm-eval's TaskManager over the laid-out tasks only; ``data_files`` = {spec task: JSONL}."""
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    meta = {f"{key}_data": str(path) for key, path in data_files.items()}
    return TaskManager(include_path=str(tasks_dir), include_defaults=False, metadata=meta)
