# The sandbox service: uvicorn + FastAPI over the Docker backend (it drives the engine through the
# socket compose mounts at /var/run/docker.sock). Build context: the repository root.
# Python packages: docker/vendor/site-packages when scripts/vendor-server-deps.sh filled it (offline CI
# build; needs the base's python to match .venv's minor version), else pip from PyPI.
ARG BASE_IMAGE=python:3.12-slim
FROM ${BASE_IMAGE}
ARG SRC_SHA=dev
LABEL org.opencontainers.image.title="forkyard-server" forkyard.src_sha="${SRC_SHA}"
# Either way the list is pyproject.toml's dependencies and server extra (the one declaration).
COPY docker/vendor/ /opt/forkyard/vendor/
COPY pyproject.toml /opt/forkyard/pyproject.toml
RUN if [ -d /opt/forkyard/vendor/site-packages ]; then echo "using vendored packages"; \
    else python3 -c "import subprocess, sys, tomllib; p = tomllib.load(open('/opt/forkyard/pyproject.toml', 'rb'))['project']; \
subprocess.check_call([sys.executable, '-m', 'pip', 'install', '--no-cache-dir', *p['dependencies'], *p['optional-dependencies']['server']])"; fi
COPY sandbox_server /opt/forkyard/src/sandbox_server
# The env sessions (/v1/envs) host forkyard's envs in the server process.
COPY envs /opt/forkyard/src/envs
ENV PYTHONPATH=/opt/forkyard/vendor/site-packages:/opt/forkyard/src PYTHONDONTWRITEBYTECODE=1
EXPOSE 8000
HEALTHCHECK --interval=5s --timeout=3s --retries=20 CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"
# The server command (python -m sandbox_server, as everywhere); other settings from FORKYARD_* (compose.yaml).
CMD ["python3", "-m", "sandbox_server", "--host", "0.0.0.0", "--port", "8000", "--backend", "docker"]
