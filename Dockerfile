# The sqsworker image: the framework on a slim Python, run as a non-root user.
# Add your handler code in an image built FROM this one (examples/Dockerfile).
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sqsworker ./sqsworker
# Everything lands in one virtual environment; pip and setuptools leave with the stage.
RUN python -m venv /opt/sqsworker \
 && /opt/sqsworker/bin/pip install --no-cache-dir . \
 && /opt/sqsworker/bin/pip uninstall --yes pip setuptools

FROM python:${PYTHON_VERSION}-slim
RUN groupadd --gid 10001 sqsworker \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin sqsworker
COPY --from=build /opt/sqsworker /opt/sqsworker
ENV PATH=/opt/sqsworker/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SQSWORKER_LOG_FORMAT=json
WORKDIR /app
USER 10001:10001
EXPOSE 9000
ENTRYPOINT ["sqsworker"]
CMD ["--help"]
