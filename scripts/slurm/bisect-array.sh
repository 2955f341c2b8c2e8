#!/bin/bash
# One shard of `layerwise bisect MODEL --inputs SAMPLES` per task of a Slurm array job; task I
# writes OUT/parts/part-I.json. submit.sh submits it as
#   sbatch --array=0-$((N-1)) bisect-array.sh MODEL SAMPLES N OUT [bisect options]
# LAYERWISE names the binary (default: layerwise on the PATH).
#SBATCH --job-name=layerwise-shard
set -u
model="$1" samples="$2" shards="$3" out="$4"
shift 4
"${LAYERWISE:-layerwise}" bisect "$model" --inputs "$samples" "$@" \
    --shard "$SLURM_ARRAY_TASK_ID/$shards" --json "$out/parts/part-$SLURM_ARRAY_TASK_ID.json"
status=$?
# Exit status 1 is this share's verdict (it diverges), not a failure: the merge must still run.
[ "$status" -le 1 ] || exit "$status"
