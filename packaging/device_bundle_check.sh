#!/bin/bash
# The bundle's llama.cpp on a lent NVIDIA machine (issue 71, item 5), through the device
# recipe (../shared/device):
#     bash .device/run.sh 'bash packaging/device_bundle_check.sh qwen3-8b'
# The bundle itself cannot go there (1.2 GB; a device takes 64 MiB and reaches no
# network), so this builds what it carries from the same llama.cpp source with the same
# flags (packaging/portable_llama.py: every CPU variant and the CUDA module, each a
# GGML_BACKEND_DL module), for this GPU's architecture with the machine's own toolkit,
# then, with nvcc hidden from the PATH and the runtime from the driver's machine:
# `homerack hardware` (the CUDA module loaded, the GPU named), one answer, and bench.gpu
# on those modules beside bench.gpu on run.sh's source build. Written under $OUT.
# Not run yet: no GPU machine was lent to the sessions that wrote it.
set -e -o pipefail
MODEL=${1:-qwen3-8b}
OUT=${OUT:-/tmp/out}
ARCH=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)-real}
HERE=/tmp/portable-device
if [ ! -f $HERE/lib/libggml-cuda.so ]; then
  T0=$(date +%s)
  python3 packaging/portable_llama.py --here /tmp/llama/llama.cpp $HERE "$ARCH" \
    > /tmp/device-logs/portable.log 2>&1 || { tail -30 /tmp/device-logs/portable.log; exit 7; }
  echo "the bundle's libraries built for $ARCH in $(( $(date +%s) - T0 )) s"
fi
# the bindings as run.sh installed them, loading the bundle's libraries instead
rm -rf $HERE/py && mkdir -p $HERE/py && cp -a .device/pylib/llama_cpp $HERE/py/
rm -rf $HERE/py/llama_cpp/lib && cp -a $HERE/lib $HERE/py/llama_cpp/lib
NO_NVCC=$(echo "$PATH" | tr : '\n' | grep -v -i cuda | paste -sd:)
RUNTIME=$(dirname "$(ldconfig -p | grep -m1 'libcudart.so' | awk '{print $NF}')" 2>/dev/null)
bundle() {
  env PATH="$NO_NVCC" PYTHONPATH="$(pwd):$HERE/py:/tmp/site" \
    LD_LIBRARY_PATH="$HERE/py/llama_cpp/lib:${RUNTIME:-/usr/local/cuda/lib64}" "$@"
}
if bundle which nvcc; then echo "nvcc is still on the PATH"; exit 8; fi
bundle python3 -m app hardware | tee $OUT/bundle-hardware.txt
grep -q "CUDA" $OUT/bundle-hardware.txt
bundle python3 -m bench.gpu --model "$MODEL" --json $OUT/bundle-gpu.json | tee $OUT/bundle-gpu.txt
python3 -m bench.gpu --model "$MODEL" --json $OUT/source-gpu.json | tee $OUT/source-gpu.txt
python3 - $OUT/bundle-gpu.json $OUT/source-gpu.json <<'EOF'
import json, sys
bundle, source = ({f["figure"]: f for f in json.load(open(p))} for p in sys.argv[1:])
for figure in sorted(set(bundle) & set(source)):
    if bundle[figure]["unit"] == "tok/s":
        ours, theirs = bundle[figure]["value"], source[figure]["value"]
        print(f"{figure}: bundle {ours:.1f}, source build {theirs:.1f} tok/s "
              f"({ours / theirs:.2f}x; target within 10%)")
EOF
