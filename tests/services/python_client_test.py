#!/usr/bin/python3
"""Streams a generation from dedit-router with Debian's python3-grpcio and
stubs generated from proto/dedit/v1 (the API is usable outside C++), then
runs a three-turn chat session (Generation.Session).

  python_client_test.py --router 127.0.0.1:50050 --stubs build/proto/python
"""
import argparse
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--router", required=True)
    parser.add_argument("--stubs", required=True,
                        help="folder with the generated *_pb2*.py modules")
    args = parser.parse_args()
    sys.path.insert(0, args.stubs)

    import grpc
    from dedit.v1 import generation_pb2, services_pb2_grpc

    with grpc.insecure_channel(args.router) as channel:
        stub = services_pb2_grpc.GenerationStub(channel)
        models = stub.ListModels(generation_pb2.ListModelsRequest(), timeout=10)
        assert len(models.models) == 1, models
        name = models.models[0].name

        request = generation_pb2.GenerateRequest(
            model=name, text="Hello from Python", max_tokens=16,
            ignore_eos=True, window=8, passes=2)
        request.sampling.temperature = 0.0
        ids, text, last = [], "", None
        for response in stub.Generate(request, timeout=60):
            ids.extend(response.token_ids)
            text += response.text
            if response.finished:
                last = response
        assert last is not None, "no final message"
        assert len(ids) == 16, ids
        assert last.usage.completion_tokens == 16, last.usage
        assert last.finish_reason == generation_pb2.FINISH_REASON_LENGTH
        assert last.acceptance.rounds > 0, last.acceptance

        # Errors arrive as gRPC status codes.
        bad = generation_pb2.GenerateRequest(text="x", max_tokens=0)
        try:
            for _ in stub.Generate(bad, timeout=10):
                pass
            raise AssertionError("max_tokens=0 was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e

        session_turns = chat_session(stub, generation_pb2)

    print("python client OK: %d tokens, %r, mean acceptance length %.2f" %
          (len(ids), text, last.acceptance.mean_acceptance_length))
    print("python session OK: " + "; ".join(
        "turn %d: %d prompt tokens, %d cached" % t for t in session_turns))
    return 0


def chat_session(stub, generation_pb2):
    """A multi-turn chat over Generation.Session: the router keeps the
    conversation and the target its KV cache, so each turn after the first
    prefills only its new tokens (usage.cached_prompt_tokens)."""
    import queue
    requests = queue.Queue()

    def request_stream():
        while True:
            request = requests.get()
            if request is None:
                return
            yield request

    responses = stub.Session(request_stream(), timeout=120)
    open_request = generation_pb2.SessionRequest()
    open_request.open.window = 8
    open_request.open.passes = 2
    open_request.open.ignore_eos = True
    requests.put(open_request)
    opened = next(responses)
    assert opened.HasField("opened"), opened
    turns = []
    for question in ["Hello!", "Tell me more.", "Thanks."]:
        turn = generation_pb2.SessionRequest()
        turn.turn.max_tokens = 8
        turn.turn.chat.messages.add(role="user", content=question)
        requests.put(turn)
        answer = ""
        for response in responses:
            if response.HasField("turn_error"):
                # A refused turn fails alone; the session stays open.
                raise RuntimeError(f"turn {response.turn} refused: "
                                   f"{response.turn_error.message}")
            answer += response.response.text
            if response.response.finished:
                usage = response.response.usage
                turns.append((response.turn, usage.prompt_tokens,
                              usage.cached_prompt_tokens))
                break
        assert usage.completion_tokens == 8, usage
    assert turns[0][2] == 0 and turns[1][2] > 0 and turns[2][2] > 0, turns
    close = generation_pb2.SessionRequest()
    close.close.SetInParent()
    requests.put(close)
    requests.put(None)
    for _ in responses:  # the server ends the stream OK
        pass
    return turns


if __name__ == "__main__":
    sys.exit(main())
