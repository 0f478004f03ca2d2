# One image for every role: the role is the `gpusharing` subcommand (webhook serve, timekeeper serve, db upgrade, meter).
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml setup.cfg README.md ./
COPY gpusharing gpusharing
COPY admin admin
COPY webhook webhook
COPY timekeeper timekeeper
COPY sidecar sidecar
COPY migrations migrations
COPY demo demo
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.12-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && mkdir -p /var/lib/gpusharing-meter && chown 65532:65532 /var/lib/gpusharing-meter
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Non-root, and nothing written outside /tmp (mount an emptyDir there under a read-only root filesystem).
USER 65532:65532
ENTRYPOINT ["gpusharing"]
