"""Shared test set-up: quiet TensorFlow's C++ logging before it is imported, and a
local HTTP server for the download tests (no network but 127.0.0.1)."""
import functools
import http.server
import os
import threading

import pytest

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """Serves tmp_path/'www' on 127.0.0.1; yields (www folder, base URL)."""
    root = tmp_path / 'www'
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield root, 'http://127.0.0.1:%d' % httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()
    thread.join()
