#!/usr/bin/python3
"""Streams a generation from dedit-router with Debian's python3-grpcio and
stubs generated from proto/dedit/v1 (the API is usable outside C++).

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

    print("python client OK: %d tokens, %r, mean acceptance length %.2f" %
          (len(ids), text, last.acceptance.mean_acceptance_length))
    return 0


if __name__ == "__main__":
    sys.exit(main())
