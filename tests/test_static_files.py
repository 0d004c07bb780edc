"""The console's static files, served by a gateway under Daphne through WhiteNoise: a collected (hashed) name is
cached for a year and immutable, and sent Brotli- or gzip-compressed to a client that asks; the pages name the
hashed files."""

import gzip
from pathlib import Path

import brotli
import httpx2
import pytest
from django.contrib.staticfiles.storage import staticfiles_storage

pytestmark = pytest.mark.e2e
STYLESHEET = "admin/css/base.css"


def _raw(http: httpx2.Client, url: str, encoding: str) -> tuple[httpx2.Response, bytes]:
    """The answer and its body as sent (the client would decompress it)."""
    with http.stream("GET", url, headers={"Accept-Encoding": encoding}) as sent:
        return sent, b"".join(sent.iter_raw())


@pytest.mark.parametrize(("encoding", "decompress"), [("br", brotli.decompress), ("gzip", gzip.decompress)])
def test_a_static_file_is_cached_for_a_year_and_compressed_when_asked(inline_gateway, encoding, decompress):
    url = staticfiles_storage.url(STYLESHEET)
    source = Path(staticfiles_storage.path(staticfiles_storage.stored_name(STYLESHEET))).read_bytes()
    with httpx2.Client(base_url=inline_gateway.url, timeout=5) as http:
        sent, body = _raw(http, url, encoding)
        plain, plain_body = _raw(http, url, "identity")
    assert sent.status_code == 200
    assert (sent.headers["content-encoding"], sent.headers["vary"]) == (encoding, "Accept-Encoding")
    assert sent.headers["cache-control"] == "max-age=315360000, public, immutable"
    assert decompress(body) == source and len(body) < len(source) / 2
    assert "content-encoding" not in plain.headers and plain_body == source


def test_the_console_names_its_static_files_by_their_content(inline_gateway):
    hashed = staticfiles_storage.url(STYLESHEET)
    assert hashed.startswith("/static/admin/css/base.") and hashed != f"/static/{STYLESHEET}"
    with httpx2.Client(base_url=inline_gateway.url, timeout=5) as http:
        assert f'href="{hashed}"' in http.get("/admin/login/").text
