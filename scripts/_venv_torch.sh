# Sourced by scripts/*: creates or reuses .venv-torch, an environment with
# Keras and PyTorch but neither TensorFlow nor JAX, and installs advtrain
# into it (the PyTorch test tier runs there). Usage: . scripts/_venv_torch.sh
# The tier installs the torch it is tested with first, torch==2.13.0
# (ADVTRAIN_TORCH_SPEC overrides it): pip takes the CPU build where its
# find-links carry that file, as on this project's machines; elsewhere
# PyPI's Linux wheel is the CUDA build (a few GB; it runs on CPUs), or set
# ADVTRAIN_TORCH_INDEX=https://download.pytorch.org/whl/cpu. Built once, the
# environment is reused until pyproject.toml changes.
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
  "${pip[@]}" ${ADVTRAIN_TORCH_INDEX:+--index-url "$ADVTRAIN_TORCH_INDEX"} \
    "${ADVTRAIN_TORCH_SPEC:-torch==2.13.0}"
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
