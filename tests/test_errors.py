"""op_error_summary: the cause of a TensorFlow error in one line, the same on every device.

A failure TensorFlow meets in one place reads '... cause [[node]]'; met in several
(the partitions of a GPU run, two virtual CPUs) it reads 'N root error(s) found.',
'(0) CODE: cause', ..., then counts. Both must give the same line: what a user acts on.
"""
import os

import pytest
import tensorflow as tf

from towers.errors import TowersError, op_error_summary

tf1 = tf.compat.v1

GONE = '/tmp/data/train-00001-of-00004; No such file or directory'


def _error(message, kind=tf.errors.NotFoundError):
    return kind(None, None, message)


def _deleted_file_error(tmp_path, device):
    """The OpError of reading a file deleted mid-run, read on device, fetched on /cpu:0."""
    path = str(tmp_path / 'train-00001-of-00004')
    with open(path, 'w') as f:
        f.write('a\nb\n')
    with tf.Graph().as_default() as graph, tf.device(device):
        reader = tf1.data.make_initializable_iterator(tf.data.TextLineDataset(path).repeat())
        line = reader.get_next()
    with tf1.Session(graph=graph, config=tf1.ConfigProto(device_count={'CPU': 2})) as sess:
        sess.run(reader.initializer)
        sess.run(line)
        os.remove(path)
        with pytest.raises(tf.errors.NotFoundError) as raised:
            for _ in range(4):  # past the two lines read: the file is opened again
                sess.run(line)
    return raised.value, path


@pytest.mark.parametrize('device,causes', [('/cpu:0', None), ('/cpu:1', '2 root error(s)')])
def test_a_file_gone_reads_the_same_in_one_partition_or_two(tmp_path, device, causes):
    """Read on another device than the fetch's (as on a GPU), the failure is reported by
    both partitions, the reader's and the one its output was sent to."""
    error, path = _deleted_file_error(tmp_path, device)
    assert causes is None or causes in error.message, error.message
    assert op_error_summary(error) == '%s; No such file or directory' % path


MULTI = '''Graph execution error:

Detected at node 'IteratorGetNext' defined at (most recent call last):
    File "/work/train.py", line 12, in <module>
Node: 'IteratorGetNext'
2 root error(s) found.
  (0) NOT_FOUND: %s
\t [[{{node IteratorGetNext}}]]
\t [[IteratorGetNext/_23]]
  (1) NOT_FOUND: %s
\t [[{{node IteratorGetNext}}]]
0 successful operations.
0 derived errors ignored.''' % (GONE, GONE)


@pytest.mark.parametrize('message', [
    MULTI,
    '1 root error(s) found.\n  (0) NOT_FOUND: %s\n\t [[{{node IteratorGetNext}}]]\n'
    '0 successful operations.\n3 derived errors ignored.' % GONE,
    # Logs TensorFlow appends after the causes repeat them: not the line to show.
    MULTI + '\n\nRecent warning and error logs:\n  OP_REQUIRES failed at '
            'iterator_ops.cc:1118 : NOT_FOUND: %s' % GONE,
    # A cancelled partition listed first is not the cause.
    '2 root error(s) found.\n  (0) CANCELLED: Step was cancelled\n  (1) NOT_FOUND: %s\n'
    '\t [[{{node IteratorGetNext}}]]\n0 successful operations.\n1 derived errors ignored.'
    % GONE,
    # One cause alone: no frame, no code.
    'Graph execution error:\n\nDetected at node \'IteratorGetNext\' defined at (most recent '
    'call last):\n    File "/work/train.py", line 12, in <module>\nNode: \'IteratorGetNext\'\n'
    '%s\n\t [[{{node IteratorGetNext}}]]' % GONE,
])
def test_the_first_cause_without_its_frame(message):
    assert op_error_summary(_error(message)) == GONE


def test_rpc_details_after_a_cause_are_not_the_cause():
    message = ('From /job:worker/replica:0/task:1:\nSocket closed\nAdditional GRPC error '
               'information from remote target /job:worker/replica:0/task:1 while calling '
               '/tensorflow.WorkerService/RecvTensor:\n:{"created":"@1.5","description":'
               '"Error received from peer","grpc_status":14}')
    assert op_error_summary(_error(message, tf.errors.UnavailableError)) == 'Socket closed'
    multi = ('2 root error(s) found.\n  (0) UNAVAILABLE: Socket closed\nAdditional GRPC error '
             'information from remote target /job:ps/replica:0/task:0:\n:{"grpc_status":14}\n'
             '  (1) UNAVAILABLE: Connection reset by peer\n0 successful operations.\n'
             '0 derived errors ignored.')
    assert op_error_summary(_error(multi, tf.errors.UnavailableError)) == 'Socket closed'


def test_a_full_disk_is_the_cause_not_the_hint():
    message = ('2 root error(s) found.\n  (0) RESOURCE_EXHAUSTED: /ckpt/model.ckpt-80_temp/'
               'part-00000-of-00001.data-00000-of-00001.tempstate123; No space left on device\n'
               '\t [[{{node save/SaveV2}}]]\nHint: If you want to see a list of allocated '
               'tensors when OOM happens, add report_tensor_allocations_upon_oom to RunOptions.\n'
               '  (1) RESOURCE_EXHAUSTED: the same\n0 successful operations.\n'
               '0 derived errors ignored.')
    assert op_error_summary(_error(message, tf.errors.ResourceExhaustedError)).endswith(
        '; No space left on device')
    single = 'Read less bytes than requested\n\t [[{{node save/RestoreV2}}]]'
    assert op_error_summary(_error(single, tf.errors.DataLossError)) == \
        'Read less bytes than requested'


def test_an_eager_ops_wrapped_function_and_a_nodes_name_are_left_out():
    """An eager op's error starts with the function TensorFlow wrapped it in, a graph's ends
    with its node: TensorFlow's frame, not the user's words (issue 43)."""
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        tf.io.decode_image(b'\xff\xd8 not a jpeg', channels=3)
    assert raised.value.message.startswith('{{function_node __wrapped__DecodeImage')
    line = op_error_summary(raised.value)
    assert '{{' not in line and line.startswith('Unknown image file format'), line
    assert op_error_summary(_error('Input to reshape is a tensor with 3 values '
                                   '[[{{node tower_0/Reshape}}]]')) == \
        'Input to reshape is a tensor with 3 values'


def test_the_suite_reads_every_error_towers_raises_for_tensorflows_internal_text():
    from tests import conftest
    TowersError('cat/3.jpg is not a decodable image')
    assert conftest._SAID_INTERNALLY == []
    TowersError('cat/3.jpg is not a decodable image ({{function_node __wrapped__DecodeImage}})')
    assert len(conftest._SAID_INTERNALLY) == 1
    del conftest._SAID_INTERNALLY[:]  # (said on purpose: the fixture's check passes)
