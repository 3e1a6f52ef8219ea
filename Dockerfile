# One image for every worker; compose and Kubernetes pick the worker with the command.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
WORKDIR /app
# torch from PyTorch's CPU wheel index: PyPI's torch wheel pulls the CUDA libraries
# (several GB) that a CPU host never uses. TORCH_INDEX_URL="" builds with PyPI's.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir torch==2.13.0 \
      ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
COPY pyproject.toml README.md LICENSE NOTICE ./
COPY intentroute intentroute
COPY services services
COPY shared shared
# The demo knowledge base the ingest job indexes (compose's `ingest`, the k8s Job).
COPY kb kb
# torch is installed: pip keeps it (the same pin) and takes the rest from PyPI.
RUN pip install --no-cache-dir .
# The processes run as this user, not root (its uid is the one deploy/k8s runs as).
# The code and packages stay root's, read-only to it; it owns only what it writes: its
# state directory (INTENTROUTE_HOME and HOME: credentials, the classifier's heads,
# caches) and the index directory (a volume: ingest writes it, retrievers read it).
# Compose and Kubernetes mount tmpfs / emptyDirs there and on /tmp over a read-only root.
RUN groupadd --gid 10001 intentroute \
 && useradd --uid 10001 --gid 10001 --no-log-init --no-create-home \
      --home-dir /var/lib/intentroute --shell /usr/sbin/nologin intentroute \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/intentroute \
 && install -d -o 10001 -g 10001 -m 0755 /data/index
ENV HOME=/var/lib/intentroute INTENTROUTE_HOME=/var/lib/intentroute
USER 10001:10001
ENTRYPOINT ["intentroute"]
