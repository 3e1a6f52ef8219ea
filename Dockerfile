# One image for every worker; compose picks the worker with the command.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY intentroute intentroute
COPY services services
COPY shared shared
COPY bench bench
COPY testkit testkit
COPY kb kb
# TORCH_PIP_ARGS: e.g. "--index-url <your CPU wheel index>" to avoid the CUDA build.
ARG TORCH_PIP_ARGS=""
RUN pip install --no-cache-dir torch==2.13.0 ${TORCH_PIP_ARGS} \
 && pip install --no-cache-dir .
ENTRYPOINT ["intentroute"]
