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
      dataset: anything with `images` [N, H, W, C] and `labels` [N] arrays, or with
        batches(batch_size) giving them a batch at a time (a split streamed from disk,
        data.image_splits.StreamedSplit).
      batch_size: global batch per run, spread over the towers.
    Returns:
      {'loss': float, metric name: float, ...}, each the mean over all N.
    """
    if split_size(dataset) == 0:
        raise TowersError('cannot evaluate on an empty dataset')
    fetches = dict(graph.eval_metrics, loss=graph.eval_loss)
    sums, total = dict.fromkeys(fetches, 0.0), 0
    batches = (dataset.batches(batch_size) if hasattr(dataset, 'batches') else
               ((dataset.images[start:start + batch_size],
                 dataset.labels[start:start + batch_size])
                for start in range(0, len(dataset.labels), batch_size)))
    for images, labels in batches:
        total += len(labels)
        values = sess.run(fetches, {graph.eval_images: images, graph.eval_labels: labels})
        # Batch means are re-weighted by batch size so the short last batch
        # counts exactly as much as its examples.
        for name, value in values.items():
            sums[name] += float(value) * len(labels)
    if total == 0:  # a streamed split whose every record was skipped
        raise TowersError('cannot evaluate on an empty dataset')
    return {name: value / total for name, value in sums.items()}


def split_size(datasets, split=None):
    """How many examples datasets.<split> (or datasets itself) holds (0 when there is no
    such set)."""
    dataset = datasets if split is None else getattr(datasets, split, None)
    if dataset is None:
        return 0
    return dataset.num_examples if hasattr(dataset, 'batches') else len(dataset.labels)


def format_metrics(values):
    names = ['loss'] + sorted(n for n in values if n != 'loss')
    return ' '.join('%s %.4f' % (n, values[n]) for n in names if n in values)
