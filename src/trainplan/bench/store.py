"""The results store: every `trainplan bench` run in one SQLite file, with the machine's
identity, so runs from different machines (and dates) can be lined up (`bench compare`).

Nothing measured is lost: a run is opened in the store before the first suite starts (so an
unwritable, locked, foreign or corrupt store is refused before any time is spent measuring),
and each suite's rows are written in their own transaction as the suite finishes; the run is
marked complete at the end. A run that was killed keeps the suites it finished and shows as
incomplete. The store is in write-ahead-log mode and writers wait for each other (a busy
timeout) instead of failing with "database is locked"."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from ..errors import PlanError

# PRAGMA application_id of a trainplan store ("tpln"), so another program's SQLite file is
# never mistaken for ours (https://www.sqlite.org/pragma.html#pragma_application_id).
APPLICATION_ID = 0x74706C6E
BUSY_TIMEOUT_S = 60.0  # how long a writer waits for another's transaction
SUITE_KEYS = ("gemm", "gemm_k", "gemm_model", "memory", "alignment", "fusion", "tiling", "attention", "recompute",
              "collectives")
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    date TEXT NOT NULL, device TEXT NOT NULL, name TEXT NOT NULL, torch TEXT NOT NULL,
    gpu TEXT, quick INTEGER NOT NULL, machine TEXT NOT NULL, complete INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS results (
    run_id INTEGER NOT NULL REFERENCES runs(id), suite TEXT NOT NULL, row TEXT NOT NULL
);
"""
RUNS_COLUMNS = {"id", "date", "device", "name", "torch", "gpu", "quick", "machine"}
RESULTS_COLUMNS = {"run_id", "suite", "row"}


def default_path() -> Path:
    """$XDG_DATA_HOME/trainplan/bench.sqlite (~/.local/share/... when unset)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "trainplan" / "bench.sqlite"


def _target(path: str | Path | None, create: bool) -> Path:
    """The store's file. Only the default location's directory is created; a --db whose folder
    does not exist is refused (a typo must not create directories)."""
    if not path:
        target = default_path()
        if create:
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise PlanError("db", f"cannot create the results store's folder {target.parent} ({exc})") from None
        elif not target.exists():
            raise PlanError("db", f"no results store at {target}; run `trainplan bench` first")
        return target
    target = Path(path)
    if target.is_dir():
        raise PlanError("db", f"{target} is a directory; name the store's file (e.g. {target / 'bench.sqlite'})")
    if not target.exists():
        if not create:
            raise PlanError("db", f"no results store at {target}; run `trainplan bench --db {target}` first")
        if not target.parent.is_dir():
            raise PlanError("db", f"folder {target.parent} does not exist")
    return target


def _check_ours(conn: sqlite3.Connection, target: Path) -> None:
    """Refuse a database that belongs to another program: one with tables but neither our
    application id nor our two tables with their columns."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
              if not name.startswith("sqlite_")}
    if app_id == APPLICATION_ID or not tables:
        return
    columns = {t: {row[1] for row in conn.execute(f"PRAGMA table_info({t})")} for t in ("runs", "results")}
    if not (RUNS_COLUMNS <= columns["runs"] and RESULTS_COLUMNS <= columns["results"]):
        raise PlanError("db", f"{target} is not a trainplan results store (it holds other tables: "
                              f"{', '.join(sorted(tables)[:5])}); name another file with --db")


def _connect(path: str | Path | None, create: bool) -> sqlite3.Connection:
    target = _target(path, create)
    conn = None
    try:
        conn = sqlite3.connect(target, timeout=BUSY_TIMEOUT_S)
        _check_ours(conn, target)
        if create:
            conn.execute("PRAGMA journal_mode=WAL")
            with conn:
                conn.executescript(SCHEMA)
                columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
                if "complete" not in columns:  # a store written before runs were saved suite by suite
                    conn.execute("ALTER TABLE runs ADD COLUMN complete INTEGER NOT NULL DEFAULT 1")
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        else:
            conn.execute("SELECT count(*) FROM runs").fetchone()  # a damaged or empty file fails here
    except PlanError:
        if conn is not None:
            conn.close()
        raise
    except (OSError, sqlite3.Error) as exc:
        if conn is not None:
            conn.close()
        reason = str(exc)
        if "not a database" in reason or "malformed" in reason:
            reason = "not an SQLite database, or damaged"
        raise PlanError("db", f"cannot use the results store {target} ({reason})") from None
    return conn


class RunWriter:
    """One run, written as it is measured: `start` opens it (refusing an unusable store before
    anything is measured), `suite` stores one suite's rows in its own transaction, `finish`
    marks the run complete."""

    def __init__(self, path: str | Path | None = None):
        self.path, self.conn, self.run_id = path, None, None

    def start(self, machine: dict, gpu: str | None, quick: bool) -> int:
        self.conn = _connect(self.path, create=True)
        try:
            with self.conn:
                cur = self.conn.execute(
                    "INSERT INTO runs (date, device, name, torch, gpu, quick, machine, complete) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, 0)",
                    (machine["date"], machine["device"], machine["name"], machine["torch"], gpu, int(bool(quick)),
                     json.dumps(machine)))
        except sqlite3.Error as exc:
            self.close()
            raise PlanError("db", f"cannot write to the results store {self.path or default_path()} ({exc})") from None
        self.run_id = int(cur.lastrowid)
        return self.run_id

    def suite(self, name: str, rows: list[dict] | None) -> None:
        encoded = [(self.run_id, name, json.dumps(r)) for r in rows or []]  # a row that cannot be stored fails here
        try:
            with self.conn:
                self.conn.executemany("INSERT INTO results (run_id, suite, row) VALUES (?, ?, ?)", encoded)
        except sqlite3.Error as exc:
            raise PlanError("db", f"cannot write suite {name} to the results store ({exc})") from None

    def finish(self) -> int:
        with self.conn:
            self.conn.execute("UPDATE runs SET complete = 1 WHERE id = ?", (self.run_id,))
        self.close()
        return self.run_id

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def save(results: dict, path: str | Path | None = None, suites=SUITE_KEYS) -> int:
    """Store one finished run in one transaction (nothing is written if a row cannot be
    stored); returns its id."""
    conn = _connect(path, create=True)
    m = results["machine"]
    try:
        rows = [(s, json.dumps(r)) for s in suites for r in results.get(s) or []]
        with conn:
            cur = conn.execute(
                "INSERT INTO runs (date, device, name, torch, gpu, quick, machine, complete) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 1)",
                (m["date"], m["device"], m["name"], m["torch"], results.get("gpu"), int(bool(results.get("quick"))),
                 json.dumps(m)))
            run_id = int(cur.lastrowid)
            conn.executemany("INSERT INTO results (run_id, suite, row) VALUES (?, ?, ?)",
                             [(run_id, s, r) for s, r in rows])
    finally:
        conn.close()
    return run_id


def load(ids: list[int] | None = None, path: str | Path | None = None, last: int = 5) -> list[dict]:
    """Runs by id (default: the `last` most recent), each with its machine and results; a run
    that was interrupted has "complete": False and the suites it finished."""
    conn = _connect(path, create=False)
    try:
        has_complete = "complete" in {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
        columns = "id, machine, gpu, quick, " + ("complete" if has_complete else "1")
        if ids:
            rows = conn.execute(f"SELECT {columns} FROM runs WHERE id IN ({','.join('?' * len(ids))}) ORDER BY id",
                                ids).fetchall()
            missing = sorted(set(ids) - {r[0] for r in rows})
            if missing:
                raise PlanError("run", f"no run {', '.join(map(str, missing))} in the store")
        else:
            rows = conn.execute(f"SELECT {columns} FROM runs ORDER BY id DESC LIMIT ?", (last,)).fetchall()
            rows.reverse()
        runs = []
        for run_id, machine, gpu, quick, complete in rows:
            try:
                run = {"id": run_id, "machine": json.loads(machine), "gpu": gpu, "quick": bool(quick),
                       "complete": bool(complete)}
                for suite, row in conn.execute("SELECT suite, row FROM results WHERE run_id = ? ORDER BY rowid",
                                               (run_id,)):
                    run.setdefault(suite, []).append(json.loads(row))
            except (TypeError, ValueError):
                raise PlanError("db", f"run {run_id} in the store is damaged (a row is not JSON)") from None
            runs.append(run)
    except sqlite3.Error as exc:
        raise PlanError("db", f"cannot read the results store ({exc})") from None
    finally:
        conn.close()
    return runs


def compare(runs: list[dict]) -> dict:
    """One row per measurement (GEMM dtype and shape, memory kernel, alignment case, ...),
    one column per run: TFLOP/s, GB/s, ms or speedup; what a run did not time is left blank."""
    table: dict[str, list] = {}
    for i, run in enumerate(runs):
        try:
            cells = _cells(run)
        except (KeyError, TypeError, AttributeError) as exc:
            raise PlanError("db", f"run {run['id']} holds results this version cannot read (no {exc})") from None
        for key, value in cells.items():
            table.setdefault(key, [None] * len(runs))[i] = value
    return {"runs": [{"id": r["id"], "name": r["machine"].get("name"), "device": r["machine"].get("device"),
                      "date": r["machine"].get("date"), "gpu": r["gpu"], "quick": r["quick"],
                      "complete": r.get("complete", True)} for r in runs],
            "rows": table}


def _cells(run: dict) -> dict:
    """A run's measurements by row label."""
    cells = {}
    for r in run.get("gemm", []):
        cells[f"gemm {r['dtype']} {r.get('m', r['n'])}x{r.get('k', r['n'])}x{r['n']} TFLOP/s"] = r["tflops"]
    for r in run.get("gemm_k", []):
        cells[f"gemm bf16 {r['m']}x{r['k']}x{r['n']} (k sweep) TFLOP/s"] = r["tflops"]
    for r in run.get("gemm_model", []):
        cells[f"gemm {r['model']} {r['gemm']} {r['m']}x{r['k']}x{r['n']} TFLOP/s"] = r["tflops"]
    for r in run.get("memory", []):
        cells[f"memory {r['kernel']} GB/s"] = r["gbs"]
    for r in run.get("alignment", []):
        cells[f"alignment {r['case']} speedup"] = r["speedup"]
    for r in run.get("fusion", []):
        cells[f"fusion {r['variant']} {r['dtype']} ms"] = r["seconds"] and r["seconds"] * 1e3
    for r in run.get("tiling", []):
        cells[f"tiling {r['n']}^3 {r['kernel']} {r['blocks']} TFLOP/s".replace("  ", " ")] = r["tflops"]
    for r in run.get("attention", []):
        cells[f"attention seq {r['seq']} {r['variant']} TFLOP/s"] = r["tflops"]
        if r.get("peak_bytes") is not None:
            cells[f"attention seq {r['seq']} {r['variant']} peak MiB"] = r["peak_bytes"] / 2**20
    for r in run.get("recompute", []):
        cells[f"recompute {r['recompute']} step s"] = r["step_s"]
        cells[f"recompute {r['recompute']} activations MiB"] = r["activation_bytes"] / 2**20
    for r in run.get("collectives", []):
        if r["size"]:
            cells[f"{r['op']} {r['size']} B x{r['world']} busbw GB/s"] = r["busbw_gbs"]
    return {k: v for k, v in cells.items() if v is not None}
