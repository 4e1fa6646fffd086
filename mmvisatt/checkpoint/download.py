"""Checkpoints named by URL: downloaded once into a cache keyed by the whole URL, never cached partial, cut or
wrong, never waiting for ever, and every failure naming the URL, the HTTP status and the cache path.

* The cache: ``$TORCH_HOME/hub/checkpoints/mmvisatt/<first 16 hex digits of the URL's SHA-256>/<file name>``, so
  two URLs that end in the same file name (``.../in1k/reswin_t.pth``, ``.../in22k/reswin_t.pth``) never share a file.
* A download has a connect timeout, a timeout for the server's answer and one per read once it answers
  (:data:`CONNECT_TIMEOUT_S`, :data:`ANSWER_TIMEOUT_S`, :data:`READ_TIMEOUT_S`), is tried :data:`ATTEMPTS` times on
  network errors and 5xx / 429 answers, but a host that gives no answer at all is reported within
  :data:`NO_ANSWER_DEADLINE_S` seconds, and it logs its progress.
* A URL's query string (a signed URL's token) is never printed; a signed URL with a new token is another cache
  entry, and the log says so when the cache holds a copy from the same address already.
* It is written under a temporary name in the cache folder, checked (as long as the server said; a checkpoint and
  not a web page; opens with the loader) and only then renamed to its cache name. A cached file that does not open
  is deleted and fetched once more.
* Processes that share the cache (the ranks of a node, or nodes on a shared file system) take a file lock on the
  cache folder: the first downloads, the others wait and then read its copy.
"""
import contextlib
import fcntl
import hashlib
import http.client
import os
import os.path as osp
import socket
import ssl
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterator, Optional

import torch
from mmengine.logging import print_log

from .safe_load import load_checkpoint_file

CONNECT_TIMEOUT_S = 30.
# seconds for the answer (the response's status and headers) after the request went out, and the whole time the
# attempts may take while a host gives none: a host that accepts connections and never answers is reported after
# two attempts
ANSWER_TIMEOUT_S = 40.
NO_ANSWER_DEADLINE_S = 90.
MIN_ATTEMPT_S = 15.
READ_TIMEOUT_S = 60.
ATTEMPTS = 3
RETRY_WAIT_S = 2.
CHUNK = 1 << 20
# progress lines: one per this share of a file whose size the server gives, else one per PROGRESS_BYTES
PROGRESS_SHARE = 0.1
PROGRESS_BYTES = 100 * 2**20
_RETRIED_STATUS = {408, 429, 500, 502, 503, 504}


class CheckpointDownloadError(OSError):
    """A checkpoint URL could not be downloaded, or did not give a checkpoint; nothing was cached."""


def is_url(path: Any) -> bool:
    """Whether ``path`` is an ``http(s)://`` URL, which :func:`download_checkpoint` fetches."""
    return isinstance(path, str) and path.startswith(('http://', 'https://'))


def shown(url: str) -> str:
    """``url`` as logs and errors print it: without its query string, which can hold a signed URL's token."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(query='<query hidden>' if parts.query else '', fragment=''))


def _address(url: str) -> str:
    """The key of ``url`` without its query string, kept beside each cache entry."""
    return hashlib.sha256(shown(url).encode()).hexdigest()[:16]


def url_cache_path(url: str, model_dir: Optional[str] = None) -> str:
    """Where the checkpoint at ``url`` is cached (see the module's docstring); ``model_dir`` replaces
    ``$TORCH_HOME/hub/checkpoints/mmvisatt``."""
    model_dir = model_dir or osp.join(torch.hub.get_dir(), 'checkpoints', 'mmvisatt')
    name = osp.basename(urllib.parse.urlparse(url).path) or 'checkpoint.pth'
    return osp.join(model_dir, hashlib.sha256(url.encode()).hexdigest()[:16], name)


def _timed(base: type, connect_s: float, answer_s: float, read_s: float) -> type:
    """``base`` (an ``http.client`` connection class) that waits ``connect_s`` to connect, ``answer_s`` for the
    answer, then ``read_s`` for each read: urllib has one timeout for all three."""

    class TimedConnection(base):
        def connect(self) -> None:
            self.timeout = connect_s
            super().connect()
            self.sock.settimeout(answer_s)

        def getresponse(self):
            sock = self.sock
            response = super().getresponse()
            sock.settimeout(read_s)  # the response reads through this socket (closed here only once it is done)
            return response

    return TimedConnection


def _opener(connect_s: float, read_s: float, answer_s: float) -> urllib.request.OpenerDirector:
    http_conn = _timed(http.client.HTTPConnection, connect_s, answer_s, read_s)
    https_conn = _timed(http.client.HTTPSConnection, connect_s, answer_s, read_s)
    context = ssl.create_default_context()

    class HTTPHandler(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(http_conn, req)

    class HTTPSHandler(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(https_conn, req, context=context)

    return urllib.request.build_opener(HTTPHandler, HTTPSHandler)


def _content_problem(path: str) -> Optional[str]:
    """Why the local file ``path`` is not a checkpoint the loader opens, or None."""
    from .loading import not_a_checkpoint  # (loading imports this module)
    problem = not_a_checkpoint(path)
    if problem is not None:
        return problem
    try:
        load_checkpoint_file(path, 'cpu', mmap=True)
    except Exception as error:  # whatever the loader says about it is the reason it is not cached
        return f'not a complete checkpoint ({type(error).__name__}: {str(error).splitlines()[0][:200]})'
    return None


def _error(url: str, cached: str, what: str, status: Optional[int] = None) -> CheckpointDownloadError:
    status_text = f'HTTP {status}: ' if status is not None else ''
    return CheckpointDownloadError(
        f'could not download the checkpoint {shown(url)}: {status_text}{what}. Nothing was cached (cache path: '
        f'{cached}). Check the URL and the network from this node, or download the file where you can and pass its '
        f'local path where this URL was given, or save it as {cached}.')


def _fetch(url: str, cached: str, connect_s: float, read_s: float, attempts: int, answer_s: float,
           deadline_s: float) -> None:
    host = urllib.parse.urlparse(url).netloc
    begun = time.monotonic()
    for attempt in range(1, attempts + 1):
        # while the host has not answered, the attempts share NO_ANSWER_DEADLINE_S
        left = max(deadline_s - (time.monotonic() - begun), MIN_ATTEMPT_S)
        opener = _opener(min(connect_s, left), read_s, min(answer_s, left))
        fd, tmp = tempfile.mkstemp(prefix=f'.{osp.basename(cached)}.', suffix='.partial', dir=osp.dirname(cached))
        retry, answered = '', False
        try:
            with os.fdopen(fd, 'wb') as out, opener.open(url) as response:
                answered = True
                total = int(response.headers.get('Content-Length') or 0) or None
                size = f' ({total / 2**20:.1f} MiB)' if total else ''
                print_log(f'Downloading {shown(url)}{size} to {cached}', logger='current')
                done, next_report, start = 0, 0, time.monotonic()
                step = int(total * PROGRESS_SHARE) if total else PROGRESS_BYTES
                while True:
                    block = response.read(CHUNK)
                    if not block:
                        break
                    out.write(block)
                    done += len(block)
                    if done >= next_report + step:
                        next_report = done - done % step
                        share = f' ({100 * done / total:.0f}%)' if total else ''
                        print_log(f'  {done / 2**20:.0f} MiB{share}, {done / 2**20 / (time.monotonic() - start):.1f} '
                                  f'MiB/s', logger='current')
            if total is not None and done != total:
                raise http.client.IncompleteRead(b'', total - done)
            problem = _content_problem(tmp)
            if problem is not None:
                raise _error(url, cached, f'the server sent {done} bytes that are {problem}')
            os.replace(tmp, cached)
            print_log(f'Downloaded {shown(url)} ({done / 2**20:.1f} MiB) to {cached}', logger='current')
            return
        except CheckpointDownloadError:
            raise
        except urllib.error.HTTPError as error:
            if error.code not in _RETRIED_STATUS or attempt == attempts:
                raise _error(url, cached, f'{error.reason}', error.code) from None
            retry = f'HTTP {error.code} {error.reason}'
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            reason = getattr(error, 'reason', error)
            if isinstance(reason, (socket.timeout, TimeoutError)):
                what = (f'no answer from {host} within the timeout (connect {connect_s:.0f} s, answer '
                        f'{answer_s:.0f} s, then {read_s:.0f} s per read)')
                # another attempt would have less than MIN_ATTEMPT_S before the deadline
                if not answered and time.monotonic() - begun + RETRY_WAIT_S * attempt + MIN_ATTEMPT_S > deadline_s:
                    raise _error(url, cached, f'{what}; no answer in {time.monotonic() - begun:.0f} s of '
                                              f'{attempt} attempts') from None
            elif isinstance(error, http.client.IncompleteRead):
                what = f'the connection closed {error.expected} bytes before the end the server announced'
            else:
                what = f'{type(reason).__name__}: {reason}'
            if attempt == attempts:
                raise _error(url, cached, f'{what} (tried {attempts} times)') from None
            retry = what
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        print_log(f'Download of {shown(url)} failed ({retry}); trying again ({attempt + 1} of {attempts})',
                  logger='current', level=30)
        time.sleep(RETRY_WAIT_S * attempt)


@contextlib.contextmanager
def _cache_lock(folder: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder/.lock``: one process at a time fills or checks that cache entry (ranks on
    one node, and on NFS, which Linux maps ``flock`` to byte-range locks for, nodes sharing the cache)."""
    os.makedirs(folder, exist_ok=True)
    with open(osp.join(folder, '.lock'), 'a') as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print_log(f'Waiting for another process to download into {folder}', logger='current')
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def download_checkpoint(url: str, model_dir: Optional[str] = None, connect_timeout: float = CONNECT_TIMEOUT_S,
                        read_timeout: float = READ_TIMEOUT_S, attempts: int = ATTEMPTS,
                        answer_timeout: Optional[float] = None, no_answer_deadline: Optional[float] = None) -> str:
    """The path of the checked local copy of the checkpoint at ``url`` (see the module's docstring); raises
    :class:`CheckpointDownloadError`. ``answer_timeout`` and ``no_answer_deadline`` default to
    :data:`ANSWER_TIMEOUT_S` and :data:`NO_ANSWER_DEADLINE_S`."""
    cached = url_cache_path(url, model_dir)
    with _cache_lock(osp.dirname(cached)):
        if osp.isfile(cached):
            problem = _content_problem(cached)
            if problem is None:
                return cached
            print_log(f'The cached copy {cached} of {shown(url)} is {problem}: deleting it and downloading it again',
                      logger='current', level=30)
            os.remove(cached)
        _note_other_copies(url, cached)
        _fetch(url, cached, connect_timeout, read_timeout, attempts,
               ANSWER_TIMEOUT_S if answer_timeout is None else answer_timeout,
               NO_ANSWER_DEADLINE_S if no_answer_deadline is None else no_answer_deadline)
        with open(osp.join(osp.dirname(cached), '.address'), 'w') as f:
            f.write(_address(url))
    return cached


def _note_other_copies(url: str, cached: str) -> None:
    """Say so when the cache holds copies downloaded from ``url``'s address with another query string: a signed
    URL's new token makes another entry, as the query string may name another file."""
    root, here = osp.dirname(osp.dirname(cached)), osp.dirname(cached)
    others = []
    for entry in sorted(os.listdir(root)) if osp.isdir(root) else []:
        folder = osp.join(root, entry)
        with contextlib.suppress(OSError):
            with open(osp.join(folder, '.address')) as f:
                if folder != here and f.read().strip() == _address(url):
                    others += [osp.join(folder, n) for n in os.listdir(folder) if not n.startswith('.')]
    if others:
        print_log(f'{shown(url)}: the cache holds {len(others)} copy(ies) from this address with another query '
                  f'string ({", ".join(others)}); downloading another, since the query string may name another file. '
                  'Delete the old copies if they are the same file.', logger='current', level=30)


__all__ = ['CheckpointDownloadError', 'download_checkpoint', 'is_url', 'shown', 'url_cache_path', 'CONNECT_TIMEOUT_S',
           'ANSWER_TIMEOUT_S', 'NO_ANSWER_DEADLINE_S', 'READ_TIMEOUT_S', 'ATTEMPTS']
