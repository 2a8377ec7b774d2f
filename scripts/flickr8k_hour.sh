#!/usr/bin/env bash
# One hour of this machine for a Flickr8k model, as the README's rows were measured: cross-entropy (its config's
# train step extracts the grids first, and the hour counts it), then SCST for what the hour leaves.
# Usage: bash scripts/flickr8k_hour.sh XE_CONFIG SCST_CONFIG [HOUR_S]   (e.g. flickr8k_soft_mirror flickr8k_soft_mirror_scst)
set -euo pipefail
xe=${1:?cross-entropy config}; scst=${2:?SCST config}; hour=${3:-3600}
start=$(date +%s)
echo "[hour] $(date -Is) cross-entropy: captioner train --config $xe"
captioner train --config "$xe"
left=$(( hour - ($(date +%s) - start) ))
echo "[hour] $(date -Is) cross-entropy done after $(( $(date +%s) - start )) s; SCST gets $left s"
if (( left < 120 )); then echo "[hour] no time left for SCST"; exit 0; fi
captioner train --config "$scst" --set train.time_budget_s="$left"
echo "[hour] $(date -Is) done: $(( $(date +%s) - start )) s in all"
