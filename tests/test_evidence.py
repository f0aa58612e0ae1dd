"""Stored evidence: code records, the freshness check, and the registry of files the chapters read."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from labkit.benchmarks import evidence
from labkit.measure import provenance

ROOT = Path(__file__).resolve().parents[1]


def test_a_code_record_ignores_comments_and_docstrings_but_not_code():
    base = 'def f(x):\n    """Doc."""\n    return x + 1  # add one\n'
    assert provenance._python_digest(base) == provenance._python_digest('def f(x):\n    "other words"\n    return x + 1\n')
    assert provenance._python_digest(base) != provenance._python_digest('def f(x):\n    return x + 2\n')
    assert provenance._python_digest(base) != provenance._python_digest('def g(x):\n    return x + 1\n')
    c = "int f(int x) { // one\n  return x + 1; /* two */ }\n"
    assert provenance._c_digest(c) == provenance._c_digest("int f(int x) {\n    return x + 1;\n}")
    assert provenance._c_digest(c) != provenance._c_digest("int f(int x) { return x - 1; }")


def test_a_code_record_covers_a_folder_and_names_what_changed():
    rec = provenance.code_record(["labkit/measure"])
    assert "labkit/measure/run.py" in rec["files"] and len(rec["digest"]) == 16
    moved = dict(rec, files={**rec["files"], "labkit/measure/run.py": "0" * 16, "labkit/gone.py": "1" * 16})
    assert provenance.changed(moved, rec) == ["labkit/measure/run.py (changed)", "labkit/gone.py (gone)"]
    with pytest.raises(ValueError, match="neither a file nor a folder"):
        provenance.code_record(["labkit/no_such_module.py"])
    with pytest.raises(ValueError, match="non-empty list"):
        provenance.code_record("labkit/measure")


def _tiny_registry(monkeypatch):
    entry = evidence.Stored("tiny.json", "echo {out}", ("labkit/measure/provenance.py",), ("00",), "none")
    monkeypatch.setattr(evidence, "STORED", {"tiny.json": entry})
    return entry


def test_status_says_fresh_older_code_no_record_and_missing(tmp_path, monkeypatch):
    _tiny_registry(monkeypatch)
    assert evidence.status("tiny.json", tmp_path)[0] == "missing"
    (tmp_path / "tiny.json").write_text(json.dumps({"results": {}}))
    assert evidence.status("tiny.json", tmp_path) == ("no record", "the file does not record which code made it")
    report = evidence.stamp({"results": {}, "cpu": {"cpu": "x"}}, tmp_path / "tiny.json", command="echo")
    (tmp_path / "tiny.json").write_text(json.dumps(report))
    assert evidence.status("tiny.json", tmp_path) == ("fresh", "echo")
    report["provenance"]["code"]["files"]["labkit/measure/provenance.py"] = "0" * 16
    (tmp_path / "tiny.json").write_text(json.dumps(report))
    state, why = evidence.status("tiny.json", tmp_path)
    assert state == "older code" and "labkit/measure/provenance.py (changed)" in why
    lines = []
    assert evidence.check(tmp_path, out=lines.append, pending={}) == 1
    assert any("re-make it: LABKIT_THREADS=all echo data/tiny.json" in line for line in lines)
    assert evidence.check(tmp_path, out=lines.append, pending={"tiny.json": "later"}) == 0  # pending: reported only
    assert any(line.startswith("pending") for line in lines)
    (tmp_path / "tiny.json").write_text(json.dumps(evidence.stamp({"results": {}}, tmp_path / "tiny.json", command="e")))
    assert evidence.check(tmp_path, out=lines.append, pending={"tiny.json": "later"}) == 1  # fresh: off the list
    assert evidence.check(tmp_path, out=lines.append, pending={"gone.json": "x"}) == 1  # not a stored file


def test_a_stamp_records_command_protocol_cpu_peers_and_code(monkeypatch):
    _tiny_registry(monkeypatch)
    rec = evidence.stamp({"cpu": {"cpu": "x"}}, "tiny.json", command="c")["provenance"]
    assert rec["command"] == "c" and rec["protocol"] == "none" and rec["cpu"] == {"cpu": "x"}
    assert set(rec["code"]["files"]) == {"labkit/measure/provenance.py"} and isinstance(rec["peers"], dict)


def test_remake_refuses_an_unknown_file():
    with pytest.raises(ValueError, match="stored files"):
        evidence.remake(["no_such.json"])


def test_every_stored_file_a_chapter_reads_is_registered():
    read = set()
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        for cell in json.loads(nb.read_text())["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] == "code":
                read |= set(re.findall(r"""evidence\.(?:load|made_by)\(\s*["']([\w.-]+\.json)["']""", src))
                read |= {m for m in re.findall(r"""data_path\(\s*["']([\w.-]+\.json)["']""", src)
                         if re.search(r"bench|quality|compression|serving_spec", m)}
    assert read and read <= set(evidence.STORED), f"register these in evidence.STORED: {sorted(read - set(evidence.STORED))}"
    for name, entry in evidence.STORED.items():
        assert provenance.source_files(entry.sources), name  # every listed source exists
        assert "{out}" in entry.command, name


def test_a_stored_peer_ratio_without_an_interval_is_printed_as_such():
    from labkit.benchmarks.step import vs_peer

    assert "too few rounds" in vs_peer({"ratio": 0.8, "low": 0.0, "high": float("inf"), "verdict": "inconclusive"})
    assert vs_peer({"ratio": 0.8, "low": 0.7, "high": 0.9, "verdict": "faster"}) == "1.25x llama.cpp (1.11-1.43, faster)"


def test_made_by_never_describes_this_machine_for_a_file_that_omits_its_cpu(tmp_path, monkeypatch):
    _tiny_registry(monkeypatch)
    (tmp_path / "data").mkdir()
    monkeypatch.setattr(evidence, "ROOT", tmp_path)
    (tmp_path / "data" / "tiny.json").write_text(json.dumps({"results": {}, "command": "echo"}))
    line = evidence.made_by("tiny.json")
    assert "a CPU it does not record" in line and "threads" not in line
    (tmp_path / "data" / "tiny.json").write_text(json.dumps(
        {"results": {}, "cpu": {"cpu": "Some CPU", "threads": 7, "flags": {"avx2": True}}}))
    assert "Some CPU, AVX2" in evidence.made_by("tiny.json") and "7 threads" in evidence.made_by("tiny.json")


def test_the_peer_table_sets_the_same_file_side_against_llama_cpp_at_the_process_level(tmp_path, monkeypatch):
    import random

    from labkit import measure
    from tests.test_measure import FakeClock

    def start(p):
        clock, rng = FakeClock(), random.Random(p)
        return measure.run({"fast format": clock.variant(0.5e-3, 0.01, rng),
                            "Q4_1 (GGUF)": clock.variant(1e-3, 0.01, rng),
                            "llama.cpp Q4_1": clock.variant(1e-3, 0.01, rng)}, rounds=2, clock=clock, machine=False)

    run = measure.replicate(start, processes=6)
    entry = evidence.Stored("step_bench.json", "echo {out}", ("labkit/measure/provenance.py",), ("03",), "none")
    monkeypatch.setattr(evidence, "STORED", {"step_bench.json": entry})
    monkeypatch.setattr(evidence, "ROOT", tmp_path)
    (tmp_path / "data").mkdir()
    report = evidence.stamp({"results": {"step": {"tok_s_run": run.as_dict()}}}, tmp_path / "data" / "step_bench.json",
                            command="echo")
    (tmp_path / "data" / "step_bench.json").write_text(json.dumps(report))
    monkeypatch.setattr(evidence, "status", lambda name, data_dir=None: ("fresh", "echo"))
    [row] = evidence.peer_table()
    assert row["labkit"] == "Q4_1 (GGUF)"  # the side named in advance, not the fastest
    assert row["rounds"] == 6 and row["processes"] == 6  # the interval is from the 6 process-level medians
    assert row["compare"].verdict in ("same within margin", "inconclusive")


def test_the_loaded_log_names_what_a_process_and_its_children_imported_and_nothing_without_it(tmp_path):
    import os
    import subprocess
    import sys

    from labkit import _loaded

    log = tmp_path / "loaded"
    code = ("import subprocess, sys, labkit.measure.clock; "
            "subprocess.run([sys.executable, '-m', 'labkit.measure.provenance'], capture_output=True)")
    env = {**os.environ, _loaded.ENV: str(log)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=tmp_path)
    got = _loaded.read(log)
    # the parent's import, announced before labkit itself ran; the child's module run by -m (no import event)
    assert {"labkit/__init__.py", "labkit/measure/__init__.py", "labkit/measure/clock.py",
            "labkit/measure/provenance.py"} <= got
    assert not any(f.startswith(("labkit/serving", "labkit/model", "labkit/quant")) for f in got)
    assert _loaded.module_files("labkit.quant.native")[1:] and all(
        f.startswith("labkit/quant/csrc/") for f in _loaded.module_files("labkit.quant.native")[1:])
    assert _loaded.module_files("json") == [] and _loaded.module_files("labkit.no_such") == []
    env.pop(_loaded.ENV)
    log.unlink()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=tmp_path)
    assert not log.exists()


def test_a_scoped_record_is_compared_on_its_loaded_files_and_a_change_to_a_file_it_never_loaded_cannot_stale_it():
    whole = {"files": {"a.py": "1", "b.py": "2", "c.cpp": "3"}}
    rec = provenance.scoped(whole, {"a.py", "c.cpp", "other.py"})
    assert rec["scope"] == "loaded" and set(rec["files"]) == {"a.py", "c.cpp"}
    assert provenance.outdated(rec, {"files": {**whole["files"], "b.py": "9"}}) == []  # b.py never loaded
    # a new file counts where a package imports what it finds in its folder, nowhere else
    assert provenance.outdated(rec, {"files": {**whole["files"], "labkit/kvcache/new.py": "4"}}) == [
        "labkit/kvcache/new.py (new)"]
    assert provenance.outdated(rec, {"files": {**whole["files"], "labkit/model/new.py": "4"}}) == []
    assert provenance.outdated(rec, {"files": {"a.py": "1", "c.cpp": "3"}}) == []  # b.py deleted: never loaded
    assert provenance.outdated(rec, {"files": {**whole["files"], "c.cpp": "9"}}) == ["c.cpp (changed)"]
    assert provenance.outdated(rec, {"files": {"b.py": "2", "c.cpp": "3"}}) == ["a.py (gone)"]
    # an unscoped record: every declared file counts, as before
    assert provenance.outdated(whole, {"files": {**whole["files"], "b.py": "9"}}) == ["b.py (changed)"]
    assert provenance.outdated(whole, {"files": {**whole["files"], "new.py": "4"}}) == ["new.py (new)"]
    with pytest.raises(ValueError, match="none of the record's 3 files"):
        provenance.scoped(whole, set())
    kept, said = provenance.scope_or_keep(whole, set())
    assert kept is whole and "keep the whole record" in said


def test_remake_records_only_the_declared_sources_its_run_loaded(tmp_path, monkeypatch):
    import labkit.data.files

    command = ("python -c \"import json, subprocess, sys, labkit.measure.clock; "
               "subprocess.run([sys.executable, '-c', 'import labkit.measure.stats']); "
               "json.dump({{'results': {{}}, 'provenance': {{}}}}, open(sys.argv[1], 'w'))\" {out}")
    sources = ("labkit/measure/clock.py", "labkit/measure/stats.py", "labkit/serving/__init__.py")
    monkeypatch.setattr(evidence, "STORED", {"tiny.json": evidence.Stored("tiny.json", command, sources, ("00",), "x")})
    monkeypatch.setattr(evidence, "ROOT", tmp_path)
    monkeypatch.setattr(labkit.data.files, "write_sums", lambda: None)
    (tmp_path / "data").mkdir()
    lines = []
    assert evidence.remake(["tiny.json"], log_dir=tmp_path / "logs", out=lambda *a, **k: lines.append(a[0])) == 0
    rec = json.loads((tmp_path / "data" / "tiny.json").read_text())["provenance"]["code"]
    assert rec["scope"] == "loaded" and set(rec["files"]) == {"labkit/measure/clock.py", "labkit/measure/stats.py"}
    assert any("2 of 3 declared source files" in line for line in lines)
    assert evidence.status("tiny.json", tmp_path / "data")[0] == "fresh"


def test_every_package_that_imports_what_it_finds_in_its_folder_is_listed_as_discovered():
    found = set()
    for path in (ROOT / "labkit").rglob("*.py"):
        text = path.read_text()
        for m in re.finditer(r"iter_modules\((\w+)\.__path__\)|iter_modules\(\[str\(Path\(__file__\)\.parent\)\]\)|"
                             r"make_getattr\(__name__\)", text):
            if m.group(1) == "package":  # labkit._collect: the packages that call make_getattr, found below
                continue
            if m.group(1) == "_commands":
                found.add("labkit/commands/")
            elif m.group(1) == "pkg":
                found.add("labkit/benchmarks/")
            else:
                found.add(str(path.parent.relative_to(ROOT)) + "/")
    assert found and found <= set(provenance.DISCOVERED), sorted(found - set(provenance.DISCOVERED))
