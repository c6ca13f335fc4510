"""Client TLS and mutual TLS, against an in-process Python gRPC server that
serves grpc.health.v1 with certificates made by the openssl command (skipped
where there is none); and TLS against the plaintext matmul-server."""

from __future__ import annotations

import concurrent.futures
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Iterator

import grpc
import numpy as np
import pytest

from conftest import ENGINES, make_client
from matmul_client import Client, MatmulError, TlsConfig
from matmul_client._proto.grpc.health.v1 import health_pb2, health_pb2_grpc
from matmul_client._proto.matmul.v1 import matmul_pb2, matmul_pb2_grpc

SERVER_NAME = "matmul.test"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificate(directory: Path, name: str, ca: str, extensions: str) -> None:
    """name.key and name.pem, signed by ca.key/ca.pem."""
    (directory / f"{name}.ext").write_text(extensions)
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=directory)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "1", "-out", f"{name}.pem", "-extfile", f"{name}.ext",
            cwd=directory)


def make_ca(directory: Path, name: str) -> None:
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "1", "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE", cwd=directory)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Dict[str, bytes]:
    """PEM files: a CA, a server and a client certificate it signed, and an
    unrelated CA."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make certificates with")
    directory = tmp_path_factory.mktemp("pki")
    make_ca(directory, "ca")
    make_ca(directory, "other-ca")
    make_certificate(directory, "server", "ca",
                     f"subjectAltName=DNS:{SERVER_NAME}\nextendedKeyUsage=serverAuth\n")
    make_certificate(directory, "client", "ca", "extendedKeyUsage=clientAuth\n")
    return {path.name: path.read_bytes() for path in directory.iterdir()}


class _Health(health_pb2_grpc.HealthServicer):
    def Check(self, request, context):
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


class _Matmul(matmul_pb2_grpc.MatmulServiceServicer):
    """Multiply of float32 matrices (no transposes), as the server answers it."""

    def Multiply(self, request, context):  # noqa: N802 - the RPC's name
        a = np.frombuffer(request.a.data, "<f4").reshape(tuple(request.a.shape))
        b = np.frombuffer(request.b.data, "<f4").reshape(tuple(request.b.shape))
        c = (a @ b).astype("<f4")
        return matmul_pb2.MultiplyResponse(
            c=matmul_pb2.Tensor(shape=c.shape, dtype=matmul_pb2.DTYPE_FLOAT32, data=c.tobytes())
        )


@pytest.fixture(scope="module")
def mtls_target(pki) -> Iterator[str]:
    """A health server on loopback that requires client certificates signed by the CA."""
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(_Health(), server)
    matmul_pb2_grpc.add_MatmulServiceServicer_to_server(_Matmul(), server)
    credentials = grpc.ssl_server_credentials(
        [(pki["server.key"], pki["server.pem"])],
        root_certificates=pki["ca.pem"],
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def test_mutual_tls(pki, mtls_target: str) -> None:
    tls = TlsConfig(pki["ca.pem"], pki["client.pem"], pki["client.key"], server_name=SERVER_NAME)
    with Client(mtls_target, timeout=30, tls=tls) as client:
        assert client.health() == "SERVING"


def test_mutual_tls_from_a_mapping_of_files(pki, mtls_target: str, tmp_path) -> None:
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_bytes(pki[name])
    tls = TlsConfig.from_files(tmp_path / "ca.pem", tmp_path / "client.pem", tmp_path / "client.key")
    fields = {"root_certificates": tls.root_certificates, "certificate_chain": tls.certificate_chain,
              "private_key": tls.private_key, "server_name": SERVER_NAME}
    with Client(mtls_target, timeout=30, tls=fields) as client:
        assert client.health() == "SERVING"


@pytest.mark.parametrize("case", ["no_client_certificate", "unknown_server_ca", "wrong_server_name"])
def test_tls_failures_are_unavailable(pki, mtls_target: str, case: str) -> None:
    tls = {
        "no_client_certificate": TlsConfig(pki["ca.pem"], server_name=SERVER_NAME),
        "unknown_server_ca": TlsConfig(pki["other-ca.pem"], pki["client.pem"], pki["client.key"],
                                       server_name=SERVER_NAME),
        "wrong_server_name": TlsConfig(pki["ca.pem"], pki["client.pem"], pki["client.key"],
                                       server_name="other.test"),
    }[case]
    with Client(mtls_target, timeout=30, tls=tls) as client:
        with pytest.raises(MatmulError) as raised:
            client.health()
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE


def test_tls_to_plaintext_server_is_unavailable(server) -> None:
    with Client(server.target, timeout=30, tls=True) as client:
        with pytest.raises(MatmulError) as raised:
            client.health()
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE


_A = np.arange(6, dtype=np.float32).reshape(2, 3)
_B = np.arange(12, dtype=np.float32).reshape(3, 4)


@pytest.mark.parametrize("engine", ENGINES)
def test_multiply_over_mutual_tls(pki, mtls_target: str, engine: str) -> None:
    """The native core takes the same TLS settings (roots, client
    certificate, server_name) as the pure-Python channel."""
    tls = TlsConfig(pki["ca.pem"], pki["client.pem"], pki["client.key"], server_name=SERVER_NAME)
    with make_client(mtls_target, engine, timeout=30, tls=tls) as client:
        np.testing.assert_array_equal(client.multiply(_A, _B), _A @ _B)
        np.testing.assert_array_equal(client.multiply_async(_A, _B).result(timeout=30), _A @ _B)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", ["no_client_certificate", "unknown_server_ca", "wrong_server_name"])
def test_multiply_tls_failures_are_unavailable(pki, mtls_target: str, engine: str, case: str) -> None:
    tls = {
        "no_client_certificate": TlsConfig(pki["ca.pem"], server_name=SERVER_NAME),
        "unknown_server_ca": TlsConfig(pki["other-ca.pem"], pki["client.pem"], pki["client.key"],
                                       server_name=SERVER_NAME),
        "wrong_server_name": TlsConfig(pki["ca.pem"], pki["client.pem"], pki["client.key"],
                                       server_name="other.test"),
    }[case]
    with make_client(mtls_target, engine, timeout=30, tls=tls) as client:
        with pytest.raises(MatmulError) as raised:
            client.multiply(_A, _B)
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
