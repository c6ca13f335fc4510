"""The server's --stripe-join-timeout: a MultiplyStream call that joins a
striped multiply nobody started fails NOT_FOUND once the flag's time has
passed, not after the default 10 s."""

import os
import time

import grpc
import pytest

from conftest import ServerProcess
from matmul_client._proto.matmul.v1 import matmul_pb2, matmul_pb2_grpc


@pytest.fixture(scope="module")
def short_join_server():
    server = ServerProcess("--stripe-join-timeout", "300ms")
    yield server
    status = server.stop()
    assert status == 0, server.output()


def test_join_without_a_start_fails_not_found_after_the_flags_time(short_join_server):
    with grpc.insecure_channel(short_join_server.target) as channel:
        stub = matmul_pb2_grpc.MatmulServiceStub(channel)
        join = matmul_pb2.MultiplyStreamRequest(
            request_id=1,
            join=matmul_pb2.MultiplyStreamJoin(stripe_key=os.urandom(32)))
        started = time.monotonic()
        responses = list(stub.MultiplyStream(iter([join]), timeout=30))
        waited = time.monotonic() - started
    # The stream carries the failure as the request's error message.
    assert len(responses) == 1, responses
    error = responses[0]
    assert error.request_id == 1
    assert error.WhichOneof("kind") == "error", error
    assert error.error.code == grpc.StatusCode.NOT_FOUND.value[0], error
    # The join waited for a start (at least the flag's 300 ms), and gave up
    # well before the 10 s default.
    assert 0.25 <= waited < 8, waited
