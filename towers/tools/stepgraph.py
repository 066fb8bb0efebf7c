"""What TensorFlow really runs for a step: its fusions and casts, from the placed graphs.

Grappler and oneDNN's layout pass rewrite the graph a session runs: on a
oneDNN CPU Conv2D + BiasAdd + Relu becomes one `_MklNativeFusedConv2D`, a
conv's weight gradient takes its bias gradient in
(`_MklNativeConv2DBackpropFilterWithBias`), and XLA replaces whole clusters.
A cast, an order of layers or a custom gradient can break a fusion silently,
and every cast is a pass over memory. So `towers bench --compare` runs one
step of each row with the partition graphs asked back and says what they
hold, and a regression is seen, not guessed.
"""
import collections
import dataclasses
import re

import tensorflow as tf

tf1 = tf.compat.v1

# An op's kernel-library prefixes: '_MklNativeFusedConv2D' is a fused 'Conv2D'.
_PREFIX = re.compile(r'^_(MklNative|Mkl)?(Fused)?')


@dataclasses.dataclass
class StepGraph:
    """Counts over a step's partition graphs.

    Attributes:
      ops: nodes in all partition graphs (sends, receives and constants too).
      fusions: {'Conv2D+BiasAdd+Relu': count, 'Conv2DBackpropFilter+BiasAddGrad': ...}.
      casts: {'float32->bfloat16': count, ...}.
      xla_clusters: XLA-compiled clusters (_XlaRun nodes).
    """
    ops: int = 0
    fusions: dict = dataclasses.field(default_factory=dict)
    casts: dict = dataclasses.field(default_factory=dict)
    xla_clusters: int = 0

    def fusion_text(self):
        """'Conv2D+BiasAdd+Relu x2, MatMul+BiasAdd x1', or '' with none."""
        return ', '.join('%s x%d' % kv for kv in sorted(self.fusions.items()))

    def text(self):
        """'113 ops; fusions Conv2D+BiasAdd+Relu x2, ...; casts 19 (float32->bfloat16 10, ...)'."""
        casts = sum(self.casts.values())
        text = '%d ops; fusions %s; casts %d%s' % (
            self.ops, self.fusion_text() or 'none', casts, ' (%s)' % ', '.join(
                '%s %d' % kv for kv in sorted(self.casts.items())) if casts else '')
        return text + ('; %d XLA cluster(s)' % self.xla_clusters if self.xla_clusters else '')


def summarize(graph_defs):
    """The StepGraph of a step's partition GraphDefs (RunMetadata.partition_graphs)."""
    fusions, casts = collections.Counter(), collections.Counter()
    ops = xla = 0
    for graph_def in graph_defs:
        for node in graph_def.node:
            ops += 1
            base = _PREFIX.sub('', node.op)
            fused = _fused(node, base)
            if fused:
                fusions[fused] += 1
            elif base == 'Cast':
                casts['%s->%s' % (tf.dtypes.as_dtype(node.attr['SrcT'].type).name,
                                  tf.dtypes.as_dtype(node.attr['DstT'].type).name)] += 1
            elif node.op == '_XlaRun':
                xla += 1
    return StepGraph(ops, dict(fusions), dict(casts), xla)


def _fused(node, base):
    """The ops a fused node stands for ('Conv2D+BiasAdd+Relu'), or None."""
    if 'fused_ops' in node.attr and node.attr['fused_ops'].list.s:
        return '+'.join([base] + [s.decode() for s in node.attr['fused_ops'].list.s])
    if base.endswith('BackpropFilterWithBias'):  # a weight gradient that sums the bias's too
        return base[:-len('WithBias')] + '+BiasAddGrad'
    if base.endswith('WithBias'):  # oneDNN's layout pass: a conv and its bias add
        return base[:-len('WithBias')] + '+BiasAdd'
    if base.startswith('BatchNorm') and 'activation_mode' in node.attr:  # _FusedBatchNormEx
        side = node.attr['num_side_inputs'].i if 'num_side_inputs' in node.attr else 0
        activation = node.attr['activation_mode'].s.decode()
        return '+'.join(['FusedBatchNorm'] + ['Add'] * bool(side)
                        + [activation] * (activation != 'Identity'))
    return None


def graph_options():
    """RunOptions that ask a sess.run for its partition graphs, and nothing slower."""
    return tf1.RunOptions(output_partition_graphs=True)


def of_run(sess, fetches, feed=None):
    """Run fetches once with the partition graphs asked back: (their values, StepGraph)."""
    metadata = tf1.RunMetadata()
    values = sess.run(fetches, feed, options=graph_options(), run_metadata=metadata)
    return values, summarize(metadata.partition_graphs)
