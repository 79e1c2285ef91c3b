"""`pdkit chat` reads the router's server-sent events as UTF-8, whatever Content-Type the answer has.

SGLang's chat stream is `data: <pydantic JSON>` lines (serving_chat.py, 0.5.23), non-ASCII written
as raw UTF-8, under `text/event-stream` with no charset. requests decodes such a text/* answer as
ISO-8859-1 (requests.utils.get_encoding_from_headers) and, with no Content-Type at all, yields bytes
from iter_lines(decode_unicode=True): the chat printed mojibake ("Ã©" for "é"), broke a line inside
"Å" (its UTF-8 ends in 0x85, which str.splitlines takes for a line break) and failed with a
TypeError on bytes. The server-sent events format is UTF-8 by definition (WHATWG HTML, 9.2).
"""

from __future__ import annotations

import io
import json

import pytest
import requests
from requests.structures import CaseInsensitiveDict

from tests.conftest import write_inventory

DELTAS = ["h\u00e9", " \u00c5", "\u2026", " \u65e5\u672c"]  # é, Å (C3 85), … (E2 80 A6), CJK


def _stream() -> bytes:
    lines = [json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                        ensure_ascii=False)]
    lines += [json.dumps({"choices": [{"index": 0, "delta": {"content": d}}]}, ensure_ascii=False) for d in DELTAS]
    return "".join(f"data: {line}\n\n" for line in lines + ["[DONE]"]).encode()


def _response(content_type: str | None) -> requests.Response:
    response = requests.Response()
    response.status_code = 200
    response.headers = CaseInsensitiveDict({"Content-Type": content_type} if content_type else {})
    # what requests.adapters.HTTPAdapter.build_response sets from the headers
    response.encoding = requests.utils.get_encoding_from_headers(response.headers)
    response.raw = io.BytesIO(_stream())
    return response


@pytest.mark.parametrize("content_type", ["text/event-stream", None, "text/event-stream; charset=utf-8"])
def test_chat_prints_the_streamed_text_as_sent(base, tmp_path, monkeypatch, capsys, content_type):
    from pdkit.cli import main

    cluster, hosts = base
    inventory = write_inventory(tmp_path, hosts, cluster)
    posted = []

    def post(url, **kwargs):
        posted.append(url)
        return _response(content_type)

    monkeypatch.setattr(requests, "post", post)
    rc = main(["chat", str(inventory), "--prompt", "hello"])
    captured = capsys.readouterr()
    assert len(posted) == 1 and posted[0].endswith("/v1/chat/completions")
    assert captured.out == "".join(DELTAS), captured.err
    assert rc == 0
    assert f"-- {len(DELTAS)} chunks" in captured.err


def test_sse_data_takes_data_lines_only_and_replaces_a_bad_byte():
    from pdkit.cli import sse_data

    assert sse_data(b"data: {\"a\": 1}") == "{\"a\": 1}"
    assert sse_data(b"event: sglext_ids") is None
    assert sse_data(b"") is None
    assert sse_data(b"data: \xff") == "\ufffd"
