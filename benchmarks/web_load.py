"""Load on the web API, against a real uvicorn server on loopback (bounded in time and count;
stops by itself).

Cheap only (default): 20 concurrent keep-alive clients of /api/plan for 30 s, p50/p99 latency
and errors. Target: p99 under 50 ms, zero errors.

Mixed (--mixed): the same cheap clients while 10 heavy clients run comparisons (DeepSeek-V3
on 2,048 GPUs, every accelerator) and searches, one server process as `trainplan serve` runs
it. Reports the cheap plans' p50/p99 and errors, the heavy requests answered, shed (503, with
Retry-After) and failed, and the server's resident memory (VmRSS now, VmHWM peak, from
/proc/<pid>/status, its own and its worker processes'). Target: cheap p99 under 100 ms, zero
errors.

    .venv/bin/python benchmarks/web_load.py [--seconds 30] [--clients 20] [--distinct]
    .venv/bin/python benchmarks/web_load.py --mixed [--seconds 30] [--heavy 10]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

BODIES = [
    {"model": "llama-3-70b", "gpus": 64, "tp": 8, "pp": 4, "gbs": 64},
    {"model": "llama-3-8b", "gpus": 8, "zero": 3, "framework": "fsdp", "gbs": 64},
    {"model": "mixtral-8x7b", "gpus": 16, "tp": 2, "ep": 8, "zero": 1, "gbs": 64},
    {"model": "gpt2-xl", "gpus": 1, "precision": "fp32", "gbs": 64},
]
HEAVY = [
    ("/api/compare", {"model": "deepseek-v3", "gpus": 2048, "compare_gpus": "all"}),
    ("/api/search", {"model": "deepseek-v3", "gpus": 2048, "top": 5}),
    ("/api/search", {"model": "llama-3.1-405b", "gpus": 1024, "top": 5}),
    ("/api/compare", {"model": "llama-3-70b", "gpus": 512, "compare_gpus": "all"}),
]
HEADERS = {"Content-Type": "application/json"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of one process, KiB (empty if it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def _children(pid: int) -> list[int]:
    """Every descendant of `pid` (its worker processes), from /proc/*/stat."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parent[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        frontier += kids
    return found


class Memory:
    """Samples the server's resident memory while the load runs."""

    def __init__(self, pid: int):
        self.pid, self.server_hwm, self.children_peak, self.server_rss = pid, 0, 0, 0

    def sample(self) -> None:
        own = _status_kib(self.pid)
        self.server_rss = own.get("VmRSS", self.server_rss)
        self.server_hwm = max(self.server_hwm, own.get("VmHWM", 0))
        kids = sum(_status_kib(c).get("VmRSS", 0) for c in _children(self.pid))
        self.children_peak = max(self.children_peak, kids)


def _wait_up(port: int) -> None:
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the server did not start")


def _post(conn, path: str, body: str):
    conn.request("POST", path, body, HEADERS)
    res = conn.getresponse()
    res.read()
    return res.status


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--workers", type=int, default=None, help="uvicorn worker processes (default 2; 1 with --mixed)")
    ap.add_argument("--distinct", action="store_true",
                    help="every request a different layout (no response-cache hits): the worst case")
    ap.add_argument("--mixed", action="store_true", help="heavy comparisons and searches beside the cheap plans")
    ap.add_argument("--heavy", type=int, default=10, help="heavy clients with --mixed")
    args = ap.parse_args()
    workers = args.workers or (1 if args.mixed else 2)
    port = _free_port()
    # The server in its own processes, as `trainplan serve` runs; the clients keep-alive.
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "trainplan.web.app:app", "--host", "127.0.0.1",
                               "--port", str(port), "--workers", str(workers), "--log-level", "warning"])
    try:
        _wait_up(port)
        for body in BODIES:  # warm each worker's catalogs
            for _ in range(workers * 2):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                _post(conn, "/api/plan", json.dumps(body))
                conn.close()
        run(args, port, server.pid)
    finally:
        server.terminate()
        server.wait(30)


def run(args, port: int, pid: int) -> None:
    latencies: list[float] = []
    errors = [0]
    heavy = {"ok": 0, "shed": 0, "failed": 0, "seconds": [], "statuses": {}}
    lock = threading.Lock()
    start = time.monotonic()
    deadline = start + args.seconds

    def client(i: int) -> None:
        n = 0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        while time.monotonic() < deadline and n < 100_000:  # bounded in time and count
            base = BODIES[(i + n) % len(BODIES)]
            # distinct: vary the global batch so no two requests are the same plan
            body = json.dumps({**base, "gbs": 64 * (1 + (i * 100_000 + n) % 4096)} if args.distinct else base)
            t0 = time.perf_counter()
            try:
                ok = _post(conn, "/api/plan", body) == 200
            except Exception:
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)
                errors[0] += 0 if ok else 1
            n += 1

    def heavy_client(i: int) -> None:
        n = 0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=args.seconds + 60)
        while time.monotonic() < deadline and n < 1_000:
            path, body = HEAVY[(i + n) % len(HEAVY)]
            t0 = time.perf_counter()
            try:
                status = _post(conn, path, json.dumps(body))
            except Exception:
                status = None
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=args.seconds + 60)
            with lock:
                kind = "ok" if status == 200 else "shed" if status == 503 else "failed"
                heavy[kind] += 1
                heavy["statuses"][status] = heavy["statuses"].get(status, 0) + 1
                if status == 200:
                    heavy["seconds"].append(time.perf_counter() - t0)
            if status == 503:
                time.sleep(1.0)  # as Retry-After asks (bounded: the loop ends at the deadline)
            n += 1

    memory = Memory(pid)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    if args.mixed:
        threads += [threading.Thread(target=heavy_client, args=(i,)) for i in range(args.heavy)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        memory.sample()
        time.sleep(0.5)
    for t in threads:
        t.join()
    memory.sample()
    elapsed = time.monotonic() - start
    lat = sorted(latencies)
    p50 = statistics.median(lat) * 1e3
    p99 = lat[int(0.99 * (len(lat) - 1))] * 1e3
    target = "p99 < 100 ms, 0 errors" if args.mixed else "p99 < 50 ms, 0 errors"
    print(f"{args.clients} clients of /api/plan x {args.seconds:.0f} s on loopback: {len(lat)} requests "
          f"({len(lat) / elapsed:.0f}/s), p50 {p50:.1f} ms, p99 {p99:.1f} ms, errors {errors[0]}   target: {target}")
    if args.mixed:
        took = statistics.median(heavy["seconds"]) if heavy["seconds"] else float("nan")
        print(f"{args.heavy} heavy clients (compare / search): {heavy['ok']} answered (median {took:.1f} s), "
              f"{heavy['shed']} shed with 503, {heavy['failed']} failed or timed out (by status: {heavy['statuses']})")
    print(f"server memory: VmRSS {memory.server_rss / 1024:.0f} MiB, VmHWM {memory.server_hwm / 1024:.0f} MiB; "
          f"its worker processes' peak VmRSS {memory.children_peak / 1024:.0f} MiB (wall {elapsed:.0f} s)")


if __name__ == "__main__":
    main()
