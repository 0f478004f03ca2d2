"""The one build step setup.cfg cannot say: the node agent's gRPC stubs for the kubelet's PodResources API, generated
from nodeagent/podresources/api.proto with grpcio-tools (pyproject.toml's build requirements) before the package's
files are collected, so that a wheel, an editable install (`make .venv/.installed`) and the image all have them.
They are never committed (.gitignore)."""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTOS = ["nodeagent/podresources/api.proto"]


class BuildWithStubs(build_py):
    def run(self) -> None:
        generate_stubs()
        super().run()


def generate_stubs() -> None:
    from grpc_tools import protoc  # a build requirement: imported only when building

    for proto in PROTOS:
        status = protoc.main(["grpc_tools.protoc", f"-I{ROOT}", f"--python_out={ROOT}", f"--grpc_python_out={ROOT}",
                              str(ROOT / proto)])
        if status != 0:
            raise SystemExit(f"protoc failed on {proto} (status {status})")


setup(cmdclass={"build_py": BuildWithStubs})
