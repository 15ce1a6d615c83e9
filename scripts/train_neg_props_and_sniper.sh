#!/usr/bin/env bash
# Negative chip mining end to end: RPN -> proposals -> SNIPER with negative chips (tools/train_neg_chips.py).
#   scripts/train_neg_props_and_sniper.sh --cfg FILE [--set KEY VALUE ...] [--rpn-epochs N] [--eval]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
exec "$root/.venv/bin/python" tools/train_neg_chips.py "$@"
