# Sourced by scripts/*: creates or reuses .venv-jax, an environment with
# Keras and JAX but no TensorFlow, and installs advtrain into it (the JAX
# test tier runs there). Usage: . scripts/_venv_jax.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv-jax"
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  echo "advtrain: creating virtual environment in .venv-jax" >&2
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
fi
stamp="$venv/.advtrain-installed-jax"
digest=$(sha256sum < "$root/pyproject.toml" | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$digest" ]; then
  echo "advtrain: installing advtrain[jax,test] into .venv-jax" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root[jax,test]"
  if "$venv/bin/python" -c "import tensorflow" 2>/dev/null; then
    echo "advtrain: .venv-jax must not hold TensorFlow; remove .venv-jax" >&2
    exit 1
  fi
  echo "$digest" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
export KERAS_BACKEND=jax
cd "$root"
