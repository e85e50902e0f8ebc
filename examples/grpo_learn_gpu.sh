#!/usr/bin/env bash
# The learning example (examples/grpo_learn.py, docs/LEARNING.md) on one GPU with the larger policy:
# the sync strategy, then async + partial rollouts + in-place pause, each to the learned level or its
# step bound, and one SVG with both curves. A few minutes on an H200; the figures go to docs/LEARNING.md.
#
#   examples/grpo_learn_gpu.sh [OUT]            # default OUT: runs/learn-gpu
#   DEVICE=cpu SIZE=small examples/grpo_learn_gpu.sh   # the same code path on a CPU, with the small model
#
# Needs: python3 with torch (CUDA for DEVICE=cuda), numpy and msgpack; the engine's CLI, found as
# `rollout` on PATH or $ROLLOUT_COMMAND (e.g. "node dist/src/cli/main.js" in a built clone).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/learn-gpu}
device=${DEVICE:-cuda}
size=()
[[ ${SIZE:-large} == large ]] && size=(--large)
mkdir -p "$out"
python3 - <<'EOF' >"$out/hardware.txt"
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"{p.total_memory / 2**30:.0f} GiB")
else:
    print("gpu none")
EOF
cat "$out/hardware.txt"
# The example picks the step size for the model's size (--lr to override it).
common=(--device "$device" "${size[@]}" --threads 0 --server-threads 0 --max-steps "${MAX_STEPS:-150}"
  --max-seconds "${MAX_SECONDS:-240}")
python3 examples/grpo_learn.py --strategy sync --out "$out/sync" "${common[@]}"
python3 examples/grpo_learn.py --strategy async --pause-mode in-place --out "$out/async" "${common[@]}"
python3 examples/grpo_learn.py --plot "$out/curve.svg" "$out/sync/curve.json" "$out/async/curve.json"
