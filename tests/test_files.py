"""edgepack.files: a file written through ``atomic_file`` is the old one or the whole new one."""

import json

import pytest

from edgepack.files import atomic_file, write_json_atomic, write_text_atomic


def test_atomic_file_replaces_the_file_when_the_block_ends(tmp_path):
    target = tmp_path / "deep" / "out.txt"  # parents made
    with atomic_file(target) as tmp:
        tmp.write_text("new")
        assert not target.exists()  # nothing at the final name while it is being written
    assert target.read_text() == "new"
    assert [p.name for p in target.parent.iterdir()] == ["out.txt"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    write_text_atomic(target, "old")
    with pytest.raises(RuntimeError), atomic_file(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_write_json_atomic_writes_sorted_indented_json(tmp_path):
    target = tmp_path / "state.json"
    write_json_atomic(target, {"b": 1, "a": [1, 2]})
    assert json.loads(target.read_text()) == {"a": [1, 2], "b": 1}
    assert target.read_text().startswith('{\n  "a"')
