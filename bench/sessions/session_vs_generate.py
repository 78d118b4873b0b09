#!/usr/bin/python3
"""Time to first token and prefill tokens per turn of a growing chat, as one
Generation.Session vs a fresh Generate over the same conversation, in the
same run (docs/SERVICES.md "Sessions"). Each turn runs the session first,
then Generate with the conversation the session holds; the two answers must
be identical (greedy). Prints a Markdown table.

  bench/sessions/session_vs_generate.py --router 127.0.0.1:50050 \
      --stubs build/proto/python [--turns 5] [--max_tokens 96] [--repeats 3]
"""
import argparse
import statistics
import sys
import time

QUESTIONS = [
    "Multiply 7315 by 46.",
    "Now add 1289 to the result.",
    "Reverse the word 'speculative'.",
    "Sort these numbers: 42 7 19 3 88.",
    "Count the vowels in 'multi-turn session'.",
    "Multiply 12 by 12.",
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--router", required=True)
    p.add_argument("--stubs", required=True)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--max_tokens", type=int, default=96)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--passes", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    sys.path.insert(0, args.stubs)
    import queue
    import grpc
    from dedit.v1 import generation_pb2, services_pb2_grpc

    channel = grpc.insecure_channel(args.router)
    stub = services_pb2_grpc.GenerationStub(channel)
    # [turn] -> lists over repeats
    rows = [dict(s_ttft=[], g_ttft=[], s_prefill=0, g_prefill=0, prompt=0)
            for _ in range(args.turns)]
    for _ in range(args.repeats):
        requests = queue.Queue()

        def stream():
            while True:
                r = requests.get()
                if r is None:
                    return
                yield r

        responses = stub.Session(stream(), timeout=600)
        o = generation_pb2.SessionRequest()
        o.open.window = args.window
        o.open.passes = args.passes
        requests.put(o)
        next(responses)
        conversation = []
        for t in range(args.turns):
            q = QUESTIONS[t % len(QUESTIONS)]
            turn = generation_pb2.SessionRequest()
            turn.turn.max_tokens = args.max_tokens
            turn.turn.chat.messages.add(role="user", content=q)
            t0 = time.perf_counter()
            requests.put(turn)
            ttft, text = None, ""
            for r in responses:
                if ttft is None and r.response.token_ids:
                    ttft = time.perf_counter() - t0
                text += r.response.text
                if r.response.finished:
                    usage = r.response.usage
                    break
            conversation.append(("user", q))
            g = generation_pb2.GenerateRequest(max_tokens=args.max_tokens,
                                               window=args.window,
                                               passes=args.passes)
            for role, content in conversation:
                g.chat.messages.add(role=role, content=content)
            t0 = time.perf_counter()
            g_ttft, g_text = None, ""
            for r in stub.Generate(g, timeout=600):
                if g_ttft is None and r.token_ids:
                    g_ttft = time.perf_counter() - t0
                g_text += r.text
                if r.finished:
                    g_usage = r.usage
            if g_text != text:
                raise SystemExit("turn %d: session and Generate differ:\n%r\n%r"
                                 % (t + 1, text, g_text))
            conversation.append(("assistant", text))
            row = rows[t]
            row["s_ttft"].append(ttft)
            row["g_ttft"].append(g_ttft)
            row["prompt"] = usage.prompt_tokens
            row["s_prefill"] = usage.prompt_tokens - usage.cached_prompt_tokens
            row["g_prefill"] = g_usage.prompt_tokens
        c = generation_pb2.SessionRequest()
        c.close.SetInParent()
        requests.put(c)
        requests.put(None)
        for _ in responses:
            pass
    print("| turn | prompt tokens | prefilled: session | prefilled: Generate "
          "| TTFT session (ms) | TTFT Generate (ms) |")
    print("|---|---|---|---|---|---|")
    for t, row in enumerate(rows):
        print("| %d | %d | %d | %d | %.1f | %.1f |" % (
            t + 1, row["prompt"], row["s_prefill"], row["g_prefill"],
            1000 * statistics.median(row["s_ttft"]),
            1000 * statistics.median(row["g_ttft"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
