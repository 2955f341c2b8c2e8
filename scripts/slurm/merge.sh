#!/bin/bash
# Merges the array job's partial reports into OUT/report.json and OUT/report.html: the report one
# `layerwise bisect --inputs SAMPLES` writes. submit.sh submits it as
#   sbatch --dependency=afterok:ARRAY_JOB --kill-on-invalid-dep=yes merge.sh OUT
# Its exit status is layerwise's: 1 when the merged report diverges (Slurm shows FAILED, 1:0),
# 2 or more on an error.
#SBATCH --job-name=layerwise-merge
set -u
out="$1"
exec "${LAYERWISE:-layerwise}" merge "$out"/parts/part-*.json --json "$out/report.json" --html "$out/report.html"
