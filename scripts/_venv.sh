# Sourced by scripts/*: creates or reuses .venv and installs advtrain into it.
# Usage: . scripts/_venv.sh EXTRAS   (e.g. "test" or "test,bench")
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
extras=${1:-test}
venv="$root/.venv"
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  echo "advtrain: creating virtual environment in .venv" >&2
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
fi
stamp="$venv/.advtrain-installed-$extras"
digest=$(cat "$root/pyproject.toml" | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$digest" ]; then
  echo "advtrain: installing advtrain[$extras] into .venv (first run takes a few minutes)" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root[$extras]"
  echo "$digest" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
cd "$root"
