"""towers/tools/rates.py and stepgraph.py: the yardsticks and the step graph bench prints."""
import numpy as np
import pytest
import tensorflow as tf

from towers import data, models
from towers.deviceplan import local_plan
from towers.inputs import make_input
from towers.models.bias_gradient import fused_bias_gradient_sums_wide
from towers.precision import Precision
from towers.tools import plain, rates, stepgraph
from towers.tools.bench import _Trainer

tf1 = tf.compat.v1

SHAPE = (28, 28, 1)
SMALL_CONV = dict(batch=2, side=6, channels=3, filters=4, kernel=3)


def test_conv_flops_count_forward_and_both_gradients():
    # 2 x 6 x 6 x 4 outputs, each 3 x 3 x 3 multiply-adds, three times over.
    assert rates.conv_flops(**SMALL_CONV) == 3 * 2 * (2 * 6 * 6 * 4) * 27


@pytest.mark.parametrize('dtype,data_format', [(tf.float32, 'NHWC'), (tf.bfloat16, 'NHWC'),
                                               (tf.float32, 'NCHW')])
def test_kernel_rates_run_in_each_precision_and_layout_on_every_device(dtype, data_format):
    measured = rates.kernel_rates(['/cpu:0', '/cpu:1'], dtype, runs=1, conv=SMALL_CONV,
                                  matmul_size=32, repeats=1, data_format=data_format)
    assert set(measured) == {'conv', 'matmul'}
    assert all(np.isfinite(v) and v > 0 for v in measured.values())


def _node(op, **attrs):
    node = tf1.NodeDef(name=op.lower(), op=op)
    for key, value in attrs.items():
        node.attr[key].CopyFrom(value)
    return node


def test_the_step_graph_names_fusions_casts_and_xla_clusters():
    fused = tf1.AttrValue(list=tf1.AttrValue.ListValue(s=[b'BiasAdd', b'Relu']))
    graph = tf1.GraphDef(node=[
        _node('_MklNativeFusedConv2D', fused_ops=fused), _node('_FusedConv2D', fused_ops=fused),
        _node('_MklNativeConv2DBackpropFilterWithBias'), _node('_MklNativeConv2DWithBias'),
        _node('_MklNativeFusedBatchNormEx', activation_mode=tf1.AttrValue(s=b'Relu'),
              num_side_inputs=tf1.AttrValue(i=1)),
        _node('_MklNativeFusedBatchNormV3'),
        _node('Cast', SrcT=tf1.AttrValue(type=tf.float32.as_datatype_enum),
              DstT=tf1.AttrValue(type=tf.bfloat16.as_datatype_enum)),
        _node('_XlaRun'), _node('Relu')])
    summary = stepgraph.summarize([graph, tf1.GraphDef(node=[_node('NoOp')])])
    assert summary.ops == 10 and summary.xla_clusters == 1
    assert summary.fusions == {'Conv2D+BiasAdd+Relu': 2, 'Conv2DBackpropFilter+BiasAddGrad': 1,
                               'Conv2D+BiasAdd': 1, 'FusedBatchNorm+Add+Relu': 1}
    assert summary.casts == {'float32->bfloat16': 1}
    assert summary.text() == (
        '10 ops; fusions Conv2D+BiasAdd x1, Conv2D+BiasAdd+Relu x2, Conv2DBackpropFilter+'
        'BiasAddGrad x1, FusedBatchNorm+Add+Relu x1; casts 1 (float32->bfloat16 1); '
        '1 XLA cluster(s)')
    assert stepgraph.StepGraph(3).text() == '3 ops; fusions none; casts 0'


def _towers_step_graph(precision):
    model_fn = models.build_model('mnist_convnet', SHAPE, 10)
    # A batch of 2: the casts and fusions do not depend on it, a bf16 step's CPU does.
    trainer = _Trainer(model_fn, SHAPE, local_plan(['/cpu:0']),
                       make_input('synthetic', None, None, 2, 10), 2, precision=precision)
    try:
        return trainer.step_graph()
    finally:
        trainer.close()


def test_towers_bf16_step_keeps_every_fusion_of_float32_and_casts_only_where_it_must():
    # mnist_convnet in bf16, float32 -> bfloat16: its 8 variables on read, the images,
    # the dropout mask (drawn in float32), the logits' gradient, and the dense layers'
    # float32 bias-gradient sums (2); back: the 8 gradients, the logits and the 2 dense
    # upstream gradients summed in float32. Where TensorFlow sums a conv's bias gradient
    # in float32 itself (bias_gradient.py) the convs add no cast and every float32 fusion
    # stays; elsewhere their wide sums add one cast each way apiece.
    wide, low = _towers_step_graph(Precision('fp32')), _towers_step_graph(Precision('bf16'))
    assert sum(wide.casts.values()) == 0
    # grappler's remapper fuses these on any CPU (oneDNN also takes the convs' bias
    # gradients into their weight gradients).
    assert {k: wide.fusions.get(k) for k in ('Conv2D+BiasAdd+Relu', 'MatMul+BiasAdd+Relu',
                                             'MatMul+BiasAdd')} == {
        'Conv2D+BiasAdd+Relu': 2, 'MatMul+BiasAdd+Relu': 1, 'MatMul+BiasAdd': 1}
    if fused_bias_gradient_sums_wide():
        assert wide.fusions['Conv2DBackpropFilter+BiasAddGrad'] == 2
        assert low.fusions == wide.fusions
        assert low.casts == {'float32->bfloat16': 13, 'bfloat16->float32': 11}
    else:
        assert low.casts == {'float32->bfloat16': 15, 'bfloat16->float32': 13}


def test_the_plain_twin_trains_the_same_net_in_each_precision():
    # Four of the sample's images, batches of 2 (one a tower): the twin holds its dataset as a
    # constant of its graph; the whole sample's 4,000 in batches of 16 took 6.7 CPU-s, this 1.4.
    sample = data.load_dataset('mnist_sample').train
    train = data.DataSet(sample.images[:4], sample.labels[:4])
    shapes = {}
    for name, dtype in (('fp32', tf.float32), ('bf16', tf.bfloat16)):
        twin = plain.Plain(plain.plain_twin('mnist_convnet'), 10, ['/cpu:0', '/cpu:1'], train,
                           2, dtype, 3)
        try:
            twin.run(2, lambda: 0.0 if not twin.rates else 1.0, timed=False)
            twin.run(1, iter([0.0, 0.5]).__next__)
            assert twin.rates == [4.0]  # 2 images in the half second the clock gave
            graph = twin.step_graph()
            shapes[name] = sorted((v.op.name, v.shape.as_list())
                                  for v in twin.graph.get_collection('trainable_variables'))
        finally:
            twin.close()
        # Per tower in bf16: 8 variables cast on read and their gradients back, the
        # images in, the logits out and their gradient in.
        assert graph.casts == ({} if name == 'fp32' else {'float32->bfloat16': 2 * 10,
                                                          'bfloat16->float32': 2 * 9})
    with tf.Graph().as_default():
        model_fn = models.build_model('mnist_convnet', SHAPE, 10)
        model_fn(tf.zeros([1] + list(SHAPE)), True)
        ours = sorted(v.shape.as_list() for v in tf1.trainable_variables())
    assert shapes['fp32'] == shapes['bf16']
    assert sorted(shape for _, shape in shapes['fp32']) == ours
    assert plain.plain_twin('resnet20') is None
