"""Easy 28x28 'digits' for fast trainer tests: class c lights one 7x7 cell of a 4x4 grid."""
import numpy as np

SHAPE = (28, 28, 1)


def images_and_labels(num, rng):
    """num images [num, 28, 28, 1] float32 on faint noise, and their int labels in [0, 10)."""
    labels = rng.randint(0, 10, num)
    images = rng.rand(num, *SHAPE).astype(np.float32) * 0.1
    for image, label in zip(images, labels):
        row, col = divmod(label, 4)
        image[row * 7:row * 7 + 7, col * 7:col * 7 + 7] += 0.9
    return images, labels
