"""towers plan: the network terms to the byte, the units, and bad input in one line."""
import json

import pytest

from towers.cli import main
from towers.cluster import emulate
from towers.cluster.emulate import parse_delay, parse_link, parse_rate
from towers.errors import SettingError
from towers.tools import plan

MB = 1e6


def test_rates_and_delays_read_as_bytes_per_second_and_seconds():
    assert parse_rate('25Gbit') == 3.125e9
    assert parse_rate('100Mbit') == 12.5e6
    assert parse_rate('1GB') == 1e9
    assert parse_delay('10us') == pytest.approx(1e-5)
    assert parse_delay('0') == 0.0
    assert parse_link('200Mbit,1ms') == (25e6, pytest.approx(1e-3))
    with pytest.raises(SettingError, match=r"^bandwidth is a positive rate such as 25Gbit, "
                                           r"100Mbit or 1GB, not 'fast'$"):
        parse_rate('fast')
    with pytest.raises(SettingError, match=r"^latency is a time such as 10us"):
        parse_delay('10')


def test_variables_go_to_the_least_loaded_ps_task():
    assert plan.shard_bytes([100, 60, 50, 10], 2) == [110, 110]
    assert plan.shard_bytes([100, 60, 50, 10], 1) == [220]


def test_the_ring_moves_2_n_minus_1_over_n_of_the_gradients():
    seconds, formula = plan.communication('collective', 4, [3 * MB, 1 * MB], 1e9, 1e-5)
    # 2*3/4 * 4 MB over 1 GB/s, and 2*3 latencies for each of one buffer and the results.
    assert seconds == pytest.approx(6e-3 + 12e-5)
    assert formula.endswith('= 6.00 MB/B + 12*a')
    assert plan.communication('collective', 1, [4 * MB], 1e9, 1e-5)[0] == 0.0


def test_a_ps_step_pulls_then_pushes_through_its_busiest_link():
    # Two ps tasks hold 3 MB and 1 MB; four workers of two towers each: ps task 0 sends
    # 4*3 MB (each worker reads once, whatever its towers) and receives 4*3 MB (one sum
    # per worker).
    seconds, formula = plan.communication('parameter-server', 4, [3 * MB, 1 * MB], 1e9, 1e-5,
                                          towers=2, ps=2)
    assert seconds == pytest.approx((12 + 12) * MB / 1e9 + 4e-5)
    assert formula == '2*max(S, N*S_p)/B + 4a = (12.00 MB + 12.00 MB)/B + 4a'
    # One worker and a ps: the worker's own link, S each way.
    seconds, _ = plan.communication('parameter-server', 1, [4 * MB], 1e9, 0.0, ps=1)
    assert seconds == pytest.approx(8e-3)
    # In-graph without ps tasks: the chief holds the variables; the other worker reads
    # and sends back G*S, and is fed its slice.
    seconds, _ = plan.communication('in-graph', 2, [4 * MB], 1e9, 0.0, towers=1, ps=0,
                                    input_bytes=1 * MB)
    assert seconds == pytest.approx(9e-3)


def test_plan_prints_each_worker_count_from_the_device_flops(capsys):
    assert main(['plan', '--model', 'small_convnet', '--workers', '1,4', '--batch-size', '64',
                 '--bandwidth', '1GB', '--latency', '0', '--cluster-mode', 'collective',
                 '--device-flops', '1T', '--all-reduce-bucket', '0', '--json']) == 0
    out = capsys.readouterr().out
    rows = json.loads(out[out.index('\n[') + 1:])
    compute = rows[0]['compute_s']
    assert [(r['workers'], r['network_s']) for r in rows] == [
        (1, 0.0), (4, pytest.approx(1.5 * 217640 * 1514 / 1448 / 1e9 + 0))]  # TCP/IP framing
    for row in rows:
        assert row['step_s'] == pytest.approx(compute + row['network_s'])
        assert row['images_per_sec'] == pytest.approx(row['workers'] * 64 / row['step_s'])
        assert row['efficiency'] == pytest.approx(compute / row['step_s'])


def test_an_overlapped_all_reduce_waits_for_the_forward_pass_and_the_last_bucket():
    # Gradients of 300, 100, 200 and 50 kB in build order: reversed, with the batch size's
    # 4 bytes first, each bucket closed once it holds 256 kB: [4 + 50 + 200 + 100 kB], then
    # [300 kB].
    sizes = [300e3, 100e3, 200e3, 50e3]
    step, network, formula = plan.overlapped(0.3, 2, sizes, 1e6, 1e-3, 256e3)
    first, last = 350004 / 1e6 + 2e-3, 300e3 / 1e6 + 2e-3  # each bucket: S_j/B + 2(N-1)a
    assert network == pytest.approx(first + last + 2e-3)  # and the step's results
    assert step == pytest.approx(max(0.3 + last, 0.1 + network))  # the network's: 0.756
    assert formula.startswith('2 buckets; max(C + t_last, C/3 + W)')
    # Compute-bound: only the last bucket's all-reduce is left after the backward pass.
    assert plan.overlapped(2.0, 2, sizes, 1e6, 1e-3, 256e3)[0] == pytest.approx(2.0 + last)
    # One bucket: nothing to overlap, the whole all-reduce after the backward pass.
    assert plan.overlapped(2.0, 2, sizes, 1e6, 0.0, 1e9)[0] == pytest.approx(2.0 + 0.650004)
    # predict() gives the link's bandwidth; the payload gets 1448 bytes of every 1514.
    rows = plan.predict('collective', [1, 2], 0.3, 64, sizes, 1514 / 1448 * 1e6, 1e-3,
                        bucket_bytes=256e3)
    assert [row['step_s'] for row in rows] == [0.3, pytest.approx(step)]


@pytest.mark.parametrize('flags,message', [
    (['--bandwidth', 'fast'], "--bandwidth is a positive rate such as 25Gbit"),
    (['--ps', '0'], '--cluster-mode parameter-server needs --ps of at least 1'),
    (['--ps', 'many'], "--ps is a count of 0 or more, or \"workers\", not 'many'"),
    (['--devices-per-worker', '0'], '--devices-per-worker is at least 1, got 0'),
    (['--device-flops', 'lots'], '--device-flops is a positive FLOP/s such as 4.5T'),
])
def test_bad_plan_flags_are_one_line(capsys, flags, message):
    assert main(['plan', '--model', 'small_convnet'] + flags) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_emulated_links_refuse_bad_input_and_a_machine_that_cannot_make_them(capsys,
                                                                             monkeypatch):
    command = ['launch', '--workers', '2', '--emulate-link']
    assert main(command + ['fast,0', '--', 'train']) == 1
    assert capsys.readouterr().err == ("towers: error: --emulate-link is a positive rate such "
                                       "as 25Gbit, 100Mbit or 1GB, not 'fast'\n")
    monkeypatch.setattr('os.geteuid', lambda: 1000)
    assert emulate.unavailable() == 'emulating links needs root (network namespaces and tc)'
    assert main(command + ['100Mbit,0', '--', 'train']) == 1
    assert capsys.readouterr().err == ('towers: error: --emulate-link: emulating links needs '
                                       'root (network namespaces and tc)\n')
