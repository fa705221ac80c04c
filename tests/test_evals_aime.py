"""AIME25: the task is lm-eval's own aime25 (its prompt and its answer extraction, reached through
``include:``), on local documents; the generated long-arithmetic set has the documented fields."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from fastpath.evals import aime, data, taskdir  # noqa: E402


@pytest.fixture(scope="module")
def aime_task(tmp_path_factory):
    work = tmp_path_factory.mktemp("aime")
    files = {"aime25": data.write_jsonl(work / "aime.jsonl", aime.generate(1, 3, 5))}
    tm = taskdir.task_manager(taskdir.lay_out(work), files)
    return tm.load(["fastpath_aime25"])["tasks"]["fastpath_aime25"]


def test_generated_rows_have_the_documented_fields_and_integer_answers():
    rows = aime.generate(9, 20, 12)
    assert rows == aime.generate(9, 20, 12) and rows != aime.generate(10, 20, 12)
    for i, row in enumerate(rows):
        assert set(row) == set(aime.FIELDS) and all(type(row[k]) is t for k, t in aime.FIELDS.items())
        assert row["id"] == i and row["answer"].isdigit() and 0 <= int(row["answer"]) <= 999
        assert "12 operations" in row["problem"]
        assert [f"Step {k}: " in row["problem"] for k in (1, 12, 13)] == [True, True, False]  # labelled
    # a worked solution takes a line per operation ("lines"), or a labelled step line and its work,
    # and ends in the boxed answer
    sol = aime.solution(rows[0], "lines")
    assert sol.count("\n") == 12 and sol.endswith(f"\\boxed{{{rows[0]['answer']}}}.")
    numbered = aime.solution(rows[0])
    assert numbered.count("\nStep ") == 11 and numbered.endswith(f"\\boxed{{{rows[0]['answer']}}}.")


def test_the_task_is_lm_evals_aime25_with_only_the_listed_overrides(aime_task):
    import lm_eval.tasks

    builtin = Path(lm_eval.tasks.__file__).parent / "aime" / "aime25.yaml"
    from lm_eval.tasks._yaml_loader import load_yaml

    theirs = load_yaml(builtin, resolve_func=False)
    ours = load_yaml(taskdir.TASKS_DIR / "fastpath_aime25.yaml", resolve_func=False, recursive=False)
    assert ours["include"] == "lm_eval_tasks/aime/aime25.yaml"
    assert set(ours) - {"include"} == {"task", "custom_dataset"}  # the overrides the file lists
    cfg = aime_task.config
    assert cfg.doc_to_text == theirs["doc_to_text"] == "Question: {{problem}}\nAnswer:"
    assert cfg.generation_kwargs["until"] == theirs["generation_kwargs"]["until"]
    fn = cfg.process_results
    assert fn.__module__ == "lm_eval.tasks.aime.utils" and fn.__name__ == "process_results"
    doc = aime_task.eval_docs[0]
    assert aime_task.doc_to_text(doc) == f"Question: {doc['problem']}\nAnswer:"


def test_answer_extraction_is_lm_evals_nested_braces_and_last_box(aime_task):
    score = lambda text, answer: aime_task.process_results({"problem": "", "answer": answer}, [text])["exact_match"]  # noqa: E731
    assert score("so \\boxed{7} or rather \\boxed{42}", "42") == 1  # several boxes: the last wins
    assert score("so \\boxed{7} or rather \\boxed{42}", "7") == 0
    assert score("the value is \\boxed{\\frac{1}{2}}", "\\frac{1}{2}") == 1  # nested braces kept whole
    assert score("no box, just 42", "42") == 0
    row = aime.generate(2, 1, 30)[0]
    assert score(aime.solution(row), row["answer"]) == 1  # a worked solution scores


def _worked_ops(line: str) -> list[tuple[int, str, int, int, int]]:
    """Every column of a "columns" work line: (digit, sign, digit, carry, result)."""
    return [(int(a), op, int(b), int(c or 0), int(r)) for a, op, b, c, r in
            re.findall(r"(\d+)([*+-])(\d+)(?:\+(\d+))?=(\d+)", line.split(": ", 1)[1])]


def test_a_column_worked_solution_is_right_column_by_column_and_carries_what_it_wrote():
    """Every column of every line is right, its carry is the tens of the column before (what
    the line wrote), the line's "so N" is its operation's value and each step's x the last one's."""
    for row in aime.generate(4, 40, 12):
        lines = aime.solution(row, "columns").splitlines()
        assert lines[-1].endswith(f"\\boxed{{{row['answer']}}}.")
        x = None
        for line in lines[:-1]:
            head = re.fullmatch(r"Step \d+: x = (\d+), (add|subtract|multiply by) (\d+)\.", line)
            if head:
                assert x is None or int(head.group(1)) == x
                continue
            op_text, so = re.fullmatch(r"(.*?): .*, so (\d+)(?:, mod 1000 = \d+)?\.", line).groups()
            carry = 0
            for a, op, b, c, r in _worked_ops(line):
                if op == "-":  # the complement: 10-d for the lowest non-zero digit, 9-d above it
                    assert a in (9, 10) and r == a - b
                    continue
                assert c == (carry if op == "*" else min(carry, 1)) and r == (a * b if op == "*" else a + b) + c
                carry = r // 10
            a, sign, b = re.fullmatch(r"(\d+) ([-+*]) (\d+)", op_text).groups()
            assert int(so) == {"+": int(a) + int(b), "*": int(a) * int(b), "-": int(a) - int(b)}[sign]
            if ", mod 1000 = " in line:
                x = int(so) % 1000
                assert line.endswith(f"mod 1000 = {x}.")
    with pytest.raises(ValueError, match="solution style 'prose'"):
        aime.solution(aime.generate(1, 1, 3)[0], "prose")
