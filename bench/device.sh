#!/bin/bash
# The GPU and 16-core figures of bench/RESULTS.md (issue 25, part 4), on a machine with a CUDA
# PyTorch but no Debian packages and no network (the lent device): unpacks Debian 12's .debs of
# what gpu-build needs (fetch them here first: `scripts/dev device-debs`, into .dev/debs, and
# carry .dev), builds build-gpu with the tests, then runs the phases named. Logs and the
# ResNet runs' metrics go to $OUT (default /tmp/device-out).
#
# usage: [TARGETS=...] bench/device.sh PHASE...   (TARGETS: what to build; default trainctl and
#                                                  the test phase's tests)
#   test     the GPU tests (NCCL, the reducer on the GPU, training and resuming on the GPU), and
#            cpu_bind on these cores
#   gpu      ResNet-50, trainctl beside PyTorch DDP, plain layout then channels-last + cuDNN benchmark
#   bf16     the same in bf16 autocast
#   gpu18    ResNet-18 and the CNN at batch 512
#   weak     weak scaling of the CPU trainer, 1..16 workers, one run each
#   weak16   1 and 16 workers, $ROUNDS alternating rounds (default 3; the machine's noise)
#            (trainctl with balance: even and balance: speed side by side)
#   weak16b  the same with every worker bound to a core of its own (cpu_bind: cores)
#   recipe   ResNet-50 learning to tell photographs apart at 112 and 224 pixels, trainctl beside
#            torchvision under one recipe (issue 75); needs the photographs in .dev/photos
#            (`bench/make_image_folder.py --save-sources .dev/photos` here; carry .dev)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/device-out}
DEBS=${DEBS:-.dev/debs}
mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "### $(( $(date +%s) - T0 )) s: $*"; }
ls "$DEBS"/*.deb >/dev/null 2>&1 || { echo "bench/device.sh: no .debs in $DEBS (scripts/dev device-debs)" >&2; exit 1; }
mkdir -p /tmp/deb /usr/share/datasets
for f in "$DEBS"/*.deb; do
  [ -e "/tmp/deb/.${f##*/}" ] || { dpkg -x "$f" /tmp/deb && touch "/tmp/deb/.${f##*/}"; }
done
ln -sfn /tmp/deb/usr/share/datasets/fashion-mnist /usr/share/datasets/fashion-mnist
# Debian's libz.so points at /lib/.../libz.so.1.2.13, which such an image may lack: use its own
# libz.so.1 (and not the static one, which is not PIC).
rm -f /tmp/deb/usr/lib/x86_64-linux-gnu/libz.a
ln -sf /usr/lib/x86_64-linux-gnu/libz.so.1 /tmp/deb/usr/lib/x86_64-linux-gnu/libz.so
export LD_LIBRARY_PATH=/tmp/deb/usr/lib/x86_64-linux-gnu
export CMAKE_PREFIX_PATH=/tmp/deb/usr
stamp "unpacked"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core)'
# A warm machine keeps build-gpu between calls, but the tree copied onto it keeps this side's
# modification times: a file changed since the last build there may look older than its object,
# and ninja would rebuild nothing. Files whose contents differ from what the last build saw are
# touched first.
sources=build-gpu/.sources.sha1
[ -f "$sources" ] && sha1sum --check --quiet "$sources" 2>/dev/null | sed -n 's/: FAILED.*$//p' | xargs -r touch
PYTHON=python3 BUILD_TESTING=ON scripts/dev gpu-build --target ${TARGETS:-trainctl trainer_test train_test cli_test} -- -j"$(nproc)" -k 0 \
  > "$OUT/build.log" 2>&1 || { grep -E "error:|FAILED" "$OUT/build.log" | head -40; exit 1; }
find src tests -type f \( -name '*.cc' -o -name '*.h' -o -name '*.txt' \) -print0 | xargs -0 sha1sum > "$sources"
stamp "built"
resnet50() {  # precision, then layouts
  local precision=$1 layout l d
  shift
  for layout in "$@"; do
    timeout 200 python3 bench/gpu.py --trainctl build-gpu/src/trainctl --python python3 \
      --configs resnet50-224-b64 --window 50 --precision "$precision" --layout "$layout" 2>&1 |
      tail -1 | sed "s/^/$precision $layout /"
    for l in /tmp/bench-gpu-*/*/logs/worker-0.log; do
      [ -e "$l" ] || continue
      grep -q -i -E 'error|fail' "$l" && tail -25 "$l"
      d=$(dirname "$(dirname "$l")")
      cp "$d/metrics.jsonl" "$OUT/metrics-$precision-$layout.jsonl" 2>/dev/null
      cp "$l" "$OUT/worker-$precision-$layout.log"
      rm -rf "$(dirname "$d")"
    done
  done
}
for phase in "$@"; do
  stamp "phase $phase"
  case $phase in
    test)
      (cd build-gpu && timeout 150 ctest --output-on-failure \
        -R "Trainer\.(DeviceCuda|ACheckpointResumesInAnotherMemoryFormat|TheTimeline|BalanceBySpeed)|Reducer\.FlatGradientsEqualPlainBackwardOnTheGpu|Nccl|Cli\.CpuBind" 2>&1 |
        tail -40) ;;
    gpu) resnet50 fp32 plain tuned ;;
    bf16) resnet50 bf16 plain tuned ;;
    gpu18)
      timeout 200 python3 bench/gpu.py --trainctl build-gpu/src/trainctl --python python3 \
        --configs resnet18-224-b64,cnn-fmnist-b512 --window 50 2>&1 | tail -2 ;;
    weak)
      timeout 400 python3 bench/weak_scaling.py --trainctl build-gpu/src/trainctl --python python3 \
        --window 50 --windows 4 2>&1 ;;
    weak16|weak16b)
      timeout 300 python3 bench/weak_scaling.py --trainctl build-gpu/src/trainctl --python python3 \
        --workers 1,16 --rounds "${ROUNDS:-3}" --window 50 --windows 4 --balance --keep "$OUT/timelines-$phase" \
        $([ "$phase" = weak16b ] && echo --bind) 2>&1 ;;
    recipe)
      [ -d /tmp/photos/test ] || python3 bench/make_image_folder.py /tmp/photos --by-source --sources .dev/photos \
        --files "${FILES:-5100}" --test "${TESTS:-1700}"
      # torchvision's reference recipe (SGD 0.1 per 256 pictures, momentum 0.9, weight decay 1e-4)
      # at a batch of 64, with a warm-up; fp32, plain layout on both sides.
      # RECIPES: SIZE:LR pairs.
      for recipe in ${RECIPES:-112:0.025 224:0.025}; do
        timeout 300 python3 bench/resnet50_recipe.py --trainctl build-gpu/src/trainctl --device cuda \
          --folder /tmp/photos/train --test-folder /tmp/photos/test --size "${recipe%%:*}" --batch 64 \
          --steps "${STEPS:-600}" --lr "${recipe#*:}" --momentum 0.9 --weight-decay 1e-4 --warmup 100 --loaders 12 2>&1 |
          tee "$OUT/recipe-${recipe/:/-lr}.txt"
      done ;;
    *) echo "bench/device.sh: unknown phase $phase" >&2 ;;
  esac
done
stamp "done"
