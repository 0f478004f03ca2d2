# One image for every role: the role is the `gpusharing` subcommand (webhook serve, timekeeper serve, db upgrade, meter).
# make image builds it, tagged with setup.cfg's version; tests/release/test_dockerfile.py holds what follows.
#
# The base: CPython 3.12 on Debian 12 "bookworm", by its Debian release tag, so that a rebuild never moves to another
# Debian or Python minor. A release also pins it by digest (make image BASE=python:3.12-slim-bookworm@sha256:…,
# the digest `docker buildx imagetools inspect python:3.12-slim-bookworm` prints on release day).
ARG BASE=python:3.12-slim-bookworm

FROM ${BASE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY constraints.txt pyproject.toml setup.cfg setup.py README.md ./
COPY gpusharing gpusharing
COPY webhook webhook
COPY timekeeper timekeeper
COPY sidecar sidecar
COPY nodeagent nodeagent
COPY migrations migrations
# The package and every dependency as wheels, at the versions constraints.txt pins; PIP_CONSTRAINT (pip before 25.3)
# and PIP_BUILD_CONSTRAINT (since) pin what builds the package too: setuptools, wheel, and grpcio-tools, which
# generates the node agent's gRPC stubs (setup.py).
RUN PIP_CONSTRAINT=/src/constraints.txt PIP_BUILD_CONSTRAINT=/src/constraints.txt pip wheel --wheel-dir /wheels -c constraints.txt .

FROM ${BASE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Those wheels only (no index): what the image runs is exactly what constraints.txt pins and the tests ran.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    --mount=type=bind,from=build,source=/src/constraints.txt,target=/constraints.txt \
    pip install --no-index --find-links /wheels -c /constraints.txt kube-gpusharing \
    && mkdir -p /var/lib/gpusharing-meter && chown 65532:65532 /var/lib/gpusharing-meter
# Non-root, and nothing written outside /tmp and the meter's state (mount an emptyDir on each under a read-only root
# filesystem): the bytecode was compiled at install, and PYTHONDONTWRITEBYTECODE keeps Python from trying again.
USER 65532:65532
ENTRYPOINT ["gpusharing"]
