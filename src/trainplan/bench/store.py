"""The results store: every `trainplan bench` run in one SQLite file, with the machine's
identity, so runs from different machines (and dates) can be lined up (`bench compare`).
A run is written in one transaction: an interrupted write leaves the store as it was."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from ..errors import PlanError

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    date TEXT NOT NULL, device TEXT NOT NULL, name TEXT NOT NULL, torch TEXT NOT NULL,
    gpu TEXT, quick INTEGER NOT NULL, machine TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    run_id INTEGER NOT NULL REFERENCES runs(id), suite TEXT NOT NULL, row TEXT NOT NULL
);
"""


def default_path() -> Path:
    """$XDG_DATA_HOME/trainplan/bench.sqlite (~/.local/share/... when unset)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "trainplan" / "bench.sqlite"


def _connect(path: str | Path | None, create: bool) -> sqlite3.Connection:
    target = Path(path) if path else default_path()
    if not target.exists() and not create:
        raise PlanError("db", f"no results store at {target}; run `trainplan bench` first")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(target)
        conn.executescript(SCHEMA)
    except (OSError, sqlite3.Error) as exc:
        raise PlanError("db", f"cannot open the results store {target} ({exc})") from None
    return conn


def save(results: dict, path: str | Path | None = None,
         suites=("gemm", "gemm_k", "gemm_model", "memory", "alignment", "fusion", "tiling", "attention", "recompute",
                 "collectives")) -> int:
    """Store one run; returns its id."""
    conn = _connect(path, create=True)
    m = results["machine"]
    try:
        with conn:  # one transaction
            cur = conn.execute(
                "INSERT INTO runs (date, device, name, torch, gpu, quick, machine) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (m["date"], m["device"], m["name"], m["torch"], results.get("gpu"), int(bool(results.get("quick"))),
                 json.dumps(m)))
            run_id = int(cur.lastrowid)
            conn.executemany("INSERT INTO results (run_id, suite, row) VALUES (?, ?, ?)",
                             [(run_id, s, json.dumps(r)) for s in suites for r in results.get(s) or []])
    finally:
        conn.close()
    return run_id


def load(ids: list[int] | None = None, path: str | Path | None = None, last: int = 5) -> list[dict]:
    """Runs by id (default: the `last` most recent), each with its machine and results."""
    conn = _connect(path, create=False)
    try:
        if ids:
            rows = conn.execute(f"SELECT id, machine, gpu, quick FROM runs WHERE id IN ({','.join('?' * len(ids))}) "
                                "ORDER BY id", ids).fetchall()
            missing = sorted(set(ids) - {r[0] for r in rows})
            if missing:
                raise PlanError("run", f"no run {', '.join(map(str, missing))} in the store")
        else:
            rows = conn.execute("SELECT id, machine, gpu, quick FROM runs ORDER BY id DESC LIMIT ?", (last,)).fetchall()
            rows.reverse()
        runs = []
        for run_id, machine, gpu, quick in rows:
            run = {"id": run_id, "machine": json.loads(machine), "gpu": gpu, "quick": bool(quick)}
            for suite, row in conn.execute("SELECT suite, row FROM results WHERE run_id = ? ORDER BY rowid", (run_id,)):
                run.setdefault(suite, []).append(json.loads(row))
            runs.append(run)
    finally:
        conn.close()
    return runs


def compare(runs: list[dict]) -> dict:
    """One row per measurement (GEMM dtype and shape, memory kernel, alignment case, ...),
    one column per run: TFLOP/s, GB/s, ms or speedup; what a run did not time is left blank."""
    table: dict[str, list] = {}
    for i, run in enumerate(runs):
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
        cells = {k: v for k, v in cells.items() if v is not None}
        for key, value in cells.items():
            table.setdefault(key, [None] * len(runs))[i] = value
    return {"runs": [{"id": r["id"], "name": r["machine"]["name"], "device": r["machine"]["device"],
                      "date": r["machine"]["date"], "gpu": r["gpu"], "quick": r["quick"]} for r in runs],
            "rows": table}
