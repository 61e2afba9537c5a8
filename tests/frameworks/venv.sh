#!/usr/bin/env bash
# tests/frameworks/venv.sh RELEASE [ROOT]: makes (or reuses) the framework suite's
# virtualenv for Slurm RELEASE in $VENVS/RELEASE (default /var/cache/slurm-lab/venvs)
# and prints its path. With ROOT (a Debian root of the lab) the venv is made with and
# for that root's python3, inside the root (chroot, with $VENVS bind-mounted at its own
# path in a private mount namespace: nothing is left mounted, nothing installed into
# the root itself); without, with the host's /usr/bin/python3.
#
# LIGHT=1 makes only JAX's CPU wheels (about 100 MB to download, 480 MB installed;
# without scipy, which jax.distributed does not import): the e2e suite's framework case.
#
# torch from PyPI is the CUDA build: it does not import without the CUDA libraries
# its shared objects are linked against (libcudart, libcublas, libcudnn, libnccl, ...,
# `readelf -d torch/lib/*.so`). The smallest install that runs gloo on CPU is torch
# with --no-deps plus exactly those libraries' wheels, without triton, cuda-bindings,
# cusolver and nvtx that torch's metadata also pulls (measured on 22.05: 4.7 GB
# installed, 3.2 GB downloaded once into the shared pip cache, 4 minutes). The
# frameworks that depend on torch are installed with --no-deps too (pip would
# otherwise resolve torch's full CUDA set again), their own dependencies listed here.
set -euo pipefail

rel=${1:?usage: venv.sh RELEASE [ROOT]}
root=${2:-}
VENVS=${VENVS:-/var/cache/slurm-lab/venvs}
name=$rel
[ -n "${LIGHT:-}" ] && name=$rel-light
venv=$VENVS/$name

TORCH=(torch==2.15.0)
CUDA_LIBS=(   # what torch/lib/*.so are linked against (DT_NEEDED), from torch 2.15.0's pins
  "nvidia-cuda-runtime==13.2.86.*" "nvidia-cublas==13.4.1.3.*" "nvidia-cuda-nvrtc==13.2.86.*"
  "nvidia-cufft==12.2.0.57.*" "nvidia-cufile==1.17.1.22.*" "nvidia-cusparse==12.7.10.12.*"
  "nvidia-nvjitlink==13.2.86.*" nvidia-cudnn-cu13==9.26.0.51 nvidia-cusparselt-cu13==0.8.1
  nvidia-nccl-cu13==2.30.7 nvidia-nvshmem-cu13==3.7.2 "nvidia-cuda-cupti==13.2.86.*"
)
TORCH_DEPS=(filelock "typing-extensions>=4.13" "sympy>=1.13.3" "networkx>=2.5.1" jinja2 "fsspec>=0.8.5"
  "setuptools>=77.0.3" wheel numpy)
ON_TORCH=(lightning-fabric==2.6.6 accelerate==1.15.0 deepspeed==0.19.8)
ON_TORCH_DEPS=(   # their requirements other than torch
  lightning-utilities "packaging>=23" "fsspec[http]" psutil pyyaml "huggingface_hub>=0.21" "safetensors>=0.4.3"
  einops hjson msgpack ninja py-cpuinfo "pydantic>=2" tqdm
)
# Pinned to what the suite was last run with (CI must not change with PyPI): jax 0.12
# needs Python 3.12, so 22.05's root (Debian 12, Python 3.11) stays on 0.10.2.
JAX=("jax==0.10.2; python_version < '3.12'" "jaxlib==0.10.2; python_version < '3.12'"
  "jax==0.12.0.1; python_version >= '3.12'" "jaxlib==0.12.0.1; python_version >= '3.12'")
JAX_DEPS=("numpy==2.4.6; python_version < '3.12'" "numpy==2.5.5; python_version >= '3.12'"
  ml_dtypes==0.6.0 opt_einsum==3.4.0)

if [ -n "${LIGHT:-}" ]; then
  want="light: ${JAX[*]} ${JAX_DEPS[*]}"
else
  want="full: ${TORCH[*]} ${CUDA_LIBS[*]} ${TORCH_DEPS[*]} ${ON_TORCH[*]} ${ON_TORCH_DEPS[*]} ${JAX[*]} ${JAX_DEPS[*]}"
fi
if [ -f "$venv/.made" ] && [ "$(cat "$venv/.made")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "$venv"
  exit 0
fi

mkdir -p "$VENVS" "$VENVS/.pip-cache"
# The steps run in the venv's python (host or root); pip's cache is shared.
script=$(cat <<SCRIPT
set -euo pipefail
export PIP_CACHE_DIR=$VENVS/.pip-cache PIP_DISABLE_PIP_VERSION_CHECK=1
unset PIP_FIND_LINKS
rm -rf '$venv'
python3 -m venv '$venv'
pip=('$venv/bin/pip' install -q)
if [ -n "${LIGHT:-}" ]; then
  "\${pip[@]}" --no-deps ${JAX[*]@Q}
  "\${pip[@]}" ${JAX_DEPS[*]@Q}
else
  "\${pip[@]}" --no-deps ${TORCH[*]@Q} ${CUDA_LIBS[*]@Q}
  "\${pip[@]}" ${TORCH_DEPS[*]@Q} ${ON_TORCH_DEPS[*]@Q} ${JAX_DEPS[*]@Q}
  "\${pip[@]}" --no-deps ${JAX[*]@Q}
  "\${pip[@]}" --no-deps --no-build-isolation ${ON_TORCH[*]@Q}
fi
SCRIPT
)
started=$SECONDS
if [ -n "$root" ]; then
  mkdir -p "$root$VENVS"
  # The host's resolver and CA bundle (it may hold a site CA the root's lacks)
  # are bound over the root's, and /proc mounted (deepspeed's setup.py reads
  # it), in the private namespace only.
  unshare -m bash -c 'mount --make-rprivate / && mount --bind "$1" "$2$1" &&
      mount --bind /etc/resolv.conf "$2/etc/resolv.conf" &&
      mount --bind /etc/ssl/certs/ca-certificates.crt "$2/etc/ssl/certs/ca-certificates.crt" &&
      mount -t proc proc "$2/proc" &&
      exec chroot "$2" /bin/bash -c "$3"' \
    venv "$VENVS" "$root" "$script" >&2
else
  PATH=/usr/bin:/bin bash -c "$script" >&2
fi
# The stamp last: a venv without it is remade.
echo "$want" > "$venv/.made"
echo "tests/frameworks/venv.sh: $venv made in $((SECONDS - started)) s, $(du -sh "$venv" | cut -f1)" >&2
echo "$venv"
