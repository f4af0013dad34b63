"""TLS between the SDK and ringod (``--tls-cert``/``--tls-key``/``--tls-client-ca``),
with certificate authorities made in the test (trustme)."""

from __future__ import annotations

import json
import pathlib
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import trio
import trustme

from ringo_trio import Ringo, RingoClient, Supervisor, Task, TaskContext, TaskState
from ringo_trio._endpoint import parse_endpoint
from ringo_trio._errors import InvalidArgumentError, UnavailableError
from ringo_trio._transport.grpclib import Transport
from ringo_trio.server import main as _main
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.processes import free_port
from tests._kit.workers import running, wait_states


@dataclass
class Pki:
    ca: pathlib.Path
    cert: pathlib.Path
    key: pathlib.Path
    client_ca: pathlib.Path
    client_cert: pathlib.Path
    client_key: pathlib.Path
    stranger_ca: pathlib.Path
    stranger_client: pathlib.Path  # certificate and key in one file


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A server CA and its 127.0.0.1 certificate, a client CA and one client's
    certificate, and an unrelated CA with a client certificate of its own."""
    root = tmp_path_factory.mktemp("pki")
    server_ca, client_ca, stranger_ca = trustme.CA(), trustme.CA(), trustme.CA()
    server = server_ca.issue_cert("127.0.0.1")
    client = client_ca.issue_cert("worker@example.com")
    stranger = stranger_ca.issue_cert("worker@example.com")
    pki = Pki(*(root / name for name in Pki.__dataclass_fields__))
    server_ca.cert_pem.write_to_path(pki.ca)
    server.cert_chain_pems[0].write_to_path(pki.cert)
    for pem in server.cert_chain_pems[1:]:
        pem.write_to_path(pki.cert, append=True)
    server.private_key_pem.write_to_path(pki.key)
    client_ca.cert_pem.write_to_path(pki.client_ca)
    client.cert_chain_pems[0].write_to_path(pki.client_cert)
    client.private_key_pem.write_to_path(pki.client_key)
    stranger_ca.cert_pem.write_to_path(pki.stranger_ca)
    stranger.private_key_and_cert_chain_pem.write_to_path(pki.stranger_client)
    return pki


def _tls_args(pki: Pki) -> list[str]:
    return ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key)]


@pytest.fixture
def tls_daemon(tmp_path: pathlib.Path, pki: Pki) -> Iterator[DaemonProcess]:
    with spawn_daemon(tmp_path / "tls", extra_args=_tls_args(pki)) as process:
        yield process


@pytest.fixture
def mtls_daemon(tmp_path: pathlib.Path, pki: Pki) -> Iterator[DaemonProcess]:
    args = [*_tls_args(pki), "--tls-client-ca", str(pki.client_ca)]
    with spawn_daemon(tmp_path / "mtls", extra_args=args) as process:
        yield process


async def _round_trip(client: RingoClient) -> None:
    """Enqueue a task and have a worker on the same client run it."""
    queue = client.queue("tls")
    task_id = (await queue.enqueue(task_type="t", payload=b"over TLS")).task.id
    seen: list[bytes] = []

    async def handle(task: Task, ctx: TaskContext) -> None:
        seen.append(task.payload)

    async with running(queue.worker(handle)):
        await wait_states(queue, [task_id], {TaskState.SUCCEEDED})
    assert seen == [b"over TLS"]


async def _refused(client: RingoClient) -> str:
    with pytest.raises(UnavailableError) as caught:
        async with client:
            pass
    return str(caught.value)


@pytest.mark.trio
async def test_a_client_trusting_the_daemons_ca_works(tls_daemon: DaemonProcess, pki: Pki) -> None:
    """Property: with --tls-cert/--tls-key the daemon serves gRPC over TLS, and a
    client given the CA that issued its certificate (tls_ca) enqueues and
    runs a worker through it; the ready line says so."""
    assert tls_daemon.info["tls"] is True
    assert tls_daemon.info["mutual_tls"] is False
    with trio.fail_after(30):
        for endpoint in (tls_daemon.endpoint, f"grpcs://{tls_daemon.endpoint}"):
            async with Ringo.connect(endpoint, tls_ca=pki.ca) as client:
                await _round_trip(client)


@pytest.mark.trio
async def test_a_plaintext_client_is_refused_by_a_tls_daemon(tls_daemon: DaemonProcess) -> None:
    """Property: a client speaking plaintext gRPC to a TLS daemon gets nowhere
    (UnavailableError), nothing travels in the clear."""
    with trio.fail_after(30):
        await _refused(Ringo.connect(f"grpc://{tls_daemon.endpoint}"))


@pytest.mark.trio
async def test_an_untrusted_daemon_certificate_is_refused_clearly(
    tls_daemon: DaemonProcess, pki: Pki
) -> None:
    """Property: a client trusting another CA, or only the system's, refuses the
    daemon's certificate with an error that says it is about TLS and the
    certificate, not a vague outage."""
    with trio.fail_after(30):
        for client in (
            Ringo.connect(tls_daemon.endpoint, tls_ca=pki.stranger_ca),
            Ringo.connect(f"grpcs://{tls_daemon.endpoint}"),
        ):
            message = await _refused(client)
            assert "TLS handshake failed" in message
            assert "CERTIFICATE_VERIFY_FAILED" in message


@pytest.mark.trio
async def test_a_tls_transport_whose_daemon_never_answered_closes_cleanly(pki: Pki) -> None:
    """Property: closing a TLS transport that never had a connection (the
    daemon was not there) neither fails nor waits for a TLS close that
    cannot come, and a second close is a no-op."""
    endpoint = parse_endpoint(f"grpcs://127.0.0.1:{free_port()}")
    endpoint = endpoint.with_tls(ssl.create_default_context(cafile=pki.ca))
    with trio.fail_after(30):
        async with Transport(endpoint) as transport:
            with pytest.raises(UnavailableError):
                await transport.health_check(rpc_timeout=5)
            await transport.aclose()
            await transport.aclose()


@pytest.mark.trio
async def test_mutual_tls_requires_a_client_certificate_from_its_ca(
    mtls_daemon: DaemonProcess, pki: Pki
) -> None:
    """Property: with --tls-client-ca the daemon refuses a client without a
    certificate and one whose certificate another CA issued, and serves a
    client presenting a certificate of that CA (tls_cert/tls_key)."""
    assert mtls_daemon.info["mutual_tls"] is True
    with trio.fail_after(30):
        for client in (
            Ringo.connect(mtls_daemon.endpoint, tls_ca=pki.ca),
            Ringo.connect(mtls_daemon.endpoint, tls_ca=pki.ca, tls_cert=pki.stranger_client),
        ):
            # TLS 1.3 finishes the client's side of the handshake before the
            # daemon checks its certificate: the client sees the connection
            # closed on its first call.
            await _refused(client)
        accepted = Ringo.connect(
            mtls_daemon.endpoint, tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key
        )
        async with accepted:
            await _round_trip(accepted)


def test_tls_options_are_checked_before_connecting(pki: Pki, tmp_path: pathlib.Path) -> None:
    """Property: TLS options that cannot work are refused by Ringo.connect at
    once: a plaintext scheme with TLS files, a key without its certificate, a
    missing or garbled file."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    for kwargs, fragment in (
        ({"endpoint": "grpc://127.0.0.1:1", "tls_ca": pki.ca}, "plaintext"),
        ({"endpoint": "127.0.0.1:1", "tls_key": pki.client_key}, "tls_key needs tls_cert"),
        ({"endpoint": "127.0.0.1:1", "tls_ca": tmp_path / "missing"}, "cannot load"),
        ({"endpoint": "127.0.0.1:1", "tls_cert": garbage}, "cannot load"),
    ):
        with pytest.raises(InvalidArgumentError, match=fragment):
            Ringo.connect(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("which", "fragment"),
    [
        ("cert-only", "go together"),
        ("ca-only", "--tls-client-ca needs"),
        ("bad-key", "cannot load --tls-cert"),
        ("bad-client-ca", "cannot load --tls-client-ca"),
    ],
)
def test_unusable_tls_flags_are_a_usage_error(
    pki: Pki, tmp_path: pathlib.Path, which: str, fragment: str
) -> None:
    """Property: TLS flags that cannot serve (a certificate without its key, a
    client CA without TLS, a key or CA file that does not load) stop ringod at
    startup with a usage error naming the flag, before it serves plaintext."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a key")
    args = {
        "cert-only": ["--tls-cert", str(pki.cert)],
        "ca-only": ["--tls-client-ca", str(pki.client_ca)],
        "bad-key": ["--tls-cert", str(pki.cert), "--tls-key", str(garbage)],
        "bad-client-ca": [*_tls_args(pki), "--tls-client-ca", str(garbage)],
    }[which]
    ringod = [sys.executable, "-m", "ringo_trio.server", "--listen", "127.0.0.1:0"]
    result = subprocess.run(
        [*ringod, "--data-dir", str(tmp_path / "data"), "--lifecycle-stdin", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == _main.EXIT_USAGE, result.stderr
    assert fragment in result.stderr
    assert result.stdout == ""


def _ringo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ringo_trio._cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_ringo_cli_speaks_mutual_tls(mtls_daemon: DaemonProcess, pki: Pki) -> None:
    """Property: the operator commands reach a TLS daemon with --tls-ca (and a
    mutual-TLS one with --tls-cert/--tls-key); without the client certificate
    the daemon refuses them, as one line on stderr and exit status 1."""
    endpoint = ["--endpoint", mtls_daemon.endpoint, "--tls-ca", str(pki.ca)]
    client = ["--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key)]
    made = _ringo("enqueue", "cli-tls", "t", "--payload", "hi", "--json", *endpoint, *client)
    assert made.returncode == 0, made.stderr
    listed = _ringo("tasks", "list", "cli-tls", "--json", *endpoint, *client)
    assert listed.returncode == 0, listed.stderr
    assert [task["id"] for task in json.loads(listed.stdout)] == [json.loads(made.stdout)["id"]]
    refused = _ringo("queues", *endpoint)
    assert refused.returncode == 1, refused
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_tls_flags_of_the_cli_need_an_endpoint(pki: Pki, tmp_path: pathlib.Path) -> None:
    """Property: --tls-* without --endpoint is a usage error (exit 2) for `ringo
    worker`, and reaches every supervised worker's command line as an absolute
    path, next to --endpoint."""
    result = _ringo("worker", "m:f", "-q", "q", "--data-dir", str(tmp_path), "--tls-ca", "ca.pem")
    assert result.returncode == 2, result
    assert "--tls-ca, --tls-cert and --tls-key need --endpoint" in result.stderr
    with pytest.raises(InvalidArgumentError, match="need endpoint"):
        Supervisor("m:f", queue="q", data_dir=tmp_path, tls_ca=pki.ca)
    argv = Supervisor(
        "m:f", queue="q", endpoint="h:1", tls_ca="ca.pem", tls_cert=pki.client_cert
    ).worker_argv()
    flags = dict(zip(argv[5::2], argv[6::2], strict=True))
    assert flags["--endpoint"] == "h:1"
    assert flags["--tls-ca"] == str(pathlib.Path("ca.pem").absolute())
    assert flags["--tls-cert"] == str(pki.client_cert)
    assert "--tls-key" not in flags
