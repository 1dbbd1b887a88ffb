#!/usr/bin/env bash
# Build the virtual environment that runs real SGLang 0.5.23 on the CPU (its CPU engine).
#
#   realengines/sglang/setup.sh [VENV_DIR]        (default: .venvs/sglang, ignored by git)
#
# Measured on the 2-core development machine (2026-12-01): 162 s and 3.0 GB with the package
# registry's mirror warm (both set up side by side); a cold download takes minutes more.
# What it does, and why:
#   - torch 2.13.0, the CPU build (SGLang pins torch 2.14.1, a CUDA build of several GB; the CPU
#     engine needs only the CPU build, so sglang is installed with --no-deps);
#   - SGLang's Python dependencies by name (the list its imports need on the CPU engine);
#   - from sglang-kernel 0.4.10 only its Python packages (sgl_kernel/, triton_kernels/): the
#     registry has CUDA builds only, and on the CPU the layers fall back to native torch once
#     sgl_kernel.load_utils is stubbed (realengines/sglang/shims/cpu_stubs.py).
# The simulator never imports anything from this environment: overlap-sim starts it as a
# subprocess (calibrate --engine sglang, validate --engine sglang) and reads what it writes.
set -euo pipefail
VENV="${1:-.venvs/sglang}"
start=$(date +%s)
python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
$PIP install -q --upgrade pip
$PIP install -q torch==2.13.0
$PIP install -q --no-deps sglang==0.5.23
# SGLang's CPU-engine imports, at the versions sglang 0.5.23 pins where it pins one (read from its
# own metadata), torch kept at the CPU build
deps=$("$VENV/bin/python" - <<'PY'
import importlib.metadata as md, re
wanted = """aiohttp anthropic apache-tvm-ffi blobfile compressed-tensors datasets distro einops fastapi gguf
grpcio grpcio-health-checking grpcio-reflection hf-xet huggingface-hub interegular IPython jsonschema llguidance loguru
msgspec ninja nvidia-ml-py openai openai-harmony orjson partial_json_parser pillow prometheus-client psutil
pybase64 pydantic python-dateutil python-multipart pyzmq regex requests safetensors scipy sentencepiece
setproctitle smg-grpc-proto smg-grpc-servicer soundfile tiktoken tokenizers tqdm transformers triton uvicorn
uvloop xgrammar xxhash""".split()
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
pins = {}
for req in md.requires("sglang"):
    if "extra ==" in req:
        continue
    spec = req.split(";")[0].strip()
    pins[norm(re.split(r"[<>=!~\[ ]", spec)[0])] = spec
print(" ".join(pins.get(norm(n), n) for n in wanted))
PY
)
$PIP install -q torch==2.13.0 $deps
tmp=$(mktemp -d)
$PIP download -q --no-deps --only-binary=:all: sglang-kernel==0.4.10 -d "$tmp"
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$VENV/bin/python" - "$tmp" "$site" <<'PY'
import glob, sys, zipfile
tmp, site = sys.argv[1:]
(whl,) = glob.glob(f"{tmp}/*.whl")
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.split("/")[0] in ("sgl_kernel", "triton_kernels") and name.endswith(".py"):
            z.extract(name, site)
PY
rm -rf "$tmp"
"$VENV/bin/python" -c 'import torch, sglang; print("sglang", sglang.__version__, "torch", torch.__version__)'
echo "setup took $(( $(date +%s) - start )) s"
