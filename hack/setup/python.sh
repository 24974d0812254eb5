#!/usr/bin/env bash
# The project virtualenv at .venv with the fully pinned requirements.lock and the package itself (editable).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
STAMP="$VENV/.stamp"
WANT="$(cat "$ROOT/requirements.lock" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "ok (cached, $("$VENV/bin/python" --version))"; exit 0
fi
mkdir -p "$ROOT/.cache/logs"
LOG="$ROOT/.cache/logs/pip.log"
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
{
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r "$ROOT/requirements.lock"
  "$VENV/bin/python" -m pip install -q --no-deps -e "$ROOT"
} >"$LOG" 2>&1 || { tail -30 "$LOG"; exit 1; }
echo "$WANT" > "$STAMP"
echo "installed $("$VENV/bin/python" -m pip list 2>/dev/null | tail -n +3 | wc -l) packages"
