"""A run: the shape of one training run, which the Trainer asks and never looks behind.

Whatever its shape (one process, or a task of a cluster), a run provides

  plan             where the towers, the variables and the host ops go (towers/deviceplan.py)
  strategy         how the towers' gradients meet and are applied (towers/variables.py)
  share            (index, count): the share of each global batch this process reads;
                   None: all of it
  finalizes_graph  whether the Trainer finalizes the graph (False where the Session's maker,
                   a MonitoredSession, adds its own ops and finalizes it)
  in_one_process   whether every step runs in this process alone (a NaN's replay,
                   callbacks/origin.py, needs it: a cluster's steps span processes)
  build_ops(host)  what the run adds to the graph before the callbacks (a cluster's pings)
  agree(trainer)   what every process must agree on, kept once the graph holds every variable
  session(graph, load, steps_done)
                   the run's Session, initialised, loaded by load(sess) and synced
  run_options(options, after_chief_work)
                   a step's RunOptions (a cluster gives each step a timeout)
  observe(seconds) a finished step's time
  votes, vote_feed(stop)
                   a stop voted on by every process (votes None: this process decides alone)

Run itself is the run of one process: `Run.local(config)`. The cluster modes are its
siblings, each a class of towers/cluster/modes.py.
"""
from towers.deviceplan import local_plan
from towers.session import open_session
from towers.variables import make_strategy


class Run:
    """One process's run: every tower in this process, its Session local.

    Args:
      plan: the DevicePlan, finished (data format, XLA).
      strategy: the VariableStrategy; None: the one of the plan's variable_update.
    """

    name = 'local'
    share = None
    votes = None
    finalizes_graph = True
    in_one_process = True

    def __init__(self, plan, strategy=None):
        self.plan = plan
        self.strategy = strategy if strategy is not None else make_strategy(plan)

    @classmethod
    def local(cls, config, plan=None):
        """The run of a TrainConfig in this process. plan: the plan of its devices, resolved
        once already (the command line's); None: resolved here, from config.towers."""
        if plan is None:
            plan = local_plan(config.towers, config.param_device, config.variable_update,
                              config.devices, logical_gpus=config.logical_gpus)
        return cls(plan.with_data_format(config.data_format).with_xla(config.xla))

    def build_ops(self, host):
        """Ops of the run's own, in the default graph, on host."""

    def agree(self, trainer):
        """Keep what every process of the run must share (one process: nothing)."""

    def session(self, graph, load, steps_done):
        """The Session, prepared: init, load(sess), the replicas synced."""
        del steps_done  # for the message of a run that loses a task
        return open_session(graph, self.plan.config, load=load)

    def run_options(self, options, after_chief_work=False):
        """A step's RunOptions: options as they are."""
        del after_chief_work
        return options

    def observe(self, seconds):
        """A finished step's time (a cluster's timeouts follow it)."""

    def vote_feed(self, stop):
        """The feed of a step in which this process votes to stop, or not."""
        del stop
        return {}
