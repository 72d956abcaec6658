"""One client process of the classic benchmark: closed-loop tritonclient threads, single-row requests.

Started by `bench_servers.py`, never by hand. Connects, warms up, prints `ready`, waits for a
line on stdin, then runs `--threads` threads (each with its own client) until `--duration-s`
passes or `--max-requests` have been sent in total, and prints one JSON line: latencies (s),
errors, the first error's text, the wall time of the run and the process's own CPU seconds in
it. Bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time
from collections.abc import Callable

import numpy as np


def grpc_call(url: str, model: str, input_name: str, output: str) -> Callable[[np.ndarray], None]:
    import tritonclient.grpc as g

    client = g.InferenceServerClient(url)
    wanted = [g.InferRequestedOutput(output)]

    def call(x: np.ndarray) -> None:
        inp = g.InferInput(input_name, list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        client.infer(model, [inp], outputs=wanted)
    return call


def http_call(url: str, model: str, input_name: str, output: str) -> Callable[[np.ndarray], None]:
    import tritonclient.http as h

    client = h.InferenceServerClient(url)
    wanted = [h.InferRequestedOutput(output, binary_data=True)]

    def call(x: np.ndarray) -> None:
        inp = h.InferInput(input_name, list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        client.infer(model, [inp], outputs=wanted)
    return call


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--proto", choices=("grpc", "http"), required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--data", required=True, help=".npy of single-row inputs, batch dimension first")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--duration-s", type=float, required=True)
    p.add_argument("--max-requests", type=int, required=True)
    args = p.parse_args()
    xs = np.load(args.data)
    make = grpc_call if args.proto == "grpc" else http_call
    latencies: list[list[float]] = [[] for _ in range(args.threads)]
    errors: list[str] = []
    budget = threading.Semaphore(args.max_requests)
    warmed = threading.Barrier(args.threads + 1)
    go = threading.Event()
    deadline = [0.0]

    def worker(i: int) -> None:
        # Each thread makes and warms its own client: tritonclient.http's gevent client stays on its thread.
        call = make(args.url, args.model, args.input, args.output)
        call(xs[:1])
        warmed.wait()
        go.wait()
        lat, n = latencies[i], i
        while time.perf_counter() < deadline[0] and budget.acquire(blocking=False):
            x = xs[n % len(xs)][None]
            t0 = time.perf_counter()
            try:
                call(x)
            except Exception as exc:  # counted and reported, never retried
                errors.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            lat.append(time.perf_counter() - t0)
            n += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(args.threads)]
    for t in threads:
        t.start()
    warmed.wait(timeout=60)
    print("ready", flush=True)
    sys.stdin.readline()
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    deadline[0] = start + args.duration_s
    go.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    print(json.dumps({"latencies": [x for per in latencies for x in per], "errors": len(errors),
                      "first_error": errors[0] if errors else None, "elapsed_s": elapsed, "cpu_s": cpu_s}), flush=True)


if __name__ == "__main__":
    main()
