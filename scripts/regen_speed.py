"""Regenerate README.md's speed block (`<!-- BEGIN speed-benchmarks -->`) from the benchmarks:
benchmarks/cli_speed.py, plan_speed.py and search_speed.py, each run against the same baseline.

    .venv/bin/python scripts/regen_speed.py [--baseline REV] [--rounds N]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ("cli_speed.py", "plan_speed.py", "search_speed.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    extra = ["--rounds", str(args.rounds)] + (["--baseline", args.baseline] if args.baseline else [])
    parts = []
    for name in BENCHMARKS:
        cmd = [sys.executable, str(ROOT / "benchmarks" / name), *extra]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if res.returncode != 0:
            raise SystemExit(f"{name} failed: {res.stderr.strip()[-2000:]}")
        shown = " ".join(["python", f"benchmarks/{name}", *extra])
        parts.append(f"$ {shown}\n{res.stdout.rstrip()}")
    body = "```console\n" + "\n\n".join(parts) + "\n```"
    readme = ROOT / "README.md"
    text = readme.read_text()
    pattern = re.compile(r"(<!-- BEGIN speed-benchmarks -->\n)(?:.*?\n)?(<!-- END speed-benchmarks -->)", re.S)
    if not pattern.search(text):
        raise SystemExit("README.md has no speed-benchmarks block")
    readme.write_text(pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text))
    print("regenerated the speed-benchmarks block in README.md")


if __name__ == "__main__":
    main()
