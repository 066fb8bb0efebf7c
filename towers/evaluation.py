"""Exact evaluation over a whole dataset, spread over the towers, and how it is printed.

Every example counts once, the last partial batch included: batch means are
re-weighted by their batch size. Used by the Evaluate callback, the final test
line of a run, and `towers eval`.
"""
from towers.errors import TowersError


def evaluate(sess, graph, dataset, batch_size):
    """Mean loss and metrics over a whole DataSet, last partial batch included.

    Args:
      sess: a Session on graph.graph with the variables initialised.
      graph: a TrainGraph or EvalGraph (its inference-mode towers are used).
      dataset: anything with `images` [N, H, W, C] and `labels` [N] arrays.
      batch_size: global batch per run, spread over the towers.
    Returns:
      {'loss': float, metric name: float, ...}, each the mean over all N.
    """
    total = len(dataset.labels)
    if total == 0:
        raise TowersError('cannot evaluate on an empty dataset')
    fetches = dict(graph.eval_metrics, loss=graph.eval_loss)
    sums = dict.fromkeys(fetches, 0.0)
    for start in range(0, total, batch_size):
        images = dataset.images[start:start + batch_size]
        labels = dataset.labels[start:start + batch_size]
        values = sess.run(fetches, {graph.eval_images: images, graph.eval_labels: labels})
        # Batch means are re-weighted by batch size so the short last batch
        # counts exactly as much as its examples.
        for name, value in values.items():
            sums[name] += float(value) * len(labels)
    return {name: value / total for name, value in sums.items()}


def split_size(datasets, split):
    """How many examples datasets.<split> holds (0 when there is no such set)."""
    dataset = getattr(datasets, split, None)
    return 0 if dataset is None else len(dataset.labels)


def format_metrics(values):
    names = ['loss'] + sorted(n for n in values if n != 'loss')
    return ' '.join('%s %.4f' % (n, values[n]) for n in names if n in values)
