# One image per role, from one Dockerfile:
#   docker build --target operator -t batchpilot-operator:0.1.0 .   # no PyTorch
#   docker build --target server -t batchpilot-server:0.1.0 .       # the reference server
# The operator (with its load generator) needs no PyTorch; only `batchpilot serve` does
# (the `server` extra). The server's default PyTorch wheels carry CUDA; for a CPU-only
# cluster pass the PyTorch CPU wheel index with --build-arg TORCH_INDEX_URL=... to make
# the image several times smaller.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build-base
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/batchpilot \
    && /opt/batchpilot/bin/pip install --upgrade pip setuptools wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src

FROM build-base AS build-operator
RUN /opt/batchpilot/bin/pip install .

FROM build-base AS build-server
ARG TORCH_INDEX_URL=
# torch first from the given index, so the extra below finds it satisfied
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
        /opt/batchpilot/bin/pip install --index-url "$TORCH_INDEX_URL" 'torch>=2.2,<3'; \
    fi \
    && /opt/batchpilot/bin/pip install '.[server]'

FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/batchpilot/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
# numeric user: Kubernetes' runAsNonRoot can only verify a numeric UID
USER 65532:65532
ENTRYPOINT ["batchpilot"]

FROM runtime AS server
COPY --from=build-server /opt/batchpilot /opt/batchpilot
EXPOSE 8080
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]

# last, so a plain `docker build .` makes the operator
FROM runtime AS operator
COPY --from=build-operator /opt/batchpilot /opt/batchpilot
EXPOSE 8080 9090
CMD ["operator", "--all-namespaces"]
