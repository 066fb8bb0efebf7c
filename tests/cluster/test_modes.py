"""The cluster modes: a Run class each (towers/cluster/modes.py), acting on the facts of its
name that the TensorFlow-free command line and the planning tools read (names.CLUSTER_MODES)."""
import pytest

from towers.cluster.modes import MODES
from towers.cluster.spec import Cluster, ClusterError
from towers.config import TrainConfig
from towers.names import CLUSTER_MODES

WITH_PS = {'worker': ['w0:1', 'w1:1'], 'ps': ['p0:1']}
WORKERS = {'worker': ['w0:1', 'w1:1']}


def _refused(call):
    try:
        call()
    except ClusterError:
        return True
    return False


@pytest.mark.parametrize('name', list(CLUSTER_MODES))
def test_each_mode_acts_on_the_facts_its_name_says(name):
    assert list(MODES) == list(CLUSTER_MODES)
    mode, facts = MODES[name], CLUSTER_MODES[name]
    assert mode.name == name
    # One graph: the chief trains alone, every other worker serves it.
    assert mode.serves(Cluster(WORKERS, 'worker', 1)) == facts.one_graph
    assert not mode.serves(Cluster(WORKERS, 'worker', 0))
    # A copy per worker: no ps tasks to give it.
    config = TrainConfig(cluster_mode=name)
    assert _refused(lambda: mode.check(config, Cluster(WITH_PS, 'worker', 0))) == \
        facts.copy_per_worker
    # The variables on the ps tasks: it cannot start without one.
    assert _refused(lambda: mode(Cluster(WORKERS, 'worker', 0), 1, num_gpus=0)) == \
        facts.needs_ps
    run = mode(Cluster(WORKERS if facts.copy_per_worker else WITH_PS, 'worker', 0), 1,
               num_gpus=0)
    assert (run.share is None) == facts.one_graph  # a worker of its own reads its share
