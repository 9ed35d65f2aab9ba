# Sourced by scripts/*: creates or reuses .venv-torch, an environment with
# Keras and PyTorch but neither TensorFlow nor JAX, and installs advtrain
# into it (the PyTorch test tier runs there). Usage: . scripts/_venv_torch.sh
# PyPI's Linux torch wheel is the CUDA build (a few GB; it runs on CPUs):
# built once, the environment is reused until pyproject.toml changes. For
# the CPU build, set ADVTRAIN_TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (or point PIP_FIND_LINKS at a local wheel).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv-torch"
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  echo "advtrain: creating virtual environment in .venv-torch" >&2
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
fi
stamp="$venv/.advtrain-installed-torch"
digest=$(sha256sum < "$root/pyproject.toml" | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$digest" ]; then
  echo "advtrain: installing advtrain[torch,test] into .venv-torch" >&2
  pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
  if [ -n "${ADVTRAIN_TORCH_INDEX:-}" ]; then
    "${pip[@]}" --index-url "$ADVTRAIN_TORCH_INDEX" "torch>=2.5,<2.15"
  fi
  "${pip[@]}" -e "$root[torch,test]"
  for library in tensorflow jax; do
    if "$venv/bin/python" -c "import $library" 2>/dev/null; then
      echo "advtrain: .venv-torch must not hold $library; remove .venv-torch" >&2
      exit 1
    fi
  done
  echo "$digest" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
export KERAS_BACKEND=torch
cd "$root"
