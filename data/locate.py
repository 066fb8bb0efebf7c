"""Where a named dataset's files are looked for, and where downloads go.

One search order for every named dataset except the embedded sample:

1. the `data_dir` argument (the CLI's `--data-dir`), when given;
2. `$TOWERS_DATA_DIR/<name>`, when that variable is set and not empty;
3. `~/.cache/towers/<name>`;
4. `/usr/share/datasets/<system name>`, where Debian's `dataset-*` packages
   install data (the system name is Debian's: `fashion-mnist` for
   `fashion_mnist`).

The first folder that already holds the dataset's files wins. When none does,
downloads go to the first folder of the list, which is never the system one:
the `data_dir` argument if given, else `$TOWERS_DATA_DIR/<name>` if set, else
`~/.cache/towers/<name>`.
"""
import collections
import os

SYSTEM_DATA_DIR = '/usr/share/datasets'

Location = collections.namedtuple('Location', ['folder', 'found', 'searched'])
Location.__doc__ = """Where a dataset is, or should go.

Attributes:
    folder: str, the first searched folder holding the files, or else the
        folder downloads should go to.
    found: bool, whether `folder` already holds the files.
    searched: tuple of str, every folder looked in, in order; error messages
        list them.
"""


def search_folders(name, data_dir=None, system_name=None):
    """Returns the folders searched for dataset `name`, in order, as a tuple of str.

    Args:
        name: the dataset's registry name, e.g. 'fashion_mnist'.
        data_dir: str or os.PathLike given by the user, or None.
        system_name: the folder name under SYSTEM_DATA_DIR; defaults to `name`.
    """
    folders = []
    if data_dir is not None:
        folders.append(os.fspath(data_dir))
    root = os.environ.get('TOWERS_DATA_DIR')
    if root:
        folders.append(os.path.join(root, name))
    folders.append(os.path.join(os.path.expanduser('~'), '.cache', 'towers', name))
    folders.append(os.path.join(SYSTEM_DATA_DIR, system_name or name))
    # Two entries can coincide (e.g. --data-dir $TOWERS_DATA_DIR/mnist); list each once.
    return tuple(dict.fromkeys(folders))


def locate(name, has_files, data_dir=None, system_name=None):
    """Finds the folder that holds dataset `name`, or the one to download it to.

    Args:
        name: the dataset's registry name.
        has_files: callable(folder str) -> bool, true when the folder holds
            everything the dataset's reader needs.
        data_dir: str or os.PathLike given by the user, or None.
        system_name: the folder name under SYSTEM_DATA_DIR; defaults to `name`.

    Returns:
        Location(folder, found, searched).
    """
    searched = search_folders(name, data_dir, system_name)
    for folder in searched:
        if has_files(folder):
            return Location(folder, True, searched)
    return Location(searched[0], False, searched)


def describe_search(searched):
    """One phrase for error messages: 'looked in A, B, C'."""
    return 'looked in ' + ', '.join(searched)
