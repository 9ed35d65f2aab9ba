# Sourced by scripts/test_jax and scripts/test_torch: creates or reuses
# .venv-BACKEND, an environment with Keras and that backend alone (the
# backend's test tier runs there), and installs advtrain[BACKEND,test]
# into it; the other backends must not be there. Built once, the
# environment is reused until pyproject.toml changes.
# Usage: . scripts/_venv_tier.sh jax|torch
# PyTorch: the tier installs the torch it is tested with first,
# torch==2.13.0 (ADVTRAIN_TORCH_SPEC overrides it): pip takes the CPU build
# where its find-links carry that file, as on this project's machines;
# elsewhere PyPI's Linux wheel is the CUDA build (a few GB; it runs on
# CPUs), or set ADVTRAIN_TORCH_INDEX=https://download.pytorch.org/whl/cpu.
set -euo pipefail
backend=$1
case "$backend" in
  jax) absent=(tensorflow) ;;
  torch) absent=(tensorflow jax) ;;
  *) echo "advtrain: scripts/_venv_tier.sh: no tier for '$backend' (jax, torch)" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv-$backend"
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  echo "advtrain: creating virtual environment in .venv-$backend" >&2
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
fi
stamp="$venv/.advtrain-installed-$backend"
digest=$(sha256sum < "$root/pyproject.toml" | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$digest" ]; then
  echo "advtrain: installing advtrain[$backend,test] into .venv-$backend" >&2
  pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
  if [ "$backend" = torch ]; then
    "${pip[@]}" ${ADVTRAIN_TORCH_INDEX:+--index-url "$ADVTRAIN_TORCH_INDEX"} \
      "${ADVTRAIN_TORCH_SPEC:-torch==2.13.0}"
  fi
  "${pip[@]}" -e "$root[$backend,test]"
  for library in "${absent[@]}"; do
    if "$venv/bin/python" -c "import $library" 2>/dev/null; then
      echo "advtrain: .venv-$backend must not hold $library; remove .venv-$backend" >&2
      exit 1
    fi
  done
  echo "$digest" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
export KERAS_BACKEND=$backend
cd "$root"
