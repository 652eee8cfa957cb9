# syntax=docker/dockerfile:1
# Multi-stage build: compile in the Rust image, run from a slim Debian as a non-root user with
# nothing but the binary and the example apps (no curl, no package manager run: the health
# check is `agentd healthcheck`, and TLS roots are compiled in).
#   docker build -t agentd .
#   docker run -p 8000:8000 agentd                      # embedded SQLite in /var/lib/agentd/data
#   docker run -p 8000:8000 -e DATABASE_URL=postgres://… agentd
# CI proves the build stage without a container engine: scripts/docker-check.sh lints this file
# (hadolint) and runs the RUN cargo line below in a clean directory holding exactly what the
# COPY lines copy.
FROM rust:1-bookworm AS build
WORKDIR /src
# The workspace: agentd and its load generator (bench/ is a member, so its manifest and
# sources must be present for cargo to load the workspace).
COPY Cargo.toml Cargo.lock build.rs ./
COPY src src
COPY migrations migrations
COPY assets assets
COPY bench bench
RUN cargo build --release --locked -p agentd --bin agentd

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/agentd --create-home agentd \
 && mkdir -p /var/lib/agentd/data && chown agentd:agentd /var/lib/agentd/data
COPY --from=build /src/target/release/agentd /usr/local/bin/agentd
COPY config /etc/agentd
USER 10001
WORKDIR /var/lib/agentd
ENV AGENTD_BIND=0.0.0.0:8000 \
    AGENTD_APPS_DIR=/etc/agentd/apps \
    AGENTD_LOG_FORMAT=json \
    AGENTD_AUTH=api-key \
    AGENTD_RATE_LIMIT_RPS=20 \
    AGENTD_MAX_RUNS_PER_USER=8 \
    DATABASE_URL=sqlite:///var/lib/agentd/data/agentd.db
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["agentd", "healthcheck"]
ENTRYPOINT ["agentd"]
CMD ["serve"]
