"""Start-up cost of the commands: CPU seconds (user + system) of one `trainplan plan --json`,
`trainplan gpus` and `trainplan models` process, this tree against a baseline revision,
alternating, the median of --rounds runs each; with compiled bytecode (.pyc, the usual
install) and without it (a read-only install, PYTHONDONTWRITEBYTECODE). The commands run in
the caller's environment (no thread settings added: what a user's shell gives them).

Target: at most 0.15 CPU-s per command with bytecode (numpy's own import is some 0.10 with
one BLAS thread, twice that with its default of one per core on two cores).

    .venv/bin/python benchmarks/cli_speed.py [--baseline REV] [--rounds 7]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sidebyside import child_cpu, parse_args, ratio, trees  # noqa: E402

COMMANDS = {
    "plan --json": ["plan", "--model", "llama-3-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--json"],
    "gpus": ["gpus"],
    "models": ["models"],
}
TARGET = 0.15


def env_for(src: Path) -> dict[str, str]:
    """The caller's environment with `src` on the path (and nothing else added)."""
    return {**os.environ, "PYTHONPATH": str(src)}


def main() -> None:
    args = parse_args(__doc__)
    with trees(args) as (srcs, label), tempfile.TemporaryDirectory(prefix="trainplan-pyc-") as pyc:
        envs = {}
        for name, src in srcs.items():
            with_pyc = env_for(src)
            with_pyc.pop("PYTHONDONTWRITEBYTECODE", None)
            with_pyc["PYTHONPYCACHEPREFIX"] = pyc
            without = env_for(src)
            without["PYTHONDONTWRITEBYTECODE"] = "1"
            without.pop("PYTHONPYCACHEPREFIX", None)
            envs[name] = {".pyc": with_pyc, "no .pyc": without}
            for cmd in COMMANDS.values():  # compile once, fill the catalog index
                child_cpu([sys.executable, "-m", "trainplan", *cmd], with_pyc)
        cpu = {(t, m, c): [] for t in srcs for m in (".pyc", "no .pyc") for c in COMMANDS}
        for _ in range(args.rounds):
            for cname, cmd in COMMANDS.items():
                for mode in (".pyc", "no .pyc"):
                    for tname in srcs:
                        seconds, _ = child_cpu([sys.executable, "-m", "trainplan", *cmd], envs[tname][mode])
                        cpu[tname, mode, cname].append(seconds)
    med = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"CPU seconds per command (user + system), median of {args.rounds} alternating runs"
          + (f"; baseline {label}" if label else ""))
    head = f"{'command':<14s} {'bytecode':<9s} {'this tree':>10s}"
    if label:
        head += f" {'baseline':>10s} {'ratio':>7s}"
    print(head + f"   target <= {TARGET} (with .pyc)")
    for cname in COMMANDS:
        for mode in (".pyc", "no .pyc"):
            line = f"{cname:<14s} {mode:<9s} {med['this tree', mode, cname]:>10.3f}"
            if label:
                line += (f" {med['baseline', mode, cname]:>10.3f}"
                         f" {ratio(med['this tree', mode, cname], med['baseline', mode, cname]):>7s}")
            print(line)
    scale = []
    for what, extra in (("", {}), (" with OPENBLAS_NUM_THREADS=1", {"OPENBLAS_NUM_THREADS": "1"})):
        numpy_cpu = statistics.median(child_cpu([sys.executable, "-c", "import numpy"], {**os.environ, **extra})[0]
                                      for _ in range(args.rounds))
        scale.append(f"{numpy_cpu:.3f} CPU-s{what}")
    print(f"for scale: `python -c 'import numpy'` {', '.join(scale)}")


if __name__ == "__main__":
    main()
