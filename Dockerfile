# syntax=docker/dockerfile:1
# rankwatch agent image, kept in sync with the Helm chart's image values
# (tests/test_deploy_kubernetes.py checks repository, tag, user and port):
#   docker build -t ghcr.io/rankwatch/rankwatch:0.1.0 .
#   docker run --rm --cap-add SYS_PTRACE --pid container:<trainer> ghcr.io/rankwatch/rankwatch:0.1.0 watch --match train.py
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
# The k8s extra (grpcio, protobuf) is for node mode on Kubernetes (`watch --k8s`); imported only there.
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[k8s]"

FROM python:${PYTHON_VERSION}-slim
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="rankwatch" \
      org.opencontainers.image.description="Out-of-process monitoring agent for distributed ML training" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/python:${PYTHON_VERSION}-slim"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# py-spy (a rankwatch dependency) gets the file capability cap_sys_ptrace+ep so that the
# agent can run as a non-root user: the kernel grants the capability on exec when the
# pod adds SYS_PTRACE to the bounding set and allows privilege escalation (no
# no_new_privs). Without SYS_PTRACE in the bounding set py-spy cannot start (EPERM):
# add --cap-add SYS_PTRACE / capabilities.add: [SYS_PTRACE], or turn dumps off.
# Tracing a process of the same user needs no capability only where
# kernel.yama.ptrace_scope is 0.
COPY --from=build /wheels /tmp/wheels
# Debian's libcap2-bin is only used here and purged; pinning its version would break rebuilds.
# hadolint ignore=DL3008
RUN pip install --no-cache-dir /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels \
    && apt-get update \
    && apt-get install -y --no-install-recommends libcap2-bin \
    && setcap cap_sys_ptrace+ep "$(command -v py-spy)" \
    && apt-get purge -y libcap2-bin \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 rankwatch \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/rankwatch --create-home \
       --shell /usr/sbin/nologin rankwatch

# Numeric, so that Kubernetes can verify runAsNonRoot without a runAsUser.
USER 10001:10001
WORKDIR /var/lib/rankwatch
EXPOSE 9478
ENTRYPOINT ["rankwatch"]
CMD ["--help"]
