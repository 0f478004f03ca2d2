"""demo.processes.Service, which the demo, the tests and the benchmarks start every role with."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo.processes import Service, free_port
from gpusharing.serving.certs import make_serving_certificate


def test_a_server_whose_certificate_is_refused_is_said_to_be_so_at_once(tmp_path: Path) -> None:
    """Not "did not start" after a minute (what `make demo` said on Python 3.13 of a certificate it refused)."""
    served = make_serving_certificate(["127.0.0.1"]).write(tmp_path / "served")
    other = make_serving_certificate(["127.0.0.1"]).write(tmp_path / "other")
    port = free_port()
    args = [
        "webhook",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--cert",
        str(served["cert"]),
        "--key",
        str(served["key"]),
    ]
    service = Service(
        "webhook", args, f"https://127.0.0.1:{port}/readyz", verify=str(other["ca"]), log_path=tmp_path / "log"
    )
    with pytest.raises(
        RuntimeError, match="webhook answers, but its TLS certificate was not accepted: .*certificate verify failed"
    ):
        service.__enter__()
    assert service.process is not None and service.process.poll() is not None  # stopped, not left running
