"""Fashion-MNIST: Zalando's 28x28 grey clothing images, in MNIST's IDX format and file names.

Read with data.read_data_sets(folder, files=FILES, mirrors=MIRRORS) or, with
the search order of data.locate, data.load_dataset('fashion_mnist').
"""
from towers.data.mnist import FileSpec, IdxSource, MnistPaths

# SHA-256 and sizes from tensorflow/datasets, tensorflow_datasets/url_checksums/fashion_mnist.txt
# (the same values appear in many other public projects). Debian's dataset-fashion-mnist holds
# the same images recompressed, with other sizes and sums: local files are not checksummed.
FILES = MnistPaths(
    train_images=FileSpec('train-images-idx3-ubyte.gz', 26421880,
                          '3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84'),
    train_labels=FileSpec('train-labels-idx1-ubyte.gz', 29515,
                          'a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845'),
    test_images=FileSpec('t10k-images-idx3-ubyte.gz', 4422102,
                         '346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073'),
    test_labels=FileSpec('t10k-labels-idx1-ubyte.gz', 5148,
                         '67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5'),
)

MIRRORS = ('http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/',)

SOURCE = IdxSource('Fashion-MNIST', FILES, MIRRORS)

# Debian's dataset-fashion-mnist installs under /usr/share/datasets/fashion-mnist.
SYSTEM_NAME = 'fashion-mnist'

# Label i is CLASS_NAMES[i], as in the dataset's README.
CLASS_NAMES = ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat',
               'Sandal', 'Shirt', 'Sneaker', 'Bag', 'Ankle boot')
