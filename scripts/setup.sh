# Sourced by the install scripts: Debian packages and the project's virtual environment on a fresh machine.
# Works on a stock Debian or Ubuntu Python too, where `pip install` outside a venv is refused (PEP 668,
# "externally managed environment") and `python3 -m venv` needs the python3-venv package.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PY:-python3}
VENV=${VENV:-$REPO/.venv}

# apt_install PACKAGE...: as root, or with sudo.
apt_install() {
  local sudo=()
  [ "$(id -u)" = 0 ] || sudo=(sudo)
  echo "installing $* (apt-get)" >&2
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# need_tools COMMAND:PACKAGE...: install the packages whose command is missing.
need_tools() {
  local want=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null || want+=("${pair#*:}")
  done
  [ ${#want[@]} -eq 0 ] || apt_install "${want[@]}"
}

# make_venv [EXTRAS]: $VENV with dltop installed (editable) and the extras, e.g. `make_venv test`.
make_venv() {
  if [ ! -x "$VENV/bin/pip" ]; then
    echo "creating $VENV" >&2
    # Without python3-venv, Debian's venv stops before pip ("ensurepip is not available") and leaves a
    # venv without pip behind: install the package and make it again over the broken one.
    if ! "$PY" -m venv --clear "$VENV" >/dev/null 2>&1; then
      apt_install python3-venv
      "$PY" -m venv --clear "$VENV"
    fi
  fi
  echo "pip install -e $REPO${1:+[$1]} (the packages in pyproject.toml)" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$REPO${1:+[$1]}"
}
