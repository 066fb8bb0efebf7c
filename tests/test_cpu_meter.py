"""tests/cpu_meter.py: each test's CPU, its own and its children's, and the sums."""
import os
import subprocess
import sys

from tests import cpu_meter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A test that burns CPU in a child process, and one that burns it itself.
_TESTS = '''import subprocess, sys, time

def _burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_child():
    subprocess.run([sys.executable, '-c', 'import time\\nend = time.process_time() + 0.4\\n'
                    'while time.process_time() < end:\\n    pass'], check=True)

def test_own():
    _burn(0.3)
'''


def test_a_childs_cpu_is_the_tests_and_the_worker_keeps_its_own(tmp_path):
    (tmp_path / 'test_burn.py').write_text(_TESTS)
    meter = tmp_path / 'meter'
    process = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'tests.cpu_meter', '-p', 'no:cacheprovider',
         str(tmp_path / 'test_burn.py')], cwd=str(tmp_path), capture_output=True, text=True,
        env=dict(os.environ, TOWERS_CPU_METER=str(meter), PYTHONPATH=ROOT), timeout=60)
    assert process.returncode == 0, process.stdout + process.stderr
    records = {r['test'].split('::')[1]: r for r in cpu_meter.read(str(meter))}
    assert sorted(records) == ['test_child', 'test_own']
    # The child's 0.4 s (and its interpreter's start) are the test's children's, not its own.
    assert records['test_child']['children'] >= 0.4 > records['test_child']['self']
    assert records['test_own']['self'] >= 0.3 and records['test_own']['children'] == 0


def test_the_report_sums_by_file_and_names_the_costliest_tests():
    records = [{'test': 'tests/a.py::x', 'wall': 3.0, 'self': 1.0, 'children': 4.0},
               {'test': 'tests/a.py::y', 'wall': 1.0, 'self': 0.5, 'children': 0.0},
               {'test': 'tests/b.py::z', 'wall': 2.0, 'self': 2.0, 'children': 0.0}]
    assert cpu_meter.report(records, top=2) == [
        '3 tests: 4 CPU-s in the workers, 4 in their child processes',
        '   CPU-s      own children tests  file',
        '     5.5      1.5      4.0     2  tests/a.py',
        '     2.0      2.0      0.0     1  tests/b.py',
        '',
        '   CPU-s      own children  test',
        '     5.0      1.0      4.0  tests/a.py::x',
        '     2.0      2.0      0.0  tests/b.py::z']
