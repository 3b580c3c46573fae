# syntax=docker/dockerfile:1
# Images for the operator and the profiler sidecar, built from the project's one wheel:
#
#   docker build --target operator -t vlmops/vlm-operator:0.1.0 .
#   docker build --target sidecar  -t vlmops/vlm-sidecar:0.1.0 .
#
# OCI labels: pass --build-arg REVISION=$(git rev-parse HEAD) CREATED=$(date -u +%FT%TZ) SOURCE=<repo URL>
# (left empty rather than guessed); VERSION must match pyproject.toml's (the tests check).
#
# The base image is pinned by its full tag (CPython patch release and Debian release). Pin it by
# digest too in production (python:3.11.11-slim-bookworm@sha256:...): the digest could not be
# resolved where this file was written (no registry access), so it is not invented here.
# tests/unit/packaging/test_dockerfile.py lints this file (hadolint) and replays the RUN steps of the
# `build` stage plus each image's `*-venv` stage in a fresh directory per image; keep those steps plain
# pip so the replay stays honest.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- build: the project's one wheel (both packages; each image's install step picks what it needs) ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY sidecar/ sidecar/
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels /src

# ---- one virtualenv per image, each from its lock (hack/lock-requirements writes both, with hashes) ----
# --require-hashes: every package, transitive ones included, is pinned and checked against the lock.
# --only-binary: no compiler in the slim image, and py-spy must come from its static wheel, not a Rust build.
# Then the wheel itself with --no-index: pip must find every requirement (and extra) already installed
# from the lock, so a dependency missing from the lock fails the build instead of floating in unpinned.
FROM build AS operator-venv
COPY requirements/operator.txt requirements/
RUN python -m venv /opt/vlm \
 && /opt/vlm/bin/pip install --no-cache-dir --require-hashes --only-binary=:all: -r requirements/operator.txt \
 && whl=$(echo /wheels/vlm_operator-*.whl) \
 && /opt/vlm/bin/pip install --no-cache-dir --no-index "${whl}[operator]" \
 && /opt/vlm/bin/pip check

# The sidecar runs in every GPU pod: the base dependencies only (py-spy, prometheus-client), no
# kopf/kubernetes/pydantic/numpy. The wheel's vlm_operator package comes along (a few hundred KB
# of Python) but cannot start without the operator extra.
FROM build AS sidecar-venv
COPY requirements/sidecar.txt requirements/
RUN python -m venv /opt/vlm \
 && /opt/vlm/bin/pip install --no-cache-dir --require-hashes --only-binary=:all: -r requirements/sidecar.txt \
 && whl=$(echo /wheels/vlm_operator-*.whl) \
 && /opt/vlm/bin/pip install --no-cache-dir --no-index "${whl}" \
 && /opt/vlm/bin/pip check

# ---- pyspy: the sidecar's py-spy, 0.4.3 from its crates.io source (sha256-pinned) with
# hack/patches/py-spy-0.4.3-vlm.patch (`record --main-thread`, no per-sample scan of every OS thread),
# built with its own Cargo.lock by the same script CI uses (docs/sidecar.md, "CPU cost"). It replaces
# the PyPI wheel's binary in the sidecar image; the output format is the same.
FROM rust:1.95.0-bookworm AS pyspy
WORKDIR /build
COPY hack/build-pyspy.sh hack/
COPY hack/patches/ hack/patches/
RUN bash hack/build-pyspy.sh /out/py-spy /build/work

# ---- operator: non-root, nothing writable needed (readOnlyRootFilesystem in the chart) ----
FROM ${PYTHON_IMAGE} AS operator
# Global ARGs are not in scope after FROM until declared again (for the base.name label).
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=""
ARG CREATED=""
ARG SOURCE=""
LABEL org.opencontainers.image.title="vlm-operator" \
      org.opencontainers.image.description="Kubernetes operator for vision-language models on SGLang, with scheduler profiling and canary gating" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
# jemalloc (bookworm's libjemalloc2): the operator re-executes itself under it (VLM_ALLOCATOR=auto), which keeps
# about a third less memory after a burst of new services than CPython's own allocator (docs/benchmarks.md).
# The passwd entry for 65532 (distroless' "nonroot"): kopf names itself user@host unless POD_ID is set, and
# getpass.getuser() raises for a uid that /etc/passwd lacks, so without it the operator stopped at start-up
# (KeyError: 'getpwuid(): uid not found: 65532'; found by running the built image, hack/build-images.sh).
RUN apt-get update \
 && apt-get install -y --no-install-recommends libjemalloc2=5.3.0-1 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 nonroot \
 && useradd --no-log-init --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin nonroot
COPY --from=operator-venv /opt/vlm /opt/vlm
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
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=""
ARG CREATED=""
ARG SOURCE=""
LABEL org.opencontainers.image.title="vlm-sidecar" \
      org.opencontainers.image.description="py-spy profiler sidecar for SGLang schedulers, exporting scheduler-loop metrics" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
COPY --from=sidecar-venv /opt/vlm /opt/vlm
COPY --from=pyspy /out/py-spy /opt/vlm/bin/py-spy
ENV PATH=/opt/vlm/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# hadolint ignore=DL3002
USER 0:0
EXPOSE 9400
ENTRYPOINT ["vlm-sidecar"]
