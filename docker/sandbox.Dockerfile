# The sandbox image: the forkyard agent as main process, a non-root user, and a read-only corpus in /data.
# Build context: the repository root.  CI passes --build-arg BASE_IMAGE=forkyard-base:bookworm (made by
# scripts/build-base-image.sh, because no registry is reachable there); the image needs python3 (>= 3.9),
# coreutils, grep and findutils, and builds offline: the corpus comes from the base image's own stdlib.
# docker/agent.pyz is a build output (the agent package as one zipapp, sandbox_server/agent_bundle.py): write it
# first with `python -m sandbox_server.agent_bundle docker/agent.pyz` (scripts/build-images.sh does).
ARG BASE_IMAGE=python:3.12-slim
FROM ${BASE_IMAGE}
ARG AGENT_SHA=dev
LABEL org.opencontainers.image.title="forkyard-sandbox" forkyard.agent_sha="${AGENT_SHA}"
RUN (getent group 1000 >/dev/null || echo 'forkyard:x:1000:' >> /etc/group) \
 && (getent passwd 1000 >/dev/null || echo 'forkyard:x:1000:1000:forkyard sandbox:/scratch:/usr/sbin/nologin' >> /etc/passwd) \
 && mkdir -p /scratch /data /opt/forkyard
COPY docker/agent.pyz sandbox_server/corpus.py /opt/forkyard/
RUN PY=$(command -v python3) && "$PY" /opt/forkyard/corpus.py /data \
 && ln -sf "$PY" /usr/local/bin/python3 2>/dev/null; \
    chown -R root:root /data /opt/forkyard && chmod -R a+rX,go-w /data /opt/forkyard
USER 1000:1000
WORKDIR /data
ENV PYTHONDONTWRITEBYTECODE=1 LC_ALL=C.UTF-8
CMD ["python3", "-u", "-I", "/opt/forkyard/agent.pyz"]
