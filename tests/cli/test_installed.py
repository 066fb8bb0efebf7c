"""Installed names: the nets and datasets are towers.models and towers.data, nothing at the top.

A wheel that put `data` and `models` at the top of site-packages would collide
with any other package of those names, and `python -m towers` run from a
folder holding its own data/ would import that one instead.
"""
import glob
import os
import shutil
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')


def test_train_runs_from_a_folder_with_its_own_data_and_models_packages(tmp_path):
    for name in ('data', 'models'):
        (tmp_path / name).mkdir()
        (tmp_path / name / '__init__.py').write_text(
            "raise ImportError('the user\\'s own %s package was imported')\n" % name)
    process = subprocess.run(
        [sys.executable, '-m', 'towers', 'train', '--steps', '2', '--model', 'small_convnet',
         '--eval-every', '0', '--quiet', '--devices', 'cpu'],
        cwd=str(tmp_path), env=ENV, capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stderr
    assert 'training 2 steps on 1 tower(s) /cpu:0' in process.stdout
    assert 'Traceback' not in process.stderr


def test_the_packages_import_as_towers_data_and_towers_models(tmp_path):
    # Found, not imported: towers.models would load TensorFlow (5 s of CPU) to say where it is.
    code = ('from importlib.util import find_spec; '
            'print(find_spec("data"), find_spec("models")); '
            'print(find_spec("towers.data").origin); print(find_spec("towers.models").origin)')
    process = subprocess.run([sys.executable, '-c', code], cwd=str(tmp_path), env=ENV,
                             capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stderr
    assert process.stdout.splitlines() == [
        'None None', os.path.join(ROOT, 'data', '__init__.py'),
        os.path.join(ROOT, 'models', '__init__.py')]


def test_the_wheel_holds_only_the_towers_package(tmp_path):
    source = tmp_path / 'source'
    source.mkdir()
    for name in ('setup.py', 'README.md'):
        shutil.copy(os.path.join(ROOT, name), str(source / name))
    for folder in ('towers', 'data', 'models'):
        shutil.copytree(os.path.join(ROOT, folder), str(source / folder),
                        ignore=shutil.ignore_patterns('__pycache__'))
    process = subprocess.run(
        [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '--quiet',
         '-w', str(tmp_path / 'wheel'), str(source)],
        capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr
    [wheel] = glob.glob(str(tmp_path / 'wheel' / 'towers-*.whl'))
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split('/')[0] for n in names if not n.startswith('towers-')} == {'towers'}
    for package in ('towers/data/__init__.py', 'towers/models/__init__.py',
                    'towers/inputs/__init__.py', 'towers/tools/__init__.py',
                    'towers/cli/__init__.py', 'towers/callbacks/__init__.py'):
        assert package in names
    assert sorted(n for n in names if n.startswith('towers/data/mnist_sample/')) == [
        'towers/data/mnist_sample/%s-%s-idx%d-ubyte.gz' % (split, kind, rank)
        for split, kind, rank in (('t10k', 'images', 3), ('t10k', 'labels', 1),
                                  ('train', 'images', 3), ('train', 'labels', 1))]
