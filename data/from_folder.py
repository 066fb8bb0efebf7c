"""`towers data convert --from-folder`: a folder of images per class -> ImageNet-format shards.

The layout torchvision's ImageFolder and Keras' image_dataset_from_directory read: one
subfolder per class, its images inside (JPEG or PNG, any case of the extension). The classes
are the subfolder names in sorted order, labelled 1..C as build_imagenet_data.py labels its
synsets (towers trains on label - 1; `labels.txt` in the output lists them, line i+1 for
class i). The images are shuffled with a fixed seed before they are dealt into shards, as
build_imagenet_data.py does, so that every shard holds every class and a reader's shuffle
buffer mixes them. A JPEG is kept as it is (after checking that it decodes); a PNG is
decoded and encoded as a JPEG (quality 95), as the schema holds JPEGs.

Each shard is written by one of K worker processes beside its final name and renamed when
complete; `manifest.json` (each shard's records, bytes and SHA-256, and the classes) is
written last, so a folder with a manifest is complete. A file that is not a decodable image
stops the conversion with one line naming it (and the shards already written are removed:
a failed conversion leaves nothing), or with skip_bad_images is counted, named in the result
and left out.
"""
import concurrent.futures
import json
import multiprocessing
import os

import numpy as np

from towers.data.atomic import atomic_output, written_beside
from towers.data.download import sha256_of_file
from towers.data.errors import DataError

FORMAT = 'towers-imagenet-1'
MANIFEST = 'manifest.json'
LABELS = 'labels.txt'
EXTENSIONS = ('.jpg', '.jpeg', '.png')
SHUFFLE_SEED = 12345  # build_imagenet_data.py's


def list_images(folder):
    """(class names sorted, [(path, label 1..C)] sorted by class then name)."""
    if not os.path.isdir(folder):
        raise DataError('%s is not a folder of class subfolders' % folder)
    # Hidden entries are not classes or images (.ipynb_checkpoints, macOS' ._x.jpg).
    classes = sorted(entry.name for entry in os.scandir(folder)
                     if entry.is_dir() and not entry.name.startswith('.'))
    if not classes:
        raise DataError('%s has no class subfolders (one folder of images per class, as '
                        'ImageFolder reads)' % folder)
    images = []
    for label, name in enumerate(classes, start=1):
        directory = os.path.join(folder, name)
        images += [(os.path.join(directory, f), label) for f in sorted(os.listdir(directory))
                   if f.lower().endswith(EXTENSIONS) and not f.startswith('.')]
    if not images:
        raise DataError('%s has class subfolders but no .jpg, .jpeg or .png image in them'
                        % folder)
    return classes, images


def convert_folder(train_folder, out, num_shards=8, validation_folder=None, workers=None,
                   skip_bad_images=False, progress=None):
    """Write the folder(s) as ImageNet-format shards with a manifest.

    Args:
      train_folder: class subfolders of training images.
      out: the output folder (created; must not hold a manifest yet).
      num_shards: training shards (the validation split gets a quarter, at least one).
      validation_folder: class subfolders of validation images (the same classes), or None.
      workers: processes writing shards (None: the CPU count, at most 8).
      skip_bad_images: leave out (and name) files that do not decode, instead of stopping.
      progress: callable(images done) called as shards finish, or None.
    Returns:
      The manifest dict, with 'skipped': [(path, reason)].
    Raises:
      DataError: no images, another class list in validation, a manifest already there,
        or a bad image (without skip_bad_images) named with its path.
    """
    if num_shards < 1:
        raise DataError('--shards must be at least 1, got %d' % num_shards)
    if os.path.exists(os.path.join(out, MANIFEST)):
        raise DataError('%s already holds shards (%s); choose an empty --out folder'
                        % (out, MANIFEST))
    classes, train = list_images(train_folder)
    splits = {'train': (train, num_shards)}
    if validation_folder is not None:
        validation_classes, validation = list_images(validation_folder)
        if validation_classes != classes:
            raise DataError('%s has other classes than %s (%d against %d folders, first '
                            'difference %r): give both the same class subfolders'
                            % (validation_folder, train_folder, len(validation_classes),
                               len(classes), _first_difference(validation_classes, classes)))
        splits['validation'] = (validation, max(1, num_shards // 4))
    created = not os.path.exists(out)
    os.makedirs(out, exist_ok=True)
    jobs = []
    for split, (images, shards) in splits.items():
        order = np.random.RandomState(SHUFFLE_SEED).permutation(len(images))
        shuffled = [images[i] for i in order]
        shards = min(shards, len(shuffled))
        for index, part in enumerate(np.array_split(np.arange(len(shuffled)), shards)):
            name = '%s-%05d-of-%05d' % (split, index, shards)
            jobs.append((split, os.path.join(out, name), [shuffled[i] for i in part],
                         skip_bad_images))
    manifest = {'format': FORMAT, 'classes': classes, 'splits': {}, 'skipped': []}
    workers = min(workers or min(8, os.cpu_count() or 1), len(jobs))
    with _pool(workers) as pool:
        futures = {pool.submit(write_shard, *job[1:]): job for job in jobs}
        done = {}
        try:
            # As they finish: a bad image stops the conversion as soon as its shard fails.
            for future in concurrent.futures.as_completed(futures):
                done[futures[future][1]] = future.result()
                if progress:
                    progress(len(futures[future][2]))
            for split, path, _, _ in jobs:  # the manifest in shard order
                records, skipped = done[path]
                entry = manifest['splits'].setdefault(split, {'records': 0, 'shards': []})
                entry['records'] += records
                entry['shards'].append({'file': os.path.basename(path), 'records': records,
                                        'bytes': os.path.getsize(path),
                                        'sha256': sha256_of_file(path)})
                manifest['skipped'] += skipped
        except BaseException:
            for future in futures:
                future.cancel()
            concurrent.futures.wait(futures)
            _remove([job[1] for job in jobs], out if created else None)
            raise
    with open(os.path.join(out, LABELS), 'w', encoding='utf-8') as f:
        f.write(''.join(name + '\n' for name in classes))
    with atomic_output(os.path.join(out, MANIFEST)) as f:
        f.write(json.dumps(manifest, indent=1).encode())
    return manifest


def _pool(workers):
    """Processes that write shards side by side; one worker writes them in a thread of this
    process, which has TensorFlow loaded already (a process of its own would load it anew:
    4 s of CPU on a 2-core AMD EPYC, longer than a small folder's shards take)."""
    if workers == 1:
        return concurrent.futures.ThreadPoolExecutor(1)
    context = multiprocessing.get_context('spawn')  # TensorFlow does not survive a fork
    return concurrent.futures.ProcessPoolExecutor(workers, mp_context=context)


def _remove(paths, folder):
    """A failed conversion leaves nothing: the shards it wrote, and the folder it made."""
    for path in paths:
        for name in (path, path + '.partial'):
            if os.path.exists(name):
                os.unlink(name)
    if folder is not None and not os.listdir(folder):
        os.rmdir(folder)


def _first_difference(a, b):
    return next((x for x, y in zip(a, b) if x != y), (a + b)[min(len(a), len(b))])


def write_shard(path, images, skip_bad_images):
    """Write one shard (in a worker process, or a thread of this one where there is one
    worker): (records written, [(path, reason)] skipped).

    Raises:
      DataError: a file that does not decode, named, unless skip_bad_images.
    """
    import tensorflow as tf

    from towers.data.imagenet import make_example
    from towers.errors import op_error_summary
    from towers.quiet import native_stderr_silenced
    skipped, records = [], 0
    with written_beside(path) as partial, tf.io.TFRecordWriter(partial) as writer:
        for image_path, label in images:
            try:
                jpeg, height, width = _as_jpeg(tf, image_path, native_stderr_silenced)
            except (tf.errors.OpError, OSError, ValueError) as e:
                reason = (op_error_summary(e) if isinstance(e, tf.errors.OpError)
                          else str(e).strip().splitlines()[0])
                if not skip_bad_images:
                    raise DataError('%s is not a decodable image (%s); remove it, or pass '
                                    '--skip-bad-images to leave it out'
                                    % (image_path, reason)) from None
                skipped.append((image_path, reason))
                continue
            writer.write(make_example(jpeg, label, height, width))
            records += 1
    return records, skipped


def _as_jpeg(tf, path, silenced):
    """(JPEG bytes, height, width) of an image file: a JPEG kept, a PNG re-encoded."""
    with open(path, 'rb') as f:
        raw = f.read()
    with silenced():  # libjpeg's own warnings about the file
        image = tf.io.decode_image(raw, channels=3, expand_animations=False)
    height, width = int(image.shape[0]), int(image.shape[1])
    if tf.io.is_jpeg(raw).numpy():
        return raw, height, width
    return tf.io.encode_jpeg(image, quality=95).numpy(), height, width
