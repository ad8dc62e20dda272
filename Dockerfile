# syntax=docker/dockerfile:1
#
# mailpush container image.
#
#   docker build -t mailpush:dev .
#   docker run --rm -e MAILPUSH_BROKERS=kafka:9092 -p 8080:8080 mailpush:dev
#
# Stage 1 builds the release binary with the Swift toolchain; the Swift runtime
# is linked statically (--static-swift-stdlib), so stage 2 needs only the C
# libraries mailpush links against at run time.

# The same Swift as development and CI (tests/helm/test_dockerfile.py keeps them in step).
ARG SWIFT_IMAGE=swift:6.3-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

# ---------------------------------------------------------------------------
# Build stage
# ---------------------------------------------------------------------------
FROM ${SWIFT_IMAGE} AS build

RUN export DEBIAN_FRONTEND=noninteractive \
    && apt-get -q update \
    && apt-get -q install -y --no-install-recommends \
         librdkafka-dev \
         libjemalloc-dev \
         libsqlite3-dev \
         libssl-dev \
         pkg-config \
         python3-pip \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /build

# Intel's multi-buffer RSA (libcrypto_mb and its runtime), staged for the runtime
# stage: mailpush loads it at start and seals eight RSA operations a call on a
# processor with AVX-512 IFMA (docs/operations.md, "RSA eight at a time").
COPY tools/install-crypto-mb ./tools/
RUN tools/install-crypto-mb /staging/lib

# Resolve dependencies in their own layer so source edits do not refetch them.
# Package.swift pins every dependency with `exact:`; no Package.resolved is shipped.
COPY Package.swift ./
RUN swift package resolve

COPY Sources ./Sources
COPY Tests ./Tests

# Also stage Swift's crash backtracer, so a crash logs a symbolicated backtrace.
RUN swift build -c release --product mailpush --static-swift-stdlib \
    && mkdir -p /staging \
    && cp "$(swift build -c release --show-bin-path)/mailpush" /staging/mailpush \
    && cp /usr/libexec/swift/linux/swift-backtrace-static /staging/swift-backtrace-static

# ---------------------------------------------------------------------------
# Runtime stage
# ---------------------------------------------------------------------------
FROM ${RUNTIME_IMAGE} AS runtime

# Only the shared libraries the binary needs, plus CA roots for TLS to Kafka
# and to the sponsor webhook.
RUN export DEBIAN_FRONTEND=noninteractive \
    && apt-get -q update \
    && apt-get -q install -y --no-install-recommends \
         librdkafka1 \
         libjemalloc2 \
         libsqlite3-0 \
         libssl3 \
         ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# Fixed numeric UID/GID so Kubernetes runAsUser/fsGroup and volume ownership
# line up with the image (the Helm chart uses 10001 as well).
RUN groupadd --system --gid 10001 mailpush \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
         --home-dir /var/lib/mailpush --shell /usr/sbin/nologin mailpush \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/mailpush

COPY --from=build --chown=root:root --chmod=0755 /staging/mailpush /usr/local/bin/mailpush
COPY --from=build --chown=root:root --chmod=0755 /staging/swift-backtrace-static /usr/local/libexec/mailpush/swift-backtrace-static
COPY --from=build --chown=root:root --chmod=0644 /staging/lib/ /usr/local/lib/
RUN ldconfig

ENV MAILPUSH_STATE_DIR=/var/lib/mailpush \
    SWIFT_BACKTRACE=enable=yes,sanitize=yes,threads=all,images=all,interactive=no,swift-backtrace=/usr/local/libexec/mailpush/swift-backtrace-static

USER 10001:10001
WORKDIR /var/lib/mailpush
VOLUME /var/lib/mailpush

# /healthz, /readyz, /metrics
EXPOSE 8080

ENTRYPOINT ["mailpush"]
CMD ["run"]
