# Sourced by demo.sh and test.sh from the repository root: make ./.venv hold Quire
# (editable) with its test tools. Reinstalls only when pyproject.toml changed, so
# later runs need no network.
python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "Quire needs Python 3.11 or newer as '$python' (set PYTHON=/path/to/python3.11)" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv || { echo "could not create .venv: on Debian/Ubuntu, install python3-venv" >&2; exit 1; }
fi
if [ ! -f .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ]; then
    echo "installing Quire and its dependencies into .venv ..." >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
    touch .venv/.installed
fi
