FROM python:3.11-slim

WORKDIR /srv/toolgate
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY pyproject.toml README.md ./
COPY app ./app
COPY examples ./examples
COPY migrations ./migrations
COPY catalog ./catalog
RUN pip install --no-cache-dir -e . && useradd --system toolgate
USER toolgate

ENV TOOLGATE_CATALOG=/srv/toolgate/catalog
EXPOSE 8080
CMD ["sh", "-c", "toolgate migrate && exec toolgate serve --host 0.0.0.0 --port 8080"]
