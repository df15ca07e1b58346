# kneecap operator image: `kneecap run` as a non-root user on python:3.11-slim.
# Build: docker build -t ghcr.io/kneecap/kneecap:0.1.0 .
# The same image serves the twin (`kneecap twin`, a vLLM-compatible server) for demos and tests/e2e/kind.sh.
# Linted by hadolint in tests/unit/test_ship_docker.py.

FROM python:3.11-slim AS build
WORKDIR /src
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# Only what the wheel needs: the package metadata and the package (no tests, benchmarks or docs).
COPY pyproject.toml README.md ./
COPY operator/ operator/
# Runtime dependencies only (pyproject's [project.dependencies]; the [test] extra is not installed).
RUN python -m venv /opt/kneecap \
 && /opt/kneecap/bin/pip install --no-cache-dir . \
 && find /opt/kneecap -name '__pycache__' -type d -prune -exec rm -rf {} +

FROM python:3.11-slim
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="kneecap" \
      org.opencontainers.image.description="Kubernetes operator that keeps vLLM deployments at the knee of their throughput curve" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/kneecap/kneecap" \
      org.opencontainers.image.documentation="https://github.com/kneecap/kneecap/tree/main/docs"

# A fixed numeric UID/GID so Kubernetes' runAsNonRoot can verify it (charts/kneecap/values.yaml).
RUN groupadd --system --gid 10001 kneecap \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin kneecap

# The package carries the CRD it reads its defaults from (kneecap/crds/, a copy by scripts/sync-crd.sh).
COPY --from=build /opt/kneecap /opt/kneecap

# Read-only root filesystem in the chart: no bytecode writes, caches under /tmp (an emptyDir).
ENV PATH=/opt/kneecap/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib

USER 10001:10001
WORKDIR /tmp
# 8080: kopf liveness (/healthz); 9100: kneecap_* metrics.
EXPOSE 8080 9100
ENTRYPOINT ["kneecap"]
CMD ["run", "--all-namespaces", "--liveness=8080", "--metrics-port=9100"]
