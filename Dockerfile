# syntax=docker/dockerfile:1
# Images for the operator and the profiler sidecar, built from the project's one wheel:
#
#   docker build --target operator -t vlmops/vlm-operator:0.1.0 .
#   docker build --target sidecar  -t vlmops/vlm-sidecar:0.1.0 .
#
# The base image is pinned by its full tag (CPython patch release and Debian release). Pin it by
# digest too in production (python:3.11.11-slim-bookworm@sha256:...): the digest could not be
# resolved where this file was written (no registry access), so it is not invented here.
# tests/unit/packaging/test_dockerfile.py lints this file (hadolint) and replays the RUN steps of the
# `build` stage in a fresh virtualenv; keep those steps plain pip so the replay stays honest.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- build: one virtualenv with the wheel and its dependencies, all from binary wheels ----
FROM ${PYTHON_IMAGE} AS build
# py-spy ships a static manylinux wheel; pinning it keeps the sampler the tests measured.
ARG PY_SPY_VERSION=0.4.3
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY sidecar/ sidecar/
# --only-binary: no compiler in the slim image, and py-spy must come from its wheel, not a Rust build.
RUN python -m venv /opt/vlm \
 && /opt/vlm/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels /src \
 && /opt/vlm/bin/pip install --no-cache-dir --only-binary=:all: "py-spy==${PY_SPY_VERSION}" /wheels/vlm_operator-*.whl

# ---- operator: non-root, nothing writable needed (readOnlyRootFilesystem in the chart) ----
FROM ${PYTHON_IMAGE} AS operator
COPY --from=build /opt/vlm /opt/vlm
ENV PATH=/opt/vlm/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# 65532: the conventional "nonroot" uid/gid of distroless images; no home, no shell login.
USER 65532:65532
# 8080: /metrics, 8081: kopf liveness (/healthz)
EXPOSE 8080 8081
ENTRYPOINT ["vlm-operator"]

# ---- sidecar: py-spy must ptrace the SGLang scheduler ----
# The lmsysorg/sglang images run SGLang as root, and ptrace across users needs the same uid (or
# CAP_SYS_PTRACE over a more privileged process), so the sidecar runs as uid 0. The operator's pod
# template drops every capability except SYS_PTRACE, sets shareProcessNamespace: true (to see the
# scheduler's PID) and mounts a writable /tmp; the root filesystem can stay read-only. With a
# non-root SGLang image, run the sidecar as SGLang's uid instead (runAsUser in the pod template)
# and keep SYS_PTRACE for kernels with yama ptrace_scope=1.
FROM ${PYTHON_IMAGE} AS sidecar
COPY --from=build /opt/vlm /opt/vlm
ENV PATH=/opt/vlm/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# hadolint ignore=DL3002
USER 0:0
EXPOSE 9400
ENTRYPOINT ["vlm-sidecar"]
