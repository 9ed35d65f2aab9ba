# Sourced by scripts/*: creates or reuses .venv and installs advtrain into it.
# Usage: . scripts/_venv.sh EXTRAS   (e.g. "tensorflow,jax,test" or "docs")
# The stamp records the pyproject.toml digest and the extras .venv holds: a
# script asking for extras it holds already installs nothing; one asking
# for more, or a changed pyproject.toml, installs them all together.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
extras=${1:-tensorflow,jax,test}
venv="$root/.venv"
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  echo "advtrain: creating virtual environment in .venv" >&2
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
fi
stamp="$venv/.advtrain-installed"
digest=$(sha256sum < "$root/pyproject.toml" | cut -c1-16)
held="" current=""
if [ -f "$stamp" ]; then
  held=$(sed -n 2p "$stamp")
  current=$(head -n1 "$stamp")
fi
wanted=$(printf '%s\n' "${held//,/$'\n'}" "${extras//,/$'\n'}" | sed '/^$/d' | LC_ALL=C sort -u | paste -sd, -)
if [ "$wanted" != "$held" ] || [ "$current" != "$digest" ]; then
  echo "advtrain: installing advtrain[$wanted] into .venv (first run takes a few minutes)" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root[$wanted]"
  printf '%s\n%s\n' "$digest" "$wanted" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
cd "$root"
