# Sourced by scripts/*: creates or reuses .venv-torch, an environment with
# Keras and PyTorch (the CPU build) but neither TensorFlow nor JAX, and
# installs advtrain into it (the PyTorch test tier runs there).
# Usage: . scripts/_venv_torch.sh
# PyPI's Linux torch wheel is the CUDA build: to keep the CPU one, point
# pip at PyTorch's CPU index first (ADVTRAIN_TORCH_INDEX=
# https://download.pytorch.org/whl/cpu) or at a local wheel (PIP_FIND_LINKS).
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
digest=$(cat "$root/pyproject.toml" | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$digest" ]; then
  echo "advtrain: installing advtrain[torch] without TensorFlow or JAX into .venv-torch" >&2
  pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
  if [ -n "${ADVTRAIN_TORCH_INDEX:-}" ]; then
    "${pip[@]}" --index-url "$ADVTRAIN_TORCH_INDEX" torch
  fi
  if "$venv/bin/python" - "$root/pyproject.toml" <<'PY'
import sys, tomllib
extras = tomllib.load(open(sys.argv[1], "rb"))["project"].get("optional-dependencies", {})
sys.exit(0 if "torch" in extras else 1)
PY
  then
    # The backends are extras: the torch one and the test tools.
    "${pip[@]}" -e "$root[torch,test]"
  else
    # Fallback while pyproject still requires TensorFlow: its dependencies
    # minus TensorFlow's own, torch and pytest, then advtrain without its
    # dependencies.
    mapfile -t requirements < <("$venv/bin/python" - "$root/pyproject.toml" <<'PY'
import re, sys, tomllib
TENSORFLOW_ONLY = {"tensorflow", "tensorboard", "cleverhans",
                   "tensorflow-datasets", "importlib-resources"}
for line in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]:
    name = re.match(r"[A-Za-z0-9_.-]+", line).group(0).lower().replace("_", "-")
    if name not in TENSORFLOW_ONLY:
        print(line)
PY
    )
    "${pip[@]}" "torch>=2.13,<3" "${requirements[@]}" "pytest>=8.3,<9" "pytest-xdist>=3.6"
    "${pip[@]}" --no-deps -e "$root"
  fi
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
