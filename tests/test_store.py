"""The results store keeps what was measured: opened before measuring, each suite saved as it
finishes, writers that wait for each other, and a clear refusal of a store that is not ours."""

import json
import sqlite3
import threading

import pytest
from typer.testing import CliRunner

from trainplan.bench import store
from trainplan.cli import app
from trainplan.errors import PlanError

MACHINE = {"date": "2026-12-01T00:00:00+00:00", "device": "cpu", "name": "test machine", "torch": "2.13.0"}
RESULTS = {"machine": MACHINE, "gpu": "A100-80GB-SXM", "quick": True,
           "memory": [{"kernel": "copy", "gbs": 12.5, "bytes": 1 << 20}],
           "gemm": [{"dtype": "fp32", "n": 256, "tflops": 0.2}]}


def test_a_killed_run_keeps_the_suites_it_finished(tmp_path):
    """The run is written suite by suite: an interruption after the first suite keeps it,
    marked incomplete, and the store stays readable."""
    db = tmp_path / "runs.sqlite"
    writer = store.RunWriter(db)
    run_id = writer.start(MACHINE, "A100-80GB-SXM", True)
    writer.suite("memory", RESULTS["memory"])
    writer.close()  # killed before the next suite: no finish()
    (run,) = store.load(None, db)
    assert run["id"] == run_id and run["complete"] is False and run["memory"] == RESULTS["memory"]
    assert "gemm" not in run
    table = store.compare([run])
    assert table["runs"][0]["complete"] is False and table["rows"]["memory copy GB/s"] == [12.5]


def test_run_bench_opens_the_store_before_measuring(tmp_path, monkeypatch):
    """A store that cannot be written is refused before the first suite runs."""
    pytest.importorskip("torch")
    from trainplan.bench import run as bench_run

    ran = []
    monkeypatch.setattr(bench_run.alignment, "run", lambda *a: ran.append("alignment") or [])
    db = tmp_path / "locked.sqlite"
    store.save(RESULTS, db)
    holder = sqlite3.connect(db)
    holder.execute("BEGIN EXCLUSIVE")  # another writer holds the store
    monkeypatch.setattr(store, "BUSY_TIMEOUT_S", 0.2)
    try:
        with pytest.raises(PlanError) as err:
            bench_run.run_bench(["alignment"], device="cpu", quick=True, store=store.RunWriter(db))
    finally:
        holder.rollback()
        holder.close()
    assert err.value.field == "db" and "locked" in err.value.rule and ran == []


def test_each_suite_is_stored_as_it_finishes(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from trainplan.bench import run as bench_run

    db = tmp_path / "runs.sqlite"
    monkeypatch.setattr(bench_run.alignment, "run", lambda *a: [{"case": "odd", "speedup": 1.25}])

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_run.fusion, "run", killed)
    writer = store.RunWriter(db)
    with pytest.raises(KeyboardInterrupt):
        bench_run.run_bench(["alignment", "fusion"], device="cpu", quick=True, store=writer)
    writer.close()
    (run,) = store.load(None, db)
    assert run["complete"] is False and run["alignment"] == [{"case": "odd", "speedup": 1.25}]


def test_concurrent_writers_wait_instead_of_failing(tmp_path):
    """16 writers saving 10 runs each at once: every run stored (without WAL and a busy
    timeout, concurrent saves failed with "database is locked")."""
    db = tmp_path / "shared.sqlite"
    store.save(RESULTS, db)
    errors = []

    def writer():
        for _ in range(10):
            try:
                store.save(RESULTS, db)
            except Exception as exc:  # noqa: BLE001 - the test counts every failure
                errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store.load(None, db, last=1000)) == 161
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_foreign_database_is_refused_and_left_alone(tmp_path):
    db = tmp_path / "other.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    for call in (lambda: store.save(RESULTS, db), lambda: store.load(None, db)):
        with pytest.raises(PlanError) as err:
            call()
        assert err.value.field == "db" and "not a trainplan results store" in err.value.rule
    with sqlite3.connect(db) as conn:  # nothing of ours was written into it
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"users"}


@pytest.mark.parametrize("content", [b"\x00\xffnot a database at all" * 64, b"SQLite format 3\x00" + b"\x07" * 4000])
def test_a_corrupt_file_is_refused_by_name(tmp_path, content):
    db = tmp_path / "corrupt.sqlite"
    db.write_bytes(content)
    for call in (lambda: store.load(None, db), lambda: store.save(RESULTS, db)):
        with pytest.raises(PlanError) as err:
            call()
        assert err.value.field == "db" and "not an SQLite database, or damaged" in err.value.rule
    assert db.read_bytes() == content


def test_a_missing_folder_is_refused_not_created(tmp_path):
    target = tmp_path / "no" / "such" / "dir" / "x.sqlite"
    with pytest.raises(PlanError) as err:
        store.save(RESULTS, target)
    assert err.value.field == "db" and "does not exist" in err.value.rule
    assert not (tmp_path / "no").exists()
    with pytest.raises(PlanError) as err:
        store.save(RESULTS, tmp_path)
    assert "is a directory" in err.value.rule


def test_a_store_written_before_suite_by_suite_saving_still_reads_and_migrates(tmp_path):
    db = tmp_path / "old.sqlite"
    with sqlite3.connect(db) as conn:  # the schema of earlier versions: no `complete` column
        conn.executescript("""
            CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, date TEXT NOT NULL, device TEXT NOT NULL,
                name TEXT NOT NULL, torch TEXT NOT NULL, gpu TEXT, quick INTEGER NOT NULL, machine TEXT NOT NULL);
            CREATE TABLE results (run_id INTEGER NOT NULL REFERENCES runs(id), suite TEXT NOT NULL, row TEXT NOT NULL);
        """)
        conn.execute("INSERT INTO runs (date, device, name, torch, gpu, quick, machine) VALUES (?,?,?,?,?,?,?)",
                     ("d", "cpu", "old", "2.4", None, 1, json.dumps({**MACHINE, "name": "old"})))
    (old,) = store.load(None, db)
    assert old["complete"] is True and old["machine"]["name"] == "old"
    new_id = store.save(RESULTS, db)
    assert [r["id"] for r in store.load(None, db)] == [old["id"], new_id]


def test_bench_compare_on_a_bad_store_is_one_line_exit_2(tmp_path):
    runner = CliRunner()
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"garbage" * 100)
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE t (x)")
    for db in (corrupt, foreign, tmp_path / "missing.sqlite"):
        res = runner.invoke(app, ["bench", "compare", "--db", str(db)])
        assert res.exit_code == 2, res.output
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: db:"), res.output
        assert res.exception is None or isinstance(res.exception, SystemExit)
