#!/bin/bash
# Bisects a folder of samples on a Slurm cluster: an array job of N shards, then a merge that runs
# once every shard succeeded.
#   scripts/slurm/submit.sh MODEL SAMPLES N OUT [bisect options, e.g. --cand sim:bf16]
# Relative paths are from the folder it runs in (the jobs start there); every node must see MODEL,
# SAMPLES and OUT. LAYERWISE names the binary (default: layerwise on the PATH), CPUS_PER_TASK the
# CPUs of each shard (default 1); the jobs get this environment. Prints "shards=JOBID merge=JOBID";
# the jobs' output goes to OUT/logs/.
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 MODEL SAMPLES N OUT [bisect options]" >&2; exit 2; }
here="$(cd "$(dirname "$0")" && pwd)"
model="$1" samples="$2" shards="$3" out="$4"
shift 4
# Partial reports of an earlier job would be merged with this one's (merge refuses a mixed set).
if [ -n "$(ls -A "$out/parts" 2>/dev/null)" ]; then
    echo "$out/parts is not empty: remove it or choose another OUT" >&2
    exit 2
fi
mkdir -p "$out/parts" "$out/logs"
shards_job="$(sbatch --parsable --array="0-$((shards - 1))" --cpus-per-task="${CPUS_PER_TASK:-1}" \
    --output="$out/logs/shard-%a.out" "$here/bisect-array.sh" "$model" "$samples" "$shards" "$out" "$@")"
shards_job="${shards_job%%;*}"
merge_job="$(sbatch --parsable --dependency="afterok:$shards_job" --kill-on-invalid-dep=yes \
    --output="$out/logs/merge.out" "$here/merge.sh" "$out")"
echo "shards=$shards_job merge=${merge_job%%;*}"
