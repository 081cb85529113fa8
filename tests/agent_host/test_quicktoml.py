"""The boot reader's plain-TOML subset (agent/config/quicktoml.py): whatever it accepts, ``tomllib`` reads
to the same document; what it cannot be sure of, it leaves (None) to the full loader."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.config.quicktoml import loads_plain

REPO = Path(__file__).resolve().parents[2]

_FRAGMENTS = [
    "[agent]", "[host]", "[[mirrors]]", "[mirrors]", "[ agent ]", "[a.b]", "[agent", "[[x]", "[x]]",
    'name = "demo-agent"', "name = 'lit\\eral'", 'name = "esc\\"aped"', 'name = ""', 'name = """', "x = '''",
    "n = 1", "n = -0", "n = +7", "n = 01", "n = 1_000", "n = 0x1f", "n = 3.0", "n = -2.5", "n = 1.",
    "n = .5", "n = 1e3", "n = inf", "n = nan", "t = true", "t = false", "t = True", "d = 1979-05-27",
    'a = ["a", "b"]', "a = [1, 2,]", "a = []", "a = [ ]", "a = [[1]]", "a = [1", 'a = ["x" "y"]',
    "a = [true]", "a = [1.5]", "a = [,]", 'a = ["#", 2] # c', "i = {x = 1}", "k.d = 1", '"q" = 1', "k=1",
    "k =", "= 1", "# comment", "#", "# bell \x07", "n = 1 # c", "n = 1#c", "n = 1 x", 'p = "/a b/{name}"',
    'u = "tab\there"', 'u = "ctl\x01"', "u = 'del\x7f'", 'u = "héllo"', "", "   ", "\t", "n = 1\r",
    "n = 1\rm = 2", "name = 2", "[agent]#c", "[[mirrors]] # c", "x = 'a'b'", 'x = "a" "b"', "n = -",
    "n = 99999999999999999999999", "s = 'it''s'", 's = "]#["', "a = ['x', \"y\"] #", "a=[1,2]",
    "s = '\u00e9'", "n = +0.0", "n = 1.5.2", "a = [1 2]", "a = [\"x\",, 1]", "[\"q\"]", "[]", "[[]]",
]


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(st.sampled_from(_FRAGMENTS), max_size=8))
def test_what_the_subset_accepts_tomllib_reads_the_same(lines: list[str]) -> None:
    text = "\n".join(lines)
    quick = loads_plain(text)
    if quick is None:
        return
    assert tomllib.loads(text) == quick


@pytest.mark.parametrize(
    "text",
    [
        'name = "esc\\"aped"',  # escapes: the full parser's
        'x = """multi\nline"""',
        "a = [\n  1,\n]",
        "i = {x = 1}",
        "k.d = 1",
        "[a]\n[a]",  # valid-looking but refused by TOML: a table defined twice
        "[[m]]\n[m]",
        "n = 1\n n = 2",
        "n = 1\rm = 2",
        "# bell \x07",
    ],
)
def test_outside_the_subset_is_left_to_the_full_loader(text: str) -> None:
    assert loads_plain(text) is None


def test_the_configurations_the_docs_show_are_in_the_subset() -> None:
    """The boot reader must answer for real files, not only be safe: every ``toml`` example of the docs
    and the benchmark's configuration are read, and read as tomllib reads them."""
    texts = [block.split("```", 1)[0] for doc in sorted((REPO / "docs").rglob("*.md"))
             for block in doc.read_text().split("```toml\n")[1:]]
    assert len(texts) >= 5
    texts.append('[agent]\nname = "bench-agent"\n\n[host]\nroot = "/w/root"\nstate_dir = "/w/state"\n'
                 'lock_path = "/w/run/bench-agent.lock"\nunit_dir = "/w/units"\n')
    texts.append('[agent]\nname = "a"  # the unit\nexec_args = ["--port", "8080"]\n[health]\n'
                 "stability_s = 3.0\nmax_attempts = 3\n[[mirrors]]\npath = '/srv/mirror'\n[[mirrors]]\n"
                 'path = "/srv/m2"\n')
    for text in texts:
        assert loads_plain(text) == tomllib.loads(text), text


# -- the boot reader's hand-written predicates against the regular expressions they stand in for ----------
_ALPHABET = "az09AZ._-_:/@?#+= \t\u00e9\u2003"
_texts = st.text(alphabet=st.sampled_from(list(_ALPHABET)), max_size=20)


@settings(max_examples=800, deadline=None)
@given(body=_texts, prefix=st.sampled_from(["", "a", "http://", "https://", "RW"]),
       suffix=st.sampled_from(["", ".service", "/", ":8080", ":65536", "a"]))
def test_the_predicates_agree_with_the_expressions(body: str, prefix: str, suffix: str) -> None:
    import re

    from agent.config import boot
    from agent.config.loader import DNS_SUBDOMAIN_RE, NAME_RE

    v = prefix + body + suffix
    assert boot.plain_name(v) == (NAME_RE.fullmatch(v) is not None)
    assert boot.dns_subdomain(v) == (DNS_SUBDOMAIN_RE.fullmatch(v) is not None)
    service = re.fullmatch(r"[a-z0-9_][a-z0-9_.-]{0,240}\.service", v)
    assert boot._plain_service(v) == (service is not None)
    assert boot._http_url(v) == (re.fullmatch(r"https?://[^/?#@\s]+(?:[/?#]\S*)?", v) is not None)
    proxy = re.fullmatch(r"https?://[A-Za-z0-9.-]+(?::(?P<port>[0-9]{1,5}))?/?", v)
    assert boot._proxy(v) == (v == "" or (proxy is not None and int(proxy.group("port") or 0) <= 65535))
