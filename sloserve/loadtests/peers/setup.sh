#!/usr/bin/env bash
# Idempotent: builds one virtual environment per peer under .peers/ (their pins conflict) and
# installs Debian's wrk and haproxy. Safe to re-run; each step is skipped when already done.
#   .peers/triton    nvidia-pytriton (bundles tritonserver 2.51, Python backend; pins numpy 1.26.4) + onnxruntime
#   .peers/mlserver  mlserver 1.7.1 (uvloop<0.22: workers crash with 0.23) + onnxruntime
#   Ray Serve 2.60 runs from the project's own .venv (ray[serve]==2.60.0 is a project dependency).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PEERS="$ROOT/.peers"
PYTHON="${PEER_PYTHON:-$ROOT/.venv/bin/python}"
# Build the venvs from the same base interpreter as the project venv (its lib dir holds libpython,
# which Triton's Python-backend stub needs through LD_LIBRARY_PATH).
BASE="$("$PYTHON" -c 'import sys; print(sys.base_prefix)')/bin/python3"
[ -x "$BASE" ] || BASE="$(command -v python3.11 || command -v python3)"
mkdir -p "$PEERS"

mkvenv() {  # name, stamp-content, pip args...
  local name="$1" want="$2"; shift 2
  local dir="$PEERS/$name" stamp="$PEERS/$name/.installed"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "[setup] $name: up to date"; return 0
  fi
  echo "[setup] $name: creating $dir"
  [ -x "$dir/bin/python" ] || "$BASE" -m venv "$dir"
  # (this machine's pip config names extra local indexes; hide pip's warnings about the missing ones)
  "$dir/bin/python" -m pip install --quiet --upgrade pip 2>&1 | { grep -v "^WARNING: Location" || true; }
  "$dir/bin/python" -m pip install --quiet "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }
  echo "$want" > "$stamp"
}

TRITON_PKGS=("nvidia-pytriton" "numpy==1.26.4" "onnxruntime")
MLSERVER_PKGS=("mlserver==1.7.1" "uvloop<0.22" "onnxruntime")
mkvenv triton "${TRITON_PKGS[*]}" "${TRITON_PKGS[@]}"
mkvenv mlserver "${MLSERVER_PKGS[*]}" "${MLSERVER_PKGS[@]}"

if ! "$ROOT/.venv/bin/python" -c 'import ray, ray.serve' 2>/dev/null; then
  echo "[setup] rayserve: installing ray[serve]==2.60.0 into .venv"
  "$ROOT/.venv/bin/python" -m pip install --quiet "ray[serve]==2.60.0"
else
  echo "[setup] rayserve: ray[serve] present in .venv"
fi

# wrk: the closed-loop generator; haproxy: Ray Serve's high-throughput mode (RAY_SERVE_ENABLE_HA_PROXY)
for tool in wrk haproxy; do
  if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ]; then
    echo "[setup] installing $tool (Debian package)"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "$tool"
  else
    echo "[setup] $tool: $(command -v "$tool" || echo /usr/sbin/$tool)"
  fi
done
echo "[setup] done"
