"""Load on /api/plan: 20 concurrent clients on loopback for 30 s (bounded), p50/p99 latency
and errors. Target: p99 under 50 ms, zero errors.

    .venv/bin/python benchmarks/web_load.py [--seconds 30] [--clients 20]
"""

from __future__ import annotations

import argparse
import http.client
import json
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--distinct", action="store_true",
                    help="every request a different layout (no response-cache hits): the worst case")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The server in its own processes, as `trainplan serve` runs; the clients keep-alive.
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "trainplan.web.app:app", "--host", "127.0.0.1",
                               "--port", str(port), "--workers", str(args.workers), "--log-level", "warning"])
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    for body in BODIES:  # warm each worker's catalogs
        for _ in range(args.workers * 2):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("POST", "/api/plan", json.dumps(body), {"Content-Type": "application/json"})
            conn.getresponse().read()
            conn.close()
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + args.seconds

    def client(i: int) -> None:
        n = 0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        while time.monotonic() < deadline and n < 100_000:  # bounded in time and count
            base = BODIES[(i + n) % len(BODIES)]
            # distinct: vary the global batch so no two requests are the same plan
            body = json.dumps({**base, "gbs": 64 * (1 + (i * 100_000 + n) % 4096)} if args.distinct else base)
            t0 = time.perf_counter()
            try:
                conn.request("POST", "/api/plan", body, {"Content-Type": "application/json"})
                res = conn.getresponse()
                res.read()
                ok = res.status == 200
            except Exception:
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)
                errors[0] += 0 if ok else 1
            n += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.terminate()
    server.wait(10)
    lat = sorted(latencies)
    p50 = statistics.median(lat) * 1e3
    p99 = lat[int(0.99 * (len(lat) - 1))] * 1e3
    print(f"{args.clients} clients x {args.seconds:.0f} s on loopback: {len(lat)} requests "
          f"({len(lat) / args.seconds:.0f}/s), p50 {p50:.1f} ms, p99 {p99:.1f} ms, errors {errors[0]}"
          f"   target: p99 < 50 ms, 0 errors")


if __name__ == "__main__":
    main()
