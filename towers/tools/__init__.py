"""Tools that use the core and are never used by it.

  bench.py    towers bench: images/sec per tower count and input, mean ± stderr
  compare.py  towers bench --compare: against the textbook loop and Keras (peers.py)
  explain.py  towers explain: where each op ran, FLOPs, bytes between devices
  trace.py    --trace: one step as a Chrome trace, its summary and picture
  check.py    towers check: N towers against one device on the same batches
  export.py   towers export: a SavedModel of one tower
"""
