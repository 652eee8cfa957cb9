# syntax=docker/dockerfile:1
# Multi-stage build: compile in the Rust image, run from a slim Debian with a non-root user.
#   docker build -t agentd .
#   docker run -p 8000:8000 agentd                      # embedded SQLite in /var/lib/agentd/data
#   docker run -p 8000:8000 -e DATABASE_URL=postgres://… agentd
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY migrations migrations
RUN cargo build --release --locked --bin agentd

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/agentd --create-home agentd \
 && mkdir -p /var/lib/agentd/data && chown agentd:agentd /var/lib/agentd/data
COPY --from=build /src/target/release/agentd /usr/local/bin/agentd
COPY config /etc/agentd
USER agentd
WORKDIR /var/lib/agentd
ENV AGENTD_BIND=0.0.0.0:8000 \
    AGENTD_APPS_DIR=/etc/agentd/apps \
    AGENTD_LOG_FORMAT=json \
    DATABASE_URL=sqlite:///var/lib/agentd/data/agentd.db
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8000/health || exit 1
ENTRYPOINT ["agentd"]
CMD ["serve"]
