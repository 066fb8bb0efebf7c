"""Safe, all-or-nothing extraction of tar archives (plain, gzip, bz2 or xz).

Members are checked one by one before anything of theirs is written, and
written by this module itself (never by TarFile.extract), into a hidden
temporary folder beside the destination; the wanted folder is renamed into
place only once the whole archive has been read. So a refused member, a
corrupt archive, a full disk or Ctrl-C leaves the destination absent, never a
half folder that a later run would take as complete.
"""
import gzip
import os
import shutil
import tarfile
import tempfile
import zlib

from towers.data.errors import DataError

_CHUNK_BYTES = 1 << 20


class ArchiveError(DataError):
    """An archive is unreadable, unsafe (a member would land outside its folder) or incomplete."""


def extract_folder(archive_path, folder_name, dest_dir, required=()):
    """Extracts the archive's top-level `folder_name/` as dest_dir/folder_name.

    Every member must be a regular file or a folder whose path stays inside
    the extraction folder: absolute paths, `..` components, symbolic and hard
    links, devices and fifos are refused. Dataset archives hold only files
    and folders, so links are refused whatever they point at; a link that
    points inside is one member away from one that points outside. Members
    outside `folder_name/` are checked like the rest, then dropped.

    Args:
        archive_path: str or os.PathLike, the tar archive.
        folder_name: the top-level folder to keep, e.g. 'cifar-10-batches-bin'.
        dest_dir: str or os.PathLike, where that folder goes; created if needed.
        required: file names, relative to `folder_name/`, that must be among
            the extracted files; the folder is not moved into place otherwise.

    Returns:
        str, the path of dest_dir/folder_name.

    Raises:
        ArchiveError: a member is unsafe (the message names it), the archive
            is corrupt or lacks `folder_name/` or a required file,
            dest_dir/folder_name already exists, or writing failed. Nothing
            is left behind.
    """
    archive_path = os.fspath(archive_path)
    dest_dir = os.fspath(dest_dir)
    final = os.path.join(dest_dir, folder_name)
    if os.path.lexists(final):
        raise ArchiveError(f'{final} already exists; delete it to extract {archive_path} again')
    try:
        os.makedirs(dest_dir, exist_ok=True)
        work = tempfile.mkdtemp(dir=dest_dir, prefix=f'.{folder_name}.', suffix='.extract')
    except OSError as err:
        raise ArchiveError(f'cannot extract {archive_path} into {dest_dir}: {err}') from err
    try:
        _extract_all(archive_path, work)
        extracted = os.path.join(work, folder_name)
        if not os.path.isdir(extracted) or os.path.islink(extracted):
            raise ArchiveError(f'{archive_path} holds no {folder_name}/ folder; it is not the '
                               'expected archive, delete it and fetch it again')
        absent = [name for name in required
                  if not os.path.isfile(os.path.join(extracted, name))]
        if absent:
            raise ArchiveError(f'{archive_path} lacks {", ".join(absent)} in {folder_name}/; it '
                               'is incomplete, delete it and fetch it again')
        try:
            os.rename(extracted, final)
        except OSError as err:
            # Another process may have finished the same extraction first.
            if not os.path.isdir(final):
                raise ArchiveError(f'cannot move the extracted {folder_name} to {final}: '
                                   f'{err}') from err
        _fsync_folder(dest_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def _extract_all(archive_path, root):
    """Writes every member of the archive under `root`, refusing unsafe ones."""
    try:
        with tarfile.open(archive_path, 'r:*') as tar:
            for member in tar:
                target = _checked_target(member, root, archive_path)
                if target is None:
                    continue
                try:
                    if member.isdir():
                        os.makedirs(target, exist_ok=True)
                    else:
                        _write_file(tar, member, target)
                except gzip.BadGzipFile:
                    raise  # a corrupt archive, reported below; not a writing problem
                except (OSError, ValueError) as err:
                    raise ArchiveError(f'cannot extract member {member.name!r} of {archive_path} '
                                       f'into {root}: {err}') from err
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise ArchiveError(f'{archive_path} is corrupt or truncated ({err}); delete it and fetch '
                           'it again') from err
    except FileNotFoundError as err:
        raise ArchiveError(f'{archive_path}: no such archive') from err


def _checked_target(member, root, archive_path):
    """Returns where `member` goes under root, None to skip it, or raises ArchiveError."""
    name = member.name

    def refuse(why):
        return ArchiveError(f'refusing archive member {name!r} of {archive_path}: {why}; the '
                            'archive is damaged or malicious, nothing was extracted')
    if name.startswith('/'):
        raise refuse('absolute path')
    if '..' in name.replace('\\', '/').split('/'):
        raise refuse("'..' in its path")
    target = os.path.realpath(os.path.join(root, name))
    if not _inside(target, root):
        raise refuse('it would land outside the target folder')
    if member.issym() or member.islnk():
        kind = 'symbolic link' if member.issym() else 'hard link'
        # A symlink's target is relative to its own folder; a hard link's to the archive root.
        base = os.path.dirname(target) if member.issym() else root
        points = os.path.realpath(os.path.join(base, member.linkname))
        where = ('points outside the target folder' if not _inside(points, root)
                 else 'links are not extracted')
        raise refuse(f'{kind} to {member.linkname!r}, {where}')
    if member.isdir():
        return target
    if not member.isreg():
        raise refuse('device, fifo or other special file')
    if target == os.path.realpath(root):
        raise refuse('a file where the target folder is')
    return target


def _inside(path, root):
    root = os.path.realpath(root)
    return os.path.commonpath([root, path]) == root


def _write_file(tar, member, target):
    os.makedirs(os.path.dirname(target), exist_ok=True)
    source = tar.extractfile(member)
    # Written with 'wb', not 'xb': tar lets a later member replace an earlier one.
    with source, open(target, 'wb') as out:
        shutil.copyfileobj(source, out, _CHUNK_BYTES)
        out.flush()
        # Synced before the final rename, so a crash cannot leave empty files under real names.
        os.fsync(out.fileno())


def _fsync_folder(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
