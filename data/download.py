"""Checksum-verified downloads with mirror fallback.

A download streams into a temporary file next to the destination and is
renamed into place only once its SHA-256 matches, so the destination is
either absent or correct: never partial, never wrong.
"""
import hashlib
import http.client
import logging
import os
import urllib.error
import urllib.request

from towers.data.atomic import atomic_output
from towers.data.errors import ChecksumError, DownloadError

_CHUNK_BYTES = 1 << 16
_USER_AGENT = 'towers-data/0.1 (+urllib)'
_log = logging.getLogger(__name__)


class _MirrorFailed(Exception):
    """One mirror did not deliver the right bytes; try the next one."""


def download(urls, dest_path, sha256, timeout=30.0):
    """Fetches a file from the first mirror that serves the expected bytes.

    Args:
        urls: a URL or a sequence of URLs for the same file, tried in order.
        dest_path: str or os.PathLike, where the file goes. Its folder is
            created if needed.
        sha256: expected SHA-256, hex string.
        timeout: seconds allowed for connecting and for each read.

    Returns:
        dest_path as a str.

    Raises:
        ChecksumError: dest_path already exists with a different SHA-256
            (it is left untouched).
        DownloadError: every mirror failed; `.reasons` lists (url, reason).
    """
    dest_path = os.fspath(dest_path)
    urls = [urls] if isinstance(urls, str) else list(urls)
    sha256 = sha256.lower()
    if os.path.exists(dest_path):
        actual = sha256_of_file(dest_path)
        if actual == sha256:
            return dest_path
        raise ChecksumError(f'{dest_path} already exists but its SHA-256 is {actual}, expected '
                            f'{sha256}; delete it or replace it with a good copy')
    os.makedirs(os.path.dirname(os.path.abspath(dest_path)), exist_ok=True)
    reasons = []
    for url in urls:
        _log.info('downloading %s to %s', url, dest_path)
        try:
            _fetch(url, dest_path, sha256, timeout)
            return dest_path
        except _MirrorFailed as err:
            reasons.append((url, str(err)))
            _log.warning('mirror failed: %s: %s', url, err)
    tried = '; '.join(f'{url}: {reason}' for url, reason in reasons) or 'no mirrors given'
    raise DownloadError(f'could not download {os.path.basename(dest_path)} ({tried}); put the '
                        f'file at {dest_path} by hand (sha256 {sha256})', reasons)


def sha256_of_file(path):
    """Returns the hex SHA-256 of the file at `path`, read in chunks."""
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(_CHUNK_BYTES), b''):
            digest.update(chunk)
    return digest.hexdigest()


def _fetch(url, dest_path, sha256, timeout):
    """Streams one URL into place, or raises _MirrorFailed leaving no file."""
    # atomic_output also removes the .part file on Ctrl-C mid-download.
    with atomic_output(dest_path, suffix='.part') as out:
        actual = _stream(url, out, timeout)
        if actual != sha256:
            raise _MirrorFailed(f'checksum mismatch (got sha256 {actual})')


def _stream(url, out, timeout):
    """Copies the body at `url` into `out`; returns its hex SHA-256."""
    digest = hashlib.sha256()
    request = urllib.request.Request(url, headers={'User-Agent': _USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for chunk in iter(lambda: response.read(_CHUNK_BYTES), b''):
                digest.update(chunk)
                out.write(chunk)
    except urllib.error.HTTPError as err:
        raise _MirrorFailed(f'HTTP {err.code} {err.reason}') from err
    except urllib.error.URLError as err:
        raise _MirrorFailed(_one_line(err.reason)) from err
    except (OSError, http.client.HTTPException, ValueError) as err:
        # OSError covers timeouts and resets; ValueError an unusable URL.
        raise _MirrorFailed(_one_line(err) or type(err).__name__) from err
    return digest.hexdigest()


def _one_line(reason):
    return ' '.join(str(reason).split())


def mirror_urls(mirrors, name):
    """The URLs of file `name` on each mirror base URL, in order."""
    return [base.rstrip('/') + '/' + name for base in mirrors]


def missing_reason(failure):
    """Why a file is still missing, for an error message: the mirrors' reasons, or
    that downloading was off (failure None)."""
    if failure is None:
        return 'downloading is disabled'
    return 'download failed: ' + '; '.join(f'{url}: {why}' for url, why in failure.reasons)
