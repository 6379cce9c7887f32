#!/usr/bin/env bash
# A/B on the H200 device machine: runs every sweep binary in bench/bin/ (built here from the
# commits under test, stripped) with the same arguments, interleaved ROUNDS times, so drift
# between runs shows up as spread rather than as a difference.
# Usage: ROUNDS=2 [EXTRA='--splits 128'] [BINS=bench/bin] bash bench/ab.sh OUTDIR [sweep args...]
# (BINS: the folder of binaries and wrapper scripts to interleave, bench/bin by default.)
set -u
out=${1:?outdir}; shift
. "$(dirname "$0")/vulkan-env.sh"
nvidia-smi -L > "$out/device.txt"
for r in $(seq 1 "${ROUNDS:-1}"); do
  for bin in "${BINS:-bench/bin}"/*; do
    name=$(basename "$bin")
    echo "== round $r $name $*"
    "$bin" "$@" ${EXTRA:-} --csv "$out/$name-r$r.csv" > "$out/$name-r$r.log" 2>&1
    # codec, ctx, step ms, GPU ms
    tail -n 40 "$out/$name-r$r.log" | grep -E "^ *[a-z0-9_=,+]+ +[0-9]+ " | awk '{printf "%s %s %s %s\n", $1, $2, $3, $5}' \
      || tail -n 5 "$out/$name-r$r.log"
    # Only a few files come back from the device machine: each run goes into one archive at
    # once, so a call cut short by its time limit still brings back every finished run.
    (cd "$out" && tar rf ab.tar ./"$name-r$r".* && rm -f ./"$name-r$r".*)
  done
done
gzip -f "$out/ab.tar"
