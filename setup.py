"""towers: TF1-style graph-mode multi-tower (data-parallel) training on tf.compat.v1."""
from setuptools import find_packages, setup

# The repository keeps the nets and the datasets in top-level folders, but they
# install (and import) as towers.models and towers.data: top-level `data` and
# `models` packages would collide with any other package of those names, and
# with a user's own data/ folder when `python -m towers` runs from it.
PACKAGE_DIR = {'towers': 'towers', 'towers.data': 'data', 'towers.models': 'models'}

setup(
    name='towers',
    version='0.1.0',
    description='Graph-mode multi-tower data-parallel training on tf.compat.v1',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.9',
    package_dir=PACKAGE_DIR,
    packages=find_packages(include=['towers', 'towers.*']) + ['towers.data', 'towers.models'],
    # The embedded digits sample ships inside the `towers.data` package.
    package_data={'towers': ['docs/*.png'], 'towers.data': ['mnist_sample/*.gz']},
    # tqdm: the training progress bar. ml_dtypes (TensorFlow's bfloat16 and float8 types, which
    # every `towers` process imports with TensorFlow): 0.7.0 takes 0.77 s to import against 0.10 s
    # for 0.6.0 on a 2-core AMD EPYC (`python -X importtime -c 'import ml_dtypes'`), 11% of a
    # `towers devices` process's CPU time; TensorFlow 2.21 asks for >=0.5.1,<1.0.
    install_requires=['numpy', 'tqdm>=4.60', 'ml_dtypes<0.7'],
    # TensorFlow comes as an extra so that CPU machines get the small CPU build
    # and GPU machines the CUDA one; both provide the same `tensorflow` module.
    extras_require={
        'cpu': ['tensorflow-cpu>=2.16'],
        'gpu': ['tensorflow[and-cuda]>=2.16'],
        'plot': ['matplotlib'],  # towers bench --compare --plot
        'tensorboard': ['tensorboard>=2.16'],  # tensorboard --logdir (TF 2.21 lacks it)
        # pytest-xdist: the suite runs on two workers (.ci/run, README's Tests); 3.2 brought
        # --dist worksteal
        'test': ['pytest', 'pytest-xdist>=3.2', 'matplotlib', 'ruff', 'tensorboard>=2.16'],
    },
    entry_points={'console_scripts': ['towers = towers.cli:main']},
)
