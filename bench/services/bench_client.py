#!/usr/bin/python3
"""Load generator for dedit-router: N concurrent streaming clients.

Each client sends `--requests` requests (token-id prompts, ignore_eos, a
fixed number of new tokens) one after another. Reports, as one JSON line:
  decode time per output token  (first token → last token) / (tokens - 1),
                                 mean over requests — the protocol's
                                 decode-only number, prefill excluded;
  throughput                    all generated tokens / wall time;
  mean acceptance length, TTFT.

  bench_client.py --router 127.0.0.1:50050 --stubs build-svc/proto/python \
      --concurrency 4 --requests 4 --max-tokens 64 --window 16 --passes 3
"""
import argparse
import json
import random
import sys
import threading
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--router", required=True)
    p.add_argument("--stubs", required=True)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--requests", type=int, default=4, help="per client")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--no-speculation", action="store_true")
    p.add_argument("--method", choices=["model", "ngram"], default="model",
                   help="who drafts (speculative_method)")
    p.add_argument("--prompts", default="",
                   help="JSON lines of prompt ids (default: random ids)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    sys.path.insert(0, a.stubs)
    import grpc
    from dedit.v1 import generation_pb2, services_pb2_grpc

    channel = grpc.insecure_channel(a.router)
    stub = services_pb2_grpc.GenerationStub(channel)
    rng = random.Random(a.seed)
    if a.prompts:
        given = [json.loads(l) for l in open(a.prompts) if l.strip()]
        prompts = [given[i % len(given)]
                   for i in range(a.concurrency * a.requests)]
    else:
        prompts = [[rng.randrange(a.vocab) for _ in range(a.prompt_len)]
                   for _ in range(a.concurrency * a.requests)]
    method = (generation_pb2.SPECULATIVE_METHOD_NGRAM if a.method == "ngram"
              else generation_pb2.SPECULATIVE_METHOD_MODEL)
    per_token, ttfts, taus, tokens_total = [], [], [], [0]
    lock = threading.Lock()
    errors = []

    def client(c):
        for r in range(a.requests):
            req = generation_pb2.GenerateRequest(
                max_tokens=a.max_tokens, ignore_eos=True, window=a.window,
                passes=0 if a.method == "ngram" else a.passes,
                disable_speculation=a.no_speculation,
                speculative_method=method)
            req.token_ids.ids.extend(prompts[c * a.requests + r])
            t0 = time.perf_counter()
            first = last = None
            n = 0
            final = None
            try:
                for resp in stub.Generate(req, timeout=600):
                    now = time.perf_counter()
                    if resp.token_ids:
                        if first is None:
                            first = now
                        last = now
                        n += len(resp.token_ids)
                    if resp.finished:
                        final = resp
            except grpc.RpcError as e:
                with lock:
                    errors.append(str(e.code()))
                continue
            with lock:
                tokens_total[0] += n
                ttfts.append(first - t0)
                if n > 1:
                    per_token.append((last - first) / (n - 1))
                taus.append(final.acceptance.mean_acceptance_length)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,))
               for c in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0
    print(json.dumps({
        "concurrency": a.concurrency,
        "requests": len(per_token),
        "errors": errors,
        "speculative": not a.no_speculation,
        "method": a.method, "window": a.window, "passes": a.passes,
        "decode_ms_per_token": 1000 * mean(per_token),
        "throughput_tokens_per_s": tokens_total[0] / wall,
        "mean_ttft_ms": 1000 * mean(ttfts),
        "mean_acceptance_length": mean(taus),
    }))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
