# One image for the operator (`batchpilot operator`) and the reference server
# (`batchpilot serve`). Build: docker build -t batchpilot:0.1.0 .
# The default PyTorch wheels carry CUDA; for a CPU-only cluster pass a CPU wheel index
# with --build-arg PIP_EXTRA_INDEX_URL=... to make the image much smaller.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ARG PIP_EXTRA_INDEX_URL=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/batchpilot
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN /opt/batchpilot/bin/pip install --upgrade pip setuptools wheel \
    && /opt/batchpilot/bin/pip install .

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/batchpilot/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
COPY --from=build /opt/batchpilot /opt/batchpilot
# numeric user: Kubernetes' runAsNonRoot can only verify a numeric UID
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["batchpilot"]
CMD ["operator", "--all-namespaces"]
