"""The two TFDS folders beside this file, as tensorflow-datasets 4.9.10 wrote them:

    pip install tensorflow-datasets==4.9.10 && python make.py tests/data/tfds_folders

(not run by the tests, which have no tensorflow-datasets: they read what it wrote).
tiny/1.0.0: 8x8x1 PNGs, 3 named classes; tiny_jpeg/2.0.0: JPEGs of varying size, 4 classes.
"""
import sys

import numpy as np
import tensorflow_datasets as tfds


class Tiny(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version('1.0.0')

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(8, 8, 1)),
            'label': tfds.features.ClassLabel(names=['a', 'b', 'c']),
        }), supervised_keys=('image', 'label'))

    def _split_generators(self, dl_manager):
        return {'train': self._generate_examples(20, 0),
                'test': self._generate_examples(6, 1)}

    def _generate_examples(self, n, seed):
        rng = np.random.RandomState(seed)
        for i in range(n):
            yield i, {'image': rng.randint(0, 256, (8, 8, 1)).astype(np.uint8),
                      'label': int(rng.randint(3))}


class TinyJpeg(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version('2.0.0')

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(encoding_format='jpeg'),
            'label': tfds.features.ClassLabel(num_classes=4),
            'file_name': tfds.features.Text(),
        }), supervised_keys=('image', 'label'))

    def _split_generators(self, dl_manager):
        return {'train': self._generate_examples(8, 0),
                'validation': self._generate_examples(4, 1)}

    def _generate_examples(self, n, seed):
        rng = np.random.RandomState(seed)
        for i in range(n):
            yield i, {'image': rng.randint(0, 256, (20 + 2 * i, 24, 3)).astype(np.uint8),
                      'label': i % 4, 'file_name': 'f%d.jpg' % i}


if __name__ == '__main__':
    for builder in (Tiny, TinyJpeg):
        builder(data_dir=sys.argv[1]).download_and_prepare()
