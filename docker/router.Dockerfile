# syntax=docker/dockerfile:1
# sgl-router at the version this repository pins and tests (generation/server/env.py,
# SGLANG_ROUTER_PACKAGE; what it forwards and how it routes: generation/server/router.py).
# A Rust binary in a wheel: it needs no GPU and none of SGLang's image.
FROM python:3.11-slim
ARG SGLANG_ROUTER_VERSION=0.3.2
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
RUN pip install "sglang-router==${SGLANG_ROUTER_VERSION}" \
 && useradd --create-home --uid 10001 --user-group router
USER 10001:10001
# Requests on 30000, Prometheus text on 29000.
EXPOSE 30000 29000
# /health answers 200 even with no worker; /readiness is 503 until a worker is registered.
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:30000/readiness', timeout=2)"]
CMD ["python", "-m", "sglang_router.launch_router", "--host", "0.0.0.0", "--port", "30000"]
