"""Side-by-side timing for the benchmarks: this working tree against a baseline revision, in one
run, alternating, in CPU time (user + system), so that a busy machine slows both alike.

The baseline is a revision's `src/` exported with `git archive` into a temporary folder (the
repository is not touched); by default the previous commit (HEAD~1), or HEAD itself when the
working tree has uncommitted changes under src/. Each benchmark runs its measuring function in
a fresh interpreter per round with PYTHONPATH pointing at one tree or the other.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE_SRC = ROOT / "src"


def default_baseline() -> str:
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.strip()
    return "HEAD" if dirty else "HEAD~1"


def describe(rev: str) -> str:
    out = subprocess.run(["git", "log", "-1", "--format=%h %s", rev], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip()[:72] if out.returncode == 0 else rev


@contextmanager
def baseline_src(rev: str):
    """The `src/` folder of revision `rev`, exported into a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="trainplan-baseline-") as tmp:
        archive = subprocess.run(["git", "archive", "--format=tar", rev, "src"], cwd=ROOT, capture_output=True)
        if archive.returncode != 0:
            raise SystemExit(f"baseline {rev!r}: {archive.stderr.decode().strip()}")
        tar_path = Path(tmp) / "src.tar"
        tar_path.write_bytes(archive.stdout)
        with tarfile.open(tar_path) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp) / "src"


def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--baseline", default=None,
                        help="revision to compare with (default: HEAD~1, or HEAD with uncommitted changes in src/)")
    parser.add_argument("--no-baseline", action="store_true", help="measure this tree only")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per tree (default 5)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    if extra:
        extra(parser)
    return parser.parse_args()


def env_for(src: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(src)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def child_cpu(cmd: list[str], env: dict[str, str], **kwargs) -> tuple[float, subprocess.CompletedProcess]:
    """CPU seconds (user + system) of one child process, and its result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, **kwargs)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), res


def run_worker(script: Path, worker: str, src: Path, extra_args: list[str] | None = None) -> dict:
    """One round of `script --worker worker` against `src`: the JSON it prints."""
    _, res = child_cpu([sys.executable, str(script), "--worker", worker, *(extra_args or [])], env_for(src))
    return json.loads(res.stdout.strip().splitlines()[-1])


def alternate(rounds: int, trees: dict[str, Path], measure: Callable[[Path], dict]) -> dict[str, list[dict]]:
    """`measure(src)` for each tree in turn, `rounds` times (ABAB...), one list of results per tree."""
    out: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(rounds):
        for name, src in trees.items():
            out[name].append(measure(src))
    return out


def median_of(results: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in results)


@contextmanager
def trees(args):
    """{'this tree': src, 'baseline': src} (just this tree with --no-baseline), and the baseline's label."""
    if args.no_baseline:
        yield {"this tree": HERE_SRC}, None
        return
    rev = args.baseline or default_baseline()
    with baseline_src(rev) as src:
        yield {"this tree": HERE_SRC, "baseline": src}, f"{rev} ({describe(rev)})"


def ratio(new: float, old: float) -> str:
    return f"{new / old:.2f}x" if old > 0 else "n/a"


def print_comparison(results: dict[str, list[dict]], label: str | None, rows: list[tuple[str, str]],
                     columns: tuple[str, int, int, str]) -> None:
    """The benchmark's table: for each (name, what) the median of this tree's rounds and, with a
    baseline, the baseline's and their ratio. columns: the first column's title and width, the
    figures' width and format (e.g. ("case", 36, 10, ".3f"))."""
    first, name_width, width, fmt = columns
    what_width = max(len(what) for _, what in rows) + 2
    head = f"{first:<{name_width}s} {'what':<{what_width}s} {'this tree':>{width}s}"
    if label:
        head += f" {'baseline':>{width}s} {'ratio':>7s}"
    print(head)
    for name, what in rows:
        key = f"{name} {what}"
        new = median_of(results["this tree"], key)
        line = f"{name:<{name_width}s} {what:<{what_width}s} {new:>{width}{fmt}}"
        if label:
            old = median_of(results["baseline"], key)
            line += f" {old:>{width}{fmt}} {ratio(new, old):>7s}"
        print(line)
