#!/usr/bin/env bash
# Pack vLLM 0.23.0, and what it needs that the GPU image lacks, for the device machine: wheels
# under OUT (default .vllmwheels, which this script has git ignore), in chunks that each fit one
# device call beside the working tree (scripts/split_device_parts.py).
#
#   scripts/pack_vllm.sh [OUT]     # packs (357 MiB: 14 chunks of 26 MiB); a re-run rebuilds OUT
#   scripts/pack_vllm.sh --check   # only compares vLLM's requirements with the lists below
#
# PACKED is vLLM 0.23.0's Requires-Dist that the GPU image lacks (gpu-image-packages.txt beside
# device-wheels), with their own dependencies as pip resolves them, pinned. LEFT_OUT is left
# out on purpose: the kernel libraries of code paths a dense bf16 model on an H100 never takes
# (FlashInfer and its precompiled kernels, CUTLASS DSL, QuACK, TileLang, TokenSpeed MLA,
# Humming with the CUDA compiler wheels it pulls) and what only they need. Without FlashInfer,
# vLLM must run with the FLASH_ATTN attention backend (its first choice on SM 9.0 anyway) and
# VLLM_USE_FLASHINFER_SAMPLER=0 (its default sampler imports FlashInfer on CUDA);
# benchmarks/vllm_baseline.py sets both. torch, torchvision, torchaudio, transformers, triton
# and numba are the image's. docs/backends.md lists the device calls that install the parts.
set -euo pipefail

VLLM=vllm==0.23.0
PACKED=(
  annotated-types==0.8.0 anthropic==2.14.0 apache-tvm-ffi==0.1.9 astor==0.8.1 blake3==1.0.11
  cachetools==8.0.2 cbor2==6.3.0 cffi==2.1.1 compressed-tensors==0.17.0 cryptography==50.0.2
  depyf==0.20.0 dill==0.4.1 diskcache==5.6.3 dnspython==2.9.2 docstring-parser==0.18.0
  email-validator==2.4.0 fastapi==0.136.3 fastapi-cli==0.0.34 fastapi-cloud-cli==0.28.0
  agent-detector==2.0.0 detect-installer==0.2.1 fastar==0.12.0 rignore==0.8.1
  sentry-sdk==2.75.0 rich-toolkit==0.20.6 fastsafetensors==0.5.0 gguf==0.19.0
  googleapis-common-protos==1.76.0 httpcore2==2.16.2 httptools==0.9.0 httpx2==2.16.2
  ijson==3.6.0 interegular==0.3.3 jiter==0.19.0 jmespath==1.1.0 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 lark==1.2.2 llguidance==1.7.6 lm-format-enforcer==0.11.3
  loguru==0.7.3 mcp==2.3.0 mcp-types==2.3.0 mistral-common==1.13.1
  model-hosting-container-standards==0.1.16 msgspec==0.22.0 openai==3.57.0
  openai-harmony==0.0.8 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2
  opentelemetry-exporter-otlp==1.45.2 opentelemetry-exporter-otlp-proto-common==1.45.2
  opentelemetry-exporter-otlp-proto-grpc==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2
  opentelemetry-exporter-http-transport==0.66b2 opentelemetry-exporter-otlp-common==0.66b2
  opentelemetry-proto==1.45.2 opentelemetry-semantic-conventions==0.66b2
  opentelemetry-semantic-conventions-ai==0.5.1 outlines-core==0.2.14
  partial-json-parser==0.2.1.1.post7 prometheus-fastapi-instrumentator==8.1.0 pybase64==1.5.1
  pycountry==26.2.16 pycparser==3.12 pydantic==2.14.4 pydantic-core==2.50.5
  pydantic-extra-types==2.11.1 pydantic-settings==2.16.3 pyjwt==2.15.1 python-dotenv==1.2.4
  python-json-logger==4.2.0 python-multipart==0.0.34 pyzmq==27.3.0 referencing==0.37.0
  rpds-py==2026.9.1 setproctitle==1.3.8 sniffio==1.3.1 sse-starlette==3.7.0 starlette==1.10.0
  supervisor==4.3.0 truststore==0.10.5 typing-inspection==0.4.5 uvicorn==0.54.0
  watchfiles==1.3.0 websockets==17.4 xgrammar==0.2.5.post1
  # not vLLM's: sparrow.config imports omegaconf, so the vLLM GPU tests that build configs run
  omegaconf==2.4.0 antlr4-python3-runtime==4.13.2
)
# vLLM requirements (and dependencies) not packed; see the header
LEFT_OUT=(
  flashinfer-python flashinfer-cubin nvidia-cudnn-frontend cuda-tile nvidia-cutlass-dsl
  nvidia-cutlass-dsl-libs-base nvidia-cutlass-dsl-libs-cu13 cuda-python quack-kernels
  tilelang z3-solver torch-c-dlpack-ext tokenspeed-mla tokenspeed-triton humming-kernels
  pyelftools nvidia-cuda-tileiras nvidia-cuda-nvcc nvidia-cuda-crt nvidia-nvvm nvidia-cuda-cccl
)

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$root"
common=$(git rev-parse --path-format=absolute --git-common-dir)
tool=""
if [ -n "${DEVICE_WHEELS:-}" ] && [ -x "$DEVICE_WHEELS" ]; then tool=$DEVICE_WHEELS; fi
[ -n "$tool" ] || { echo "pack_vllm: device-wheels not found (set DEVICE_WHEELS=PATH)" >&2; exit 2; }
image_list="$(dirname "$tool")/gpu-image-packages.txt"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

check_requirements() {
  # every unconditional Requires-Dist of the vLLM wheel: in the image, packed, or left out
  if ! python3 -m pip install -q --dry-run --no-deps --ignore-installed --only-binary=:all: \
      --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
      --target "$work/target" --report "$work/report.json" "$VLLM" > "$work/pip.log" 2>&1; then
    cat "$work/pip.log" >&2
    return 2
  fi
  python3 - "$work/report.json" "$image_list" "${PACKED[*]}" "${LEFT_OUT[*]}" <<'PY'
import json, re, sys
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
report, image_file, packed, left_out = sys.argv[1:]
requires = json.load(open(report))["install"][0]["metadata"]["requires_dist"]
image = {norm(line.strip()) for line in open(image_file) if line.strip()}
packed = {norm(r.split("==")[0]) for r in packed.split()}
left_out = {norm(n) for n in left_out.split()}
direct = {norm(re.match(r"[A-Za-z0-9_.-]+", r).group(0)) for r in requires if "extra ==" not in r}
unplaced = sorted(direct - image - packed - left_out)
print(f"pack_vllm: {len(direct)} direct requirements: {len(direct & image)} in the image, "
      f"{len(direct & packed)} packed, {len(direct & left_out)} left out "
      f"({', '.join(sorted(direct & left_out))})")
if unplaced:
    sys.exit(f"pack_vllm: in none of the lists: {', '.join(unplaced)}")
PY
}

if [ "${1:-}" = "--check" ]; then
  check_requirements
  exit 0
fi
out=${1:-.vllmwheels}
out=${out%/}
# the exclude file is shared by every worktree of this repository
exclude="$common/info/exclude"
grep -qxF "/$out/" "$exclude" 2>/dev/null || echo "/$out/" >> "$exclude"
mkdir -p "$out"
git check-ignore -q "$out" || { echo "pack_vllm: $out is not ignored by git" >&2; exit 2; }
check_requirements
NO_DEPS=1 "$tool" "$out" "$VLLM" "${PACKED[@]}"
# 50 MiB parts no longer fit one call beside the tree (with the kept models): cut them smaller
python3 scripts/split_device_parts.py "$out"
echo "pack_vllm: $(du -sm "$out" | cut -f1) MiB under $out; device calls: docs/backends.md"
