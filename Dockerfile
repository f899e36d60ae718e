# toolgate: `docker build -t toolgate .`, then `docker run` it with TOOLGATE_DATABASE_URL,
# TOOLGATE_REDIS_URL and TOOLGATE_JWT_SECRET (or another key) set; docker-compose.yml runs the
# whole demo. The image holds the installed package only: migrations and the demo catalog
# travel inside it, and no source tree is left where an import could pick it up instead.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# app/migrations and app/catalog/demo.yaml link to migrations/ and catalog/: copy all four.
WORKDIR /tmp/toolgate-source
COPY pyproject.toml README.md ./
COPY app ./app
COPY examples ./examples
COPY migrations ./migrations
COPY catalog ./catalog
RUN pip install --no-cache-dir . \
    && mkdir -p /etc/toolgate \
    && cp -r catalog /etc/toolgate/catalog \
    && rm -rf /tmp/toolgate-source \
    && useradd --system --uid 10001 --user-group --no-create-home toolgate

# The catalog directory: the demo catalog unless a volume or ConfigMap is mounted over it.
ENV TOOLGATE_CATALOG=/etc/toolgate/catalog
WORKDIR /srv/toolgate
USER 10001:10001
EXPOSE 8080

# Liveness: the process answers. Slim images have no curl; Python's stdlib does the request,
# and an error status or a refused connection makes urlopen raise, so the check fails.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]

# Migrating at start is safe with many containers (an advisory lock serialises it);
# Kubernetes runs it once per pod in an init container instead (deploy/kubernetes/).
CMD ["sh", "-c", "toolgate migrate && exec toolgate serve --host 0.0.0.0 --port 8080"]
