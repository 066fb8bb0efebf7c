#!/usr/bin/env bash
# fake-gpu-audit.sh NAME PYTEST-ARGS...: run pytest on a copy of this working tree in which
# towers.devices.visible_gpus() says the machine has 1 GPU, on a CPU-only machine. TensorFlow
# still runs everything on the CPU (soft placement moves the ops planned on /gpu:N), so a run
# whose towers were planned on GPUs is stopped by its placement audit, and a test that asserts
# CPU devices without naming them fails: what a GPU machine would show of a test that leans on
# the machine having no GPU. Tests guarded by a real skipif(GPU) fail here only. The copy is
# /tmp/fake-gpu-NAME, made afresh each time; the environment's towers (an editable install)
# keeps data/ and models/ from this tree. Issue 33 found 135 such tests this way.
set -euo pipefail
name=${1:?usage: fake-gpu-audit.sh NAME PYTEST-ARGS...}
shift
top=$(cd "$(dirname "$0")/.." && pwd)
dest=/tmp/fake-gpu-$name
rm -rf "$dest" && mkdir -p "$dest"
tar -C "$top" --exclude ./.venv --exclude ./.git --exclude ./.gpu --exclude __pycache__ -cf - . \
  | tar -C "$dest" -xf -
cd "$dest"
python3 - <<'PY'
p = 'towers/devices.py'
s = open(p).read()
old = "    return len(tf.config.list_physical_devices('GPU'))"
assert old in s, 'visible_gpus() changed: mend this script'
s = s.replace(old, "    if os.environ.get('TOWERS_FAKE_GPUS'):\n"
                   "        return int(os.environ['TOWERS_FAKE_GPUS'])\n" + old, 1)
open(p, 'w').write(s)
PY
export PYTHONPATH=$dest TOWERS_FAKE_GPUS=1 TOWERS_MLXTEND=${TOWERS_MLXTEND:-}
exec python -m pytest -p no:cacheprovider "$@"
