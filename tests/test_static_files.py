"""The console's static files, served by a gateway under Daphne through WhiteNoise: a collected (hashed) name is
cached for a year and immutable, and sent Brotli- or gzip-compressed to a client that asks; the pages name the
hashed files."""

import gzip
from pathlib import Path

import brotli
import httpx2
import pytest
from django.contrib.staticfiles.storage import staticfiles_storage
from django.core.management import call_command

from tests.helpers import eventually

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


def test_static_ready_later_collects_at_once_and_compresses_whole_copies_in_a_process_of_its_own(settings, tmp_path):
    """scripts/demo's first start: the manifest (all the pages need) at once, the copies from another process; a
    copy a kill cut short (`.part`) is removed, never served."""
    settings.STATIC_ROOT = tmp_path / "static"
    leftover = tmp_path / "static/admin/css/base.css.br.part"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"cut short")
    call_command("static_ready", later=True, verbosity=0)
    assert (tmp_path / "static/staticfiles.json").exists()
    source = Path(staticfiles_storage.path(staticfiles_storage.stored_name(STYLESHEET)))
    done = tmp_path / "static.compressed"
    eventually(done.exists, timeout=60)
    assert brotli.decompress(Path(f"{source}.br").read_bytes()) == source.read_bytes()
    assert gzip.decompress(Path(f"{source}.gz").read_bytes()) == source.read_bytes()
    assert not list((tmp_path / "static").rglob("*.part"))
    # A compression stopped before its end (no mark) is taken up by the next start; the files stay collected.
    Path(f"{source}.br").unlink()
    done.unlink()
    call_command("static_ready", later=True, verbosity=0)
    eventually(done.exists, timeout=60)
    assert brotli.decompress(Path(f"{source}.br").read_bytes()) == source.read_bytes()
