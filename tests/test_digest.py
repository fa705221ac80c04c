import os
from pathlib import Path

import pytest

from fastpath.digest import SourceDigestError, canonical_json, source_digest, tree_digest


def _tree(root):
    (root / "fast" / "k").mkdir(parents=True)
    (root / "fast" / "a.py").write_text("A = 1\n")
    (root / "fast" / "k" / "b.py").write_text("B = 2\n")
    (root / "fast" / "t.json").write_text("{}\n")
    return root


def test_digest_is_path_sorted_and_content_addressed(tmp_path):
    d = source_digest(_tree(tmp_path), ["fast/**/*.py", "fast/**/*.json"])
    assert d["algorithm"] == "sha256-tree-v1"
    assert [f["path"] for f in d["files"]] == ["fast/a.py", "fast/k/b.py", "fast/t.json"]
    assert d["files"][0]["size"] == 6
    assert d["digest"] == tree_digest(d["files"])


def test_digest_ignores_mtime_permissions_and_glob_order(tmp_path):
    root = _tree(tmp_path)
    before = source_digest(root, ["fast/**/*.py", "fast/**/*.json"])
    os.utime(root / "fast" / "a.py", (1, 1))
    os.chmod(root / "fast" / "a.py", 0o600)
    after = source_digest(root, ["fast/**/*.json", "fast/**/*.py", "fast/*.py"])
    assert after == before


def test_digest_changes_with_one_byte_and_with_a_rename(tmp_path):
    root = _tree(tmp_path)
    base = source_digest(root, ["fast/**/*.py"])["digest"]
    (root / "fast" / "a.py").write_text("A = 2\n")
    changed = source_digest(root, ["fast/**/*.py"])["digest"]
    assert changed != base
    (root / "fast" / "a.py").rename(root / "fast" / "c.py")
    assert source_digest(root, ["fast/**/*.py"])["digest"] not in (base, changed)


def test_digest_same_for_same_tree_elsewhere(tmp_path):
    a = source_digest(_tree(tmp_path / "one"), ["fast/**/*.py"])
    b = source_digest(_tree(tmp_path / "two"), ["fast/**/*.py"])
    assert a == b


def test_glob_matching_nothing_names_the_glob(tmp_path):
    with pytest.raises(SourceDigestError, match=r"fast/\*\*/\*\.cu"):
        source_digest(_tree(tmp_path), ["fast/**/*.py", "fast/**/*.cu"])


@pytest.mark.parametrize("glob", ["/etc/*", "../*.py", "fast\\*.py", ""])
def test_unsafe_globs_are_refused(tmp_path, glob):
    with pytest.raises(SourceDigestError):
        source_digest(_tree(tmp_path), [glob])


def test_symlink_out_of_tree_is_refused(tmp_path):
    root = _tree(tmp_path / "repo")
    (tmp_path / "secret.py").write_text("x")
    (root / "fast" / "evil.py").symlink_to(tmp_path / "secret.py")
    with pytest.raises(SourceDigestError, match="outside"):
        source_digest(root, ["fast/**/*.py"])


def test_canonical_json_is_order_independent():
    assert canonical_json({"b": 1, "a": [1, "é"]}) == canonical_json({"a": [1, "é"], "b": 1})
    assert canonical_json({"b": 1, "a": 2}) == '{"a":2,"b":1}\n'.encode()


def _project(root):
    _tree(root)
    (root / "fastpath" / "suites").mkdir(parents=True)
    (root / "fastpath" / "suites" / "test_x.py").write_text("def test_x(): pass\n")
    (root / "model.py").write_text("M = 1\n")
    (root / "fastpath.toml").write_text((Path(__file__).parent / "doubles" / "stub" / "spec.toml").read_text()
                                        .replace('globs = ["src/**/*.py"]', 'globs = ["fast/**/*.py"]'))
    return root


def test_attested_parts_defaults_ownership_and_pseudo_entries(tmp_path):
    from fastpath.digest import PARTS, attested_parts
    from fastpath.spec import load_spec

    root = _project(tmp_path)
    a = attested_parts(root, load_spec(root / "fastpath.toml"))
    files = {p: [f["path"] for f in a["parts"][p]["files"]] for p in PARTS}
    assert files == {"fast_path": ["fast/a.py", "fast/k/b.py"],
                     "validation": ["fastpath/suites/test_x.py", "[gates]", "fastpath-version"],
                     "subject": ["model.py"],  # the spec's directory's .py files, minus the fast path
                     "spec": ["fastpath.toml"]}
    assert a["spec_path"] == "fastpath.toml"
    for p in PARTS:
        assert a["parts"][p]["digest"] == tree_digest(a["parts"][p]["files"])


def test_declared_globs_must_match_defaults_need_not(tmp_path):
    from fastpath.digest import attested_parts
    from fastpath.spec import load_spec

    root = _project(tmp_path)
    (root / "fastpath" / "suites" / "test_x.py").unlink()
    attested_parts(root, load_spec(root / "fastpath.toml"))  # default validation globs: fine
    spec = root / "fastpath.toml"
    spec.write_text(spec.read_text().replace('globs = ["fast/**/*.py"]', 'globs = ["fast/**/*.py"]\nvalidation = ["suites/*.py"]'))
    with pytest.raises(SourceDigestError, match="'suites/\\*.py' matches no file"):
        attested_parts(root, load_spec(spec))
