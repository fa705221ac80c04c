"""lab/launch_log.py: the fast step's Triton launches in order, compared with another commit's."""

from lab import launch_log as L
from sm90_compile import head_tree, run_without_interpreter

LOG = [["fp_gemv_kernel", "(1, 8, 4)", [["tensor", [1, 64], [64, 1], 0, "torch.bfloat16", 128], "16"]],
       ["mla_verify_split_kernel", "(1, 8, 4)", ["0.5"]]]


def test_first_difference_names_the_launch_and_what_parts():
    assert L.first_difference(LOG, [list(x) for x in LOG]) is None
    grid = [LOG[0], ["mla_verify_split_kernel", "(1, 9, 4)", ["0.5"]]]
    assert L.first_difference(LOG, grid).startswith("launch 1: mla_verify_split_kernel (1, 8, 4) here")
    strides = [["fp_gemv_kernel", "(1, 8, 4)", [["tensor", [1, 64], [128, 1], 0, "torch.bfloat16", 128], "16"]], LOG[1]]
    assert "arguments differ: [0]" in L.first_difference(LOG, strides)
    assert L.first_difference(LOG, LOG[:1]) == "2 launches here, 1 at REV"
    assert L.digest(LOG) != L.digest(strides)


def test_a_tree_launches_as_its_own_revision_does_decode_and_verify():
    """End to end (a worktree of HEAD against HEAD): the tool logs decode and verify steps and
    finds two runs of the same code equal (the first-difference rules are tested above)."""
    with head_tree() as tree:
        out = run_without_interpreter("-m", "lab.launch_log", "--rev", "HEAD", "--config", "tiny", "--batches", "1,4",
                                      "--verify", "1x3,2x7", needs_ptxas=False, cwd=tree)
    assert "against HEAD" in out and ": identical" in out and " 0 launches" not in out
