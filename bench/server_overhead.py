"""What the HTTP server costs over the engine: decode tokens/s and time to first token.

Direct: the engine in this process (add_request + step loop), greedy, ignore_eos, N new tokens.
HTTP:   `ninfer serve` in its own process with the same model and flags, driven by a streaming
        client (httpx) from this process: POST /v1/chat/completions, stream=true, the same prompt.
Both render the same chat prompt. Decode rate = (N - 1) / (last token - first token); TTFT =
request sent -> first token chunk received (HTTP) vs add_request -> first token out (direct).
Runs alternate direct/HTTP so that machine noise hits both; medians are reported. The server's
own request log (JSON lines on its stderr) splits the HTTP TTFT into server-side time (arrival ->
first token handed to the HTTP layer, and the parse/render/tokenize part of it) and the rest
(socket, client).

`--threads` (default 1) sets torch's intra-op threads on both sides. On a small CPU box, OpenMP
threads spread over every core collapse when any other process runs: on the 2-core CI machine a
second process using 2% of a core cut the direct engine from 99 to 26 tok/s (measured). The HTTP
client is such a process, so with all cores given to torch the comparison measures the box, not
the server; one thread leaves a core to the client.

    python bench/server_overhead.py [--model tiny] [--device cpu] [--tokens 128] [--runs 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]


def direct_run(engine: Any, ids: list[int], n: int) -> tuple[float, float]:
    from ninfer.config import SamplingParams

    params = SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)
    t0 = time.perf_counter()
    rid = engine.add_request(ids, params)
    times = []
    done = False
    while not done:
        for out in engine.step():
            if out.request_id == rid:
                times.append(time.perf_counter())
                done = out.finished
    assert len(times) == n, len(times)
    return times[0] - t0, (n - 1) / (times[-1] - times[0])


def http_run(client: Any, url: str, model: str, n: int, thinking: bool) -> tuple[float, float, int]:
    body = {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "enable_thinking": thinking,
    }
    times = []
    usage = 0
    t0 = time.perf_counter()
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]["completion_tokens"]
            for ch in ev["choices"]:
                d = ch["delta"]
                if d.get("content") or d.get("reasoning_content"):
                    times.append(now)
    # a delta holds back text that may still become a tag (`</think>`, a stop string) or half a
    # character, so the chunk count can be a little under the token count: use the usage
    return times[0] - t0, (usage - 1) / (times[-1] - times[0]), usage


def start_server(args: argparse.Namespace, log: list[dict[str, Any]]) -> tuple[subprocess.Popen, str, str]:
    cmd = [
        sys.executable, "-m", "ninfer.cli", "serve", "--model", args.model, "--device", args.device,
        "--port", "0", "--max-context", str(args.max_context), "--max-batch", "1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(r"serving (\S+) on (http://\S+)", line)
        if m:
            break
    else:
        raise SystemExit(f"the server did not start: {' '.join(cmd)}")

    def read_log() -> None:
        for line in proc.stderr:
            if line.startswith("{"):
                log.append(json.loads(line))

    threading.Thread(target=read_log, daemon=True).start()
    return proc, m.group(2), m.group(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-context", type=int, default=1024)
    ap.add_argument("--thinking", action="store_true", help="render the prompt with thinking on (default off)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads on both sides (0: torch's default)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    import httpx
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from ninfer.cli import _resolve_model
    from ninfer.config import EngineConfig
    from ninfer.startup import build_engine

    engine = build_engine(
        EngineConfig(model=_resolve_model(args.model), device=args.device, max_context=args.max_context, max_batch=1)
    )
    ids = engine.tokenizer.encode(engine.chat.render(MESSAGES, enable_thinking=args.thinking))
    log: list[dict[str, Any]] = []
    proc, url, model = start_server(args, log)
    try:
        with httpx.Client(timeout=300) as client:
            direct_run(engine, ids, 8)  # warm both paths up
            http_run(client, url, model, 8, args.thinking)
            d_ttft, d_rate, h_ttft, h_rate = [], [], [], []
            for _ in range(args.runs):
                t, r = direct_run(engine, ids, args.tokens)
                d_ttft.append(t)
                d_rate.append(r)
                t, r, n = http_run(client, url, model, args.tokens, args.thinking)
                assert n == args.tokens, n
                h_ttft.append(t)
                h_rate.append(r)
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    med = statistics.median
    served = [x for x in log if x.get("path") == "/v1/chat/completions" and x.get("completion_tokens") == args.tokens]
    result = {
        "model": model,
        "device": engine.info.get("device"),
        "prompt_tokens": len(ids),
        "new_tokens": args.tokens,
        "runs": args.runs,
        "direct_decode_tok_s": round(med(d_rate), 2),
        "http_decode_tok_s": round(med(h_rate), 2),
        "http_share": round(med(h_rate) / med(d_rate), 4),
        "direct_ttft_ms": round(med(d_ttft) * 1e3, 3),
        "http_ttft_ms": round(med(h_ttft) * 1e3, 3),
        "ttft_overhead_ms": round((med(h_ttft) - med(d_ttft)) * 1e3, 3),
        "server_ttft_ms": round(med(x["ttft_ms"] for x in served), 3) if served else None,
        "server_parse_ms": round(med(x["parse_ms"] for x in served), 3) if served else None,
        "threads": args.threads or torch.get_num_threads(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{model} on {result['device']}: {args.tokens} tokens x {args.runs} runs, prompt {len(ids)} tokens\n"
            f"decode  direct {result['direct_decode_tok_s']:.1f} tok/s   HTTP stream {result['http_decode_tok_s']:.1f} tok/s"
            f"   ({result['http_share']:.1%} of direct)\n"
            f"TTFT    direct {result['direct_ttft_ms']:.2f} ms   HTTP {result['http_ttft_ms']:.2f} ms"
            f"   (overhead {result['ttft_overhead_ms']:.2f} ms; server side {result['server_ttft_ms']} ms,"
            f" of which parse+render+tokenize {result['server_parse_ms']} ms)\n"
            f"torch intra-op threads {result['threads']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
